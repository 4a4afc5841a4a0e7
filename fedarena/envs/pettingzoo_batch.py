"""Batched runners that step many copies of a PettingZoo environment for RL actors.

- :class:`ParallelEnvBatch`: ``n`` copies of a parallel env stepped together. Arrays are indexed
  ``[copy, agent]`` over the env's ``possible_agents``; agents that are already done in a copy (dead agents)
  get zero observations and an all-false action mask, and ``alive`` says which slots acted. The last
  observation of an agent that finishes (terminated or truncated) is in ``final_obs`` of that step, for
  bootstrapping truncations. A copy whose agents are all done is reset in the same step (same-step
  auto-reset, as gymnasium's vector envs); its last global state is kept in ``final_state``.
- :class:`TurnBasedVecEnv`: ``n`` copies of a turn-based (AEC) env where one seat per copy is the learner
  and every other seat is played by an opponent policy drawn per episode from a sampler (a fixed policy, a
  pool of past snapshots, a league). The learner sees an ordinary single-agent vector env: observation,
  legal-action mask, reward (summed over everything that happened since its last move), terminated /
  truncated. Opponent moves are batched over the copies that share an opponent.

Observations are flattened to float32 vectors: a ``Box`` as is, a classic-env ``Dict`` by its
``"observation"`` entry (its ``"action_mask"`` entry, or ``info["action_mask"]``, is the mask), a
``Discrete`` one-hot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable

import numpy as np
from gymnasium import spaces

OpponentPolicy = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``policy(obs (k, D) float32, mask (k, A) bool) -> actions (k,)``; only legal actions may be returned."""

OpponentSampler = Callable[[np.random.Generator], tuple[Hashable, OpponentPolicy]]
"""Called at the start of every episode of every copy: ``rng -> (opponent id, policy)``."""


def _obs_space(space: Any) -> Any:
    return space["observation"] if isinstance(space, spaces.Dict) and "observation" in space.spaces else space


def observation_size(space: Any) -> int:
    """Length of the flattened observation vector of ``space``."""
    s = _obs_space(space)
    if isinstance(s, spaces.Discrete):
        return int(s.n)
    if isinstance(s, spaces.Box):
        return int(np.prod(s.shape))
    raise TypeError(f"observation_space: {s} is neither Box nor Discrete (nor a Dict holding one as 'observation')")


def flatten_observation(space: Any, obs: Any) -> np.ndarray:
    s = _obs_space(space)
    x = obs["observation"] if isinstance(obs, dict) and "observation" in obs else obs
    if isinstance(s, spaces.Discrete):
        v = np.zeros(int(s.n), dtype=np.float32)
        v[int(x) - int(s.start)] = 1.0
        return v
    return np.asarray(x, dtype=np.float32).reshape(-1)


def action_mask(obs: Any, info: dict | None, num_actions: int) -> np.ndarray:
    if isinstance(obs, dict) and "action_mask" in obs:
        return np.asarray(obs["action_mask"], dtype=bool)
    if info and "action_mask" in info:
        return np.asarray(info["action_mask"], dtype=bool)
    return np.ones(num_actions, dtype=bool)


def random_policy(seed: int | np.random.Generator | None = None) -> OpponentPolicy:
    """Uniform play over the legal actions."""
    rng = np.random.default_rng(seed)

    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        u = rng.random(mask.shape) * mask
        return np.argmax(u + mask, axis=1)  # argmax over legal entries of uniform noise

    return act


def _discrete_n(space: Any, agent: str) -> int:
    if not isinstance(space, spaces.Discrete):
        raise TypeError(f"action_space('{agent}'): the batched runners need Discrete actions, got {space}")
    return int(space.n)


# ----------------------------------------------------------------------------- parallel envs


@dataclass(frozen=True)
class ParallelBatchStep:
    """One step of every copy. ``obs``/``action_mask``/``state`` are already those of the next step (a new
    episode where ``episode_end``); rewards and flags belong to the step just taken."""

    obs: np.ndarray            # (n, M, D) float32
    action_mask: np.ndarray    # (n, M, A) bool; all false for dead agents
    state: np.ndarray          # (n, S) float32 global state (the env's state() method, else the concatenated observations)
    reward: np.ndarray         # (n, M) float64
    terminated: np.ndarray     # (n, M) bool
    truncated: np.ndarray      # (n, M) bool
    alive: np.ndarray          # (n, M) bool: the agent acted in this step
    episode_end: np.ndarray    # (n,) bool: every agent of the copy is done; the copy was reset
    final_obs: np.ndarray      # (n, M, D) last observation of each agent that finished in this step (zeros elsewhere)
    final_state: np.ndarray    # (n, S)
    episode_return: np.ndarray  # (n, M) returns of the finished episodes (nan elsewhere)
    episode_length: np.ndarray  # (n,) lengths of the finished episodes (0 elsewhere)


