"""IMPALA: importance-weighted actor-learner architecture with V-trace (Espeholt et al., 2018, ICML).

Actors run a possibly stale copy of the policy mu and send trajectories stamped with the weight
version; the learner evaluates its current policy pi on them and corrects the off-policyness with
V-trace (section 4.1): value targets v_s and policy-gradient advantages rho_s (r_s + gamma v_{s+1} -
V(x_s)) (section 4.2). Loss: -mean(log pi(a|x) * advantage) + baseline_cost * 0.5 mean((v_s - V(x))^2)
- entropy_cost * mean(entropy). Trajectories more than ``max_policy_lag`` versions old are dropped.
The paper optimises with RMSProp; this module uses Adam (the update rule is not part of the method).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Mapping

import numpy as np

from fedarena import engine
from fedarena.engine import ops, optim
from fedarena.engine.backend_selection import backend_jit, check_engine_backend, to_host
from fedarena.engine.distributed import (DataParallelLearner, ParameterServerConfig, ParameterServerLearner,
                                         ReplicaStep)
from fedarena.engine.distributed.parameter_server import MODES as PS_MODES
from fedarena.platform.experiment import param
from fedarena.rl.networks import ActorCritic, torso_for
from fedarena.rl.returns import vtrace
from fedarena.rl.spaces import action_distribution, observation_adapter
from fedarena.rl.workers import Learner, Weights


@dataclass(frozen=True)
class IMPALAConfig:
    num_envs: int = param(8, "environments per actor")
    unroll_length: int = param(32, "steps per trajectory an actor sends to the learner")
    gamma: float = param(0.99, "discount factor")
    learning_rate: float = param(1e-3, "learner learning rate")
    baseline_cost: float = param(0.5, "value (baseline) loss coefficient")
    entropy_cost: float = param(0.01, "entropy bonus coefficient")
    clip_rho_threshold: float = param(1.0, "V-trace rho-bar: truncation of the importance weights in the value targets")
    clip_c_threshold: float = param(1.0, "V-trace c-bar: truncation of the trace-cutting coefficients")
    clip_pg_rho_threshold: float = param(1.0, "truncation of the importance weights in the policy gradient")
    max_grad_norm: float = param(40.0, "global gradient-norm clipping threshold")
    max_policy_lag: int = param(20, "drop trajectories whose weights are more than this many learner versions old")
    hidden: tuple[int, ...] = param((64, 64), "hidden layer sizes of the actor-critic MLP")
    activation: str = param("tanh", "hidden activation: tanh or relu")
    learners: int = param(1, "data-parallel learner replicas; each trajectory batch is split evenly over them "
                          "(with a parameter server: its workers, one trajectory each)")
    learner_transport: str = param("threads", "how learner replicas communicate: threads, shm or tcp")
    parameter_server: str = param("off", "off, or sync / threshold / async: the learner's parameters live on a "
                                  "parameter server (threads in the learner's process) and `learners` workers "
                                  "push V-trace gradients to it")
    ps_servers: int = param(1, "parameter-server shards (server ranks)")
    ps_threshold: float = param(0.5, "threshold mode: the fraction of workers a server step waits for")
    ps_staleness: int = param(1, "threshold / async mode: largest version lag of an applied gradient")
    engine_backend: str = param("numpy", "where the compiled update step runs: numpy, cupy (a CUDA GPU) or "
                                "cupy-emulated (the cupy backend's kernels on the CPU, a testing aid); acting "
                                "stays on the numpy backend")

    def __post_init__(self) -> None:
        checks = {"num_envs": self.num_envs >= 1, "unroll_length": self.unroll_length >= 1,
                  "gamma": 0.0 <= self.gamma <= 1.0, "learning_rate": self.learning_rate > 0,
                  "max_policy_lag": self.max_policy_lag >= 0, "clip_rho_threshold": self.clip_rho_threshold > 0,
                  "clip_c_threshold": self.clip_c_threshold > 0,
                  "learners": self.learners >= 1 and (self.parameter_server != "off"
                                                     or (self.unroll_length * self.num_envs) % self.learners == 0),
                  "learner_transport": self.learner_transport in ("threads", "shm", "tcp"),
                  "parameter_server": self.parameter_server in ("off",) + PS_MODES,
                  "ps_servers": self.ps_servers >= 1, "ps_threshold": 0.0 < self.ps_threshold <= 1.0,
                  "ps_staleness": self.ps_staleness >= 0}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"impala.{name}: invalid value {getattr(self, name)!r}")
        check_engine_backend(self.engine_backend, "impala.engine_backend")
        if self.engine_backend != "numpy" and (self.learners != 1 or self.parameter_server != "off"):
            raise ValueError(f"impala.engine_backend: {self.engine_backend} runs one learner without a parameter "
                             f"server, got learners = {self.learners}, parameter_server = {self.parameter_server}")


class IMPALA:
    """The IMPALA learner for one observation/action space pair (actors use :attr:`forward`)."""

    def __init__(self, observation_space: Any, action_space: Any, config: IMPALAConfig, seed: int = 0) -> None:
        self.config = config
        self.adapter = observation_adapter(observation_space)
        self.dist = action_distribution(action_space)
        self.net = ActorCritic(torso_for(self.adapter, config.hidden, config.activation), self.dist)
        self.rng = np.random.default_rng(seed)
        params = self.net.init(self.rng)
        self.optimizer = optim.adam(config.learning_rate, eps=1e-5)
        self.forward = engine.jit(self._forward)
        self.dropped_stale = 0
        if config.parameter_server != "off":
            self.learner: Any = ParameterServerIMPALALearner(self, params)
            return
        self.learner = Learner(params, self.optimizer.init(params), self._learn)
        self._step = backend_jit(self._train_step, config.engine_backend) if config.learners == 1 else \
            DataParallelLearner(partial(impala_replica, observation_space, action_space, config, seed),
                                config.learners, config.learner_transport)

    def _forward(self, params: Any, x: Any) -> tuple[tuple[Any, ...], Any]:
        return self.net.policy(params, x), self.net.value(params, x)

    def weights(self) -> Weights:
        return self.learner.weights()

    def loss(self, params: Any, batch: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        c = self.config
        dist_inputs = self.net.policy(params, batch["obs"])
        log_prob = self.dist.log_prob(*dist_inputs, batch["action"])
        entropy = ops.mean(self.dist.entropy(*dist_inputs))
        value = self.net.value(params, batch["obs"])
        pg_loss = -ops.mean(log_prob * batch["pg_advantage"])
        baseline_loss = 0.5 * ops.mean(ops.square(batch["vs"] - value))
        loss = pg_loss + c.baseline_cost * baseline_loss - c.entropy_cost * entropy
        return loss, {"pg_loss": pg_loss, "baseline_loss": baseline_loss, "entropy": entropy}

    def _train_step(self, params: Any, opt_state: Any, batch: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        (loss, aux), grads = engine.value_and_grad(self.loss, has_aux=True)(params, batch)
        grads, grad_norm = optim.clip_by_global_norm(grads, self.config.max_grad_norm)
        params, opt_state = self.optimizer.update(grads, opt_state, params)
        return params, opt_state, dict(aux, loss=loss, grad_norm=grad_norm)

    def _grad(self, params: Any, batch: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        (loss, aux), grads = engine.value_and_grad(self.loss, has_aux=True)(params, batch)
        return grads, dict(aux, loss=loss)

    def _clipped_grad(self, params: Any, batch: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        grads, aux = self._grad(params, batch)
        grads, grad_norm = optim.clip_by_global_norm(grads, self.config.max_grad_norm)
        return grads, dict(aux, grad_norm=grad_norm)

    def _apply(self, params: Any, opt_state: Any, grads: Any) -> tuple[Any, Any, dict[str, Any]]:
        grads, grad_norm = optim.clip_by_global_norm(grads, self.config.max_grad_norm)
        params, opt_state = self.optimizer.update(grads, opt_state, params)
        return params, opt_state, {"grad_norm": grad_norm}

    def vtrace_batch(self, params: Any, traj: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Evaluate pi and V on a trajectory and compute V-trace targets (numpy, outside the gradient)."""
        c = self.config
        obs = np.asarray(traj["obs"], dtype=np.float32)
        t, n = obs.shape[:2]
        flat_obs = obs.reshape((t * n,) + obs.shape[2:])
        actions = np.asarray(traj["action"]).reshape((t * n,) + np.shape(traj["action"])[2:])
        all_obs = np.concatenate([flat_obs, np.asarray(traj["last_obs"], dtype=np.float32)], axis=0)
        dist_inputs, values = self.forward(params, all_obs)
        values = np.asarray(values, dtype=np.float64)
        inputs = tuple(np.asarray(a)[: t * n] if np.ndim(a) > 1 else np.asarray(a) for a in dist_inputs)
        if len(inputs) == 2:
            inputs = (inputs[0], np.broadcast_to(inputs[1], inputs[0].shape))
        target_log_prob = self.dist.log_prob_np(*inputs, actions).reshape(t, n)
        log_rhos = target_log_prob - np.asarray(traj["log_prob"], dtype=np.float64)
        vt = vtrace(log_rhos, traj["discount"], traj["reward"], values[: t * n].reshape(t, n), values[t * n:],
                    c.clip_rho_threshold, c.clip_c_threshold, c.clip_pg_rho_threshold)
        return {"obs": flat_obs, "action": self.dist.encode(actions),
                "vs": vt.vs.reshape(-1).astype(np.float32),
                "pg_advantage": vt.pg_advantages.reshape(-1).astype(np.float32),
                "mean_rho": np.float32(np.mean(vt.clipped_rhos))}

    def _learn(self, params: Any, opt_state: Any, traj: Mapping[str, Any]) -> tuple[Any, Any, dict]:
        batch = self.vtrace_batch(params, traj)
        mean_rho = float(batch.pop("mean_rho"))
        params, opt_state, aux = self._step(params, opt_state, batch)
        if self.config.engine_backend != "numpy":  # V-trace and the actors read numpy: back once per step
            params, opt_state, aux = to_host((params, opt_state, aux))
        metrics = {k: float(v) for k, v in aux.items()}
        metrics["mean_clipped_rho"] = mean_rho
        return params, opt_state, metrics

    def update(self, traj: Mapping[str, Any]) -> dict[str, float] | None:
        """Learn from one actor trajectory, or drop it (returns None) when its weights are too stale."""
        lag = self.learner.version - int(traj["version"])
        if lag > self.config.max_policy_lag:
            self.dropped_stale += 1
            return None
        metrics = self.learner.update(traj)
        metrics["policy_lag"] = float(lag)
        return metrics

    def close(self) -> None:
        """Stop the background parameter server, if this learner uses one."""
        if isinstance(self.learner, ParameterServerIMPALALearner):
            self.learner.close()


