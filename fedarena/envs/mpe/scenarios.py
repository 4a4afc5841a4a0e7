"""The nine MPE scenarios of ``mpe2`` (Lowe et al., 2017; Mordatch & Abbeel, 2018) over batched worlds: their
entities, initial-state draws, observations and rewards, with ``mpe2``'s constants and layouts.

Each scenario draws its initial state from one ``numpy.random.Generator`` in ``mpe2``'s order (goal indices,
then agent positions, then landmark positions), batch-first, so a batch of one drawn from
``default_rng(seed)`` is the state ``mpe2``'s ``reset(seed=seed)`` makes. Observations are float64 here (the
env casts them to float32, as ``mpe2`` does). Scenario options beyond ``mpe2``'s defaults that change the
world size are accepted (``N``, ``local_ratio``, agent/obstacle counts); ``mpe2``'s curriculum,
early-termination and partial-observability options are not implemented.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from fedarena.envs.mpe.core import WorldSpec, WorldState


def distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean distance over the last axis (``mpe2``'s ``sqrt(sum(square(a - b)))``)."""
    d = a - b
    return np.sqrt(np.square(d[..., 0]) + np.square(d[..., 1])) if d.shape[-1] == 2 else np.sqrt(np.sum(np.square(d), -1))


def relative(points: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """``points (n, k, 2)`` relative to ``origin (n, 2)``, flattened to ``(n, 2k)``."""
    return (points - origin[:, None, :]).reshape(len(points), -1)


def boundary_penalty(x: np.ndarray) -> np.ndarray:
    """simple_tag's penalty for leaving the unit square, per coordinate ``|x|``: 0 below 0.9, then
    ``10 (x - 0.9)`` below 1, then ``min(exp(2x - 2), 10)``."""
    return np.where(x < 0.9, 0.0, np.where(x < 1.0, (x - 0.9) * 10, np.minimum(np.exp(2 * x - 2), 10)))


def _spec(A: int, L: int, dim_c: int, *, size: float | list = 0.05, movable: bool | list = True,
          silent: bool | list = False, collide: bool | list = True, accel: float | list = 5.0,
          max_speed: float | list = np.inf, landmark_size: float | list = 0.05,
          landmark_collide: bool | list = False) -> WorldSpec:
    full = lambda v, k, dt=float: np.broadcast_to(np.asarray(v, dtype=dt), (k,)).copy()  # noqa: E731
    return WorldSpec(full(size, A), full(movable, A, bool), full(silent, A, bool), full(collide, A, bool),
                     full(accel, A), full(max_speed, A), full(landmark_size, L), full(landmark_collide, L, bool),
                     dim_c)


class Scenario:
    """One scenario: agent names, the world's fixed properties, and its reset / observation / reward rules."""

    name: str
    agents: tuple[str, ...]
    spec: WorldSpec
    local_ratio: float | None = None  # mpe2's blend of the shared and the agent's own reward

    def reset(self, rng: np.random.Generator, n: int) -> WorldState:
        raise NotImplementedError

    def observations(self, ws: WorldState) -> list[np.ndarray]:
        """One ``(n, obs_size_i)`` float64 array per agent, in ``agents`` order."""
        raise NotImplementedError

    def rewards(self, ws: WorldState) -> np.ndarray:
        """``(n, A)`` agent rewards (before any ``local_ratio`` blend)."""
        raise NotImplementedError

    def global_reward(self, ws: WorldState) -> np.ndarray:
        return np.zeros(len(ws.agent_pos))

    def _positions(self, rng: np.random.Generator, n: int, goal: np.ndarray, landmark_range: float = 1.0
                   ) -> WorldState:
        A, L = self.spec.num_agents, self.spec.num_landmarks
        pos = rng.uniform(-1, +1, (n, A, 2))
        lm = rng.uniform(-landmark_range, +landmark_range, (n, L, 2))
        return WorldState(pos, np.zeros((n, A, 2)), np.zeros((n, A, self.spec.dim_c)), lm, goal)


class Simple(Scenario):
    """One agent, one landmark; reward ``-|p - landmark|^2``."""

    name = "simple"

    def __init__(self) -> None:
        self.agents = ("agent_0",)
        self.spec = _spec(1, 1, 0, silent=True, collide=False)

    def reset(self, rng, n):
        return self._positions(rng, n, np.zeros((n, 0), dtype=np.int64))

    def observations(self, ws):
        return [np.concatenate([ws.agent_vel[:, 0], relative(ws.landmark_pos, ws.agent_pos[:, 0])], axis=1)]

    def rewards(self, ws):
        return -np.sum(np.square(ws.agent_pos - ws.landmark_pos[:, :1]), axis=-1)


class SimpleSpread(Scenario):
    """``N`` agents cover ``N`` landmarks: shared ``-sum_l min_i |p_i - l|``, own -1 per agent collided with,
    blended by ``local_ratio``."""

    name = "simple_spread"

    def __init__(self, N: int = 3, local_ratio: float = 0.5) -> None:
        if N < 1:
            raise ValueError(f"N: must be >= 1, got {N}")
        if not 0.0 <= local_ratio <= 1.0:
            raise ValueError(f"local_ratio: must be in [0, 1], got {local_ratio}")
        self.N, self.local_ratio = N, local_ratio
        self.agents = tuple(f"agent_{i}" for i in range(N))
        self.spec = _spec(N, N, 2, size=0.15, silent=True)
        self._others = [np.array([j for j in range(N) if j != i], dtype=np.int64) for i in range(N)]

    def reset(self, rng, n):
        return self._positions(rng, n, np.zeros((n, 0), dtype=np.int64))

    def observations(self, ws):
        out = []
        for i, o in enumerate(self._others):
            p = ws.agent_pos[:, i]
            out.append(np.concatenate([ws.agent_vel[:, i], p, relative(ws.landmark_pos, p),
                                       relative(ws.agent_pos[:, o], p), ws.agent_c[:, o].reshape(len(p), -1)], axis=1))
        return out

    def rewards(self, ws):
        d = distance(ws.agent_pos[:, :, None], ws.agent_pos[:, None, :])
        hit = (d < 2 * 0.15) & ~np.eye(self.N, dtype=bool)
        return -hit.sum(axis=2).astype(np.float64)

    def global_reward(self, ws):
        d = distance(ws.agent_pos[:, :, None], ws.landmark_pos[:, None, :])  # (n, agent, landmark)
        return -np.sum(d.min(axis=1), axis=1)


LANDMARK_RGB = np.array([[0.75, 0.25, 0.25], [0.25, 0.75, 0.25], [0.25, 0.25, 0.75]])


class SimpleReference(Scenario):
    """Two speaking agents; each must bring the other to its own goal landmark (colour observed), shared
    reward blended by ``local_ratio``. ``goal[:, i]`` is agent ``i``'s goal landmark."""

    name = "simple_reference"

    def __init__(self, local_ratio: float = 0.5) -> None:
        if not 0.0 <= local_ratio <= 1.0:
            raise ValueError(f"local_ratio: must be in [0, 1], got {local_ratio}")
        self.local_ratio = local_ratio
        self.agents = ("agent_0", "agent_1")
        self.spec = _spec(2, 3, 10, collide=False)

    def reset(self, rng, n):
        return self._positions(rng, n, rng.integers(3, size=(n, 2)))

    def observations(self, ws):
        n = len(ws.agent_pos)
        out = []
        for i in range(2):
            p = ws.agent_pos[:, i]
            out.append(np.concatenate([ws.agent_vel[:, i], relative(ws.landmark_pos, p), LANDMARK_RGB[ws.goal[:, i]],
                                       ws.agent_c[:, 1 - i].reshape(n, -1)], axis=1))
        return out

    def rewards(self, ws):
        n = np.arange(len(ws.agent_pos))
        return np.stack([-distance(ws.agent_pos[:, 1 - i], ws.landmark_pos[n, ws.goal[:, i]]) for i in range(2)], 1)

    def global_reward(self, ws):
        r = self.rewards(ws)
        return (0 + r[:, 0] + r[:, 1]) / 2


class SimpleSpeakerListener(Scenario):
    """A speaker sees the goal landmark's colour and speaks (3 symbols); a listener hears it and moves; both
    get ``-|listener - goal|^2``. ``goal[:, 0]`` is the goal landmark."""

    name = "simple_speaker_listener"
    colours = np.array([[0.65, 0.15, 0.15], [0.15, 0.65, 0.15], [0.15, 0.15, 0.65]])

    def __init__(self) -> None:
        self.agents = ("speaker_0", "listener_0")
        self.spec = _spec(2, 3, 3, size=0.075, movable=[False, True], silent=[False, True], collide=False,
                          landmark_size=0.04)

    def reset(self, rng, n):
        return self._positions(rng, n, rng.integers(3, size=(n, 1)))

    def observations(self, ws):
        p = ws.agent_pos[:, 1]
        return [self.colours[ws.goal[:, 0]],
                np.concatenate([ws.agent_vel[:, 1], relative(ws.landmark_pos, p), ws.agent_c[:, 0]], axis=1)]

    def rewards(self, ws):
        goal = ws.landmark_pos[np.arange(len(ws.goal)), ws.goal[:, 0]]
        r = -np.sum(np.square(ws.agent_pos[:, 1] - goal), axis=-1)
        return np.stack([r, r], axis=1)


class SimplePush(Scenario):
    """An agent goes to the goal landmark; an adversary, not told which, pushes it away. ``goal[:, 0]``."""

    name = "simple_push"

    def __init__(self) -> None:
        self.agents = ("adversary_0", "agent_0")
        self.spec = _spec(2, 2, 2, silent=True, collide=True)
        self.landmark_colours = np.stack([self._colour(i, 0.1, 0.8) for i in range(2)])
        self.agent_colours = np.stack([self._colour(j, 0.25, 0.5) for j in range(2)])

    @staticmethod
    def _colour(i: int, base: float, add: float) -> np.ndarray:
        c = np.array([base, base, base])
        c[i + 1] += add  # as mpe2 builds it, to the last bit
        return c

    def reset(self, rng, n):
        goal = rng.integers(2, size=(n, 1))
        return self._positions(rng, n, goal)

    def _goal_pos(self, ws):
        return ws.landmark_pos[np.arange(len(ws.goal)), ws.goal[:, 0]]

    def observations(self, ws):
        n = len(ws.agent_pos)
        g = self._goal_pos(ws)
        adv, ag = ws.agent_pos[:, 0], ws.agent_pos[:, 1]
        good = np.concatenate([ws.agent_vel[:, 1], g - ag, self.agent_colours[ws.goal[:, 0]],
                               relative(ws.landmark_pos, ag), np.broadcast_to(self.landmark_colours.reshape(-1), (n, 6)),
                               adv - ag], axis=1)
        bad = np.concatenate([ws.agent_vel[:, 0], relative(ws.landmark_pos, adv), ag - adv], axis=1)
        return [bad, good]

    def rewards(self, ws):
        g = self._goal_pos(ws)
        good = distance(ws.agent_pos[:, 1], g)
        return np.stack([good - distance(g, ws.agent_pos[:, 0]), -good], axis=1)


class SimpleAdversary(Scenario):
    """``N`` agents know the goal among ``N`` landmarks, one adversary does not; agents gain the adversary's
    distance to the goal and lose the nearest agent's. ``goal[:, 0]``."""

    name = "simple_adversary"

    def __init__(self, N: int = 2) -> None:
        if N < 1:
            raise ValueError(f"N: must be >= 1, got {N}")
        self.N = N
        self.agents = ("adversary_0",) + tuple(f"agent_{i}" for i in range(N))
        self.spec = _spec(N + 1, N, 2, size=0.15, silent=True, collide=False, landmark_size=0.08)

    def reset(self, rng, n):
        return self._positions(rng, n, rng.integers(self.N, size=(n, 1)))

    def _goal_pos(self, ws):
        return ws.landmark_pos[np.arange(len(ws.goal)), ws.goal[:, 0]]

    def observations(self, ws):
        g = self._goal_pos(ws)
        out = []
        for i in range(self.N + 1):
            p = ws.agent_pos[:, i]
            others = relative(np.delete(ws.agent_pos, i, axis=1), p)
            parts = [relative(ws.landmark_pos, p), others]
            out.append(np.concatenate(parts if i == 0 else [g - p] + parts, axis=1))
        return out

    def rewards(self, ws):
        d = distance(ws.agent_pos, self._goal_pos(ws)[:, None])  # (n, A)
        good = (-d[:, 1:].min(axis=1)) + (0 + d[:, 0])
        return np.concatenate([-d[:, :1], np.repeat(good[:, None], self.N, axis=1)], axis=1)


class SimpleTag(Scenario):
    """Predator-prey: slower adversaries (+10 per contact with any prey) chase faster prey (-10 per contact,
    minus a penalty for leaving the unit square) among obstacles."""

    name = "simple_tag"

    def __init__(self, num_good: int = 1, num_adversaries: int = 3, num_obstacles: int = 2) -> None:
        for k, v in (("num_good", num_good), ("num_adversaries", num_adversaries)):
            if v < 1:
                raise ValueError(f"{k}: must be >= 1, got {v}")
        if num_obstacles < 0:
            raise ValueError(f"num_obstacles: must be >= 0, got {num_obstacles}")
        self.num_adv, self.num_good = num_adversaries, num_good
        A = num_adversaries + num_good
        adv = [i < num_adversaries for i in range(A)]
        self.agents = tuple(f"adversary_{i}" if a else f"agent_{i - num_adversaries}" for i, a in enumerate(adv))
        self.spec = _spec(A, num_obstacles, 2, size=[0.075 if a else 0.05 for a in adv], silent=True,
                          accel=[3.0 if a else 4.0 for a in adv], max_speed=[1.0 if a else 1.3 for a in adv],
                          landmark_size=0.2, landmark_collide=True)

    def reset(self, rng, n):
        return self._positions(rng, n, np.zeros((n, 0), dtype=np.int64), landmark_range=0.9)

    def observations(self, ws):
        out = []
        A = self.spec.num_agents
        for i in range(A):
            p = ws.agent_pos[:, i]
            others = [j for j in range(A) if j != i]
            good = [j for j in others if j >= self.num_adv]
            out.append(np.concatenate([ws.agent_vel[:, i], p, relative(ws.landmark_pos, p),
                                       relative(ws.agent_pos[:, others], p),
                                       ws.agent_vel[:, good].reshape(len(p), -1)], axis=1))
        return out

    def _contacts(self, ws):
        a, s = ws.agent_pos, self.spec.agent_size
        hit = distance(a[:, :self.num_adv, None], a[:, None, self.num_adv:]) < s[:self.num_adv, None] + s[None, self.num_adv:]
        return hit  # (n, adversary, prey)

    def rewards(self, ws):
        hit = self._contacts(ws)
        caught = hit.sum(axis=(1, 2)).astype(np.float64)
        prey = -10.0 * hit.sum(axis=1)
        prey = prey - boundary_penalty(np.abs(ws.agent_pos[:, self.num_adv:, 0])) \
            - boundary_penalty(np.abs(ws.agent_pos[:, self.num_adv:, 1]))
        return np.concatenate([np.repeat(10.0 * caught[:, None], self.num_adv, axis=1), prey], axis=1)


class SimpleCrypto(Scenario):
    """Alice encodes the goal colour with a key shared with Bob; Eve listens without the key. ``goal[:, 0]``
    is the goal landmark, ``goal[:, 1]`` the key's landmark (colours are one-hot in 4 dimensions)."""

    name = "simple_crypto"

    def __init__(self) -> None:
        self.agents = ("eve_0", "bob_0", "alice_0")
        self.spec = _spec(3, 2, 4, movable=False, collide=False)
        self.colours = np.eye(2, 4)

    def reset(self, rng, n):
        goal = rng.integers(2, size=(n, 1))
        key = rng.integers(2, size=(n, 1))
        return self._positions(rng, n, np.concatenate([goal, key], axis=1))

    def observations(self, ws):
        goal, key = self.colours[ws.goal[:, 0]], self.colours[ws.goal[:, 1]]
        alice_c = ws.agent_c[:, 2]
        return [alice_c.copy(), np.concatenate([key, alice_c], axis=1), np.concatenate([goal, key], axis=1)]

    def rewards(self, ws):
        goal = self.colours[ws.goal[:, 0]]
        err = np.sum(np.square(ws.agent_c - goal[:, None]), axis=-1)  # (n, A)
        spoke = np.any(ws.agent_c != 0, axis=-1)
        eve = np.where(spoke[:, 0], err[:, 0], 0.0)
        bob = np.where(spoke[:, 1], err[:, 1], 0.0)
        good = (0 + eve) + (0 - bob)
        return np.stack([0 - eve, good, good], axis=1)


class SimpleWorldComm(Scenario):
    """simple_tag with food (+2 on contact, -0.05 x distance to the nearest), forests that hide agents from
    those outside them, and a leader adversary who sees everything and speaks to the other adversaries."""

    name = "simple_world_comm"

    def __init__(self, num_good: int = 2, num_adversaries: int = 4, num_obstacles: int = 1, num_food: int = 2,
                 num_forests: int = 2) -> None:
        for k, v in (("num_good", num_good), ("num_adversaries", num_adversaries), ("num_food", num_food)):
            if v < 1:
                raise ValueError(f"{k}: must be >= 1, got {v}")
        for k, v in (("num_obstacles", num_obstacles), ("num_forests", num_forests)):
            if v < 0:
                raise ValueError(f"{k}: must be >= 0, got {v}")
        self.num_adv, self.num_good = num_adversaries, num_good
        self.num_obstacles, self.num_food, self.num_forests = num_obstacles, num_food, num_forests
        A = num_adversaries + num_good
        adv = [i < num_adversaries for i in range(A)]
        self.agents = tuple("leadadversary_0" if i == 0 else f"adversary_{i - 1}" if a else f"agent_{i - num_adversaries}"
                            for i, a in enumerate(adv))
        L = num_obstacles + num_food + num_forests
        self.spec = _spec(A, L, 4, size=[0.075 if a else 0.045 for a in adv], silent=[i > 0 for i in range(A)],
                          accel=[3.0 if a else 4.0 for a in adv], max_speed=[1.0 if a else 1.3 for a in adv],
                          landmark_size=[0.2] * num_obstacles + [0.03] * num_food + [0.3] * num_forests,
                          landmark_collide=[True] * num_obstacles + [False] * (num_food + num_forests))
        self.food = slice(num_obstacles, num_obstacles + num_food)
        self.forests = slice(num_obstacles + num_food, L)

    def reset(self, rng, n):
        ws = self._positions(rng, n, np.zeros((n, 0), dtype=np.int64), landmark_range=0.9)
        ws.landmark_pos[:, self.food] = rng.uniform(-0.9, +0.9, (n, self.num_food, 2))  # mpe2 draws these again
        ws.landmark_pos[:, self.forests] = rng.uniform(-0.9, +0.9, (n, self.num_forests, 2))
        return ws

    def observations(self, ws):
        n, A = len(ws.agent_pos), self.spec.num_agents
        size = self.spec.agent_size
        forests = ws.landmark_pos[:, self.forests]
        inside = distance(ws.agent_pos[:, :, None], forests[:, None]) < size[:, None] + 0.3  # (n, A, F)
        anywhere = inside.any(axis=2)
        out = []
        for i in range(A):
            p = ws.agent_pos[:, i]
            others = [j for j in range(A) if j != i]
            shared = np.any(inside[:, i:i + 1] & inside[:, others], axis=2)            # (n, A-1)
            seen = shared | (~anywhere[:, i:i + 1] & ~anywhere[:, others]) | (i == 0)
            rel = np.where(seen[..., None], ws.agent_pos[:, others] - p[:, None], 0.0).reshape(n, -1)
            good = [k for k, j in enumerate(others) if j >= self.num_adv]
            vel = np.where(seen[:, good, None], ws.agent_vel[:, [others[k] for k in good]], 0.0).reshape(n, -1)
            in_forest = np.where(inside[:, i], 1.0, -1.0)
            head = [ws.agent_vel[:, i], p, relative(ws.landmark_pos, p), rel]
            if i < self.num_adv:
                out.append(np.concatenate(head + [vel, in_forest, ws.agent_c[:, 0]], axis=1))
            else:
                out.append(np.concatenate(head + [in_forest, vel], axis=1))
        return out

    def rewards(self, ws):
        a, s, k = ws.agent_pos, self.spec.agent_size, self.num_adv
        hit = distance(a[:, :k, None], a[:, None, k:]) < s[:k, None] + s[None, k:]  # (n, adversary, prey)
        prey = a[:, k:]
        food = ws.landmark_pos[:, self.food]
        d_food = distance(prey[:, :, None], food[:, None])  # (n, prey, food)
        good = -5.0 * hit.sum(axis=1)
        good = good - 2 * boundary_penalty(np.abs(prey[..., 0])) - 2 * boundary_penalty(np.abs(prey[..., 1]))
        good = good + 2.0 * (d_food < s[k:, None] + 0.03).sum(axis=2)
        good = good - 0.05 * d_food.min(axis=2)
        d_prey = distance(prey[:, :, None], a[:, None, :k])  # (n, prey, adversary)
        adv = 0 - 0.1 * d_prey.min(axis=1) + 5.0 * hit.sum(axis=(1, 2))[:, None]
        return np.concatenate([adv, good], axis=1)


SCENARIOS: dict[str, Callable[..., Scenario]] = {
    "simple": Simple,
    "simple_spread": SimpleSpread,
    "simple_reference": SimpleReference,
    "simple_speaker_listener": SimpleSpeakerListener,
    "simple_push": SimplePush,
    "simple_adversary": SimpleAdversary,
    "simple_tag": SimpleTag,
    "simple_crypto": SimpleCrypto,
    "simple_world_comm": SimpleWorldComm,
}
