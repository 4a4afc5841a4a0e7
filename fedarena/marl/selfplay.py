"""PPO self-play on turn-based PettingZoo games against a pool of the learner's past snapshots.

The learner plays a random seat of every episode (:class:`~fedarena.envs.pettingzoo_batch.TurnBasedVecEnv`);
each other seat is played by an opponent drawn when the episode starts: with probability ``latest_prob``
the learner's current parameters (plain self-play), otherwise a snapshot drawn uniformly from the pool
(fictitious self-play over past policies; Heinrich et al., 2015; the "pool of past selves" of Bansal et al.,
2018, "Emergent complexity via multi-agent competition"). A snapshot of the learner joins the pool every
``snapshot_every`` PPO updates; the pool keeps the newest ``pool_size``. Learning is masked PPO
(:func:`fedarena.marl.independent.masked_ppo`) on the learner's own moves, with the reward of a move being
everything the learner received until its next move.

:class:`SnapshotPool` is the small store the league builds on: immutable parameter snapshots with ids,
sampled uniformly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from fedarena import engine
from fedarena.envs.pettingzoo_batch import OpponentPolicy, TurnBasedVecEnv, observation_size
from fedarena.marl.independent import masked_ppo, sample_actions
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


__all__ = ["Snapshot", "SnapshotPool", "SelfPlayConfig", "SelfPlayPPO", "network_policy"]
