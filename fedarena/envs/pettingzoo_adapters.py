"""PettingZoo adapters in both directions (Terry et al., 2021, "PettingZoo: Gym for multi-agent RL").

- :class:`GameAECEnv`: any fedarena extensive-form :class:`~fedarena.envs.efg.Game` (Kuhn, Leduc, matrix games
  in extensive form, OpenSpiel games through :mod:`fedarena.envs.openspiel`) as a PettingZoo ``AECEnv``:
  agents ``player_0 .. player_{n-1}``, chance moves sampled by the env's seeded generator, observations
  ``{"observation", "action_mask"}`` (the classic-env convention), rewards only at the end of the game,
  optional truncation after ``max_steps`` player moves.
- :class:`MatrixParallelEnv`: a two-player matrix game repeated ``rounds`` times as a PettingZoo
  ``ParallelEnv`` (both players move at once; each sees the previous joint action; truncated after the
  last round, like PettingZoo's ``rps_v2``).
- :func:`make_env`: a PettingZoo environment by id (``"pettingzoo.classic.tictactoe_v3"``, ``"connect_four_v3"``,
  ``"rps_v2"``, ``"mpe2.simple_spread_v3"`` / ``"simple_spread_v3"``, or fedarena's own ``"two_step_v0"``),
  AEC or parallel.

Both adapters pass ``pettingzoo.test.api_test`` / ``parallel_api_test`` (see the tests).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv

from fedarena.envs.efg import CHANCE, Game, State, estimate_tree_size
from fedarena.envs.efg import max_tree_nodes as _tree_bound
from fedarena.envs.matrix import MatrixGame


class UnknownEnvError(KeyError):
    """An environment id that names no PettingZoo environment (one-line message)."""

    def __str__(self) -> str:
        return str(self.args[0])


# ----------------------------------------------------------------------------- environments by id

ENV_FAMILIES = ("pettingzoo.classic", "pettingzoo.butterfly", "pettingzoo.sisl", "pettingzoo.atari", "mpe2")
"""Where a short id like ``"tictactoe_v3"`` is looked for, in this order."""


FEDARENA_ENVS = {"two_step_v0": "fedarena.envs.pettingzoo_two_step"}
"""PettingZoo environments that fedarena itself defines, by id."""


def _env_module(env_id: str) -> Any:
    if not isinstance(env_id, str) or not env_id:
        raise UnknownEnvError(f"env_id: expected a PettingZoo environment id, got {env_id!r}")
    if env_id in FEDARENA_ENVS:
        return importlib.import_module(FEDARENA_ENVS[env_id])
    if "." in env_id:
        candidates = [env_id]
        if env_id.split(".", 1)[0] not in ("pettingzoo", "mpe2"):
            raise UnknownEnvError(f"env_id: '{env_id}' is not a PettingZoo environment "
                                  "(expected pettingzoo.<family>.<name> or mpe2.<name>)")
    else:
        candidates = [f"{family}.{env_id}" for family in ENV_FAMILIES]
    for path in candidates:
        try:
            module = importlib.import_module(path)
        except ModuleNotFoundError as e:
            if e.name is not None and path.startswith(e.name):  # the env module itself is missing
                continue
            raise UnknownEnvError(f"env_id: '{env_id}' needs the missing package '{e.name}'") from None
        except ImportError as e:  # e.g. pettingzoo.mpe, which now only says it moved to mpe2
            reason = (str(e).strip().splitlines() or ["import failed"])[0]
            raise UnknownEnvError(f"env_id: '{env_id}' cannot be imported: {reason}") from None
        if hasattr(module, "env") or hasattr(module, "parallel_env"):
            return module
    raise UnknownEnvError(f"env_id: unknown PettingZoo environment '{env_id}' "
                          f"(looked in {', '.join(ENV_FAMILIES)})")


def is_pettingzoo_id(env_id: str) -> bool:
    """True when ``env_id`` names a PettingZoo (or mpe2) environment that can be imported."""
    try:
        _env_module(env_id)
    except UnknownEnvError:
        return False
    return True


def make_env(env_id: str, api: str = "aec", **kwargs: Any) -> Any:
    """The PettingZoo environment ``env_id`` with the ``"aec"`` or ``"parallel"`` API (keyword arguments go
    to its constructor). Unknown ids raise :class:`UnknownEnvError` with a one-line message."""
    module = _env_module(env_id)
    if api == "aec":
        if not hasattr(module, "env"):
            raise UnknownEnvError(f"env_id: '{env_id}' has no AEC constructor")
        return module.env(**kwargs)
    if api == "parallel":
        if not hasattr(module, "parallel_env"):
            raise UnknownEnvError(f"env_id: '{env_id}' is turn-based and has no parallel API; use the AEC API")
        return module.parallel_env(**kwargs)
    raise ValueError(f"api: expected 'aec' or 'parallel', got {api!r}")


# ----------------------------------------------------------------------------- fedarena games as AEC envs


def _agent(p: int) -> str:
    return f"player_{p}"


@functools.lru_cache(maxsize=16)
def _infostate_vocabulary(game: Game, max_nodes: int) -> tuple[dict[str, int], ...] | None:
    """Per player, the information states where that player acts, numbered in sorted order; ``None`` when the
    tree is estimated (or counted) above ``max_nodes`` histories, so nothing large is ever enumerated."""
    if estimate_tree_size(game, stop_above=max_nodes).histories > max_nodes:
        return None
    seen: list[set[str]] = [set() for _ in range(game.num_players)]
    stack, count = [game.new_initial_state()], 0
    while stack:   # depth first, keeping only the open branches: memory grows with the depth, not the tree
        h = stack.pop()
        count += 1
        if count > max_nodes:
            return None
        p = h.current_player()
        if p >= 0:
            seen[p].add(h.information_state_string(p))
        if not h.is_terminal():
            moves = [a for a, _ in h.chance_outcomes()] if p == CHANCE else h.legal_actions()
            stack.extend(h.child(a) for a in moves)
    return tuple({s: k for k, s in enumerate(sorted(states))} for states in seen)


class LazyVocabulary:
    """Information states numbered in the order they are first met, at most ``capacity`` per player: the
    observation of a game too large to enumerate that has no tensor. Meeting one more raises ``EnvStepError``."""

    def __init__(self, num_players: int, capacity: int) -> None:
        self.capacity = capacity
        self._ids: list[dict[str, int]] = [{} for _ in range(num_players)]

    def index(self, player: int, key: str) -> int:
        ids = self._ids[player]
        j = ids.get(key)
        if j is None:
            if len(ids) >= self.capacity:
                from fedarena.envs.gym_envs import EnvStepError
                raise EnvStepError(f"vocabulary_size: player {player} met more than {self.capacity} information "
                                   "states; raise vocabulary_size (the game has no observation tensor)")
            j = ids[key] = len(ids)
        return j


class GameAECEnv(AECEnv):
    """A fedarena extensive-form game as a PettingZoo AEC environment.

    ``observation``, the first that applies:

    1. the game's information-state tensor (``state.information_state_tensor(player)``) when it provides one
       (most OpenSpiel imperfect-information games do), or, in a perfect-information game, its observation
       tensor (the state itself: tic-tac-toe, chess);
    2. a one-hot vector over the information states at which that player acts, enumerated once from the game
       tree, when the tree is at most ``max_tree_nodes`` histories (estimated, then counted; default
       :func:`fedarena.envs.efg.max_tree_nodes`); the last entry is set when the player's current information
       state is not one of its decision states, e.g. at the end;
    3. the observation tensor (``state.observation_tensor(player)``) of a larger game that provides one
       (oshi_zumo);
    4. otherwise a one-hot vector over at most ``vocabulary_size`` information states per player, numbered as
       they are met (:class:`LazyVocabulary`; one more is a one-line error).

    The ``action_mask`` marks the legal actions of the agent to act (all zeros for the others).
    ``max_steps``: truncate all agents after this many player moves (``None``: never).
    """

    metadata = {"render_modes": ["ansi"], "name": "fedarena_game", "is_parallelizable": False}

    def __init__(self, game: Game, max_steps: int | None = None, render_mode: str | None = None,
                 max_tree_nodes: int | None = None, vocabulary_size: int = 4096) -> None:
        super().__init__()
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps: must be >= 1 or None, got {max_steps}")
        if vocabulary_size < 1:
            raise ValueError(f"vocabulary_size: must be >= 1, got {vocabulary_size}")
        self.game = game
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.metadata = dict(self.metadata, name=f"fedarena_{game.name}")
        self.possible_agents = [_agent(p) for p in range(game.num_players)]
        self._tensor = None   # "information_state" or "observation" when a tensor is the observation
        self._vocab: Any = None
        shape = self._tensor_shape(game, "information_state")
        if shape is not None:
            self._tensor = "information_state"
        elif getattr(game, "perfect_information", False) and self._tensor_shape(game, "observation") is not None:
            self._tensor, shape = "observation", self._tensor_shape(game, "observation")
        else:
            self._vocab = _infostate_vocabulary(game, _tree_bound(max_tree_nodes))
            if self._vocab is None:
                shape = self._tensor_shape(game, "observation")
                if shape is not None:
                    self._tensor = "observation"
                else:
                    self._vocab = LazyVocabulary(game.num_players, vocabulary_size)
        if self._tensor is not None:
            obs_space = spaces.Box(-np.inf, np.inf, shape, dtype=np.float32)
        else:
            size = (vocabulary_size if isinstance(self._vocab, LazyVocabulary)
                    else max(len(v) for v in self._vocab)) + 1
            obs_space = spaces.Box(0.0, 1.0, (size,), dtype=np.float32)
        A = game.num_distinct_actions
        self.observation_spaces = {a: spaces.Dict({"observation": obs_space,
                                                   "action_mask": spaces.Box(0, 1, (A,), dtype=np.int8)})
                                   for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(A) for a in self.possible_agents}
        self._rng = np.random.default_rng()
        self._state: State | None = None

    def observation_space(self, agent: str) -> Any:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> Any:
        return self.action_spaces[agent]

    # -- helpers
    @staticmethod
    def _tensor_shape(game: Game, kind: str) -> tuple[int, ...] | None:
        fn = getattr(game, f"{kind}_tensor_shape", None)
        if fn is None:
            return None
        try:
            return tuple(fn())
        except ValueError:  # the game provides no such tensor
            return None

    def _advance_chance(self) -> None:
        s = self._state
        while s.current_player() == CHANCE:
            outcomes = s.chance_outcomes()
            probs = np.array([q for _, q in outcomes])
            s.apply_action(outcomes[int(self._rng.choice(len(outcomes), p=probs / probs.sum()))][0])

    def _mask(self, agent: str) -> np.ndarray:
        m = np.zeros(self.game.num_distinct_actions, dtype=np.int8)
        s = self._state
        if s is not None and not s.is_terminal() and _agent(s.current_player()) == agent:
            m[s.legal_actions()] = 1
        return m

    def _vector(self, player: int) -> np.ndarray:
        s = self._state
        if self._tensor is not None:
            shape = self.observation_spaces[_agent(player)]["observation"].shape
            return np.asarray(getattr(s, f"{self._tensor}_tensor")(player), dtype=np.float32).reshape(shape)
        size = self.observation_spaces[_agent(player)]["observation"].shape[0]
        v = np.zeros(size, dtype=np.float32)
        try:
            key = s.information_state_string(player)
        except ValueError:
            key = None
        if key is None:
            v[size - 1] = 1.0
        elif isinstance(self._vocab, LazyVocabulary):
            v[self._vocab.index(player, key)] = 1.0
        else:
            v[self._vocab[player].get(key, size - 1)] = 1.0
        return v

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        return {"observation": self._vector(int(agent.rsplit("_", 1)[1])), "action_mask": self._mask(agent)}

    def _select(self) -> None:
        s = self._state
        if not s.is_terminal():
            self.agent_selection = _agent(s.current_player())
        for a in self.agents:
            self.infos[a] = {"action_mask": self._mask(a)}

    # -- AEC API
    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._state = self.game.new_initial_state()
        self._advance_chance()
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._moves = 0
        self.agent_selection = self.agents[0]
        if self._state.is_terminal():  # a game decided by chance alone
            self._finish(truncated=False)
        else:
            self._select()

    def _finish(self, truncated: bool) -> None:
        returns = np.zeros(self.num_agents) if truncated else np.asarray(self._state.returns(), dtype=np.float64)
        for p, a in enumerate(self.possible_agents):
            if a in self.agents:
                self.rewards[a] = float(returns[p])
                self.terminations[a] = not truncated
                self.truncations[a] = truncated
                self.infos[a] = {"action_mask": np.zeros(self.game.num_distinct_actions, dtype=np.int8)}
        self._accumulate_rewards()

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        legal = self._state.legal_actions()
        if action is None or int(action) not in legal:
            raise ValueError(f"action: {action!r} is not legal for {agent}; legal: {legal}")
        self._state.apply_action(int(action))
        self._moves += 1
        self._advance_chance()
        if self._state.is_terminal():
            self._finish(truncated=False)
        elif self.max_steps is not None and self._moves >= self.max_steps:
            self._finish(truncated=True)
        else:
            self._select()
            self._accumulate_rewards()

    def render(self) -> str | None:
        return str(self._state) if self.render_mode == "ansi" else None

    def close(self) -> None:
        pass

    @property
    def state_of_game(self) -> State:
        """The underlying extensive-form history (read it; do not mutate it)."""
        return self._state


class MatrixParallelEnv(ParallelEnv):
    """A two-player matrix game repeated ``rounds`` times as a PettingZoo parallel environment.

    Each round both agents choose at once and receive ``payoffs[p, a0, a1]``. The observation is a one-hot
    vector of the previous joint action ``a0 * cols + a1`` (the last entry marks the first round). All
    agents are truncated after ``rounds`` rounds; nothing terminates early.
    """

    metadata = {"render_modes": [], "name": "fedarena_matrix"}

    def __init__(self, game: MatrixGame, rounds: int = 1, render_mode: str | None = None) -> None:
        if rounds < 1:
            raise ValueError(f"rounds: must be >= 1, got {rounds}")
        self.game, self.rounds, self.render_mode = game, rounds, render_mode
        self.metadata = dict(self.metadata, name=f"fedarena_{game.name}")
        self.possible_agents = ["player_0", "player_1"]
        rows, cols = game.num_actions
        self._cols = cols
        self._obs_size = rows * cols + 1
        self.observation_spaces = {a: spaces.Box(0.0, 1.0, (self._obs_size,), dtype=np.float32)
                                   for a in self.possible_agents}
        self.action_spaces = {"player_0": spaces.Discrete(rows), "player_1": spaces.Discrete(cols)}
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> Any:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> Any:
        return self.action_spaces[agent]

    def _obs(self, index: int) -> dict[str, np.ndarray]:
        v = np.zeros(self._obs_size, dtype=np.float32)
        v[index] = 1.0
        return {a: v.copy() for a in self.agents}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents = list(self.possible_agents)
        self._round = 0
        return self._obs(self._obs_size - 1), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise ValueError(f"actions: missing an action for {missing}")
        a0, a1 = int(actions["player_0"]), int(actions["player_1"])
        for a, x in (("player_0", a0), ("player_1", a1)):
            if not self.action_spaces[a].contains(x):
                raise ValueError(f"actions['{a}']: {x} is not in {self.action_spaces[a]}")
        self._round += 1
        rewards = {"player_0": float(self.game.payoffs[0, a0, a1]), "player_1": float(self.game.payoffs[1, a0, a1])}
        done = self._round >= self.rounds
        obs = self._obs(a0 * self._cols + a1)
        terms = {a: False for a in self.agents}
        truncs = {a: done for a in self.agents}
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos

