"""Actor, Learner and InferenceServer: the three roles of distributed RL, independent of the algorithm.

An :class:`Actor` steps a vectorized environment with a policy that is either a local copy of the
weights or a client of an :class:`InferenceServer`, and returns time-major trajectories stamped with
the weight version that produced them (A3C/IMPALA actors: Mnih et al., 2016; Espeholt et al., 2018).
A :class:`Learner` owns the parameters and the optimizer, consumes trajectories or replay samples,
and publishes :class:`Weights` with an increasing version. The :class:`InferenceServer` collects
observations from many actors and evaluates them in one batched forward pass once ``max_batch``
rows are waiting or the oldest request is ``deadline_s`` old (SEED RL: Espeholt et al., 2020).
The same classes run in-process (local synchronous), in worker processes, or as Ray actors
(:mod:`fedarena.rl.execution`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from fedarena.rl.spaces import ObservationAdapter, env_action


@dataclass(frozen=True)
class Weights:
    """Parameters (a pytree of numpy arrays) and the learner version that produced them."""

    version: int
    params: Any


class Policy(Protocol):
    """What an actor calls: numpy observations (already adapted) in, numpy decisions out."""

    def __call__(self, x: np.ndarray) -> Mapping[str, np.ndarray]:
        """Returns at least ``action`` (raw, as the learner stores it) and ``value``; may add ``log_prob``."""
        ...

    @property
    def version(self) -> int: ...


@dataclass
class EpisodeStats:
    """Undiscounted returns and lengths of the episodes finished so far (env reward, before any bootstrap)."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)

    def drain(self) -> tuple[list[float], list[int]]:
        r, ln = self.returns, self.lengths
        self.returns, self.lengths = [], []
        return r, ln


class Actor:
    """Runs ``env`` (a :class:`fedarena.envs.vector.VectorEnv`) with ``policy`` and records trajectories.

    Rewards of truncated episodes are bootstrapped: r_T += gamma * V(final observation), discount 0, so
    return estimators see each trajectory segment as complete (see :mod:`fedarena.rl.returns`).
    """

    def __init__(self, env: Any, adapter: ObservationAdapter, dist: Any, policy: Policy, gamma: float,
                 seed: int | None = None) -> None:
        self.env, self.adapter, self.dist, self.policy, self.gamma = env, adapter, dist, policy, float(gamma)
        self.obs = env.reset(seed=seed)
        self.env_steps = 0
        self.stats = EpisodeStats()
        self._ep_return = np.zeros(env.num_envs)
        self._ep_length = np.zeros(env.num_envs, dtype=np.int64)

    def set_policy(self, policy: Policy) -> None:
        self.policy = policy

    def state_dict(self) -> dict[str, Any] | None:
        """The actor between rollouts (environments, current observation, unfinished episodes), or None when its
        environment cannot export its state (gymnasium environments)."""
        if not hasattr(self.env, "state_dict") or self.stats.returns:
            return None
        return {"env": self.env.state_dict(), "obs": self.obs, "env_steps": self.env_steps,
                "ep_return": self._ep_return, "ep_length": self._ep_length}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env.load_state_dict(state["env"])
        self.obs = state["obs"]
        self.env_steps = int(state["env_steps"])
        self._ep_return = np.asarray(state["ep_return"], dtype=np.float64)
        self._ep_length = np.asarray(state["ep_length"], dtype=np.int64)

    def _record(self, reward: np.ndarray, done: np.ndarray) -> None:
        self._ep_return += reward
        self._ep_length += 1
        for i in np.nonzero(done)[0]:
            self.stats.returns.append(float(self._ep_return[i]))
            self.stats.lengths.append(int(self._ep_length[i]))
        self._ep_return[done] = 0.0
        self._ep_length[done] = 0

    def rollout(self, num_steps: int) -> dict[str, Any]:
        """``num_steps`` steps of every environment; time-major arrays (T, num_envs, ...) plus
        ``last_obs`` and ``bootstrap_value`` (the observation after the last step and its value), ``version`` (oldest weight version used) and the
        episode statistics finished during the rollout. ``reward`` includes the truncation bootstrap,
        ``env_reward`` is the environment's reward alone (for reward normalization)."""
        n = self.env.num_envs
        keys = ("obs", "action", "log_prob", "value", "reward", "env_reward", "discount")
        traj: dict[str, list] = {k: [] for k in keys}
        versions = []
        sde_freq = getattr(self.policy, "sde_sample_freq", None)  # gSDE: fresh noise matrices (SDEPolicy)
        for t in range(num_steps):
            if sde_freq is not None and (t == 0 or (sde_freq > 0 and t % sde_freq == 0)):
                self.policy.reset_noise(n)
            x = self.adapter(self.obs)
            out = self.policy(x)
            versions.append(self.policy.version)
            step = self.env.step(env_action(self.dist, out["action"]))
            reward = np.asarray(step.reward, dtype=np.float64)
            terminated, truncated = np.asarray(step.terminated), np.asarray(step.truncated)
            done = terminated | truncated
            self._record(reward, done)
            learn_reward = reward.copy()
            cut = truncated & ~terminated
            if cut.any():
                final = self.adapter(_rows(step.final_obs, cut))
                learn_reward[cut] += self.gamma * np.asarray(self.policy(final)["value"], dtype=np.float64)
            traj["obs"].append(x)
            traj["action"].append(out["action"])
            traj["log_prob"].append(out.get("log_prob", np.zeros(n)))
            traj["value"].append(out["value"])
            traj["reward"].append(learn_reward)
            traj["env_reward"].append(reward)
            traj["discount"].append(np.where(done, 0.0, self.gamma))
            self.obs = step.obs
            self.env_steps += n
        result: dict[str, Any] = {k: np.stack(v) for k, v in traj.items()}
        last_x = self.adapter(self.obs)
        result["last_obs"] = last_x
        result["bootstrap_value"] = np.asarray(self.policy(last_x)["value"], dtype=np.float64)
        result["version"] = int(min(versions))
        result["env_steps"] = num_steps * n
        returns, lengths = self.stats.drain()
        result["episode_returns"] = np.asarray(returns, dtype=np.float64)
        result["episode_lengths"] = np.asarray(lengths, dtype=np.int64)
        return result


