"""PPO self-play on two-player turn-based games against a pool of the learner's past snapshots.

The learner plays a random seat of every game; the other seat is played by an opponent drawn when the game
starts: with probability ``latest_prob`` the learner's current parameters (plain self-play), otherwise a
snapshot drawn uniformly from the pool (fictitious self-play over past policies; Heinrich et al., 2015; the
"pool of past selves" of Bansal et al., 2018, "Emergent complexity via multi-agent competition"). A snapshot of
the learner joins the pool every ``snapshot_every`` PPO updates; the pool keeps the newest ``pool_size``.
Learning is masked PPO on the learner's own moves, the opponent's moves being part of the environment.

Two backends:

- :class:`BoardSelfPlay`, for tic-tac-toe and connect four: the league's masked actor-critic
  :class:`~fedarena.marl.league.agent.BoardAgent` and its PPO learner (GAE over the learner's turns, the game's
  result as the reward of its last turn), on the numpy-batched boards of
  :class:`~fedarena.envs.boardgames.BoardGameBatch` (PettingZoo's rules, observations and masks), a whole
  number of complete games per update; resumable (:meth:`BoardSelfPlay.state_dict`).
- :class:`SelfPlayPPO`, for any other turn-based PettingZoo AEC env (e.g. a fedarena game wrapped by
  :class:`~fedarena.envs.pettingzoo_adapters.GameAECEnv`): :func:`fedarena.marl.independent.masked_ppo` on
  :class:`~fedarena.envs.pettingzoo_batch.TurnBasedVecEnv`, ``num_steps`` learner moves per copy per update,
  the reward of a move being everything the learner received until its next move. Its PettingZoo envs
  hold mid-episode state that cannot be saved, so it has no checkpoint.

:class:`SnapshotPool` is the small store the league builds on: immutable parameter snapshots with ids,
sampled uniformly.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from fedarena import engine
from fedarena.envs.boardgames import BoardGameBatch
from fedarena.envs.pettingzoo_batch import OpponentPolicy, TurnBasedVecEnv, observation_size
from fedarena.marl.independent import masked_ppo, sample_actions
from fedarena.marl.league.agent import AgentConfig, BoardAgent, play
from fedarena.platform.experiment import param
from fedarena.rl.ppo import PPO, PPOConfig


@dataclass(frozen=True)
class Snapshot:
    """An immutable copy of a policy's parameters, with its id and the learner update it was taken at."""

    id: str
    update: int
    params: Any


class SnapshotPool:
    """The newest ``capacity`` snapshots of a learner, sampled uniformly."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"pool_size: must be >= 1, got {capacity}")
        self.capacity = capacity
        self.snapshots: list[Snapshot] = []

    def add(self, params: Any, update: int) -> Snapshot:
        frozen = engine.tree_map(lambda a: np.array(a, copy=True), params)
        for leaf in engine.tree_leaves(frozen):
            leaf.setflags(write=False)
        snap = Snapshot(f"snapshot-{update}", update, frozen)
        self.snapshots.append(snap)
        del self.snapshots[:-self.capacity]
        return snap

    def sample(self, rng: np.random.Generator) -> Snapshot:
        if not self.snapshots:
            raise ValueError("pool: empty")
        return self.snapshots[int(rng.integers(len(self.snapshots)))]

    def __len__(self) -> int:
        return len(self.snapshots)


@dataclass(frozen=True)
class SelfPlayConfig:
    latest_prob: float = param(0.5, "probability that an episode's opponent is the current learner rather than a pool snapshot")
    snapshot_every: int = param(5, "add a snapshot of the learner to the pool every this many PPO updates")
    pool_size: int = param(20, "snapshots kept (newest)")

    def __post_init__(self) -> None:
        if not 0.0 <= self.latest_prob <= 1.0:
            raise ValueError(f"latest_prob: expected a probability, got {self.latest_prob}")
        if self.snapshot_every < 1 or self.pool_size < 1:
            raise ValueError("snapshot_every, pool_size: must be >= 1")


def network_policy(ppo: PPO, params: Callable[[], Any] | Any, rng: np.random.Generator) -> OpponentPolicy:
    """An opponent that samples from ``ppo``'s masked network with ``params`` (or ``params()`` at each call)."""

    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        p = params() if callable(params) else params
        x = np.concatenate([obs, mask], axis=1).astype(np.float32)
        (logits,), _ = ppo.forward(p, x)  # already -1e9 on illegal actions (MaskedActorCritic)
        return ppo.dist.sample(np.asarray(logits, dtype=np.float64), rng)

    return act


