"""Batched RL views of extensive-form games: statistics against exact expected returns of the compiled tree."""

import numpy as np
import pytest

from fedarena.envs import IllegalActionError, load_game
from fedarena.envs.efg import all_histories
from fedarena.envs.efg_vector import Population, ResponseEnv, VectorGame, compile_tables
from fedarena.marl import TabularPolicy, expected_returns, uniform_policy
from fedarena.marl.game_tree import game_tree


def _random_policy(game, seed):
    tree = game_tree(game)
    rng = np.random.default_rng(seed)
    p = rng.random(tree.legal.shape) * tree.legal
    return TabularPolicy(tree, p / p.sum(axis=1, keepdims=True))


@pytest.mark.parametrize("name", ["kuhn_poker", "leduc_poker"])
def test_tables_cover_every_history_and_information_state(name):
    game = load_game(name)
    t = compile_tables(game)
    assert t.num_nodes == len(all_histories(game))
    assert set(t.infostates) == set(game_tree(game).infostates)
    for s in all_histories(game)[:300]:
        if not s.is_terminal() and not s.is_chance_node():
            j = t.infostate_index[s.information_state_string()]
            np.testing.assert_array_equal(t.tensors[j], s.information_state_tensor())
            assert np.flatnonzero(t.legal[j]).tolist() == s.legal_actions()


@pytest.mark.parametrize("name,player", [("kuhn_poker", 0), ("kuhn_poker", 1), ("leduc_poker", 1)])
def test_response_env_mean_return_matches_exact_value(name, player):
    """The learner plays a fixed random policy through the env; its mean return is the exact value."""
    game = load_game(name)
    tree = game_tree(game)
    mine, theirs = _random_policy(game, 1), _random_policy(game, 2)
    env = ResponseEnv(game, player, {1 - player: theirs}, num_envs=512, seed=3)
    t = env.tables
    cdf = np.cumsum(mine.probs[[tree.infostate_index[s] for s in t.infostates]], axis=1)
    rng = np.random.default_rng(4)
    obs = env.reset()
    rows = {o.tobytes(): j for j, o in enumerate(t.tensors)}
    for _ in range(400):
        s = np.array([rows[o.tobytes()] for o in obs])
        a = (rng.random(len(s))[:, None] >= cdf[s]).sum(axis=1)
        obs = env.step(a).obs
    joint = mine.with_player(1 - player, theirs)
    exact = expected_returns(tree, joint)[player]
    r = np.asarray(env.episode_returns)
    assert len(r) > 10_000
    assert abs(r.mean() - exact) < 4 * r.std() / np.sqrt(len(r))


def test_population_mixes_members_per_episode_and_callables_match_tables():
    game = load_game("kuhn_poker")
    tree = game_tree(game)
    a, b = _random_policy(game, 5), _random_policy(game, 6)
    w = np.array([0.3, 0.7])
    # the second member given as a callable over (tensor, legal mask)
    t = compile_tables(game)
    table_b = b.probs[[tree.infostate_index[s] for s in t.infostates]]
    rows = {o.tobytes(): j for j, o in enumerate(t.tensors)}
    fn_b = lambda obs, legal: table_b[[rows[o.tobytes()] for o in obs]]  # noqa: E731
    env = ResponseEnv(game, 0, {1: Population([a, fn_b], w)}, num_envs=1000, seed=7)
    env.reset()
    for _ in range(300):
        env.step(np.zeros(1000, dtype=np.int64))  # always pass
    always_pass = TabularPolicy(tree, np.where(tree.legal, np.eye(2)[[0]], 0.0))
    exact = sum(wk * expected_returns(tree, always_pass.with_player(1, pk))[0] for wk, pk in zip(w, (a, b)))
    r = np.asarray(env.episode_returns)
    assert abs(r.mean() - exact) < 4 * r.std() / np.sqrt(len(r))


def test_chance_is_sampled_with_its_probabilities():
    game = load_game("leduc_poker")
    vg = VectorGame(game, 20_000, seed=0)
    cards = np.array([int(s.split(":")[0][0] == "K") for s in np.asarray(vg.tables.infostates)[vg.infostate_ids(np.arange(20_000))]])
    assert abs(cards.mean() - 1 / 3) < 4 * np.sqrt(2 / 9 / 20_000)


def test_bad_input_is_a_one_line_error():
    game = load_game("leduc_poker")
    vg = VectorGame(game, 4, seed=0)
    with pytest.raises(IllegalActionError, match="not legal at"):
        vg.step(np.arange(4), np.zeros(4, dtype=np.int64))  # fold without facing a raise
    with pytest.raises(ValueError, match=r"policy array of shape \(936, 3\)"):
        ResponseEnv(game, 0, {1: np.ones((10, 3)) / 3}, num_envs=2)
    with pytest.raises(ValueError, match="opponents: expected a policy for each of players"):
        ResponseEnv(game, 0, {}, num_envs=2)
    with pytest.raises(ValueError, match="weights"):
        Population([uniform_policy(game)], [0.5])