def _rows(obs: Any, mask: np.ndarray) -> Any:
    if isinstance(obs, dict):
        return {k: _rows(v, mask) for k, v in obs.items()}
    return np.asarray(obs)[mask]


class LocalPolicy:
    """A policy evaluated in-process from a local copy of the weights: ``forward(params, x)`` returns the
    distribution inputs and the value; actions are sampled in numpy."""

    def __init__(self, forward: Callable[[Any, np.ndarray], tuple[tuple[Any, ...], Any]], dist: Any,
                 weights: Weights, seed: int | None = None, deterministic: bool = False) -> None:
        self.forward, self.dist, self.weights = forward, dist, weights
        self.rng = np.random.default_rng(seed)
        self.deterministic = deterministic

    @property
    def version(self) -> int:
        return self.weights.version

    def set_weights(self, weights: Weights) -> None:
        self.weights = weights

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        dist_inputs, value = self.forward(self.weights.params, x)
        return sample_action(self.dist, dist_inputs, value, self.rng, self.deterministic)


class SDEPolicy(LocalPolicy):
    """Generalized state-dependent exploration (gSDE; Raffin, Kober & Stulp, 2022): the action is
    mean(s) + phi(s) E_k for environment k, with E_k = sigma * Z_k and Z_k a standard-normal (features x actions)
    matrix held fixed between :meth:`reset_noise` calls (the actor calls it every ``sde_sample_freq`` steps and at
    the start of each rollout; -1: only there). ``forward(params, x)`` returns ((mean, log_std), value, phi, sigma);
    ``log_prob`` is the likelihood under N(mean, exp(log_std)^2), the marginal of phi(s) E given s.
    """

    def __init__(self, forward: Callable[[Any, np.ndarray], tuple[Any, Any, Any, Any]], dist: Any,
                 weights: Weights, sde_sample_freq: int, seed: int | None = None) -> None:
        super().__init__(forward, dist, weights, seed=seed)
        self.sde_sample_freq = int(sde_sample_freq)
        self._z: np.ndarray | None = None
        self._batch = -1

    def reset_noise(self, batch: int) -> None:
        """New standard-normal noise matrices Z for the next calls on ``batch`` rows (drawn at the first one)."""
        self._z = None
        self._batch = int(batch)

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        (mean, log_std), value, phi, sigma = self.forward(self.weights.params, x)
        mean, log_std, phi, sigma = (np.asarray(a, dtype=np.float64) for a in (mean, log_std, phi, sigma))
        rows = mean.shape[0]
        if rows == self._batch:
            if self._z is None:
                self._z = self.rng.standard_normal((rows,) + sigma.shape)
            z = self._z
        else:  # other batch sizes (truncation bootstraps, whose actions are not used) draw noise of their own
            z = self.rng.standard_normal((rows,) + sigma.shape)
        raw = mean + np.einsum("bi,bij->bj", phi, sigma * z)
        return {"action": raw, "log_prob": self.dist.log_prob_np(mean, log_std, raw),
                "value": np.asarray(value, dtype=np.float64)}


def sample_action(dist: Any, dist_inputs: tuple[Any, ...], value: Any, rng: np.random.Generator,
                  deterministic: bool = False) -> dict[str, np.ndarray]:
    """Sample (or take the mode of) the action distribution; returns action, log_prob, value."""
    inputs = tuple(np.asarray(a) for a in dist_inputs)
    if len(inputs) == 2:  # Gaussian: broadcast the free log-std over the batch
        inputs = (inputs[0], np.broadcast_to(inputs[1], inputs[0].shape))
    action = dist.mode(inputs[0]) if deterministic else dist.sample(*inputs, rng)
    return {"action": action, "log_prob": dist.log_prob_np(*inputs, action),
            "value": np.asarray(value, dtype=np.float64)}