class SelfPlayPPO:
    """Masked PPO self-play with a snapshot pool on the AEC env made by ``make_env()``."""

    def __init__(self, make_env: Callable[[], Any], num_envs: int, ppo: PPOConfig, selfplay: SelfPlayConfig,
                 seed: int = 0, total_steps: int | None = None) -> None:
        self.selfplay = selfplay
        self.rng = np.random.default_rng([seed, 3])
        self.pool = SnapshotPool(selfplay.pool_size)
        probe = make_env()
        probe.reset(seed=0)
        agent = probe.possible_agents[0]
        self.obs_size = observation_size(probe.observation_space(agent))
        self.num_actions = int(probe.action_space(agent).n)
        probe.close()
        self.config = replace(ppo, num_envs=num_envs)
        self.ppo = masked_ppo(self.obs_size, self.num_actions, self.config, seed=seed, total_steps=total_steps)
        self.pool.add(self.ppo.learner.params, 0)
        self._latest = network_policy(self.ppo, lambda: self.ppo.learner.params, self.rng)
        self._snap_policies: dict[str, OpponentPolicy] = {}
        self.env = TurnBasedVecEnv(make_env, num_envs, self._opponent, seed=seed)
        self.obs, self.mask = self.env.reset()
        self.updates = 0
        self.env_steps = 0  # learner moves
        self.episodes = 0

    def _opponent(self, rng: np.random.Generator) -> tuple[str, OpponentPolicy]:
        if rng.random() < self.selfplay.latest_prob:
            return "latest", self._latest
        snap = self.pool.sample(rng)
        if snap.id not in self._snap_policies:
            live = {s.id for s in self.pool.snapshots}
            self._snap_policies = {k: v for k, v in self._snap_policies.items() if k in live}
            self._snap_policies[snap.id] = network_policy(self.ppo, snap.params, self.rng)
        return snap.id, self._snap_policies[snap.id]

    def iteration(self) -> tuple[np.ndarray, dict[str, float]]:
        """One rollout of ``num_steps`` learner moves per copy and one PPO update; returns the learner's
        returns of the finished episodes."""
        T, gamma = self.config.num_steps, self.config.gamma
        keys = ("obs", "action", "log_prob", "value", "reward", "discount")
        buf: dict[str, list] = {k: [] for k in keys}
        finished = []
        for _ in range(T):
            x = np.concatenate([self.obs, self.mask], axis=1).astype(np.float32)
            actions, logp, value = sample_actions(self.ppo, x, self.rng)
            st = self.env.step(actions)
            reward = st.reward.copy()
            if st.truncated.any():
                fx = np.concatenate([st.final_obs, np.ones((len(reward), self.num_actions), np.float32)], axis=1)
                _, _, v = sample_actions(self.ppo, fx, self.rng)
                reward += gamma * v * st.truncated
            for k, v in zip(keys, (x, actions, logp, value, reward, gamma * (1.0 - (st.terminated | st.truncated)))):
                buf[k].append(v)
            self.obs, self.mask = st.obs, st.action_mask
            self.env_steps += len(actions)
            finished.extend(st.episode_return[st.episode_end].tolist())
        x = np.concatenate([self.obs, self.mask], axis=1).astype(np.float32)
        _, _, boot = sample_actions(self.ppo, x, self.rng)
        rollout = {k: np.stack(v) for k, v in buf.items()}
        rollout["bootstrap_value"] = boot
        metrics = self.ppo.update(rollout)
        self.updates += 1
        if self.updates % self.selfplay.snapshot_every == 0:
            self.pool.add(self.ppo.learner.params, self.updates)
        self.episodes += len(finished)
        return np.asarray(finished), {k: float(v) for k, v in metrics.items()}

    def evaluate(self, make_env: Callable[[], Any], opponent: OpponentPolicy, episodes: int, seed: int
                 ) -> dict[str, float]:
        """Win / draw / loss rates of the current learner (sampling its policy) against ``opponent`` over
        ``episodes`` episodes, seats drawn at random; a win is a positive return."""
        n = min(16, episodes)
        env = TurnBasedVecEnv(make_env, n, lambda rng: ("eval", opponent), seed=seed)
        me = network_policy(self.ppo, self.ppo.learner.params, np.random.default_rng(seed))
        obs, mask = env.reset()
        rets: list[float] = []
        while len(rets) < episodes:
            st = env.step(me(obs, mask))
            obs, mask = st.obs, st.action_mask
            rets.extend(st.episode_return[st.episode_end].tolist())
        r = np.asarray(rets[:episodes])
        env.close()
        return {"win": float((r > 0).mean()), "draw": float((r == 0).mean()), "loss": float((r < 0).mean()),
                "return": float(r.mean())}


