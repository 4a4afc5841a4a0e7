"""Vectorised Overcooked (fedarena.envs.overcooked): a hand-scripted soup in cramped_room with every reward at the
step worked out by hand, pot state transitions, collision rules, determinism, batch/single-copy agreement, and
PettingZoo's parallel API test."""

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

from fedarena.envs.overcooked import OvercookedParallelEnv, OvercookedVecEnv, UnknownLayoutError
from fedarena.envs.overcooked.vector import DISH, DOWN, INTERACT, LEFT, ONION, PLATE, RIGHT, STAY, UP

# cramped_room (x right, y down):   y0 X X P X X   pot (2,0)
#                                   y1 O . . 2 O   onion dispensers (0,1) (4,1); agent_1 starts at (3,1)
#                                   y2 X 1 . . X   agent_0 starts at (1,2)
#                                   y3 X D X S X   dish dispenser (1,3), serving cell (3,3)
ONION_TRIP = [LEFT, INTERACT, RIGHT, UP, INTERACT]      # from (2,1) facing the pot and back, one onion in
SCRIPT = ([UP, LEFT, INTERACT, RIGHT, UP, INTERACT]     # steps 1-6: first onion in the pot
          + ONION_TRIP + ONION_TRIP                     # steps 7-16: second and third (cooking starts at 16)
          + [LEFT, DOWN, INTERACT, UP, RIGHT, UP]       # steps 17-22: plate from (1,2), back to face the pot
          + [STAY] * 12 + [INTERACT]                    # steps 23-35: wait; 35 is one tick early
          + [INTERACT]                                  # step 36: the soup (cooked 20 ticks: steps 16..35)
          + [DOWN, RIGHT, DOWN, INTERACT])              # steps 37-40: to (3,2), face the serving cell, deliver
CH = {"onions_in_pot": 16, "onions_in_soup": 18, "cook_time": 20, "soup_ready": 21}


def _cell(obs: np.ndarray, env: OvercookedVecEnv, x: int, y: int) -> np.ndarray:
    return obs.reshape((-1,) + env.obs_shape)[:, y, x]


def _start(env: OvercookedVecEnv, seed: int = 0) -> None:
    env.reset(seed)
    ws = env.ws.copy()
    ws.dir[:] = UP
    env.set_state(ws)


def test_scripted_soup_in_cramped_room_rewards_at_the_predicted_steps():
    env = OvercookedVecEnv("overcooked.cramped_room", 1, shaped_reward_coef=1.0)
    _start(env)
    assert len(SCRIPT) == 40
    sparse, shaped, inv, pot = [], [], [], []
    for a in SCRIPT:
        st = env.step([np.array([a]), np.array([STAY])])
        sparse.append(st.sparse_reward[0])
        shaped.append(st.shaped_reward[0].copy())
        inv.append(int(env.ws.inv[0, 0]))
        pot.append((int(env.ws.pot_onions[0, 0]), int(env.ws.pot_cook[0, 0])))
        np.testing.assert_array_equal(st.reward[0], st.sparse_reward[0] + st.shaped_reward[0])
    sparse, shaped = np.array(sparse), np.array(shaped)
    assert np.nonzero(sparse)[0].tolist() == [39] and sparse[39] == 20.0  # the 40th step delivers
    expected = np.zeros(40)
    expected[[5, 10, 15]] = 3.0   # onions into the pot
    expected[18] = 3.0            # a useful plate (a pot holds soup, no plate held or on a counter)
    expected[35] = 5.0            # the soup
    np.testing.assert_array_equal(shaped[:, 0], expected)
    assert not shaped[:, 1].any()
    assert inv[2] == ONION and inv[5] == 0 and inv[18] == PLATE
    assert inv[34] == PLATE and inv[35] == DISH and inv[39] == 0  # step 35's interact is one tick early
    assert env.ws.pos[0, 0].tolist() == [3, 2] and env.ws.pos[0, 1].tolist() == [3, 1]
    assert [p[0] for p in pot[:16]] == [0] * 5 + [1] * 5 + [2] * 5 + [3]
    assert pot[15] == (3, 19) and pot[34] == (3, 0) and pot[33] == (3, 1) and pot[35] == (0, 0)


