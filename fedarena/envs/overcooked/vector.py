"""``num_envs`` copies of two-player Overcooked (Carroll et al., 2019, "On the Utility of Learning about Humans
for Human-AI Coordination") stepped as numpy arrays, batch axis first, with the mechanics of JaxMARL's
``Overcooked`` (Rutherford et al., 2024), the array form of the paper's environment.

Mechanics. Six actions per agent: up, down, right, left (move one cell and face that way; a move into a
non-floor cell only turns the agent), stay, interact. Moves resolve together: if both agents would end on one
cell, or would swap cells, neither moves. ``interact`` acts on the cell the agent faces, agent_0 first, then
agent_1 on what agent_0 left: take an onion or a plate from a dispenser (empty hands), put a held item on an
empty counter or take one from a counter, put an onion in a pot holding fewer than three (the third starts the
cooking), take a cooked soup from a pot with a plate (the plate becomes a dish), deliver a dish on a serving
cell. A pot cooks for ``COOK_TIME`` = 20 ticks, the first at the end of the step the third onion goes in, so
its soup can be taken on the 20th step after that one. Every delivery gives both agents the sparse reward 20.
Shaped rewards (the paper's defaults, also JaxMARL's): 3 to the agent that puts an onion in a pot, 5 to one
that takes a soup, 3 to one that takes a plate when no plate lies on a counter and fewer plates are held than
pots hold onions or soup; scaled by ``shaped_reward_coef``, annealed linearly to 0 over
``shaped_reward_horizon`` environment steps of this env (summed over copies) when that is given.
Episodes last ``max_cycles`` = 400 steps (the paper's horizon) and end by truncation in every copy together.
``reset`` puts the agents on the layout's start cells facing random directions (as JaxMARL), hands, pots and
counters empty.

Observation: JaxMARL's 26-channel featurisation of the whole grid, (H, W, 26) flattened in C order, each agent
seeing its own layers first: 0 own position, 1 the other's, 2-5 own orientation (one-hot at its cell: up,
down, right, left), 6-9 the other's, 10 pots, 11 empty counters, 12 onion dispensers, 13 tomato dispensers
(none), 14 dish dispensers, 15 serving cells, 16 onions in a pot not yet cooking, 17 tomatoes in pot (0),
18 onions in a cooking or cooked soup (3, also on dishes), 19 tomatoes in soup (0), 20 cooking ticks left,
21 soup ready (cooked pots and dishes), 22 plates, 23 onions (on counters or held, at the holder's cell),
24 tomatoes (0), 25 urgency (all ones when fewer than 40 steps remain). It determines the grid state
exactly (positions, orientations, held items, counters, pots); of the clock it carries only the urgency bit.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from gymnasium import spaces

from fedarena.envs.overcooked.layouts import COUNTER, FLOOR, GOAL, LAYOUTS, ONION_PILE, PLATE_PILE, POT, Layout

UP, DOWN, RIGHT, LEFT, STAY, INTERACT = range(6)
ACTIONS = ("up", "down", "right", "left", "stay", "interact")
DX = np.array([0, 0, 1, -1], dtype=np.int64)  # by orientation (= move action) index
DY = np.array([-1, 1, 0, 0], dtype=np.int64)
EMPTY, ONION, PLATE, DISH = range(4)          # held or counter items
COOK_TIME = 20
DELIVERY_REWARD = 20.0
PLACEMENT_IN_POT_REWARD, PLATE_PICKUP_REWARD, SOUP_PICKUP_REWARD = 3.0, 3.0, 5.0
URGENCY_CUTOFF = 40
NUM_CHANNELS = 26


# Cell codes: floor (+ the item held by an agent standing there), counter (+ the item on it), dispensers, serving
# cell, pot (+ onions 0-2 while filling, 3 + ticks left once cooking).
_FLOOR_CODE, _COUNTER_CODE = 0, 4
_ONION_PILE_CODE, _PLATE_PILE_CODE, _GOAL_CODE, _POT_CODE = 8, 9, 10, 11
_NUM_CODES = _POT_CODE + 3 + COOK_TIME + 1


def _cell_features() -> np.ndarray:
    """``(codes, 26)`` float32: channels 10-24 of a cell with each code (see the module docstring)."""
    f = np.zeros((_NUM_CODES, NUM_CHANNELS), dtype=np.float32)
    for base in (_FLOOR_CODE, _COUNTER_CODE):  # an item held on a floor cell or lying on a counter
        f[base + ONION, 23] = 1
        f[base + PLATE, 22] = 1
        f[base + DISH, 18], f[base + DISH, 21] = 3, 1
    f[_COUNTER_CODE + EMPTY, 11] = 1
    f[_ONION_PILE_CODE, 12] = f[_PLATE_PILE_CODE, 14] = f[_GOAL_CODE, 15] = 1
    f[_POT_CODE:, 10] = 1
    f[_POT_CODE:_POT_CODE + 3, 16] = np.arange(3)
    cooking = slice(_POT_CODE + 3, None)
    f[cooking, 18] = 3
    f[cooking, 20] = np.arange(COOK_TIME + 1)
    f[_POT_CODE + 3, 21] = 1
    return f


_CELL_FEATURES = _cell_features()


class UnknownLayoutError(ValueError):
    """An Overcooked layout name that is not one of :data:`LAYOUTS`."""

    user_error = True


def is_overcooked(env_id: str) -> bool:
    """Whether ``env_id`` names an Overcooked layout (``overcooked.<layout>``)."""
    return env_id.startswith("overcooked.")


def layout_name(env_id: str) -> str:
    """``"overcooked.cramped_room"`` or ``"cramped_room"`` -> ``"cramped_room"``."""
    name = env_id.split(".", 1)[1] if env_id.startswith("overcooked.") else env_id
    if name not in LAYOUTS:
        close = difflib.get_close_matches(name, list(LAYOUTS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UnknownLayoutError(f"unknown Overcooked layout '{env_id}'{hint} Known: {', '.join(LAYOUTS)}")
    return name


@dataclass
class OvercookedState:
    """Per copy: ``pos`` (n, 2, 2) agents' (x, y); ``dir`` (n, 2) orientation (0 up, 1 down, 2 right, 3 left);
    ``inv`` (n, 2) held item (0 none, 1 onion, 2 plate, 3 dish); ``pot_onions`` (n, P) onions in each pot;
    ``pot_cook`` (n, P) cooking ticks left (0 when not cooking or cooked); ``counter`` (n, H, W) item on each
    counter cell."""

    pos: np.ndarray
    dir: np.ndarray
    inv: np.ndarray
    pot_onions: np.ndarray
    pot_cook: np.ndarray
    counter: np.ndarray

    def copy(self) -> "OvercookedState":
        return OvercookedState(*(np.array(a, copy=True) for a in (self.pos, self.dir, self.inv, self.pot_onions,
                                                                   self.pot_cook, self.counter)))


@dataclass(frozen=True)
class OvercookedStep:
    obs: list[np.ndarray]        # per agent (n, H*W*26) float32
    reward: np.ndarray           # (n, 2) float64: sparse + coefficient x shaped
    terminated: np.ndarray       # (n, 2) bool (never: episodes end by the time limit)
    truncated: np.ndarray        # (n, 2) bool
    sparse_reward: np.ndarray    # (n,) float64: 20 per soup delivered in the step
    shaped_reward: np.ndarray    # (n, 2) float64: unscaled shaped rewards


class OvercookedVecEnv:
    """``num_envs`` copies of Overcooked on the layout ``env_id`` (``overcooked.cramped_room``, ...).

    The interface of :class:`fedarena.envs.mpe.MPEVecEnv`: ``agents``, ``observation_sizes``,
    ``action_sizes``, ``state_size``, ``reset(seed)``, ``step(actions)`` with one ``(n,)`` integer array per
    agent, ``state()`` (both observations concatenated). ``reset(seed)`` draws the start orientations from
    ``numpy.random.default_rng(seed)``; ``reset()`` continues the env's generator.
    """

    def __init__(self, env_id: str, num_envs: int, max_cycles: int = 400, seed: int | None = None,
                 shaped_reward_coef: float = 0.0, shaped_reward_horizon: int | None = None) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs: must be >= 1, got {num_envs}")
        if max_cycles < 1:
            raise ValueError(f"max_cycles: must be >= 1, got {max_cycles}")
        if shaped_reward_coef < 0:
            raise ValueError(f"shaped_reward_coef: must be >= 0, got {shaped_reward_coef}")
        if shaped_reward_horizon is not None and shaped_reward_horizon < 1:
            raise ValueError(f"shaped_reward_horizon: must be >= 1 (or null), got {shaped_reward_horizon}")
        self.layout: Layout = LAYOUTS[layout_name(env_id)]
        self.num_envs, self.max_cycles = num_envs, max_cycles
        self.shaped_reward_coef, self.shaped_reward_horizon = float(shaped_reward_coef), shaped_reward_horizon
        self.agents: tuple[str, ...] = ("agent_0", "agent_1")
        self.num_agents = 2
        L = self.layout
        self.obs_shape = (L.height, L.width, NUM_CHANNELS)
        size = int(np.prod(self.obs_shape))
        self.observation_sizes = [size, size]
        self.action_sizes = [len(ACTIONS)] * 2
        self.state_size = 2 * size
        self.observation_spaces = {a: spaces.Box(0.0, float(COOK_TIME), (size,), dtype=np.float32) for a in self.agents}
        self.action_spaces = {a: spaces.Discrete(len(ACTIONS)) for a in self.agents}
        self.continuous = False
        self.total_steps = 0  # environment steps of this env, summed over copies (the shaping anneal's clock)
        k = L.kind
        self._is_counter = k == COUNTER
        self._floor = k == FLOOR
        self._is_pot = k == POT
        # every cell's channels 10-24 are a row of _CELL_FEATURES, picked by the cell's code: its static code
        # plus, on counters, the item on it (added per step), on pots the pot's state, on floor the held item
        self._static_code = np.select([k == FLOOR, k == COUNTER, k == ONION_PILE, k == PLATE_PILE, k == GOAL],
                                      [_FLOOR_CODE, _COUNTER_CODE, _ONION_PILE_CODE, _PLATE_PILE_CODE, _GOAL_CODE],
                                      _POT_CODE).astype(np.int64)
        self.rng = np.random.default_rng(seed)
        self.steps = 0
        self.ws = self._initial_state()

    # -- state
    def _initial_state(self) -> OvercookedState:
        n, L = self.num_envs, self.layout
        P = len(L.pots)
        return OvercookedState(pos=np.broadcast_to(L.start, (n, 2, 2)).copy(),
                               dir=self.rng.integers(0, 4, (n, 2)),
                               inv=np.zeros((n, 2), dtype=np.int64),
                               pot_onions=np.zeros((n, P), dtype=np.int64),
                               pot_cook=np.zeros((n, P), dtype=np.int64),
                               counter=np.zeros((n, L.height, L.width), dtype=np.int64))

    def reset(self, seed: int | None = None) -> list[np.ndarray]:
        """Fresh episodes in every copy; per-agent observations."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.ws = self._initial_state()
        self.steps = 0
        return self.observations()

    def set_state(self, ws: OvercookedState, steps: int = 0) -> list[np.ndarray]:
        """Put the copies in state ``ws`` (copied), ``steps`` steps into their episodes."""
        n, L = self.num_envs, self.layout
        want = {"pos": (n, 2, 2), "dir": (n, 2), "inv": (n, 2), "pot_onions": (n, len(L.pots)),
                "pot_cook": (n, len(L.pots)), "counter": (n, L.height, L.width)}
        for name, shape in want.items():
            if np.shape(getattr(ws, name)) != shape:
                raise ValueError(f"ws.{name}: expected shape {shape}, got {np.shape(getattr(ws, name))}")
        if not self._floor[ws.pos[..., 1], ws.pos[..., 0]].all():
            raise ValueError("ws.pos: agents must stand on floor cells")
        if (ws.counter[:, ~self._is_counter] != EMPTY).any():
            raise ValueError("ws.counter: items may lie on counter cells only")
        self.ws, self.steps = ws.copy(), steps
        return self.observations()

    # -- observations
    def observations(self) -> list[np.ndarray]:
        ws, n = self.ws, self.num_envs
        e = np.arange(n)
        code = self._static_code + np.where(self._is_counter, ws.counter, 0)
        py, px = self.layout.pots[:, 1], self.layout.pots[:, 0]
        code[:, py, px] = _POT_CODE + np.where(ws.pot_onions == 3, 3 + ws.pot_cook, ws.pot_onions)
        for k in range(2):
            code[e, ws.pos[:, k, 1], ws.pos[:, k, 0]] = _FLOOR_CODE + ws.inv[:, k]
        first = _CELL_FEATURES[code]  # (n, H, W, 26), channels 0-9 and 25 still zero
        if self.max_cycles - self.steps < URGENCY_CUTOFF:
            first[..., 25] = 1.0
        second = first.copy()
        for k, o in enumerate((first, second)):
            for j, agent in enumerate((k, 1 - k)):
                x, y = ws.pos[:, agent, 0], ws.pos[:, agent, 1]
                o[e, y, x, j] = 1.0
                o[e, y, x, 2 + 4 * j + ws.dir[:, agent]] = 1.0
        return [first.reshape(n, -1), second.reshape(n, -1)]

    def state(self, obs: Sequence[np.ndarray] | None = None) -> np.ndarray:
        """``(n, state_size)`` float32: both agents' observations concatenated."""
        return np.concatenate(list(self.observations() if obs is None else obs), axis=1)

    # -- dynamics
    def shaping_coefficient(self) -> float:
        """The shaped rewards' current scale: ``shaped_reward_coef``, annealed linearly to 0 over
        ``shaped_reward_horizon`` environment steps when that is set."""
        if self.shaped_reward_horizon is None:
            return self.shaped_reward_coef
        return self.shaped_reward_coef * max(0.0, 1.0 - self.total_steps / self.shaped_reward_horizon)

    def _move(self, acts: np.ndarray) -> None:
        ws = self.ws
        moving = acts < 4
        d = np.where(moving, acts, 0)
        tx = ws.pos[..., 0] + np.where(moving, DX[d], 0)
        ty = ws.pos[..., 1] + np.where(moving, DY[d], 0)
        ok = moving & self._floor[ty, tx]  # the layout's border is never floor, so targets stay on the grid
        fwd = np.where(ok[..., None], np.stack([tx, ty], axis=-1), ws.pos)
        same_cell = (fwd[:, 0] == fwd[:, 1]).all(axis=1)
        swap = (fwd[:, 0] == ws.pos[:, 1]).all(axis=1) & (fwd[:, 1] == ws.pos[:, 0]).all(axis=1)
        blocked = same_cell | swap
        ws.pos = np.where(blocked[:, None, None], ws.pos, fwd)
        ws.dir = np.where(moving, acts, ws.dir)

    def _interact(self, k: int, acts: np.ndarray, sparse: np.ndarray, shaped: np.ndarray) -> None:
        """Agent ``k``'s interactions in the copies where it chose ``interact``."""
        ws, L = self.ws, self.layout
        e = np.nonzero(acts[:, k] == INTERACT)[0]
        if not len(e):
            return
        d = ws.dir[e, k]
        fx, fy = ws.pos[e, k, 0] + DX[d], ws.pos[e, k, 1] + DY[d]
        kind = L.kind[fy, fx]
        inv = ws.inv[e, k]
        empty_hands = inv == EMPTY
        # pots
        p = np.maximum(L.pot_index[fy, fx], 0)
        onions, cook = ws.pot_onions[e, p], ws.pot_cook[e, p]
        is_pot = kind == POT
        add_onion = is_pot & (onions < 3) & (inv == ONION)
        take_soup = is_pot & (onions == 3) & (cook == 0) & (inv == PLATE)
        # counters, dispensers, serving cells
        item = ws.counter[e, fy, fx]
        on_counter = kind == COUNTER
        drop = on_counter & (item == EMPTY) & ~empty_hands
        take_item = on_counter & (item != EMPTY) & empty_hands
        take_onion = (kind == ONION_PILE) & empty_hands
        take_plate = (kind == PLATE_PILE) & empty_hands
        deliver = (kind == GOAL) & (inv == DISH)
        # the plate-pickup shaping looks at the kitchen before this interaction (after agent_0's)
        got_plate = take_plate | (take_item & (item == PLATE))
        no_loose_plate = ~(ws.counter[e] == PLATE).any(axis=(1, 2))
        plates_held = (ws.inv[e] == PLATE).sum(axis=1)
        useful = plates_held < (ws.pot_onions[e] > 0).sum(axis=1)
        plate_bonus = got_plate & no_loose_plate & useful

        new_inv = inv.copy()
        new_inv[add_onion | drop | deliver] = EMPTY
        new_inv[take_soup] = DISH
        new_inv[take_item] = item[take_item]
        new_inv[take_onion] = ONION
        new_inv[take_plate] = PLATE
        ws.inv[e, k] = new_inv
        ws.counter[e[drop], fy[drop], fx[drop]] = inv[drop]
        ws.counter[e[take_item], fy[take_item], fx[take_item]] = EMPTY
        started = add_onion & (onions == 2)
        ws.pot_onions[e[add_onion], p[add_onion]] += 1
        ws.pot_cook[e[started], p[started]] = COOK_TIME
        ws.pot_onions[e[take_soup], p[take_soup]] = 0
        sparse[e] += DELIVERY_REWARD * deliver
        shaped[e, k] += (PLACEMENT_IN_POT_REWARD * add_onion + SOUP_PICKUP_REWARD * take_soup
                         + PLATE_PICKUP_REWARD * plate_bonus)

    def step(self, actions: Sequence[np.ndarray]) -> OvercookedStep:
        if len(actions) != 2:
            raise ValueError(f"actions: expected one array per agent (2), got {len(actions)}")
        acts = []
        for i, a in enumerate(actions):
            a = np.asarray(a)
            if a.shape != (self.num_envs,):
                raise ValueError(f"actions[{i}] ({self.agents[i]}): expected shape {(self.num_envs,)}, got {a.shape}")
            if not np.issubdtype(a.dtype, np.integer) or a.min() < 0 or a.max() >= len(ACTIONS):
                raise ValueError(f"actions[{i}] ({self.agents[i]}): actions must be integers in 0..{len(ACTIONS) - 1}")
            acts.append(a.astype(np.int64))
        A = np.stack(acts, axis=1)
        n = self.num_envs
        coef = self.shaping_coefficient()
        sparse, shaped = np.zeros(n), np.zeros((n, 2))
        self._move(A)
        for k in range(2):
            self._interact(k, A, sparse, shaped)
        ws = self.ws
        ws.pot_cook -= (ws.pot_onions == 3) & (ws.pot_cook > 0)
        self.steps += 1
        self.total_steps += n
        reward = sparse[:, None] + coef * shaped
        trunc = np.full((n, 2), self.steps >= self.max_cycles)
        return OvercookedStep(self.observations(), reward, np.zeros((n, 2), dtype=bool), trunc, sparse, shaped)