def _rng_state(rng: np.random.Generator) -> np.ndarray:
    return np.frombuffer(repr(rng.bit_generator.state).encode(), dtype=np.uint8).copy()


def _set_rng_state(rng: np.random.Generator, blob: np.ndarray) -> None:
    rng.bit_generator.state = ast.literal_eval(bytes(np.asarray(blob, np.uint8)).decode())  # a literal, never unpickled


class BoardSelfPlay:
    """Self-play of a :class:`~fedarena.marl.league.agent.BoardAgent` with a snapshot pool on ``game``
    ("tictactoe" | "connect_four"): ``games_per_update`` complete games on ``num_envs`` boards per PPO update."""

    def __init__(self, game: str, num_envs: int, games_per_update: int, agent: AgentConfig,
                 selfplay: SelfPlayConfig, seed: int = 0) -> None:
        if games_per_update < 1:
            raise ValueError(f"games_per_update: must be >= 1, got {games_per_update}")
        self.game = game
        self.env = BoardGameBatch(game, num_envs)
        self.agent = BoardAgent(self.env.spec.observation_shape, self.env.spec.num_actions, agent)
        self.selfplay = selfplay
        self.games_per_update = games_per_update
        self.rng = np.random.default_rng([seed, 3])
        self.initial_params = self.agent.init_params(seed)
        self.learner = self.agent.learner(self.initial_params, seed + 1)
        self.pool = SnapshotPool(selfplay.pool_size)
        self.pool.add(self.initial_params, 0)
        self.updates = 0
        self.episodes = 0
        self.learner_moves = 0

    @property
    def params(self) -> dict[str, np.ndarray]:
        return self.learner.params

    def opponents(self) -> tuple[list[Any], np.ndarray]:
        """The opponents of the next update (the current parameters, then the pool) and their probabilities."""
        k = len(self.pool)
        q = self.selfplay.latest_prob
        return [self.learner.params] + [s.params for s in self.pool.snapshots], \
            np.array([q] + [(1.0 - q) / k] * k)

    def iteration(self) -> tuple[np.ndarray, dict[str, float]]:
        """One batch of games and one PPO update; returns the learner's results (+1/0/-1) and PPO diagnostics."""
        opponents, probs = self.opponents()
        traj, results = play(self.agent, self.env, self.learner.params, opponents, probs, self.games_per_update,
                             self.rng)
        metrics = self.learner.update(traj)
        self.updates += 1
        self.episodes += len(results)
        self.learner_moves += len(traj)
        if self.updates % self.selfplay.snapshot_every == 0:
            self.pool.add(self.learner.params, self.updates)
        return np.array([r for _, r in results], dtype=np.float64), metrics

    # -- resume
    def state_dict(self) -> dict[str, Any]:
        """Everything the next update depends on, as nested dicts of numpy arrays and scalars."""
        return {"learner": self.learner.state_dict(), "rng": _rng_state(self.rng),
                "pool": [{"update": s.update, "params": {k: np.array(v) for k, v in s.params.items()}}
                         for s in self.pool.snapshots],
                "updates": self.updates, "episodes": self.episodes, "learner_moves": self.learner_moves}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state["learner"])
        _set_rng_state(self.rng, state["rng"])
        shapes = {k: np.shape(v) for k, v in self.initial_params.items()}
        self.pool.snapshots = []
        for snap in state["pool"]:
            got = {k: np.shape(v) for k, v in snap["params"].items()}
            if got != shapes:
                raise ValueError(f"checkpoint: pool snapshot of update {snap['update']} has parameters {got}, "
                                 f"the agent has {shapes}")
            self.pool.add(snap["params"], int(snap["update"]))
        self.updates, self.episodes = int(state["updates"]), int(state["episodes"])
        self.learner_moves = int(state["learner_moves"])


__all__ = ["BoardSelfPlay", "Snapshot", "SnapshotPool", "SelfPlayConfig", "SelfPlayPPO", "network_policy"]