def test_pot_observation_channels_follow_the_pot():
    env = OvercookedVecEnv("overcooked.cramped_room", 1)
    _start(env)
    seen = []
    for a in SCRIPT[:36]:
        st = env.step([np.array([a]), np.array([STAY])])
        seen.append({k: float(_cell(st.obs[1], env, 2, 0)[0, c]) for k, c in CH.items()})
    assert seen[10] == {"onions_in_pot": 2, "onions_in_soup": 0, "cook_time": 0, "soup_ready": 0}
    assert seen[15] == {"onions_in_pot": 0, "onions_in_soup": 3, "cook_time": 19, "soup_ready": 0}
    assert seen[33] == {"onions_in_pot": 0, "onions_in_soup": 3, "cook_time": 1, "soup_ready": 0}
    assert seen[34] == {"onions_in_pot": 0, "onions_in_soup": 3, "cook_time": 0, "soup_ready": 1}
    assert seen[35] == {"onions_in_pot": 0, "onions_in_soup": 0, "cook_time": 0, "soup_ready": 0}
    # the dish is seen at its holder's cell, from both agents
    holder = _cell(st.obs[0], env, 2, 1)[0]
    assert holder[CH["soup_ready"]] == 1 and holder[CH["onions_in_soup"]] == 3
    shared = [o.reshape(env.obs_shape)[..., 10:] for o in st.obs]  # the kitchen's channels are the same for both
    np.testing.assert_array_equal(shared[0], shared[1])


def test_onion_into_a_cooking_pot_and_drop_on_counter():
    env = OvercookedVecEnv("overcooked.cramped_room", 1)
    _start(env)
    for a in SCRIPT[:16]:
        env.step([np.array([a]), np.array([STAY])])
    for a in [LEFT, INTERACT, RIGHT, UP, INTERACT]:  # a fourth onion: the cooking pot refuses it
        env.step([np.array([a]), np.array([STAY])])
    assert env.ws.inv[0, 0] == ONION and env.ws.pot_onions[0, 0] == 3
    env.step([np.array([DOWN]), np.array([STAY])])
    assert env.ws.inv[0, 0] == ONION and env.ws.pos[0, 0].tolist() == [2, 2]
    for a in [UP, LEFT, UP, INTERACT]:  # to (1,1), face the counter (1,0), put the onion there
        env.step([np.array([a]), np.array([STAY])])
    assert env.ws.pos[0, 0].tolist() == [1, 1] and env.ws.inv[0, 0] == 0 and env.ws.counter[0, 0, 1] == ONION
    st = env.step([np.array([INTERACT]), np.array([STAY])])  # and takes it back
    assert env.ws.inv[0, 0] == ONION and env.ws.counter[0, 0, 1] == 0 and not st.shaped_reward.any()


@pytest.mark.parametrize("a0,a1,pos0,pos1", [
    ((1, 1), (3, 1), (1, 1), (3, 1)),   # both into (2,1): neither moves
    ((1, 1), (2, 1), (1, 1), (2, 1)),   # swap: neither moves
])
def test_collisions_block_both_agents(a0, a1, pos0, pos1):
    env = OvercookedVecEnv("overcooked.cramped_room", 1)
    env.reset(0)
    ws = env.ws.copy()
    ws.pos[0] = [a0, a1]
    env.set_state(ws)
    env.step([np.array([RIGHT]), np.array([LEFT])])
    assert env.ws.pos[0].tolist() == [list(pos0), list(pos1)]
    assert env.ws.dir[0].tolist() == [RIGHT, LEFT]  # they turn all the same


def test_moving_into_a_standing_agent_is_blocked_following_one_is_not():
    env = OvercookedVecEnv("overcooked.cramped_room", 2)
    env.reset(0)
    ws = env.ws.copy()
    ws.pos[:] = [[1, 1], [2, 1]]
    env.set_state(ws)
    env.step([np.array([RIGHT, RIGHT]), np.array([STAY, RIGHT])])
    assert env.ws.pos[0].tolist() == [[1, 1], [2, 1]]   # copy 0: agent_1 stays, agent_0 bounces
    assert env.ws.pos[1].tolist() == [[2, 1], [3, 1]]   # copy 1: agent_1 moves on, agent_0 follows
    env.step([np.array([UP, UP]), np.array([UP, DOWN])])  # into the pot / counters: turn only
    assert env.ws.pos[0].tolist() == [[1, 1], [2, 1]] and env.ws.dir[0].tolist() == [UP, UP]
    assert env.ws.pos[1].tolist() == [[2, 1], [3, 2]]