class ParallelEnvBatch:
    """``num_envs`` copies of the PettingZoo parallel env made by ``make_env()``, stepped together.

    All agents must have Discrete action spaces with the same number of actions and observations of the
    same flattened size (true of the MPE tasks and of :class:`~fedarena.envs.pettingzoo_adapters.MatrixParallelEnv`).
    """

    def __init__(self, make_env: Callable[[], Any], num_envs: int, seed: int = 0) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs: must be >= 1, got {num_envs}")
        self.envs = [make_env() for _ in range(num_envs)]
        e0 = self.envs[0]
        self.agents: list[str] = list(e0.possible_agents)
        sizes = {observation_size(e0.observation_space(a)) for a in self.agents}
        acts = {_discrete_n(e0.action_space(a), a) for a in self.agents}
        if len(sizes) != 1 or len(acts) != 1:
            raise ValueError(f"env: agents differ in observation size {sorted(sizes)} or action count {sorted(acts)}; "
                             "the batched runner stacks agents")
        self.obs_size, self.num_actions = sizes.pop(), acts.pop()
        self.num_envs, self.num_agents = num_envs, len(self.agents)
        self.seed = seed
        self._has_state = False  # decided at reset()
        self._returns = np.zeros((num_envs, self.num_agents))
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._obs = np.zeros((num_envs, self.num_agents, self.obs_size), dtype=np.float32)
        self._mask = np.zeros((num_envs, self.num_agents, self.num_actions), dtype=bool)
        self._state: np.ndarray | None = None
        self._resets = 0

    @property
    def state_size(self) -> int:
        if self._state is None:
            raise RuntimeError("reset() first")
        return self._state.shape[1]

    def _global_state(self, i: int) -> np.ndarray:
        if self._has_state:
            try:
                return np.asarray(self.envs[i].state(), dtype=np.float32).reshape(-1)
            except NotImplementedError:
                self._has_state = False
        return self._obs[i].reshape(-1).copy()

    def _detect_state(self) -> bool:
        """Whether the copies offer a global state: ``state`` must be a method of the env itself, not an
        attribute holding data. PettingZoo's wrappers forward ``state()`` to the unwrapped env, and some
        envs (``rps_v2``) keep a dict named ``state`` on their instance once reset, which the forwarded
        call would try to call."""
        env = self.envs[0]
        base = getattr(env, "unwrapped", env)
        return callable(getattr(env, "state", None)) and callable(getattr(base, "state", None))

    def _write(self, i: int, obs: dict, infos: dict) -> None:
        env = self.envs[i]
        self._obs[i] = 0.0
        self._mask[i] = False
        for k, a in enumerate(self.agents):
            if a in obs:
                space = env.observation_space(a)
                self._obs[i, k] = flatten_observation(space, obs[a])
                self._mask[i, k] = action_mask(obs[a], infos.get(a), self.num_actions)

    def _reset_copy(self, i: int) -> None:
        seed = self.seed * 1_000_003 + self._resets  # a distinct, reproducible seed per episode
        self._resets += 1
        obs, infos = self.envs[i].reset(seed=seed)
        self._write(i, obs, infos)

    def reset(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(obs (n, M, D), action_mask (n, M, A), state (n, S))`` of fresh episodes."""
        self._resets = 0
        for i in range(self.num_envs):
            self._reset_copy(i)
        self._has_state = self._detect_state()  # after reset: an env may replace its state() by data then
        self._state = np.stack([self._global_state(i) for i in range(self.num_envs)])
        self._returns[:] = 0.0
        self._lengths[:] = 0
        return self._obs.copy(), self._mask.copy(), self._state.copy()

    def step(self, actions: np.ndarray) -> ParallelBatchStep:
        """``actions``: (n, M) integers; entries of dead agents are ignored."""
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs, self.num_agents):
            raise ValueError(f"actions: expected shape {(self.num_envs, self.num_agents)}, got {actions.shape}")
        n, M = self.num_envs, self.num_agents
        reward = np.zeros((n, M))
        term = np.zeros((n, M), dtype=bool)
        trunc = np.zeros((n, M), dtype=bool)
        alive = np.zeros((n, M), dtype=bool)
        end = np.zeros(n, dtype=bool)
        final_obs = np.zeros_like(self._obs)
        final_state = np.zeros_like(self._state)
        ep_ret = np.full((n, M), np.nan)
        ep_len = np.zeros(n, dtype=np.int64)
        for i, env in enumerate(self.envs):
            live = list(env.agents)
            idx = [self.agents.index(a) for a in live]
            alive[i, idx] = True
            obs, rew, te, tr, infos = env.step({a: int(actions[i, k]) for a, k in zip(live, idx)})
            for a, k in zip(live, idx):
                reward[i, k] = rew.get(a, 0.0)
                term[i, k] = te.get(a, False)
                trunc[i, k] = tr.get(a, False)
            self._returns[i] += reward[i]
            self._lengths[i] += 1
            for a, k in zip(live, idx):
                if a not in env.agents and a in obs:  # done in this step: its last observation
                    final_obs[i, k] = flatten_observation(env.observation_space(a), obs[a])
            self._write(i, {a: o for a, o in obs.items() if a in env.agents}, infos)
            if not env.agents:
                end[i] = True
                final_state[i] = self._global_state(i)
                ep_ret[i] = self._returns[i]
                ep_len[i] = self._lengths[i]
                self._returns[i] = 0.0
                self._lengths[i] = 0
                self._reset_copy(i)
            self._state[i] = self._global_state(i)
        return ParallelBatchStep(self._obs.copy(), self._mask.copy(), self._state.copy(), reward, term, trunc,
                                 alive, end, final_obs, final_state, ep_ret, ep_len)

    def close(self) -> None:
        for env in self.envs:
            env.close()


# ----------------------------------------------------------------------------- turn-based envs, one learner seat


@dataclass(frozen=True)
class TurnStep:
    """The learner's view after one of its moves in every copy (``obs``/``action_mask`` are those of its next
    move, in a new episode where ``episode_end``)."""

    obs: np.ndarray            # (n, D) float32
    action_mask: np.ndarray    # (n, A) bool
    reward: np.ndarray         # (n,) learner's reward since its previous move
    terminated: np.ndarray     # (n,) bool
    truncated: np.ndarray      # (n,) bool
    final_obs: np.ndarray      # (n, D) learner's last observation of the finished episodes
    episode_end: np.ndarray    # (n,) bool
    episode_return: np.ndarray  # (n,) learner's return of the finished episodes (nan elsewhere)
    seat: np.ndarray           # (n,) learner's seat (index into possible_agents) of the finished episodes (-1 elsewhere)
    opponent: list             # per copy: the id of the finished episode's opponent (None elsewhere)


class TurnBasedVecEnv:
    """``num_envs`` copies of the AEC env made by ``make_env()``; in each, one seat is the learner's.

    ``opponents`` draws ``(id, policy)`` per episode and copy; ``seat`` is the learner's seat index, or
    ``None`` for a uniformly random seat each episode (so a self-play learner plays both sides).
    """

    def __init__(self, make_env: Callable[[], Any], num_envs: int, opponents: OpponentSampler,
                 seed: int = 0, seat: int | None = None) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs: must be >= 1, got {num_envs}")
        self.envs = [make_env() for _ in range(num_envs)]
        e0 = self.envs[0]
        self.agents = list(e0.possible_agents)
        if seat is not None and not 0 <= seat < len(self.agents):
            raise ValueError(f"seat: expected 0..{len(self.agents) - 1} or None, got {seat}")
        sizes = {observation_size(e0.observation_space(a)) for a in self.agents}
        acts = {_discrete_n(e0.action_space(a), a) for a in self.agents}
        if len(sizes) != 1 or len(acts) != 1:
            raise ValueError(f"env: seats differ in observation size {sorted(sizes)} or action count {sorted(acts)}")
        self.obs_size, self.num_actions = sizes.pop(), acts.pop()
        self.num_envs = num_envs
        self.opponents = opponents
        self.fixed_seat = seat
        self.rng = np.random.default_rng(seed)
        self._seed = seed
        self._episodes = 0
        self._seat = np.zeros(num_envs, dtype=np.int64)
        self._opp: list[tuple[Hashable, OpponentPolicy]] = [None] * num_envs  # type: ignore[list-item]
        self._pending = np.zeros(num_envs)
        self._return = np.zeros(num_envs)

    def _current(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        env = self.envs[i]
        a = env.agent_selection
        obs = env.observe(a)
        space = env.observation_space(a)
        return flatten_observation(space, obs), action_mask(obs, env.infos.get(a), self.num_actions)

    def _learner_done(self, i: int) -> bool:
        env = self.envs[i]
        learner = self.agents[self._seat[i]]
        return bool(env.terminations.get(learner, False) or env.truncations.get(learner, False)) \
            or learner not in env.agents

    def _collect(self, i: int) -> None:
        env = self.envs[i]
        r = float(env.rewards.get(self.agents[self._seat[i]], 0.0))
        self._pending[i] += r
        self._return[i] += r

    def _new_episode(self, i: int) -> None:
        env = self.envs[i]
        env.reset(seed=self._seed * 1_000_003 + self._episodes)
        self._episodes += 1
        self._seat[i] = self.rng.integers(len(self.agents)) if self.fixed_seat is None else self.fixed_seat
        self._opp[i] = self.opponents(self.rng)
        self._return[i] = 0.0

    def _play_opponents(self, copies: list[int]) -> None:
        """Let the opponents move in ``copies`` until the learner is to move or its episode is over."""
        waiting = list(copies)
        while waiting:
            groups: dict[int, list[int]] = {}
            still = []
            for i in waiting:
                env = self.envs[i]
                if self._learner_done(i) or env.agent_selection == self.agents[self._seat[i]]:
                    continue
                if env.terminations[env.agent_selection] or env.truncations[env.agent_selection]:
                    env.step(None)  # a dead opponent seat: PettingZoo removes it with a None action
                    self._collect(i)
                    still.append(i)
                    continue
                groups.setdefault(id(self._opp[i][1]), []).append(i)
            for members in groups.values():
                policy = self._opp[members[0]][1]
                views = [self._current(i) for i in members]
                acts = np.asarray(policy(np.stack([v[0] for v in views]), np.stack([v[1] for v in views])))
                for i, a, (_, m) in zip(members, acts, views):
                    if not m[int(a)]:
                        raise ValueError(f"opponent {self._opp[i][0]!r} chose illegal action {int(a)}")
                    self.envs[i].step(int(a))
                    self._collect(i)
                    still.append(i)
            waiting = still

    def reset(self) -> tuple[np.ndarray, np.ndarray]:
        """``(obs (n, D), action_mask (n, A))`` at the learner's first move of fresh episodes."""
        self._episodes = 0
        for i in range(self.num_envs):
            self._start(i)
        views = [self._current(i) for i in range(self.num_envs)]
        return np.stack([v[0] for v in views]), np.stack([v[1] for v in views])

    def _start(self, i: int) -> None:
        # a new episode in which the learner has a move (episodes the opponents finish alone are skipped)
        while True:
            self._new_episode(i)
            self._play_opponents([i])
            if not self._learner_done(i):
                self._pending[i] = 0.0
                return

    def step(self, actions: np.ndarray) -> TurnStep:
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions: expected shape ({self.num_envs},), got {actions.shape}")
        n = self.num_envs
        self._pending[:] = 0.0
        for i, env in enumerate(self.envs):
            _, m = self._current(i)
            if not m[int(actions[i])]:
                raise ValueError(f"actions[{i}]: {int(actions[i])} is not legal; legal: {np.flatnonzero(m).tolist()}")
            env.step(int(actions[i]))
            self._collect(i)
        self._play_opponents(list(range(n)))
        term = np.zeros(n, dtype=bool)
        trunc = np.zeros(n, dtype=bool)
        end = np.zeros(n, dtype=bool)
        final_obs = np.zeros((n, self.obs_size), dtype=np.float32)
        ep_ret = np.full(n, np.nan)
        seat = -np.ones(n, dtype=np.int64)
        opp: list = [None] * n
        reward = self._pending.copy()
        for i, env in enumerate(self.envs):
            if not self._learner_done(i):
                continue
            learner = self.agents[self._seat[i]]
            end[i] = True
            term[i] = bool(env.terminations.get(learner, False))
            trunc[i] = bool(env.truncations.get(learner, False)) and not term[i]
            final_obs[i] = flatten_observation(env.observation_space(learner), env.observe(learner))
            ep_ret[i], seat[i], opp[i] = self._return[i], self._seat[i], self._opp[i][0]
            self._start(i)
        views = [self._current(i) for i in range(n)]
        return TurnStep(np.stack([v[0] for v in views]), np.stack([v[1] for v in views]), reward, term, trunc,
                        final_obs, end, ep_ret, seat, opp)

    def close(self) -> None:
        for env in self.envs:
            env.close()
