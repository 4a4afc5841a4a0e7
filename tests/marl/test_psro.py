"""PSRO (Lanctot et al., 2017): exact Kuhn equilibrium with the Nash meta-solver, self-play cycling under
'last', sampled payoffs within their standard error, the oracle interface and checkpoints."""

import numpy as np
import pytest

from fedarena.envs import load_game
from fedarena.marl.best_response import best_response, expected_returns
from fedarena.marl.policy import uniform_policy
from fedarena.envs.efg import Game
from fedarena.marl.psro import PSRO, exact_best_response_oracle, fictitious_self_play, mixture_policy, self_play


def test_nash_psro_reaches_exact_kuhn_equilibrium():
    game = load_game("kuhn_poker")
    psro = PSRO(game, meta_solver="nash")
    for it in range(1, 16):
        psro.iteration()
        if psro.exploitability() < 1e-9:
            break
    assert psro.exploitability() < 1e-9
    assert expected_returns(game, psro.joint_policy())[0] == pytest.approx(-1 / 18, abs=1e-9)
    assert it <= 10
    # the empirical game entries are the exact expected returns of the population members
    for i, pi in enumerate(psro.populations[0]):
        for j, pj in enumerate(psro.populations[1]):
            joint = pi.with_player(1, pj)
            assert psro.meta_game[:, i, j] == pytest.approx(expected_returns(game, joint), abs=1e-12)


def test_self_play_cycles_on_rock_paper_scissors():
    rps = load_game("rock_paper_scissors")
    psro = self_play(rps)
    rows = []
    for _ in range(6):
        psro.iteration()
        rows.append(int(np.argmax(psro.populations[0][-1]["row"])))
    # iterated best response: each best-responds to the other's last pure strategy, so play cycles
    assert len(set(rows[-3:])) == 3
    assert psro.exploitability() == pytest.approx(1.0)  # a pure strategy in RPS loses 1 to its answer


def test_mixture_policy_matches_mixed_strategy_payoffs():
    game = load_game("kuhn_poker")
    rng = np.random.default_rng(1)
    u = uniform_policy(game)
    pols = []
    for _ in range(3):
        p = rng.random(u.probs.shape)
        pols.append(type(u)(u.tree, p / p.sum(axis=1, keepdims=True)))
    w = np.array([0.2, 0.5, 0.3])
    mix = mixture_policy(game, pols, w)
    opponent = pols[0]
    # against a fixed opponent, the behavioural mixture earns the weighted average of the payoffs
    direct = sum(wk * expected_returns(game, pk.with_player(1, opponent)) for wk, pk in zip(w, pols))
    assert expected_returns(game, mix.with_player(1, opponent)) == pytest.approx(direct, abs=1e-12)
    br = exact_best_response_oracle(game, 1, pols, w)
    assert expected_returns(game, mix.with_player(1, br))[1] == pytest.approx(best_response(game, mix, 1).value)
    with pytest.raises(ValueError, match="opponent_weights"):
        mixture_policy(game, pols, [0.5, 0.5])
    with pytest.raises(ValueError, match="opponent_weights"):
        mixture_policy(game, pols, [0.5, 0.6, -0.1])


def test_sampled_payoffs_are_seeded_and_within_standard_error():
    game = load_game("kuhn_poker")
    a = PSRO(game, sample_episodes=4000, seed=7)
    b = PSRO(game, sample_episodes=4000, seed=7)
    exact = PSRO(game)
    for _ in range(3):
        a.iteration(), b.iteration(), exact.iteration()
    assert np.array_equal(a.meta_game, b.meta_game)
    assert not np.array_equal(a.meta_game, exact.meta_game)
    # Kuhn payoffs lie in [-2, 2]: standard error at most 2 / sqrt(n); allow 4 of them
    assert np.abs(a.meta_game - exact.meta_game).max() < 4 * 2 / np.sqrt(4000)
    with pytest.raises(ValueError, match="seed"):
        PSRO(game, sample_episodes=10)


def test_custom_oracle_interface_and_checkpoint():
    game = load_game("kuhn_poker")
    calls = []

    def oracle(g, player, opponent_policies, opponent_weights):
        assert isinstance(g, Game)  # learned oracles need the game itself, to play it
        calls.append((player, len(opponent_policies), np.asarray(opponent_weights).copy()))
        return exact_best_response_oracle(g, player, opponent_policies, opponent_weights)

    psro = fictitious_self_play(game, oracle=oracle)
    psro.iteration()
    psro.iteration()
    assert [c[:2] for c in calls] == [(0, 1), (1, 1), (0, 2), (1, 2)]
    assert calls[2][2].tolist() == [0.5, 0.5]
    state = psro.state_dict()
    again = PSRO(game, meta_solver="uniform")
    again.load_state_dict(state)
    psro.iteration(), again.iteration()
    assert np.array_equal(psro.meta_game, again.meta_game)
    assert psro.exploitability() == pytest.approx(again.exploitability(), abs=0)
    with pytest.raises(ValueError, match="sample_episodes"):
        PSRO(game, sample_episodes=-1)
    with pytest.raises(KeyError, match="meta-solver"):
        PSRO(game, meta_solver="best")


def test_oracle_rejects_a_bad_opponent_policy_naming_it():
    from fedarena.marl.policy import PolicyError, TabularPolicy

    game = load_game("kuhn_poker")
    u = uniform_policy(game)
    bad = u.probs.copy()
    bad[u.tree.infostate_index["1b"]] = [0.7, 0.7]
    with pytest.raises(PolicyError, match=r"opponent_policies\[1\]: policy\['1b'\]: probabilities sum to 1.4"):
        exact_best_response_oracle(game, 0, [u, TabularPolicy(u.tree, bad)], np.array([0.5, 0.5]))
    # the responder's own rows are not used, so they are not checked
    bad_own = u.probs.copy()
    bad_own[u.tree.infostate_index["1pb"]] = [2.0, 0.0]
    exact_best_response_oracle(game, 0, [TabularPolicy(u.tree, bad_own)], np.array([1.0]))
