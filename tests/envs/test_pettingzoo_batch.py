"""ParallelEnvBatch on PettingZoo's rps_v2 and simple_spread_v3 and on fedarena's matrix and two-step envs,
against closed-form payoffs and against the same PettingZoo env stepped directly with the same seeds."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.envs.matrix import MatrixGame
from fedarena.envs.pettingzoo_adapters import MatrixParallelEnv, make_env
from fedarena.envs.pettingzoo_batch import ParallelEnvBatch, flatten_observation
from fedarena.envs.pettingzoo_two_step import PAYOFF_2A, PAYOFF_2B, TwoStepGame


def _rps_reward(a0: np.ndarray, a1: np.ndarray) -> np.ndarray:
    """Player 0's reward in rock (0) / paper (1) / scissors (2): the action one step ahead in the cycle wins."""
    d = (a0 - a1) % 3
    return np.where(d == 1, 1.0, np.where(d == 2, -1.0, 0.0))


def test_rps_v2_has_no_state_method_and_falls_back_to_observations():
    cycles = 4
    batch = ParallelEnvBatch(lambda: make_env("rps_v2", api="parallel", max_cycles=cycles), 3, seed=1)
    obs, mask, state = batch.reset()
    assert obs.shape == (3, 2, 4) and mask.shape == (3, 2, 3) and mask.all()
    np.testing.assert_array_equal(obs[..., 3], 1.0)  # "no move yet"
    np.testing.assert_array_equal(state, obs.reshape(3, -1))
    rng = np.random.default_rng(0)
    total = np.zeros((3, 2))
    for t in range(1, cycles + 1):
        a = rng.integers(0, 3, size=(3, 2))
        st = batch.step(a)
        r0 = _rps_reward(a[:, 0], a[:, 1])
        np.testing.assert_array_equal(st.reward, np.stack([r0, -r0], axis=1))
        total += st.reward
        if t < cycles:
            assert not st.episode_end.any()
            # each player observes the other's last action
            np.testing.assert_array_equal(st.obs[:, 0].argmax(axis=1), a[:, 1])
            np.testing.assert_array_equal(st.obs[:, 1].argmax(axis=1), a[:, 0])
            np.testing.assert_array_equal(st.state, st.obs.reshape(3, -1))
    assert st.episode_end.all() and st.truncated.all() and (st.episode_length == cycles).all()
    np.testing.assert_array_equal(st.episode_return, total)
    np.testing.assert_array_equal(st.obs[..., 3], 1.0)  # reset in the same step


def test_simple_spread_v3_matches_the_env_stepped_directly():
    make = lambda: make_env("simple_spread_v3", api="parallel", max_cycles=6)  # noqa: E731
    n, seed = 2, 3
    batch = ParallelEnvBatch(make, n, seed=seed)
    obs, mask, state = batch.reset()
    refs = [make() for _ in range(n)]
    ref_obs = [r.reset(seed=seed * 1_000_003 + i)[0] for i, r in enumerate(refs)]
    agents = refs[0].possible_agents
    space = refs[0].observation_space(agents[0])
    for i, r in enumerate(refs):
        np.testing.assert_allclose(obs[i], [flatten_observation(space, ref_obs[i][a]) for a in agents])
        np.testing.assert_allclose(state[i], np.asarray(r.state()).reshape(-1), rtol=1e-6)
    assert state.shape[1] == np.asarray(refs[0].state()).size
    rng = np.random.default_rng(1)
    for t in range(6):
        a = rng.integers(0, batch.num_actions, size=(n, batch.num_agents))
        st = batch.step(a)
        for i, r in enumerate(refs):
            o, rew, te, tr, _ = r.step({ag: int(a[i, k]) for k, ag in enumerate(agents)})
            np.testing.assert_allclose(st.reward[i], [rew[ag] for ag in agents], rtol=1e-6)
            if t < 5:
                np.testing.assert_allclose(st.obs[i], [flatten_observation(space, o[ag]) for ag in agents], rtol=1e-6)
                np.testing.assert_allclose(st.state[i], np.asarray(r.state()).reshape(-1), rtol=1e-6)
            else:
                np.testing.assert_allclose(st.final_obs[i], [flatten_observation(space, o[ag]) for ag in agents],
                                           rtol=1e-6)
                assert all(tr[ag] for ag in agents)
    assert st.episode_end.all() and st.truncated.all()


def test_matrix_parallel_env_pays_the_payoff_table():
    payoffs = np.array([[[3.0, 0.0], [5.0, 1.0]], [[3.0, 5.0], [0.0, 1.0]]])  # prisoner's dilemma
    game = MatrixGame("pd", payoffs, ("C", "D"), ("C", "D"))
    batch = ParallelEnvBatch(lambda: MatrixParallelEnv(game, rounds=2), 4, seed=0)
    obs, _, state = batch.reset()
    np.testing.assert_array_equal(obs[:, :, -1], 1.0)
    np.testing.assert_array_equal(state, obs.reshape(4, -1))
    a = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
    st = batch.step(a)
    np.testing.assert_array_equal(st.reward, payoffs[:, a[:, 0], a[:, 1]].T)
    np.testing.assert_array_equal(st.obs[:, 0].argmax(axis=1), a[:, 0] * 2 + a[:, 1])
    st2 = batch.step(a[::-1])
    assert st2.episode_end.all() and st2.truncated.all()
    np.testing.assert_array_equal(st2.episode_return, st.reward + payoffs[:, a[::-1, 0], a[::-1, 1]].T)


@pytest.mark.parametrize("first", [0, 1])
def test_two_step_game_state_is_the_one_hot_state(first):
    batch = ParallelEnvBatch(TwoStepGame, 4, seed=0)
    _, _, state = batch.reset()
    np.testing.assert_array_equal(state, np.tile([1.0, 0.0, 0.0], (4, 1)))
    st = batch.step(np.stack([np.full(4, first), np.arange(4) % 2], axis=1))
    np.testing.assert_array_equal(st.state, np.tile(np.eye(3)[1 + first], (4, 1)))
    assert (st.reward == 0).all() and not st.episode_end.any()
    a = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
    st = batch.step(a)
    table = PAYOFF_2A if first == 0 else PAYOFF_2B
    np.testing.assert_array_equal(st.reward, np.repeat(table[a[:, 0], a[:, 1]][:, None], 2, axis=1))
    assert st.episode_end.all() and st.terminated.all()
    np.testing.assert_array_equal(st.final_state, np.tile(np.eye(3)[1 + first], (4, 1)))
    np.testing.assert_array_equal(st.state, np.tile([1.0, 0.0, 0.0], (4, 1)))
