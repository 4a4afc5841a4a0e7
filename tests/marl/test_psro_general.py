"""PSRO beyond two-player zero-sum: n-player Kuhn poker and general-sum matrix games."""

import itertools

import numpy as np
import pytest

from fedarena.envs import load_game
from fedarena.envs.kuhn import KuhnPoker
from fedarena.marl import expected_returns, exploitability
from fedarena.marl.game_tree import game_tree
from fedarena.marl.meta_solvers import projected_replicator_dynamics
from fedarena.marl.policy import TabularPolicy
from fedarena.marl.psro import PSRO


def _profile(tree, pols):
    probs = np.zeros_like(tree.uniform_probs())
    for p, pol in enumerate(pols):
        rows = tree.infostate_player == p
        probs[rows] = pol.probs[rows]
    return TabularPolicy(tree, probs)


def test_three_player_kuhn_meta_game_matches_brute_force_and_exploitability_falls():
    game = KuhnPoker(num_players=3)
    psro = PSRO(game, meta_solver=lambda u: projected_replicator_dynamics(u, iterations=500, step=0.1))
    start = psro.exploitability()
    psro.run(2)
    tree = game_tree(game)
    assert psro.meta_game.shape == (3, 3, 3, 3)
    for idx in itertools.product(range(3), repeat=3):
        want = expected_returns(tree, _profile(tree, [psro.populations[p][k] for p, k in enumerate(idx)]))
        np.testing.assert_allclose(psro.meta_game[(slice(None),) + idx], want, atol=1e-12)
    assert psro.exploitability() < start
    # the joint policy mixes each population by its meta-strategy: its value is the meta-game's
    sig = psro.meta_strategies
    mixed = np.einsum("pijk,i,j,k->p", psro.meta_game, *sig)
    np.testing.assert_allclose(expected_returns(tree, psro.joint_policy()), mixed, atol=1e-9)


def test_n_player_prd_solves_a_three_player_table():
    """Three players, each wants to match player 0's coin: (heads, heads, heads) is a strict equilibrium."""
    u = np.zeros((3, 2, 2, 2))
    u[:, 0, 0, 0] = 1.0
    u[:, 1, 1, 1] = 0.5
    sig = projected_replicator_dynamics(u, iterations=1000, step=0.5)
    # from uniform, the better equilibrium has the larger basin
    assert all(s[0] > 0.9 for s in sig)


def test_general_sum_two_player_psro():
    pd = load_game("prisoners_dilemma")
    with pytest.raises(ValueError, match="'nash' solves zero-sum meta-games and .* is general-sum; use prd"):
        PSRO(pd, meta_solver="nash")
    psro = PSRO(pd, meta_solver="prd").run(2)
    # defection strictly dominates: the best response (defect) is found at once and the meta-solver plays it
    # (PRD returns the time average of its run, which keeps a little of its uniform start)
    assert exploitability(pd, psro.joint_policy()) < 0.02
    assert all(s[1:].sum() > 0.95 for s in psro.meta_strategies)  # members 1 and 2 both defect


def test_two_player_solvers_refuse_more_players():
    with pytest.raises(ValueError, match="'nash' is for two-player meta-games"):
        PSRO(KuhnPoker(num_players=3), meta_solver="nash")
