"""RL best-response oracles against exact best responses; PSRO driven by them; approximate exploitability."""

import numpy as np
import pytest

from fedarena.envs import load_game
from fedarena.envs.efg_vector import ResponseEnv, compile_tables
from fedarena.marl import best_response, expected_returns, exploitability, uniform_policy
from fedarena.marl.approx_exploitability import approximate_exploitability
from fedarena.marl.game_tree import game_tree
from fedarena.marl.policy import TabularPolicy
from fedarena.marl.psro import PSRO, mixture_policy
from fedarena.marl.rl_oracles import DQNOracle, DQNOracleConfig, NetworkPolicy, PPOOracle, PPOOracleConfig

FAST = DQNOracleConfig(episodes=4000, num_envs=128)


def _random_policy(game, seed):
    tree = game_tree(game)
    p = np.random.default_rng(seed).random(tree.legal.shape) * tree.legal
    return TabularPolicy(tree, p / p.sum(axis=1, keepdims=True))


@pytest.mark.parametrize("player", [0, 1])
def test_dqn_oracle_answers_a_mixture_with_an_exact_best_response_on_kuhn(player):
    game = load_game("kuhn_poker")
    pols, w = [_random_policy(game, 1), _random_policy(game, 2)], np.array([0.25, 0.75])
    oracle = DQNOracle(FAST, seed=0)
    response = oracle(game, player, pols, w)
    mix = mixture_policy(game, pols, w, players=(1 - player,))
    exact = best_response(game, mix, player).value
    learned = expected_returns(game, mix.with_player(player, response))[player]
    assert learned == pytest.approx(exact, abs=1e-9)
    assert oracle.training_episodes >= 4000 and len(oracle.networks) == 1
    # the same response played as a network gives the same greedy actions as its table
    net = oracle.networks[0]
    t = compile_tables(game)
    rows = np.flatnonzero(t.infostate_player == player)
    tab = response.probs[[game_tree(game).infostate_index[t.infostates[r]] for r in rows]]
    np.testing.assert_array_equal(net(t.tensors[rows], t.legal[rows]), tab)


def test_ppo_oracle_on_kuhn_and_its_refusal_on_leduc():
    game = load_game("kuhn_poker")
    u = uniform_policy(game)
    response = PPOOracle(PPOOracleConfig(episodes=8000), seed=0)(game, 0, [u], np.ones(1))
    exact = best_response(game, u, 0).value
    assert expected_returns(game, u.with_player(0, response))[0] > exact - 0.02
    with pytest.raises(ValueError, match="PPO has no action masks"):
        PPOOracle()(load_game("leduc_poker"), 0, [uniform_policy(load_game("leduc_poker"))], np.ones(1))


def test_psro_with_the_dqn_oracle_improves_on_uniform():
    game = load_game("kuhn_poker")
    psro = PSRO(game, meta_solver="nash", oracle=DQNOracle(FAST, seed=1))
    start = psro.exploitability()
    psro.run(2)
    assert len(psro.populations[0]) == 3
    assert psro.exploitability() < start - 0.1


def test_network_policy_of_the_wrong_layout_is_refused():
    kuhn = compile_tables(load_game("kuhn_poker"))
    oracle = DQNOracle(DQNOracleConfig(episodes=10, learning_starts=10_000), seed=0)
    leduc_net = oracle.network(load_game("leduc_poker"), 0, [uniform_policy(load_game("leduc_poker"))], np.ones(1))
    with pytest.raises(ValueError, match="reads inputs of size 30, but kuhn_poker's information_state tensor has size 11"):
        NetworkPolicy(kuhn, 0, leduc_net.net, leduc_net.params)


def test_approximate_exploitability_brackets_the_exact_value_on_kuhn():
    game = load_game("kuhn_poker")
    pol = _random_policy(game, 7)
    est = approximate_exploitability(game, pol, oracle=FAST, eval_episodes=20_000, confidence=0.999, seed=0)
    exact = exploitability(game, pol)
    # the interval covers the exact value of the learned responses (what the estimator measures) ...
    tree = game_tree(game)
    learned = [expected_returns(tree, pol.with_player(i, r.tabular()))[i] for i, r in enumerate(est.responses)]
    assert est.ci_low <= sum(learned) / 2 <= est.ci_high
    # ... and those responses are (near-)best, so the estimate is close to the exact exploitability
    assert abs(est.value - exact) < 0.03 and est.ci_high - est.ci_low < 0.06


def test_approximate_exploitability_of_callable_policies():
    """The frozen policy given as one callable per player (the way a network policy is passed)."""
    game = load_game("kuhn_poker")
    tree, t = game_tree(game), compile_tables(game)
    pol = _random_policy(game, 3)
    table = pol.probs[[tree.infostate_index[s] for s in t.infostates]]
    rows = {o.tobytes(): j for j, o in enumerate(t.tensors)}
    fn = lambda obs, legal: table[[rows[o.tobytes()] for o in obs]]  # noqa: E731
    est = approximate_exploitability(game, {0: fn, 1: fn}, oracle=FAST, eval_episodes=5000, seed=1)
    assert abs(est.value - exploitability(game, pol)) < 0.06
