"""Where actors run: in-process (local synchronous), in worker processes, or as Ray actors.

Each pool offers the same two calls: ``submit(i, weights)`` asks actor ``i`` for one rollout made
with ``weights`` and ``next() -> (i, trajectory)`` returns whichever requested rollout finished first,
so a synchronous learner (PPO: submit to all, take all) and an asynchronous one (IMPALA: resubmit
each actor as soon as its trajectory arrives) drive every mode alike. Actors in worker processes
receive weights and send trajectories through :mod:`fedarena.rl.wire` (no pickle). Ray actors are
supervised by the pool: when one dies its pending rollout fails, the pool starts a fresh Ray actor in its
place, requests the same rollout again, and training continues.
With ``inference_server=True`` (Ray mode) actors hold no weights: they send observations to one
:class:`fedarena.rl.workers.InferenceServer` Ray actor that batches them (SEED RL).
"""

from __future__ import annotations

import multiprocessing as mp
from collections import deque
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Callable, Mapping

import numpy as np

from fedarena.rl import wire
from fedarena.rl.dqn import DQN, DQNConfig
from fedarena.rl.impala import IMPALA, IMPALAConfig
from fedarena.rl.ppo import PPO, PPOConfig
from fedarena.rl.workers import Actor, InferenceServer, LocalPolicy, SDEPolicy, Weights

EXECUTION_MODES = ("local", "multiprocess", "ray")


@dataclass(frozen=True)
class Algorithm:
    """One row of :data:`ALGORITHMS`: an RL algorithm's config type, how its agent is built, and how it trains."""

    name: str
    config_type: type
    build: Callable[..., Any]
    """``build(observation_space, action_space, config, seed, total_steps) -> agent`` (config: ``config_type``)"""
    rollout_length: Callable[[Any], int] | None = None
    """On-policy algorithms: environment steps per actor rollout, from the config."""
    asynchronous: bool = False
    """True: each actor is sent new weights as soon as its trajectory is consumed (IMPALA; stale trajectories
    are dropped, an inference server may serve the actors); False: the learner waits for every actor (PPO)."""

    def typed(self, config: Any) -> Any:
        """``config`` as ``config_type``: returned as it is when it is one, else built once from its fields."""
        if isinstance(config, self.config_type):
            return config
        if is_dataclass(config):
            raise TypeError(f"{self.name}: expected {self.config_type.__name__}, got {type(config).__name__}")
        return self.config_type(**_tuples(dict(config)))


ALGORITHMS: dict[str, Algorithm] = {
    "ppo": Algorithm("ppo", PPOConfig, lambda obs, act, c, seed, total: PPO(obs, act, c, seed=seed, total_steps=total),
                     rollout_length=lambda c: c.num_steps),
    "impala": Algorithm("impala", IMPALAConfig, lambda obs, act, c, seed, total: IMPALA(obs, act, c, seed=seed),
                        rollout_length=lambda c: c.unroll_length, asynchronous=True),
    "dqn": Algorithm("dqn", DQNConfig, lambda obs, act, c, seed, total: DQN(obs, act, c, seed=seed)),
}
"""The one place an algorithm name is looked up: name -> :class:`Algorithm`."""