def _rollout(env: OvercookedVecEnv, seed: int, steps: int) -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = [np.concatenate(env.reset(seed), axis=1)]
    rewards = []
    for _ in range(steps):
        st = env.step([rng.integers(0, 6, env.num_envs), rng.integers(0, 6, env.num_envs)])
        obs.append(np.concatenate(st.obs, axis=1))
        rewards.append(st.reward)
    return obs, np.array(rewards)


@pytest.mark.parametrize("layout", ["cramped_room", "asymmetric_advantages"])
def test_deterministic_and_each_copy_steps_as_a_single_env(layout):
    kw = dict(shaped_reward_coef=1.0)
    a = _rollout(OvercookedVecEnv(f"overcooked.{layout}", 8, **kw), 3, 120)
    b = _rollout(OvercookedVecEnv(f"overcooked.{layout}", 8, **kw), 3, 120)
    for x, y in zip(a[0], b[0]):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a[1], b[1])
    # copy 5 of the batch, replayed alone from its start state with its actions
    batch = OvercookedVecEnv(f"overcooked.{layout}", 8, **kw)
    single = OvercookedVecEnv(f"overcooked.{layout}", 1, **kw)
    batch.reset(11)
    ws = single.ws.copy()
    for name in ("pos", "dir", "inv", "pot_onions", "pot_cook", "counter"):
        setattr(ws, name, getattr(batch.ws, name)[5:6].copy())
    single.set_state(ws)
    rng = np.random.default_rng(4)
    for _ in range(150):
        acts = [rng.integers(0, 6, 8), rng.integers(0, 6, 8)]
        sb, ss = batch.step(acts), single.step([acts[0][5:6], acts[1][5:6]])
        np.testing.assert_array_equal(sb.obs[0][5:6], ss.obs[0])
        np.testing.assert_array_equal(sb.obs[1][5:6], ss.obs[1])
        np.testing.assert_array_equal(sb.reward[5:6], ss.reward)


def test_shaping_anneals_and_episodes_truncate_at_max_cycles():
    env = OvercookedVecEnv("overcooked.cramped_room", 4, max_cycles=10, shaped_reward_coef=2.0,
                           shaped_reward_horizon=20)
    env.reset(0)
    coefs = []
    for t in range(10):
        coefs.append(env.shaping_coefficient())
        st = env.step([np.full(4, STAY), np.full(4, STAY)])
        assert st.truncated.all() == (t == 9) and not st.terminated.any()
    np.testing.assert_allclose(coefs, [2.0 * max(0.0, 1 - 4 * t / 20) for t in range(10)])
    urgency = st.obs[0].reshape((4,) + env.obs_shape)[..., 25]
    assert urgency.all()  # fewer than 40 steps left throughout a 10-step episode


def test_bad_input_is_one_line():
    with pytest.raises(UnknownLayoutError, match="did you mean 'cramped_room'"):
        OvercookedVecEnv("overcooked.cramped_rom", 2)
    env = OvercookedVecEnv("overcooked.cramped_room", 2)
    with pytest.raises(ValueError, match=r"actions\[1\] \(agent_1\): actions must be integers in 0..5"):
        env.step([np.zeros(2, dtype=int), np.full(2, 6)])
    with pytest.raises(ValueError, match="expected shape"):
        env.step([np.zeros(3, dtype=int), np.zeros(2, dtype=int)])
    ws = env.ws.copy()
    ws.pos[0, 0] = [0, 0]
    with pytest.raises(ValueError, match="floor"):
        env.set_state(ws)


@pytest.mark.parametrize("layout", ["cramped_room", "asymmetric_advantages"])
def test_parallel_api(layout):
    parallel_api_test(OvercookedParallelEnv(f"overcooked.{layout}", max_cycles=60), num_cycles=100)
