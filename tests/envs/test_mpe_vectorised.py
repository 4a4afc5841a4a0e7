"""The vectorised MPE scenarios against ``mpe2`` itself: same initial states for the same seed, then the same
observations, rewards, terminations and truncations for 200 random-action steps, in a batch of two copies,
for discrete and continuous actions; and PettingZoo's parallel API test on every view."""

import importlib

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

from fedarena.envs.mpe import SCENARIOS, MPEVecEnv, UnknownScenarioError, WorldState, parallel_env

STEPS = 200
VERSIONS = {name: 4 if name == "simple_speaker_listener" else 3 for name in SCENARIOS}


def reference(name: str, continuous: bool):
    mod = importlib.import_module(f"mpe2.{name}_v{VERSIONS[name]}")
    return mod.parallel_env(max_cycles=STEPS, continuous_actions=continuous)


def concat(states: list[WorldState]) -> WorldState:
    return WorldState(*(np.concatenate([getattr(s, f) for s in states]) for f in
                        ("agent_pos", "agent_vel", "agent_c", "landmark_pos", "goal")))


@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "continuous"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_matches_mpe2_step_by_step(name, continuous):
    seeds = (3, 11)
    refs = [reference(name, continuous) for _ in seeds]
    ref_obs = [r.reset(seed=s)[0] for r, s in zip(refs, seeds)]
    singles = [MPEVecEnv(name, 1, max_cycles=STEPS, continuous_actions=continuous) for _ in seeds]
    env = MPEVecEnv(name, 2, max_cycles=STEPS, continuous_actions=continuous)
    assert list(env.agents) == list(refs[0].possible_agents)
    for a in env.agents:
        assert env.action_spaces[a] == refs[0].action_space(a)
        assert env.observation_spaces[a] == refs[0].observation_space(a)
    # the same seed gives mpe2's initial state (checked through every observation and the global state) ...
    starts = []
    for single, s, ro, r in zip(singles, seeds, ref_obs, refs):
        obs = single.reset(seed=s)
        for i, a in enumerate(env.agents):
            np.testing.assert_array_equal(obs[i][0], ro[a])
        np.testing.assert_array_equal(single.state()[0], r.state())
        starts.append(single.ws)
    # ... and the batch, put in those two states, steps as the two mpe2 envs
    env.set_state(concat(starts))
    for r, s in zip(refs, seeds):
        for a in env.agents:
            r.action_space(a).seed(s)
    moved = 0.0
    ours, theirs = [], []
    for t in range(STEPS):
        acts = [{a: r.action_space(a).sample() for a in r.agents} for r in refs]
        out = [r.step(a) for r, a in zip(refs, acts)]
        st = env.step([np.stack([np.asarray(a[name_]) for a in acts]) for name_ in env.agents])
        ours.append(np.concatenate([np.concatenate(st.obs, axis=1), st.reward, st.terminated, st.truncated], axis=1))
        theirs.append([np.concatenate([o[a] for a in env.agents] + [[rew[a] for a in env.agents],
                                       [term[a] for a in env.agents], [trunc[a] for a in env.agents]])
                       for o, rew, term, trunc, _ in out])
        moved += float(np.abs(env.ws.agent_vel).sum())
    # per step and copy: every agent's observation, then rewards, terminations, truncations
    np.testing.assert_allclose(np.stack(ours), np.array(theirs), rtol=0, atol=1e-6)
    assert st.truncated.all()  # max_cycles reached on the last step, as mpe2
    assert all(not r.agents for r in refs)
    if env.spec.agent_movable.any():
        assert moved > 0  # the comparison covered motion, not only resting worlds


def test_contacts_are_exercised():
    # simple_tag from a state with every pair in contact: contact forces and capture rewards both act
    env = MPEVecEnv("simple_tag", 1, max_cycles=5)
    ref = reference("simple_tag", False)
    ref.reset(seed=0)
    world = ref.unwrapped.world
    for k, ag in enumerate(world.agents):
        ag.state.p_pos = np.array([0.01 * k, 0.0])
    env.set_state(WorldState(np.array([[[0.01 * k, 0.0] for k in range(4)]]), np.zeros((1, 4, 2)),
                                  np.zeros((1, 4, 2)), np.stack([lm.state.p_pos for lm in world.landmarks])[None],
                                  np.zeros((1, 0), dtype=np.int64)))
    o, r, *_ = ref.step({a: 0 for a in ref.agents})
    st = env.step([np.zeros(1, dtype=np.int64)] * 4)
    for i, a in enumerate(env.agents):
        np.testing.assert_allclose(st.obs[i][0], o[a], atol=1e-6)
        assert st.reward[0, i] == pytest.approx(r[a], abs=1e-6)
    assert st.reward[0, 0] == 30.0 and np.abs(env.ws.agent_vel).max() > 1.0  # three captures, a hard push


@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "continuous"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_parallel_api(name, continuous):
    parallel_api_test(parallel_env(name, continuous_actions=continuous), num_cycles=60)


def test_unknown_scenario_suggests_the_nearest():
    with pytest.raises(UnknownScenarioError, match="did you mean 'simple_spread'"):
        MPEVecEnv("mpe2.simple_sprad_v3", 2)


def test_bad_actions_are_refused():
    env = MPEVecEnv("simple_spread", 2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions\[1\] \(agent_1\): actions must be in 0..4"):
        env.step([np.zeros(2, dtype=int), np.array([0, 5]), np.zeros(2, dtype=int)])


def test_stacked_batch_follows_the_parallel_batch_contract():
    from fedarena.envs.mpe.batch import HeterogeneousAgentsError, MPEBatch

    batch = MPEBatch("mpe2.simple_spread_v3", 1, seed=5, max_cycles=10)
    ref = reference("simple_spread", False)
    ref_obs, _ = ref.reset(seed=5)
    obs, mask, state = batch.reset()
    assert mask.all() and mask.shape == (1, 3, 5) and state.shape == (1, 54)
    np.testing.assert_array_equal(obs[0], np.stack([ref_obs[a] for a in ref.possible_agents]))
    rng = np.random.default_rng(0)
    total = np.zeros(3)
    for t in range(10):
        acts = rng.integers(0, 5, (1, 3))
        o, r, *_ = ref.step({a: int(acts[0, i]) for i, a in enumerate(ref.possible_agents)})
        st = batch.step(acts)
        total += [r[a] for a in ref.possible_agents]
        np.testing.assert_allclose(st.reward[0], [r[a] for a in ref.possible_agents], atol=1e-12)
        last = np.stack([o[a] for a in ref.possible_agents])
    assert st.episode_end[0] and st.truncated.all() and st.episode_length[0] == 10
    np.testing.assert_allclose(st.episode_return[0], total, atol=1e-9)
    np.testing.assert_array_equal(st.final_obs[0], last)
    np.testing.assert_array_equal(st.final_state[0], last.reshape(-1))
    assert not np.array_equal(st.obs[0], last)  # a new episode started in the same step
    with pytest.raises(HeterogeneousAgentsError, match="speaker_0: 3 obs / 3 actions, listener_0: 11 obs / 5 actions"):
        MPEBatch("mpe2.simple_speaker_listener_v4", 2)