def algorithm_named(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm: expected one of {', '.join(repr(a) for a in ALGORITHMS)}, got '{name}'")
    return ALGORITHMS[name]


@dataclass(frozen=True)
class ActorSpec:
    """Everything a (possibly remote) actor needs to build its environment and policy."""

    algorithm: str
    """``"ppo"`` or ``"impala"``: which network definition the actor evaluates (a key of :data:`ALGORITHMS`)"""
    env_id: str
    num_envs: int
    rollout_length: int
    seed: int
    config: Any = field(default_factory=dict)
    """the algorithm's typed config (``PPOConfig`` / ``IMPALAConfig``), or a mapping of its fields"""
    env_backend: str = "auto"
    env_kwargs: dict = field(default_factory=dict)
    """keyword arguments of the environment's constructor"""
    wrappers: dict = field(default_factory=dict)
    """fields of :class:`fedarena.envs.gym_envs.EnvWrappers`"""

    def vector_env(self, num_envs: int, seed: int | None = None) -> Any:
        return build_vector_env(self.env_id, num_envs, seed, self.env_backend, self.env_kwargs, self.wrappers)


def build_vector_env(env_id: str, num_envs: int, seed: int | None, backend: str, env_kwargs: dict | None,
                     wrappers: dict | None) -> Any:
    """``make_vector_env`` with the env options of an RL config (``wrappers`` as a plain dict)."""
    from fedarena.envs.gym_envs import EnvWrappers
    from fedarena.envs.vector import make_vector_env

    return make_vector_env(env_id, num_envs, seed=seed, backend=backend, env_kwargs=env_kwargs,
                           wrappers=EnvWrappers(**(wrappers or {})))


def build_agent(algorithm: str, observation_space: Any, action_space: Any, config: Any, seed: int,
                total_steps: int | None = None) -> Any:
    """The algorithm object (network, compiled forward) for ``algorithm`` (a key of :data:`ALGORITHMS`);
    ``config``: its typed config, or a mapping of the config's fields (a policy manifest's)."""
    algo = algorithm_named(algorithm)
    return algo.build(observation_space, action_space, algo.typed(config), seed, total_steps)


def _tuples(config: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}


def config_dict(config: Any) -> dict:
    """A typed algorithm config as JSON-able fields (for policy manifests and the evaluator)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}


def _limit_blas_threads() -> None:
    """Small RL matrices run fastest on one BLAS thread, and workers must not oversubscribe the cores."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        pass


class ActorWorker:
    """One actor built from an :class:`ActorSpec` (used in-process, in a worker process and as a Ray actor)."""

    def __init__(self, spec: ActorSpec, index: int, policy_client: Any = None) -> None:
        _limit_blas_threads()
        self.spec, self.index = spec, index
        env = spec.vector_env(spec.num_envs, seed=spec.seed + 1000 * index)
        config = algorithm_named(spec.algorithm).typed(spec.config)
        self.agent = build_agent(spec.algorithm, env.observation_space, env.action_space, config, spec.seed)
        gamma = float(config.gamma)
        if policy_client is None and getattr(self.agent, "forward_sde", None) is not None:  # PPO with use_sde
            self.policy = SDEPolicy(self.agent.forward_sde, self.agent.dist, self.agent.weights(),
                                    int(config.sde_sample_freq), seed=spec.seed + 7919 * (index + 1))
        elif policy_client is None:
            self.policy = LocalPolicy(self.agent.forward, self.agent.dist, self.agent.weights(),
                                      seed=spec.seed + 7919 * (index + 1))
        else:
            self.policy = policy_client
        self.actor = Actor(env, self.agent.adapter, self.agent.dist, self.policy, gamma, seed=spec.seed + 1000 * index)

    def rollout(self, weights: Weights | None) -> dict[str, Any]:
        if weights is not None and isinstance(self.policy, LocalPolicy):
            self.policy.set_weights(weights)
        traj = self.actor.rollout(self.spec.rollout_length)
        traj["actor"] = self.index
        return traj

    def state(self) -> dict[str, Any] | None:
        """The actor and its sampling generator between rollouts (None: its environment exports no state)."""
        actor = self.actor.state_dict()
        if actor is None or not isinstance(self.policy, LocalPolicy):
            return None
        return {"actor": actor, "policy_rng": self.policy.rng.bit_generator.state}

    def load(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        assert isinstance(self.policy, LocalPolicy)
        self.policy.rng.bit_generator.state = {k: (dict(v) if isinstance(v, dict) else v)
                                               for k, v in state["policy_rng"].items()}

    def pid(self) -> int:
        import os

        return os.getpid()


class LearnerHost:
    """The learner of an on-policy run as one object: in-process, or (Ray mode) the body of a Ray actor.

    Holds the algorithm (PPO or IMPALA), consumes trajectories, publishes versioned weights and exports
    or restores its checkpoint state (weights, optimizer state, version, RNG, dropped-trajectory count).
    """

    def __init__(self, algorithm: str, env_id: str, env_backend: str, config: dict, seed: int,
                 total_steps: int | None = None, env_kwargs: dict | None = None, wrappers: dict | None = None) -> None:
        _limit_blas_threads()
        env = build_vector_env(env_id, 1, None, env_backend, env_kwargs, wrappers)
        self.agent = build_agent(algorithm, env.observation_space, env.action_space, config, seed, total_steps)
        if hasattr(env, "close"):
            env.close()

    def update(self, traj: dict[str, Any]) -> dict[str, float] | None:
        return self.agent.update(traj)

    def weights(self) -> Weights:
        return self.agent.weights()

    def version(self) -> int:
        return self.agent.learner.version

    def dropped_stale(self) -> int:
        return int(getattr(self.agent, "dropped_stale", 0))

    def close(self) -> None:
        """Release what the algorithm runs in the background (IMPALA's parameter server)."""
        if hasattr(self.agent, "close"):
            self.agent.close()

    def state(self) -> dict[str, Any]:
        learner = self.agent.learner
        state = {"params": learner.params, "opt_state": learner.opt_state, "version": learner.version,
                 "rng": self.agent.rng.bit_generator.state, "dropped_stale": self.dropped_stale()}
        if hasattr(self.agent, "normalization_state"):
            state["normalization"] = self.agent.normalization_state()
        return state

    def load(self, state: dict[str, Any]) -> None:
        self.agent.learner.set_state(state["params"], state["opt_state"], int(state["version"]))
        self.agent.rng.bit_generator.state = {k: (dict(v) if isinstance(v, dict) else v) for k, v in state["rng"].items()}
        if hasattr(self.agent, "dropped_stale"):
            self.agent.dropped_stale = int(state.get("dropped_stale", 0))
        if "normalization" in state and hasattr(self.agent, "load_normalization_state"):
            self.agent.load_normalization_state(state["normalization"])


class RemoteLearner:
    """A :class:`LearnerHost` running as a Ray actor, called with the same method names (blocking)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import ray

        self._actor = ray.remote(num_cpus=0)(LearnerHost).remote(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        import ray

        method = getattr(self._actor, name)
        return lambda *a, **k: ray.get(method.remote(*a, **k))

    def close(self) -> None:
        import ray

        try:
            ray.get(self._actor.close.remote(), timeout=30)
        except ray.exceptions.RayError:  # the actor is gone already: nothing left to release
            pass
        finally:
            ray.kill(self._actor, no_restart=True)


# ------------------------------------------------------------------------------------------ local


class LocalActorPool:
    """Actors in this process; ``next`` runs the oldest submitted rollout to completion."""

    def __init__(self, spec: ActorSpec, num_actors: int) -> None:
        self.workers = [ActorWorker(spec, i) for i in range(num_actors)]
        self._pending: deque[tuple[int, Weights]] = deque()
        self.restarts = 0

    def submit(self, i: int, weights: Weights) -> None:
        self._pending.append((i, weights))

    def next(self) -> tuple[int, dict[str, Any]]:
        i, weights = self._pending.popleft()
        return i, self.workers[i].rollout(weights)

    def state(self) -> list[dict[str, Any]] | None:
        """Every actor's state between rollouts, for an exact resume (None when an environment exports none)."""
        states = [w.state() for w in self.workers]
        return None if any(st is None for st in states) else states  # type: ignore[return-value]

    def load(self, states: list[dict[str, Any]]) -> None:
        for w, st in zip(self.workers, states, strict=True):
            w.load(st)

    def close(self) -> None:
        self._pending.clear()


# ------------------------------------------------------------------------------------------ processes


class ActorFailure(RuntimeError):
    """An actor in a worker process raised; ``user_error`` is copied from the original exception's class."""

    def __init__(self, message: str, user_error: bool) -> None:
        super().__init__(message)
        self.user_error = user_error


def _failure(exc: BaseException) -> dict[str, Any]:
    return {"__error__": " ".join(str(exc).split()) or type(exc).__name__, "type": type(exc).__name__,
            "user_error": bool(getattr(type(exc), "user_error", False))}


def _process_main(conn: Any, spec: ActorSpec, index: int) -> None:
    try:
        worker = ActorWorker(spec, index)
    except Exception as exc:  # report instead of dying (a dead worker would be restarted forever)
        conn.send_bytes(wire.encode(_failure(exc)))
        return
    while True:
        try:
            msg = wire.decode(conn.recv_bytes())
        except EOFError:
            return
        if msg.get("cmd") == "stop":
            return
        weights = Weights(int(msg["version"]), msg["params"])
        try:
            out = worker.rollout(weights)
        except Exception as exc:
            conn.send_bytes(wire.encode(_failure(exc)))
            return
        conn.send_bytes(wire.encode(out))


class ActorUserError(ActorFailure):
    """An actor failure caused by a user error (e.g. the environment raised): exit status 2 in the CLI."""

    user_error = True


class ProcessActorPool:
    """One worker process per actor (spawned), talking over pipes with the :mod:`fedarena.rl.wire` codec.
    A worker that dies is started again and its rollout requested anew."""

    def __init__(self, spec: ActorSpec, num_actors: int) -> None:
        self.spec = spec
        self._ctx = mp.get_context("spawn")
        self.procs: list[Any] = [None] * num_actors
        self.conns: list[Any] = [None] * num_actors
        self._requests: dict[int, bytes] = {}
        self.restarts = 0
        for i in range(num_actors):
            self._start(i)

    def _start(self, i: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_process_main, args=(child, self.spec, i), daemon=True)
        proc.start()
        child.close()
        self.procs[i], self.conns[i] = proc, parent

    def submit(self, i: int, weights: Weights) -> None:
        msg = wire.encode({"cmd": "rollout", "version": weights.version, "params": weights.params})
        self._requests[i] = msg
        try:
            self.conns[i].send_bytes(msg)
        except (BrokenPipeError, OSError):
            self._restart(i)

    def _restart(self, i: int) -> None:
        self.restarts += 1
        if self.procs[i] is not None and self.procs[i].is_alive():
            self.procs[i].kill()
        self._start(i)
        self.conns[i].send_bytes(self._requests[i])

    def next(self) -> tuple[int, dict[str, Any]]:
        from multiprocessing.connection import wait

        while True:
            waiting = {self.conns[i]: i for i in self._requests}
            if not waiting:
                raise RuntimeError("next: no rollout was submitted")
            for conn in wait(list(waiting), timeout=5.0):
                i = waiting[conn]
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):
                    self._restart(i)
                    continue
                del self._requests[i]
                out = wire.decode(data)
                if "__error__" in out:
                    err = ActorFailure(f"actor {i}: {out['__error__']}", bool(out.get("user_error")))
                    if err.user_error:
                        raise ActorUserError(str(err), True)
                    raise err
                return i, out
            for i in list(self._requests):  # a worker killed without closing its pipe
                if not self.procs[i].is_alive():
                    self._restart(i)

    def close(self) -> None:
        for i, conn in enumerate(self.conns):
            try:
                conn.send_bytes(wire.encode({"cmd": "stop"}))
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()


# ------------------------------------------------------------------------------------------ Ray


class _RemoteInferencePolicy:
    """Policy of a Ray actor that asks a Ray-hosted InferenceServer (implements workers.Policy)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        import ray

        out, self._version = ray.get(self.server.infer.remote(x))
        return out


class _InferenceHost:
    """Body of the Ray actor hosting an InferenceServer (threaded: many actors wait in it at once)."""

    def __init__(self, spec: ActorSpec, weights: Weights, max_batch: int, deadline_s: float) -> None:
        _limit_blas_threads()
        env = spec.vector_env(1)
        agent = build_agent(spec.algorithm, env.observation_space, env.action_space, spec.config, spec.seed)
        self.server = InferenceServer(agent.forward, agent.dist, weights, max_batch, deadline_s, seed=spec.seed)

    def infer(self, x: np.ndarray) -> tuple[dict[str, np.ndarray], int]:
        version = self.server.version
        return self.server.infer(x), version

    def set_weights(self, weights: Weights) -> None:
        self.server.set_weights(weights)

    def stats(self) -> dict[str, int]:
        return {"batches": self.server.batches_served, "rows": self.server.rows_served}


class _RayActorBody(ActorWorker):
    def __init__(self, spec: ActorSpec, index: int, server: Any = None) -> None:
        super().__init__(spec, index, None if server is None else _RemoteInferencePolicy(server))


class RayActorPool:
    """Actors as Ray actors; optional Ray-hosted InferenceServer. An actor whose process dies is replaced by a
    fresh Ray actor (at most ``max_restarts`` times per actor) and its rollout is requested again."""

    def __init__(self, spec: ActorSpec, num_actors: int, inference_server: bool = False, initial: Weights | None = None,
                 max_batch: int = 256, deadline_s: float = 0.002, max_restarts: int = 10) -> None:
        import ray

        self.spec, self.max_restarts = spec, max_restarts
        self.restarts = 0
        self._deaths = [0] * num_actors
        self.server = None
        if inference_server:
            host = ray.remote(num_cpus=0, max_concurrency=num_actors + 4)(_InferenceHost)
            self.server = host.remote(spec, initial, max_batch, deadline_s)
        self._cls = ray.remote(num_cpus=0, max_restarts=0)(_RayActorBody)
        self.actors = [self._make(i) for i in range(num_actors)]
        self._pending: dict[Any, tuple[int, Weights | None]] = {}

    def _make(self, i: int) -> Any:
        return self._cls.remote(self.spec, i, self.server)

    def _request(self, i: int, weights: Weights | None) -> None:
        ref = self.actors[i].rollout.remote(weights)
        self._pending[ref] = (i, weights)

    def submit(self, i: int, weights: Weights) -> None:
        if self.server is not None:
            self.server.set_weights.remote(weights)
            self._request(i, None)
        else:
            self._request(i, weights)

    def _replace(self, i: int) -> None:
        import ray

        self._deaths[i] += 1
        self.restarts += 1
        if self._deaths[i] > self.max_restarts:
            raise RuntimeError(f"actor {i} died {self._deaths[i]} times (max_restarts={self.max_restarts})")
        try:
            ray.kill(self.actors[i], no_restart=True)
        except Exception:  # already gone
            pass
        self.actors[i] = self._make(i)

    def next(self) -> tuple[int, dict[str, Any]]:
        import ray
        from ray.exceptions import RayActorError

        while True:
            if not self._pending:
                raise RuntimeError("next: no rollout was submitted")
            ready, _ = ray.wait(list(self._pending), num_returns=1)
            ref = ready[0]
            i, weights = self._pending.pop(ref)
            try:
                return i, ray.get(ref)
            except RayActorError:
                self._replace(i)  # the actor's process died: start a new one and ask it for the same rollout
                self._request(i, weights)

    def actor_pid(self, i: int) -> int:
        import ray

        return int(ray.get(self.actors[i].pid.remote()))

    def inference_stats(self) -> dict[str, int] | None:
        import ray

        return None if self.server is None else ray.get(self.server.stats.remote())

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a, no_restart=True)
        if self.server is not None:
            ray.kill(self.server, no_restart=True)
        self._pending.clear()


def make_actor_pool(mode: str, spec: ActorSpec, num_actors: int, **ray_options: Any) -> Any:
    """An actor pool for ``mode`` in :data:`EXECUTION_MODES`."""
    if num_actors < 1:
        raise ValueError(f"num_actors: must be >= 1, got {num_actors}")
    if mode == "local":
        return LocalActorPool(spec, num_actors)
    if mode == "multiprocess":
        return ProcessActorPool(spec, num_actors)
    if mode == "ray":
        return RayActorPool(spec, num_actors, **ray_options)
    raise ValueError(f"execution: expected one of {EXECUTION_MODES}, got '{mode}'")