class Learner:
    """Owns parameters and optimizer state; ``update_fn(params, opt_state, batch) -> (params, opt_state,
    metrics)`` is the algorithm's step. Every update bumps the version published with the weights."""

    def __init__(self, params: Any, opt_state: Any, update_fn: Callable[[Any, Any, Any], tuple[Any, Any, dict]]):
        self.params, self.opt_state, self.update_fn = params, opt_state, update_fn
        self.version = 0
        self._lock = threading.Lock()

    def update(self, batch: Any) -> dict[str, float]:
        params, opt_state, metrics = self.update_fn(self.params, self.opt_state, batch)
        with self._lock:
            self.params, self.opt_state = params, opt_state
            self.version += 1
        return metrics

    def weights(self) -> Weights:
        with self._lock:
            return Weights(self.version, self.params)

    def set_state(self, params: Any, opt_state: Any, version: int) -> None:
        with self._lock:
            self.params, self.opt_state, self.version = params, opt_state, int(version)


@dataclass
class _Request:
    x: np.ndarray
    arrived: float
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, np.ndarray] | None = None
    error: BaseException | None = None


class InferenceServer:
    """Batches policy evaluations from many actors: a request waits until ``max_batch`` rows are queued or
    the oldest request is ``deadline_s`` old, then all queued requests share one forward pass.

    ``forward(params, x) -> (dist_inputs, value)``; actions are sampled here, so actors need no weights.
    Thread-safe; :meth:`client` returns a :class:`Policy` for one actor.
    """

    def __init__(self, forward: Callable[[Any, np.ndarray], tuple[tuple[Any, ...], Any]], dist: Any,
                 weights: Weights, max_batch: int = 256, deadline_s: float = 0.002, seed: int | None = None) -> None:
        if max_batch < 1 or deadline_s < 0:
            raise ValueError(f"max_batch, deadline_s: need max_batch >= 1 and deadline_s >= 0, got "
                             f"{max_batch}, {deadline_s}")
        self.forward, self.dist = forward, dist
        self.max_batch, self.deadline_s = int(max_batch), float(deadline_s)
        self._weights = weights
        self._rng = np.random.default_rng(seed)
        self._queue: deque[_Request] = deque()
        self._cv = threading.Condition()
        self._stop = False
        self.batches_served = 0
        self.rows_served = 0
        self._thread = threading.Thread(target=self._serve, name="inference-server", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self._weights.version

    def set_weights(self, weights: Weights) -> None:
        self._weights = weights

    def infer(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Blocking: queue ``x`` (a batch of adapted observations) and wait for its share of a batch."""
        req = _Request(np.asarray(x), time.monotonic())
        with self._cv:
            if self._stop:
                raise RuntimeError("infer: the inference server is stopped")
            self._queue.append(req)
            self._cv.notify_all()
        req.done.wait()
        if req.error is not None:
            raise RuntimeError(f"infer: the batched forward pass failed: {req.error!r}") from req.error
        assert req.result is not None
        return req.result

    def client(self) -> "InferenceClient":
        return InferenceClient(self)

    def _take_batch(self) -> list[_Request]:
        with self._cv:
            while True:
                if self._stop and not self._queue:
                    return []
                queued = sum(r.x.shape[0] for r in self._queue)
                if self._queue and (queued >= self.max_batch or self._stop):
                    break
                if self._queue:
                    wait = self._queue[0].arrived + self.deadline_s - time.monotonic()
                    if wait <= 0:
                        break
                    self._cv.wait(wait)
                else:
                    self._cv.wait()
            batch, rows = [], 0
            while self._queue and (not batch or rows + self._queue[0].x.shape[0] <= self.max_batch):
                r = self._queue.popleft()
                batch.append(r)
                rows += r.x.shape[0]
            return batch

    def _serve(self) -> None:
        while True:
            batch = self._take_batch()
            if not batch:
                return
            try:
                x = np.concatenate([r.x for r in batch], axis=0)
                dist_inputs, value = self.forward(self._weights.params, x)
                out = sample_action(self.dist, dist_inputs, value, self._rng)
                start = 0
                for r in batch:
                    stop = start + r.x.shape[0]
                    r.result = {k: v[start:stop] for k, v in out.items()}
                    start = stop
                self.batches_served += 1
                self.rows_served += x.shape[0]
            except BaseException as exc:  # hand the failure to every waiting actor, keep serving
                for r in batch:
                    r.error = exc
            for r in batch:
                r.done.set()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=5)


class InferenceClient:
    """An actor's handle on an :class:`InferenceServer` (implements :class:`Policy`)."""

    def __init__(self, server: InferenceServer) -> None:
        self.server = server

    @property
    def version(self) -> int:
        return self.server.version

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        return self.server.infer(x)