class ParameterServerIMPALALearner:
    """IMPALA's learner with its parameters on a :class:`ParameterServerLearner`: ``learners`` workers each
    take a trajectory, compute V-trace targets and the clipped gradient on the parameters they last pulled,
    and push it; the servers apply Adam to their shards in the configured mode. It has the interface of
    :class:`fedarena.rl.workers.Learner` (``update``, ``weights``, ``version``, ``params``, ``opt_state``,
    ``set_state``), so actors, checkpoints and resume work unchanged; ``opt_state`` is the list of shard
    states."""

    def __init__(self, impala: IMPALA, params: Any) -> None:
        self._impala = impala
        self._grad_step = engine.jit(impala._clipped_grad)
        self._start(params, None, 0)

    def _start(self, params: Any, opt_state: list | None, version: int) -> None:
        c = self._impala.config
        ps = ParameterServerConfig(mode=c.parameter_server, servers=c.ps_servers, threshold=c.ps_threshold,
                                   staleness=c.ps_staleness)
        self.server = ParameterServerLearner(params, self._gradient, self._impala.optimizer, ps, c.learners,
                                             opt_state, version)

    def _gradient(self, params: Any, traj: Mapping[str, Any]) -> tuple[Any, dict[str, float]]:
        batch = self._impala.vtrace_batch(params, traj)
        mean_rho = float(batch.pop("mean_rho"))
        grads, aux = self._grad_step(params, batch)
        return grads, dict({k: float(v) for k, v in aux.items()}, mean_clipped_rho=mean_rho)

    def update(self, traj: Mapping[str, Any]) -> dict[str, float]:
        return self.server.update(traj)

    def weights(self) -> Weights:
        return Weights(*self.server.weights())

    @property
    def version(self) -> int:
        return self.server.version

    @property
    def params(self) -> Any:
        return self.server.params

    @property
    def opt_state(self) -> list:
        return self.server.opt_state

    def set_state(self, params: Any, opt_state: list, version: int) -> None:
        self.server.close()
        self._start(params, list(opt_state), int(version))

    def close(self) -> None:
        self.server.close()


def impala_replica(observation_space: Any, action_space: Any, config: IMPALAConfig, seed: int) -> ReplicaStep:
    """One data-parallel replica of IMPALA's learner step (built in each learner's thread or process)."""
    impala = IMPALA(observation_space, action_space, replace(config, learners=1), seed)
    return ReplicaStep(engine.jit(impala._grad), engine.jit(impala._apply), impala.learner.params,
                       impala.learner.opt_state)
