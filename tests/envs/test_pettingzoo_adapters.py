"""PettingZoo adapters and batched runners: PettingZoo's own API tests on wrapped fedarena games, the listed
PettingZoo envs by id, reward bookkeeping against known outcomes, dead agents and auto-reset."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.test import api_test, parallel_api_test

from fedarena.envs import load_game, load_matrix_game
from fedarena.envs.pettingzoo_adapters import GameAECEnv, MatrixParallelEnv, UnknownEnvError, make_env
from fedarena.envs.pettingzoo_batch import ParallelEnvBatch, TurnBasedVecEnv, random_policy
from fedarena.envs.pettingzoo_two_step import TwoStepGame


@pytest.mark.parametrize("name", ["kuhn_poker", "leduc_poker", "rock_paper_scissors", "kuhn_poker(players=3)"])
def test_wrapped_games_pass_pettingzoo_api_test(name):
    api_test(GameAECEnv(load_game(name)), num_cycles=60)


def test_truncation_passes_api_test_and_truncates_everyone():
    env = GameAECEnv(load_game("leduc_poker"), max_steps=2)
    api_test(env, num_cycles=30)
    env.reset(seed=1)
    env.step(env.observe(env.agent_selection)["action_mask"].argmax())
    env.step(env.observe(env.agent_selection)["action_mask"].argmax())
    assert all(env.truncations.values()) and not any(env.terminations.values())


def test_matrix_and_two_step_parallel_envs_pass_parallel_api_test():
    parallel_api_test(MatrixParallelEnv(load_matrix_game("prisoners_dilemma"), rounds=4), num_cycles=20)
    parallel_api_test(TwoStepGame(), num_cycles=20)


def test_matrix_parallel_env_pays_the_table_and_shows_the_last_joint_action():
    game = load_matrix_game("rock_paper_scissors")
    env = MatrixParallelEnv(game, rounds=2)
    obs, _ = env.reset()
    assert obs["player_0"][-1] == 1.0
    obs, rew, _, trunc, _ = env.step({"player_0": 0, "player_1": 2})
    assert rew == {"player_0": game.payoffs[0, 0, 2], "player_1": game.payoffs[1, 0, 2]}
    assert obs["player_1"].argmax() == 0 * 3 + 2 and not any(trunc.values())
    _, _, _, trunc, _ = env.step({"player_0": 1, "player_1": 1})
    assert all(trunc.values()) and env.agents == []


def test_two_step_game_payoffs():
    env = TwoStepGame()
    for first, second, expected in ((0, (0, 1), 7.0), (1, (1, 1), 8.0), (1, (0, 1), 1.0), (1, (0, 0), 0.0)):
        env.reset()
        _, r, _, _, _ = env.step({"agent_0": first, "agent_1": 1 - first})
        assert r["agent_0"] == 0.0
        _, r, term, _, _ = env.step({"agent_0": second[0], "agent_1": second[1]})
        assert r == {"agent_0": expected, "agent_1": expected} and all(term.values())


@pytest.mark.parametrize("env_id", ["pettingzoo.classic.tictactoe_v3", "connect_four_v3", "rps_v2", "simple_spread_v3"])
def test_listed_pettingzoo_envs_run_by_id(env_id):
    env = make_env(env_id)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for agent in env.agent_iter(max_iter=30):
        obs, _, term, trunc, info = env.last()
        if term or trunc:
            env.step(None)
            continue
        mask = obs["action_mask"] if isinstance(obs, dict) else info.get("action_mask")
        legal = np.flatnonzero(mask) if mask is not None else np.arange(env.action_space(agent).n)
        env.step(int(rng.choice(legal)))
    env.close()


def test_unknown_env_ids_are_one_line_errors():
    for bad, reason in (("no_such_env_v1", "unknown PettingZoo environment"), ("os.path", "not a PettingZoo"),
                        ("pettingzoo.classic.nope_v0", "unknown PettingZoo environment")):
        with pytest.raises(UnknownEnvError, match=reason) as e:
            make_env(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(UnknownEnvError, match="no parallel API"):
        make_env("tictactoe_v3", api="parallel")


def test_cli_exits_2_on_an_unknown_pettingzoo_env(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("kind: cooperative_marl\nenv_id: pettingzoo.mpe.nope_v9\n")
    r = subprocess.run([sys.executable, "-m", "fedarena", "run", str(cfg), "--out", str(tmp_path / "run")],
                       capture_output=True, text=True)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "nope_v9" in lines[0], r.stderr


def _always(action):
    def act(obs, mask):
        return np.where(mask[:, action], action, mask.argmax(axis=1))
    return act


def test_turn_based_runner_credits_the_learner_in_both_seats():
    # Kuhn: a player who always bets against one who always passes wins the ante, +1, whatever the cards
    # and whichever seat it has (P0 bets, P1 folds; or P0 checks, P1 bets, P0 folds).
    env = TurnBasedVecEnv(lambda: GameAECEnv(load_game("kuhn_poker")), 6, lambda rng: ("passer", _always(0)), seed=3)
    obs, mask = env.reset()
    me = _always(1)
    seats, returns = [], []
    for _ in range(40):
        st = env.step(me(obs, mask))
        obs, mask = st.obs, st.action_mask
        returns += st.episode_return[st.episode_end].tolist()
        seats += st.seat[st.episode_end].tolist()
        assert np.all(st.reward[st.episode_end] == 1.0) and np.all(st.reward[~st.episode_end] == 0.0)
    assert len(returns) >= 40 and set(seats) == {0, 1} and set(returns) == {1.0}


def test_turn_based_runner_matches_exact_value_of_random_play():
    from fedarena.marl import expected_returns, uniform_policy

    game = load_game("kuhn_poker")
    exact = expected_returns(game, uniform_policy(game))  # [0.125, -0.125]
    opponent = random_policy(1)  # one generator for the whole run (a fresh one per episode would replay its draws)
    env = TurnBasedVecEnv(lambda: GameAECEnv(game), 16, lambda rng: ("r", opponent), seed=0, seat=1)
    me = random_policy(2)
    obs, mask = env.reset()
    rets = []
    while len(rets) < 2000:
        st = env.step(me(obs, mask))
        obs, mask = st.obs, st.action_mask
        rets += st.episode_return[st.episode_end].tolist()
    r = np.asarray(rets)
    assert abs(r.mean() - exact[1]) < 4 * r.std() / np.sqrt(len(r))


class _Dying(ParallelEnv):
    """Agent k is done after k + 1 steps (terminated for even k, truncated for odd k); reward = k + 1."""

    metadata = {"name": "dying_v0"}

    def __init__(self):
        self.possible_agents = ["a0", "a1", "a2"]
        self.observation_spaces = {a: spaces.Box(0, 10, (2,), np.float32) for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(2) for a in self.possible_agents}

    def observation_space(self, agent):
        return self.observation_spaces[agent]

    def action_space(self, agent):
        return self.action_spaces[agent]

    def state(self):
        return np.array([self.t], dtype=np.float32)

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return {a: np.array([self.t, k], np.float32) for k, a in enumerate(self.agents)}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        k_of = {a: int(a[1]) for a in self.agents}
        done = {a: self.t >= k + 1 for a, k in k_of.items()}
        obs = {a: np.array([self.t, k_of[a]], np.float32) for a in self.agents}
        rew = {a: float(k_of[a] + 1) for a in self.agents}
        term = {a: done[a] and k_of[a] % 2 == 0 for a in self.agents}
        trunc = {a: done[a] and k_of[a] % 2 == 1 for a in self.agents}
        self.agents = [a for a in self.agents if not done[a]]
        return obs, rew, term, trunc, {a: {} for a in obs}


def test_parallel_batch_pads_dead_agents_and_resets_finished_copies():
    batch = ParallelEnvBatch(_Dying, 2, seed=0)
    obs, mask, state = batch.reset()
    assert obs.shape == (2, 3, 2) and mask.all() and state.shape == (2, 1)
    s1 = batch.step(np.zeros((2, 3), int))
    assert s1.alive.all() and s1.terminated[:, 0].all() and not s1.episode_end.any()
    assert np.all(s1.obs[:, 0] == 0) and not s1.action_mask[:, 0].any() and s1.action_mask[:, 1:].all()
    np.testing.assert_array_equal(s1.final_obs[:, 0], [[1, 0], [1, 0]])  # a0's last observation
    assert np.all(s1.final_obs[:, 1:] == 0)
    s2 = batch.step(np.zeros((2, 3), int))
    assert (s2.alive == [False, True, True]).all() and s2.truncated[:, 1].all()
    s3 = batch.step(np.zeros((2, 3), int))
    assert (s3.alive == [False, False, True]).all() and s3.episode_end.all() and s3.terminated[:, 2].all()
    np.testing.assert_array_equal(s3.episode_return, [[1, 4, 9], [1, 4, 9]])
    assert (s3.episode_length == 3).all()
    np.testing.assert_array_equal(s3.final_obs[:, 2], [[3, 2], [3, 2]])
    assert np.all(s3.final_obs[:, :2] == 0)
    np.testing.assert_array_equal(s3.obs[:, :, 0], 0)  # reset in the same step: t = 0 again
    assert s3.action_mask.all() and (s3.state == 0).all() and (s3.final_state == 3).all()


# ----------------------------------------------------------------------------- games too large to enumerate


@pytest.mark.parametrize("name", ["oshi_zumo(coins=4,size=1)", "oshi_zumo", "chess", "tic_tac_toe"])
def test_games_without_an_information_state_tensor_pass_api_test_without_enumeration(name):
    """Before the size bound, oshi_zumo(coins=4,size=1) enumerated every history (22 GB and killed)."""
    pytest.importorskip("pyspiel")
    env = GameAECEnv(load_game(name), max_steps=40)
    assert env._tensor == "observation" and env._vocab is None
    api_test(env, num_cycles=30)
    env.reset(seed=0)
    obs = env.observe(env.agent_selection)["observation"]
    state = env.state_of_game.pyspiel_state
    np.testing.assert_array_equal(obs.reshape(-1), np.asarray(state.observation_tensor(state.current_player())))


class _NoTensorGame:
    """Kuhn poker without tensors: the adapter must observe information-state strings."""

    def __init__(self):
        self.inner = load_game("kuhn_poker")
        self.name, self.num_players = "kuhn_no_tensor", self.inner.num_players
        self.num_distinct_actions = self.inner.num_distinct_actions

    def new_initial_state(self):
        return self.inner.new_initial_state()


def test_lazy_vocabulary_above_the_bound_passes_api_test_and_overflows_in_one_line():
    from fedarena.envs.gym_envs import EnvStepError

    game = _NoTensorGame()
    enumerated = GameAECEnv(game)                              # 58 histories: enumerated, sorted
    lazy = GameAECEnv(game, max_tree_nodes=20, vocabulary_size=16)
    assert enumerated._vocab is not None and lazy._tensor is None
    api_test(lazy, num_cycles=40)
    assert sum(len(ids) for ids in lazy._vocab._ids) > 0
    tiny = GameAECEnv(game, max_tree_nodes=20, vocabulary_size=1)
    with pytest.raises(EnvStepError, match="vocabulary_size"):
        for seed in range(20):
            tiny.reset(seed=seed)
            while tiny.agents:
                tiny.step(int(np.argmax(tiny.observe(tiny.agent_selection)["action_mask"])))
