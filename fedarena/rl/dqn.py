"""Deep Q-Networks with the usual extensions, each switchable: Mnih et al. (2015), "Human-level control
through deep reinforcement learning", Nature 518 (target network, replay, Huber loss, epsilon-greedy);
double DQN (van Hasselt, Guez & Silver, 2016: the online network picks argmax_a' Q(s', a'), the target
network evaluates it); dueling heads (Wang et al., 2016); n-step returns and prioritized replay
(Schaul et al., 2016), combined as in Rainbow (Hessel et al., 2018).

The TD target for a stored n-step transition (s, a, R, s', d) is y = R + d * Q_target(s', a*) with
d = gamma^m, or 0 when the episode terminated inside the window; the loss is the importance-weighted
Huber loss (``loss: huber``, the default) or squared error (``loss: mse``) of Q(s, a) - y, and
|Q(s, a) - y| becomes the new priority. One update (both forward passes, the gradient and Adam) compiles
into one graph. The squared error's minimiser is the mean target; the Huber loss's lies between the mean
and the median, so with random returns (card games: +1 or -2 from the same information state) Huber
biases Q.

Action masks, for environments whose legal actions vary (board and card games): pass ``legal`` (B, A)
bool to :meth:`DQN.act` and ``next_legal`` to :meth:`DQN.observe`. Then the greedy action, the uniform
exploratory action and the bootstrap (the max of Q_target(s', .), or double DQN's argmax of Q(s', .))
range over legal actions only; the mask of s' is stored in the replay with the transition. Without masks
every action is legal and nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from fedarena import engine
from fedarena.engine import ops, optim, tree_map
from fedarena.platform.experiment import param
from fedarena.rl.networks import QNetwork, torso_for
from fedarena.rl.nstep import NStepAccumulator
from fedarena.engine.backend_selection import backend_jit, check_engine_backend, to_host
from fedarena.rl.replay import PrioritizedReplayBuffer, ReplayBuffer
from fedarena.rl.spaces import observation_adapter
from fedarena.rl.workers import EpisodeStats, Learner, Weights

LOSSES = ("huber", "mse")
ILLEGAL_Q = -1e9  # stands in for Q of illegal actions in the bootstrap's max / argmax


@dataclass(frozen=True)
class DQNConfig:
    num_envs: int = param(4, "parallel environments")
    buffer_size: int = param(50_000, "replay buffer capacity in transitions")
    batch_size: int = param(64, "transitions per gradient step")
    learning_rate: float = param(1e-3, "Adam learning rate")
    gamma: float = param(0.99, "discount factor")
    n_step: int = param(3, "n of the n-step return targets")
    double: bool = param(True, "double DQN targets (van Hasselt et al. 2016)")
    dueling: bool = param(True, "dueling value/advantage heads (Wang et al. 2016)")
    prioritized: bool = param(True, "prioritized replay (Schaul et al. 2016) instead of uniform")
    alpha: float = param(0.6, "prioritized replay: priority exponent")
    beta_start: float = param(0.4, "prioritized replay: importance-sampling exponent, annealed linearly to 1 over the run")
    target_update_interval: int = param(500, "environment steps between copies of the online network into the target network")
    tau: float = param(1.0, "target update rate (1 = hard copy)")
    learning_starts: int = param(1000, "environment steps collected before learning begins")
    train_frequency: int = param(4, "environment steps (summed over envs) between gradient phases")
    gradient_steps: int = param(1, "gradient steps per gradient phase")
    exploration_fraction: float = param(0.2, "fraction of the step budget over which epsilon decays linearly")
    epsilon_start: float = param(1.0, "initial epsilon of epsilon-greedy exploration")
    epsilon_final: float = param(0.02, "final epsilon of epsilon-greedy exploration")
    max_grad_norm: float = param(10.0, "global gradient-norm clipping threshold")
    loss: str = param("huber", "TD loss: huber (Mnih et al. 2015) or mse (unbiased when returns are random)")
    huber_delta: float = param(1.0, "Huber loss threshold of the TD error (loss: huber)")
    hidden: tuple[int, ...] = param((128, 128), "hidden layer sizes of the Q network")
    engine_backend: str = param("numpy", "where the compiled update step runs: numpy, cupy (a CUDA GPU) or "
                                "cupy-emulated (the cupy backend's kernels on the CPU, a testing aid); acting "
                                "stays on the numpy backend")

    def __post_init__(self) -> None:
        checks = {
            "num_envs": self.num_envs >= 1, "buffer_size": self.buffer_size >= self.batch_size >= 1,
            "n_step": self.n_step >= 1, "gamma": 0.0 <= self.gamma <= 1.0, "learning_rate": self.learning_rate > 0,
            "tau": 0.0 < self.tau <= 1.0, "train_frequency": self.train_frequency >= 1,
            "gradient_steps": self.gradient_steps >= 1, "target_update_interval": self.target_update_interval >= 1,
            "exploration_fraction": 0.0 < self.exploration_fraction <= 1.0,
            "epsilon_final": 0.0 <= self.epsilon_final <= self.epsilon_start <= 1.0,
            "loss": self.loss in LOSSES, "huber_delta": self.huber_delta > 0,
        }
        for name, ok in checks.items():
            if not ok:
                expected = f" (expected one of {', '.join(LOSSES)})" if name == "loss" else ""
                raise ValueError(f"dqn.{name}: invalid value {getattr(self, name)!r}{expected}")
        check_engine_backend(self.engine_backend, "dqn.engine_backend")


class DQN:
    """A DQN agent over a vectorized environment with a Discrete action space."""

    def __init__(self, observation_space: Any, action_space: Any, config: DQNConfig, seed: int = 0) -> None:
        if not hasattr(action_space, "n"):
            raise ValueError(f"action_space: DQN needs a Discrete action space, got {action_space}")
        self.config = config
        self.num_actions = int(action_space.n)
        self.adapter = observation_adapter(observation_space)
        self.q = QNetwork(torso_for(self.adapter, config.hidden, "relu"), self.num_actions, config.dueling)
        self.rng = np.random.default_rng(seed)
        params = self.q.init(self.rng)
        self.target_params = tree_map(np.copy, params)
        self.optimizer = optim.adam(config.learning_rate, eps=1e-5)
        self.learner = Learner(params, self.optimizer.init(params), self._learn)
        if config.prioritized:
            self.replay: ReplayBuffer = PrioritizedReplayBuffer(config.buffer_size, alpha=config.alpha, seed=self.rng)
        else:
            self.replay = ReplayBuffer(config.buffer_size, seed=self.rng)
        self.nstep = NStepAccumulator(config.n_step, config.gamma, config.num_envs)
        self.q_values = engine.jit(self.q.__call__)
        self._step = backend_jit(self._train_step, config.engine_backend)
        self.beta = config.beta_start
        self.env_steps = 0
        self._last_target_update = 0
        self._last_train = 0

    # -- acting
    def epsilon(self, progress: float) -> float:
        c = self.config
        frac = min(1.0, progress / c.exploration_fraction)
        return c.epsilon_start + frac * (c.epsilon_final - c.epsilon_start)

    def act(self, x: np.ndarray, epsilon: float, params: Any | None = None,
            legal: np.ndarray | None = None) -> np.ndarray:
        """Epsilon-greedy actions for a batch of adapted observations; with ``legal`` (B, A) bool, the greedy
        and the exploratory actions are legal ones (exploration uniform over them)."""
        q = np.asarray(self.q_values(self.learner.params if params is None else params, x))
        if legal is None:
            greedy = np.argmax(q, axis=-1)
            explore = self.rng.random(x.shape[0]) < epsilon
            return np.where(explore, self.rng.integers(self.num_actions, size=x.shape[0]), greedy)
        legal = self._check_legal(legal, x.shape[0], "legal")
        greedy = np.argmax(np.where(legal, q, -np.inf), axis=-1)
        explore = self.rng.random(x.shape[0]) < epsilon
        uniform = np.argmax(self.rng.random(legal.shape) * legal, axis=-1)  # uniform over the legal actions
        return np.where(explore, uniform, greedy)

    def _check_legal(self, legal: np.ndarray, n: int, name: str) -> np.ndarray:
        legal = np.asarray(legal, dtype=bool)
        if legal.shape != (n, self.num_actions):
            raise ValueError(f"{name}: expected a ({n}, {self.num_actions}) action mask, got shape {legal.shape}")
        if not legal.any(axis=1).all():
            raise ValueError(f"{name}: rows {np.flatnonzero(~legal.any(axis=1))[:8].tolist()} have no legal action")
        return legal

    def weights(self) -> Weights:
        return self.learner.weights()

    # -- learning
    def loss(self, params: Any, target_params: Any, batch: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        q_all = self.q(params, batch["obs"])
        q_taken = ops.sum(q_all * batch["action"], axis=-1)
        q_next_target = self.q(target_params, batch["next_obs"])
        masked = "next_legal" in batch
        if self.config.double:
            q_next_online = self.q(params, batch["next_obs"])
            if masked:
                q_next_online = ops.where(batch["next_legal"], q_next_online, ILLEGAL_Q)
            best = ops.one_hot(ops.argmax(q_next_online, axis=-1), self.num_actions)
            next_value = ops.sum(q_next_target * best, axis=-1)
        else:
            if masked:
                q_next_target = ops.where(batch["next_legal"], q_next_target, ILLEGAL_Q)
            next_value = ops.max(q_next_target, axis=-1)
        target = ops.stop_gradient(batch["reward"] + batch["discount"] * next_value)
        td = q_taken - target
        if self.config.loss == "mse":
            per_item = ops.square(td)
        else:
            per_item = ops.huber(q_taken, target, delta=self.config.huber_delta, reduction="none")
        loss = ops.mean(batch["weights"] * per_item)
        return loss, {"td_error": td, "q_mean": ops.mean(q_taken)}

    def _train_step(self, params: Any, target_params: Any, opt_state: Any,
                    batch: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        (loss, aux), grads = engine.value_and_grad(self.loss, has_aux=True)(params, target_params, batch)
        grads, grad_norm = optim.clip_by_global_norm(grads, self.config.max_grad_norm)
        params, opt_state = self.optimizer.update(grads, opt_state, params)
        return params, opt_state, dict(aux, loss=loss, grad_norm=grad_norm)

    def _learn(self, params: Any, opt_state: Any, batch: Mapping[str, Any]) -> tuple[Any, Any, dict]:
        feed = {k: batch[k] for k in ("obs", "action", "reward", "discount", "next_obs", "weights", "next_legal")
                if k in batch}
        params, opt_state, aux = self._step(params, self.target_params, opt_state, feed)
        if self.config.engine_backend != "numpy":  # acting and the target update read numpy: back once per step
            params, opt_state, aux = to_host((params, opt_state, aux))
        td = np.asarray(aux.pop("td_error"))
        if isinstance(self.replay, PrioritizedReplayBuffer):
            self.replay.update_priorities(batch["indices"], np.abs(td))
        return params, opt_state, {k: float(v) for k, v in aux.items()}

    def observe(self, x: np.ndarray, actions: np.ndarray, reward: np.ndarray, next_x: np.ndarray,
                terminated: np.ndarray, truncated: np.ndarray, next_legal: np.ndarray | None = None) -> None:
        """Feed one vectorized step (observations already adapted) into the n-step window and the replay.

        ``next_legal`` (B, A) bool: the legal actions at ``next_x`` (ignored where ``terminated``, whose
        bootstrap has discount 0); give it on every step or on none."""
        if next_legal is None:
            out = self.nstep.push(x, actions, reward, next_x, terminated, truncated)
        else:
            n = x.shape[0]
            done = np.asarray(terminated, dtype=bool)
            next_legal = np.asarray(next_legal, dtype=bool) | done[:, None]
            next_legal = self._check_legal(next_legal, n, "next_legal")
            # the window's transitions end at this step, so their s' is a row of next_x: carry the row index
            # through the window in next_obs' place and look up the observation and its mask afterwards
            out = self.nstep.push(x, actions, reward, np.arange(n), terminated, truncated)
            if out:
                rows = out.pop("next_obs")
                out["next_obs"], out["next_legal"] = np.asarray(next_x)[rows], next_legal[rows]
        if out:
            item = {"obs": out["obs"].astype(np.float32),
                    "action": np.eye(self.num_actions, dtype=np.float32)[out["action"]],
                    "reward": out["reward"].astype(np.float32),
                    "discount": out["discount"].astype(np.float32),
                    "next_obs": out["next_obs"].astype(np.float32)}
            if "next_legal" in out:
                item["next_legal"] = out["next_legal"]
            self.replay.add(item)
        self.env_steps += x.shape[0]

    def maybe_train(self, progress: float) -> dict[str, float] | None:
        """Run the gradient phase and target update when their intervals have elapsed."""
        c = self.config
        metrics = None
        if self.env_steps >= c.learning_starts and self.env_steps - self._last_train >= c.train_frequency:
            self._last_train = self.env_steps
            self.beta = c.beta_start + min(1.0, progress) * (1.0 - c.beta_start)
            for _ in range(c.gradient_steps):
                if isinstance(self.replay, PrioritizedReplayBuffer):
                    batch = self.replay.sample(c.batch_size, beta=self.beta)
                else:
                    batch = self.replay.sample(c.batch_size)
                    batch["weights"] = np.ones(c.batch_size, dtype=np.float32)
                metrics = self.learner.update(batch)
        if self.env_steps - self._last_target_update >= c.target_update_interval:
            self._last_target_update = self.env_steps
            online = self.learner.params
            self.target_params = tree_map(lambda t, o: (1.0 - c.tau) * t + c.tau * np.asarray(o),
                                          self.target_params, online) if c.tau < 1.0 else tree_map(np.copy, online)
        return metrics


def run_dqn_steps(agent: DQN, env: Any, obs: Any, num_steps: int, progress_of: Any, stats: EpisodeStats,
                  ep_state: dict[str, np.ndarray]) -> tuple[Any, dict[str, float] | None]:
    """Advance ``env`` by ``num_steps`` vectorized steps with epsilon-greedy acting and learning.

    ``progress_of(env_steps) -> [0, 1]`` drives epsilon and beta; finished episodes go to ``stats``.
    Returns the latest observation and the last training metrics.
    """
    metrics = None
    for _ in range(num_steps):
        x = agent.adapter(obs)
        progress = progress_of(agent.env_steps)
        actions = agent.act(x, agent.epsilon(progress))
        step = env.step(actions)
        agent.observe(x, actions, step.reward, agent.adapter(step.final_obs), step.terminated, step.truncated)
        done = np.asarray(step.terminated) | np.asarray(step.truncated)
        ep_state["ret"] += step.reward
        ep_state["len"] += 1
        for i in np.nonzero(done)[0]:
            stats.returns.append(float(ep_state["ret"][i]))
            stats.lengths.append(int(ep_state["len"][i]))
        ep_state["ret"][done] = 0.0
        ep_state["len"][done] = 0
        m = agent.maybe_train(progress)
        metrics = m or metrics
        obs = step.obs
    return obs, metrics
