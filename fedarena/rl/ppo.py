"""Proximal Policy Optimization (Schulman, Wolski, Dhariwal, Radford & Klimov, 2017, arXiv:1707.06347).

Every detail is here, with the paper's names: the clipped surrogate objective L^CLIP (eq. 7), the
value loss with optional clipping around the old value estimate, the entropy bonus (eq. 9:
L = L^CLIP - c1 L^VF + c2 S), per-minibatch advantage normalisation, GAE(lambda) advantages
(Schulman et al., 2016), K epochs of minibatch Adam updates per rollout (Algorithm 1), global
gradient-norm clipping and linear learning-rate annealing (the implementation details catalogued by
Huang et al., 2022, "The 37 implementation details of PPO"). For Box actions the exploration is a Gaussian with a
free or state-dependent log-std, or gSDE (``use_sde``; :class:`fedarena.rl.networks.ActorCritic`,
:class:`fedarena.rl.workers.SDEPolicy`). One update step - loss, gradient,
clipping, Adam - is compiled by ``fedarena.engine.jit`` into a single graph.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Mapping

import numpy as np

from fedarena import engine
from fedarena.engine import ops, optim
from fedarena.engine.backend_selection import backend_jit, check_engine_backend, to_host
from fedarena.engine.distributed import DataParallelLearner, ReplicaStep
from fedarena.engine.interop import TorchConversionError, load_torch_factory
from fedarena.platform.experiment import param
from fedarena.rl.networks import LOG_STD_MODES, ActorCritic, torso_for
from fedarena.rl.normalization import RewardScaler, RunningMeanStd, obs_norm_params
from fedarena.rl.returns import gae
from fedarena.rl.spaces import action_distribution, observation_adapter
from fedarena.rl.torch_torso import TorchTorso
from fedarena.rl.workers import Learner, Weights


@dataclass(frozen=True)
class PPOConfig:
    num_envs: int = param(8, "parallel environments per actor")
    num_steps: int = param(128, "rollout horizon T per environment; a rollout has num_envs * num_steps transitions")
    gamma: float = param(0.99, "discount factor")
    gae_lambda: float = param(0.95, "GAE lambda (Schulman et al. 2016)")
    update_epochs: int = param(4, "passes over each rollout (K epochs)")
    num_minibatches: int = param(4, "minibatches per epoch")
    clip_coef: float = param(0.2, "PPO ratio clipping epsilon")
    clip_vloss: bool = param(True, "clip the value loss around the old values as well")
    ent_coef: float = param(0.0, "entropy bonus coefficient")
    vf_coef: float = param(0.5, "value loss coefficient")
    max_grad_norm: float = param(0.5, "global gradient-norm clipping threshold")
    learning_rate: float = param(2.5e-4, "Adam learning rate (initial value when annealed)")
    anneal_lr: bool = param(True, "decay the learning rate linearly to 0 over the update budget")
    norm_adv: bool = param(True, "normalise advantages per minibatch")
    hidden: tuple[int, ...] = param((64, 64), "hidden layer sizes of the actor and critic MLPs")
    activation: str = param("tanh", "hidden activation: tanh or relu")
    squash: bool = param(False, "Box actions: tanh-squashed Gaussian instead of a clipped one")
    log_std: str = param("state_independent", "Box actions: state_independent (a free log-std vector) or "
                         "state_dependent (a linear head on the policy torso)")
    log_std_init: float = param(0.0, "Box actions: initial log standard deviation of the Gaussian")
    use_sde: bool = param(False, "Box actions: generalized state-dependent exploration (gSDE, Raffin et al. 2022): "
                          "noise phi(s) E with a learned per-feature log-std (starting at log_std_init) instead of "
                          "the log_std head")
    sde_sample_freq: int = param(-1, "with use_sde: resample the noise matrix E every this many steps (-1: only at "
                                 "the start of each rollout)")
    normalize_obs: bool = param(False, "normalize observations by running mean/std (statistics in the parameters, "
                                "checkpoints and exported policies)")
    normalize_reward: bool = param(False, "scale rewards by the running std of the discounted return")
    obs_clip: float = param(10.0, "normalized observations are clipped to [-obs_clip, obs_clip]")
    reward_clip: float = param(10.0, "scaled rewards are clipped to [-reward_clip, reward_clip]")
    torso: str = param("", "a torch feature extractor 'torch:module.path:factory' (factory(observation_shape) -> "
                       "nn.Module giving (batch, features), converted by engine.from_torch) for the actor and critic "
                       "instead of the MLP of hidden / the Nature CNN; '' = those. The run imports that module "
                       "and calls the factory: a config is code, run only configs you trust")
    learners: int = param(1, "data-parallel learner replicas; each minibatch is split evenly over them")
    learner_transport: str = param("threads", "how learner replicas communicate: threads, shm or tcp")
    engine_backend: str = param("numpy", "where the compiled update step runs: numpy, cupy (a CUDA GPU) or "
                                "cupy-emulated (the cupy backend's kernels on the CPU, a testing aid); acting "
                                "stays on the numpy backend")

    def __post_init__(self) -> None:
        checks = {
            "num_envs": self.num_envs >= 1, "num_steps": self.num_steps >= 1,
            "update_epochs": self.update_epochs >= 1, "num_minibatches": self.num_minibatches >= 1,
            "gamma": 0.0 <= self.gamma <= 1.0, "gae_lambda": 0.0 <= self.gae_lambda <= 1.0,
            "clip_coef": self.clip_coef > 0, "learning_rate": self.learning_rate > 0,
            "max_grad_norm": self.max_grad_norm > 0, "obs_clip": self.obs_clip > 0, "reward_clip": self.reward_clip > 0,
            "log_std": self.log_std in LOG_STD_MODES, "learners": self.learners >= 1,
            "learner_transport": self.learner_transport in ("threads", "shm", "tcp"),
            "sde_sample_freq": self.sde_sample_freq == -1 or self.sde_sample_freq >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"ppo.{name}: invalid value {getattr(self, name)!r}")
        check_engine_backend(self.engine_backend, "ppo.engine_backend")
        if self.engine_backend != "numpy" and self.learners != 1:
            raise ValueError(f"ppo.engine_backend: {self.engine_backend} runs one learner (learners = 1), "
                             f"got learners = {self.learners}")
        if self.torso:
            try:
                load_torch_factory(self.torso)
            except ValueError as e:
                raise ValueError(f"ppo.torso: {e}") from None
        if (self.num_envs * self.num_steps) % self.num_minibatches:
            raise ValueError(f"ppo.num_minibatches: {self.num_minibatches} does not divide the rollout size "
                             f"{self.num_envs * self.num_steps}")
        if self.minibatch_size % self.learners:
            raise ValueError(f"ppo.learners: {self.learners} does not divide the minibatch size "
                             f"{self.minibatch_size}")

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches


class PPO:
    """PPO for one gymnasium observation/action space pair: network, compiled update, rollout learning."""

    def __init__(self, observation_space: Any, action_space: Any, config: PPOConfig, seed: int = 0,
                 total_steps: int | None = None) -> None:
        """``total_steps``: the run's environment-step budget; with ``anneal_lr`` the learning rate falls
        linearly to 0 over the updates that budget allows (engine.optim.linear on the update count)."""
        self.config = config
        self.adapter = observation_adapter(observation_space)
        self.dist = action_distribution(action_space, squash=config.squash)
        torso = torso_for(self.adapter, config.hidden, config.activation) if not config.torso else \
            torch_torso(config.torso, self.adapter.shape)
        self.net = ActorCritic(torso, self.dist,
                               log_std=config.log_std, log_std_init=config.log_std_init,
                               normalize_obs=config.normalize_obs, obs_clip=config.obs_clip, sde=config.use_sde)
        self.rng = np.random.default_rng(seed)
        params = self.net.init(self.rng)
        self.obs_rms = RunningMeanStd(self.adapter.shape) if config.normalize_obs else None
        self.reward_scaler: RewardScaler | None = None
        self.total_updates = None
        lr: Any = config.learning_rate
        if config.anneal_lr and total_steps:
            self.total_updates = -(-int(total_steps) // config.batch_size) * config.update_epochs * config.num_minibatches
            lr = optim.linear(config.learning_rate, 0.0, self.total_updates)
        self.optimizer = optim.adam(lr, eps=1e-5)
        self.learner = Learner(params, self.optimizer.init(params), self._update_rollout)
        self.forward = engine.jit(self._forward)
        self.forward_sde = engine.jit(self._forward_sde) if config.use_sde else None
        self._step = backend_jit(self._train_step, config.engine_backend) if config.learners == 1 else \
            DataParallelLearner(partial(ppo_replica, observation_space, action_space, config, seed, total_steps),
                                config.learners, config.learner_transport)

    # -- acting
    def _forward(self, params: Any, x: Any) -> tuple[tuple[Any, ...], Any]:
        return self.net.policy(params, x), self.net.value(params, x)

    def _forward_sde(self, params: Any, x: Any) -> tuple[tuple[Any, ...], Any, Any, Any]:
        """gSDE acting: the distribution inputs, the value, the features phi(s) and the noise scales sigma."""
        dist_inputs, features = self.net.policy_and_features(params, x)
        return dist_inputs, self.net.value(params, x), features, self.net.sde_std(params)

    def weights(self) -> Weights:
        return self.learner.weights()

    # -- learning
    def loss(self, params: Any, mb: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        """PPO's objective on one minibatch (to be minimised), and diagnostics."""
        c = self.config
        dist_inputs = self.net.policy(params, mb["obs"])
        new_log_prob = self.dist.log_prob(*dist_inputs, mb["action"])
        entropy = ops.mean(self.dist.entropy(*dist_inputs))
        new_value = self.net.value(params, mb["obs"])
        log_ratio = new_log_prob - mb["log_prob"]
        ratio = ops.exp(log_ratio)
        adv = mb["advantage"]
        pg_loss = ops.mean(ops.maximum(-adv * ratio, -adv * ops.clip(ratio, 1.0 - c.clip_coef, 1.0 + c.clip_coef)))
        v_loss_unclipped = ops.square(new_value - mb["value_target"])
        if c.clip_vloss:
            v_clipped = mb["value"] + ops.clip(new_value - mb["value"], -c.clip_coef, c.clip_coef)
            v_loss = 0.5 * ops.mean(ops.maximum(v_loss_unclipped, ops.square(v_clipped - mb["value_target"])))
        else:
            v_loss = 0.5 * ops.mean(v_loss_unclipped)
        loss = pg_loss - c.ent_coef * entropy + c.vf_coef * v_loss
        approx_kl = ops.mean((ratio - 1.0) - log_ratio)  # Schulman's k3 estimator
        clipfrac = ops.mean(ops.astype(ops.abs(ratio - 1.0) > c.clip_coef, np.float32))
        return loss, {"pg_loss": pg_loss, "v_loss": v_loss, "entropy": entropy, "approx_kl": approx_kl,
                      "clipfrac": clipfrac}

    def _train_step(self, params: Any, opt_state: Any, mb: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        """One minibatch update: the gradient (:meth:`_grad`) then the clipped Adam step (:meth:`_apply`); the
        data-parallel learner runs the same two halves with an all-reduce between them."""
        grads, aux = self._grad(params, mb)
        params, opt_state, extra = self._apply(params, opt_state, grads)
        return params, opt_state, dict(aux, **extra)

    def learning_rewards(self, rollout: Mapping[str, Any]) -> np.ndarray:
        """The rewards GAE sees: the actor's (env reward + truncation bootstrap), or with ``normalize_reward``
        the env reward scaled by the running return std plus the bootstrap (already in value units)."""
        if not self.config.normalize_reward:
            return rollout["reward"]
        env_reward = np.asarray(rollout["env_reward"], dtype=np.float64)
        if self.reward_scaler is None:
            self.reward_scaler = RewardScaler(env_reward.shape[1], self.config.gamma, self.config.reward_clip)
        scaled = self.reward_scaler(env_reward, np.asarray(rollout["discount"]) == 0.0)
        return scaled + np.asarray(rollout["reward"], dtype=np.float64) - env_reward

    def _grad(self, params: Any, mb: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        (loss, aux), grads = engine.value_and_grad(self.loss, has_aux=True)(params, mb)
        return grads, dict(aux, loss=loss)

    def _apply(self, params: Any, opt_state: Any, grads: Any) -> tuple[Any, Any, dict[str, Any]]:
        grads, grad_norm = optim.clip_by_global_norm(grads, self.config.max_grad_norm)
        params, opt_state = self.optimizer.update(grads, opt_state, params)
        return params, opt_state, {"grad_norm": grad_norm}

    def prepare(self, rollout: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Flatten a time-major rollout (from :meth:`fedarena.rl.workers.Actor.rollout`) and add GAE."""
        adv, targets = gae(self.learning_rewards(rollout), rollout["value"], rollout["bootstrap_value"],
                           rollout["discount"], self.config.gae_lambda)
        t, n = rollout["reward"].shape
        flat = lambda a: np.asarray(a).reshape((t * n,) + np.shape(a)[2:])  # noqa: E731
        return {
            "obs": flat(rollout["obs"]).astype(np.float32),
            "action": self.dist.encode(flat(rollout["action"])),
            "log_prob": flat(rollout["log_prob"]).astype(np.float32),
            "value": flat(rollout["value"]).astype(np.float32),
            "advantage": flat(adv).astype(np.float32),
            "value_target": flat(targets).astype(np.float32),
        }

    def _update_rollout(self, params: Any, opt_state: Any, rollout: Mapping[str, Any]) -> tuple[Any, Any, dict]:
        c = self.config
        data = self.prepare(rollout)
        n = data["obs"].shape[0]
        mb_size = n // c.num_minibatches
        sums: dict[str, float] = {}
        count = 0
        for _ in range(c.update_epochs):
            perm = self.rng.permutation(n)
            for start in range(0, n, mb_size):
                idx = perm[start:start + mb_size]
                mb = {k: v[idx] for k, v in data.items()}
                if c.norm_adv:
                    a = mb["advantage"]
                    mb["advantage"] = ((a - a.mean()) / (a.std() + 1e-8)).astype(np.float32)
                params, opt_state, aux = self._step(params, opt_state, mb)  # device arrays stay on the device
                if c.engine_backend != "numpy":
                    aux = to_host(aux)
                for k, v in aux.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                count += 1
        metrics = {k: v / count for k, v in sums.items()}
        if c.engine_backend != "numpy":
            params, opt_state = to_host(params), to_host(opt_state)  # actors and checkpoints read numpy
        var_y = float(np.var(data["value_target"]))
        metrics["explained_variance"] = float("nan") if var_y == 0 else 1.0 - float(
            np.var(data["value_target"] - data["value"])) / var_y
        metrics["learning_rate"] = self.learning_rate(int(opt_state["count"]))
        if self.obs_rms is not None:  # refresh the statistics for the next rollout (module docstring)
            self.obs_rms.update(data["obs"])
            params = dict(params, obs_norm=obs_norm_params(self.obs_rms))
        return params, opt_state, metrics

    def normalization_state(self) -> dict[str, Any]:
        """Running statistics for checkpoints (the float32 copy for acting is in the parameters)."""
        out: dict[str, Any] = {}
        if self.obs_rms is not None:
            out["obs"] = self.obs_rms.state()
        if self.reward_scaler is not None:
            out["reward"] = self.reward_scaler.state()
        return out

    def load_normalization_state(self, state: Mapping[str, Any]) -> None:
        if self.obs_rms is not None and "obs" in state:
            self.obs_rms.load(state["obs"])
        if self.config.normalize_reward and "reward" in state:
            cols = np.asarray(state["reward"]["returns"]).shape[0]
            self.reward_scaler = RewardScaler(cols, self.config.gamma, self.config.reward_clip)
            self.reward_scaler.load(state["reward"])

    def learning_rate(self, updates_done: int) -> float:
        """The learning rate of the next update after ``updates_done`` updates."""
        if self.total_updates is None:
            return self.config.learning_rate
        return self.config.learning_rate * max(0.0, 1.0 - updates_done / self.total_updates)

    def update(self, rollout: Mapping[str, Any]) -> dict[str, float]:
        """Learn from one rollout (``update_epochs`` passes of minibatch updates)."""
        return self.learner.update(rollout)


def torch_torso(spec: str, observation_shape: tuple[int, ...]) -> Any:
    """``ppo.torso``: the converted torch torso (:mod:`fedarena.rl.torch_torso`); errors name the field."""
    try:
        return TorchTorso(spec, observation_shape)
    except (ValueError, TorchConversionError) as e:
        raise ValueError(f"ppo.torso: {e}") from None


def ppo_replica(observation_space: Any, action_space: Any, config: PPOConfig, seed: int,
                total_steps: int | None) -> ReplicaStep:
    """One data-parallel replica of PPO's update step (built in each learner's thread or process)."""
    ppo = PPO(observation_space, action_space, replace(config, learners=1), seed, total_steps)
    return ReplicaStep(engine.jit(ppo._grad), engine.jit(ppo._apply), ppo.learner.params, ppo.learner.opt_state)
