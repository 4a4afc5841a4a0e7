"""Cooperative value decomposition: VDN (Sunehag et al., 2017) and QMIX (Rashid et al., 2018), on the engine.

Each agent ``a`` has a utility ``Q_a(o_a, u_a)`` from one network shared by all agents (its input is the
observation plus a one-hot agent id, as in Rashid et al.). The joint value mixes the chosen utilities:

- VDN: ``Q_tot = sum_a Q_a`` (Sunehag et al.);
- QMIX: ``Q_tot = w2(s) . elu(W1(s)^T q + b1(s)) + b2(s)`` where hypernetworks of the global state ``s``
  produce the weights, made non-negative by an absolute value, so ``dQ_tot/dQ_a >= 0`` (monotonic mixing,
  Rashid et al., fig. 2); ``b2`` is a two-layer network of ``s`` with a ReLU. ``W1`` and ``w2`` come from
  linear hypernetworks (Rashid et al.) or, with ``hypernet_layers=2``, from two-layer ReLU ones (PyMARL's and
  EPyMARL's ``hypernet_layers: 2``). ``mixer_state=False`` feeds the hypernetworks zeros instead of ``s``: the
  weights no longer depend on the state (Rashid et al.'s QMIX-NS ablation).

Training minimizes the TD error ``(r + gamma (1 - terminal) Q_tot^-(s', argmax_u Q_a(o'_a, u)) - Q_tot(s, u))^2``
on transitions drawn uniformly from a replay buffer, with a target network (``^-``) copied every
``target_update_every`` updates and the next actions chosen among legal actions by the online utilities
(double Q-learning, as PyMARL's ``double_q``; ``double_q=False``: by the target's). With
``standardise_rewards`` the rewards of each sampled batch are standardised by the running mean and standard
deviation of every team reward seen so far (as EPyMARL's ``standardise_rewards``): mean 0 and variance 1,
whatever the task's reward scale. With ``n_step = n > 1`` the targets are n-step returns
``sum_{i<k} gamma^i r_{t+i} + gamma^k (1 - terminal) Q_tot^-(s_{t+k}, ...)``, ``k = n`` or fewer steps where the
episode ends first (or is cut by a reset); a transition enters the replay buffer once its k steps are known (Sutton &
Barto, 2018, sec. 7.1; the multi-step targets of Hessel et al., 2018, "Rainbow", also uncorrected for the
exploration policy). Standardised rewards then enter the return as ``(R - mean * sum_{i<k} gamma^i) / std``,
the same as summing standardised rewards. With ``buffer="episode"`` the buffer holds whole episodes (padded to
the task's longest) and each update trains on every step of ``batch_size`` sampled episodes against TD(lambda)
targets computed backwards over each episode from the target network's mixed values (double Q as above): the
recipe of Hu et al. (2021), "Rethinking the Implementation Tricks and Monotonicity Constraint in Cooperative
Multi-Agent Reinforcement Learning" (pymarl2, lambda 0.6); ``td_lambda=0`` gives the one-step targets.
Agents act epsilon-greedily on their own utilities (decentralized execution). The agents here are feed-forward networks of the current observation (the
papers use GRU agents over the observation history; the tasks here are fully observed per agent).
One update step -- both networks' forward passes, the loss, its gradient, clipping and Adam -- is one
``engine.jit`` graph, and the ``updates_per_step`` updates of one update round (their batches drawn at
once) run as one compiled call that updates the parameters and Adam moments in place (donated buffers). An
update round follows every ``update_every``-th batched environment step: with 8 copies of a 25-step task,
``update_every = 3`` (24 transitions) and one update of ``batch_size = 800`` transitions is, counted in
transitions, EPyMARL's cadence (one update on 32 episodes per episode collected; Papoudakis et al., 2021).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.platform.experiment import param

MIXERS = ("vdn", "qmix")
BUFFERS = ("transition", "episode")


@dataclass(frozen=True)
class ValueDecompositionConfig:
    mixer: str = param("qmix", "joint-value mixer: qmix (monotonic hypernetwork mixing) or vdn (sum)")
    hidden: tuple[int, ...] = param((64,), "hidden layer sizes of the shared agent network")
    mixing_embed: int = param(32, "QMIX mixing network width")
    hypernet_hidden: int = param(64, "QMIX: hidden size of the hypernetwork producing b2 (V(s)), and of those "
                                 "producing W1 and w2 when hypernet_layers is 2")
    hypernet_layers: int = param(1, "QMIX: layers of the hypernetworks producing W1 and w2: 1 (linear in the "
                                 "state, Rashid et al.) or 2 (a ReLU layer of hypernet_hidden units first, as "
                                 "EPyMARL's hypernet_layers: 2)")
    mixer_state: bool = param(True, "QMIX: the hypernetworks see the global state; false feeds them zeros, so the "
                              "mixing weights depend on nothing (Rashid et al.'s QMIX-NS ablation, state-independent "
                              "monotonic mixing)")
    gamma: float = param(0.99, "discount factor")
    learning_rate: float = param(5e-4, "Adam learning rate")
    batch_size: int = param(32, "transitions per update")
    buffer_size: int = param(5000, "replay capacity, in transitions")
    learning_starts: int = param(100, "transitions collected before the first update")
    updates_per_step: int = param(1, "updates per update round (once learning started)")
    update_every: int = param(1, "batched environment steps between update rounds (EPyMARL's episode runner: one "
                              "update per episode collected)")
    target_update_every: int = param(200, "copy the online networks to the target every this many updates")
    epsilon_start: float = param(1.0, "epsilon-greedy exploration at the start")
    epsilon_finish: float = param(0.05, "epsilon after annealing")
    epsilon_anneal_steps: int = param(5000, "environment steps (per copy, summed over copies) over which epsilon falls linearly")
    max_grad_norm: float = param(10.0, "global gradient-norm clipping")
    double_q: bool = param(True, "choose the next joint action by the online utilities (double Q-learning), "
                           "else by the target's")
    standardise_rewards: bool = param(False, "train on team rewards standardised by their running mean and std "
                                      "(EPyMARL's standardise_rewards)")
    n_step: int = param(1, "n-step targets: the discounted team rewards of up to n steps (fewer where the episode "
                        "ends) plus gamma^n times the target's mixed value there (Sutton & Barto, 2018, sec. 7.1; "
                        "Hessel et al., 2018); not corrected for the exploration policy; 1 = one-step targets")
    buffer: str = param("transition", "what the replay buffer stores and samples: transition (single transitions, "
                        "one-step or n-step targets) or episode (whole episodes padded to the episode length, "
                        "trained on every step with TD(lambda) targets, as pymarl2; Hu et al., 2021). With episode, "
                        "batch_size, buffer_size and learning_starts count episodes")
    td_lambda: float = param(0.0, "buffer episode: lambda of the TD(lambda) targets computed backwards over each "
                             "sampled episode from the target network's mixed values (Sutton & Barto, 2018, "
                             "sec. 12.1); 0 = one-step targets")

    def __post_init__(self) -> None:
        if self.mixer not in MIXERS:
            raise ValueError(f"mixer: expected one of {', '.join(MIXERS)}, got '{self.mixer}'")
        checks = {"gamma": 0.0 <= self.gamma <= 1.0, "learning_rate": self.learning_rate > 0,
                  "batch_size": self.batch_size >= 1, "buffer_size": self.buffer_size >= self.batch_size,
                  "learning_starts": self.learning_starts >= 0, "updates_per_step": self.updates_per_step >= 0,
                  "update_every": self.update_every >= 1,
                  "target_update_every": self.target_update_every >= 1, "mixing_embed": self.mixing_embed >= 1,
                  "hypernet_hidden": self.hypernet_hidden >= 1, "hypernet_layers": self.hypernet_layers in (1, 2),
                  "epsilon_start": 0.0 <= self.epsilon_start <= 1.0, "epsilon_finish": 0.0 <= self.epsilon_finish <= 1.0,
                  "epsilon_anneal_steps": self.epsilon_anneal_steps >= 1, "max_grad_norm": self.max_grad_norm > 0,
                  "n_step": self.n_step >= 1, "buffer": self.buffer in BUFFERS, "td_lambda": 0.0 <= self.td_lambda <= 1.0}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}: invalid value {getattr(self, name)!r}")
        if self.td_lambda > 0 and self.buffer != "episode":
            raise ValueError(f"td_lambda: {self.td_lambda} needs buffer: episode (lambda-returns run over whole "
                             "episodes)")
        if self.n_step > 1 and self.buffer != "transition":
            raise ValueError(f"n_step: {self.n_step} needs buffer: transition (with buffer: episode use td_lambda)")

    def epsilon(self, steps: int) -> float:
        frac = min(1.0, steps / self.epsilon_anneal_steps)
        return self.epsilon_start + frac * (self.epsilon_finish - self.epsilon_start)


def rng_state_from_checkpoint(state: Mapping[str, Any]) -> dict[str, Any]:
    """A numpy bit-generator state from its checkpointed form (nested mappings of ints)."""
    return {k: (rng_state_from_checkpoint(v) if isinstance(v, Mapping) else (int(v) if isinstance(v, np.integer) else v))
            for k, v in state.items()}


def elu(x: Any) -> Any:
    return ops.where(x > 0, x, ops.exp(ops.minimum(x, 0.0)) - 1.0)


class ValueDecomposition:
    """VDN or QMIX for ``num_agents`` agents with ``num_actions`` discrete actions each."""

    def __init__(self, obs_size: int, state_size: int, num_agents: int, num_actions: int,
                 config: ValueDecompositionConfig, seed: int = 0) -> None:
        self.config = c = config
        self.obs_size, self.state_size = obs_size, state_size
        self.num_agents, self.num_actions = num_agents, num_actions
        self.rng = np.random.default_rng(seed)
        self.agent_net = nn.MLP((obs_size + num_agents,) + tuple(c.hidden) + (num_actions,), activation="relu")
        params: dict[str, Any] = {"agent": self.agent_net.init(self.rng)}
        if c.mixer == "qmix":
            E, H, S = c.mixing_embed, c.hypernet_hidden, state_size
            if c.hypernet_layers == 1:
                self.hyper_w1: Any = nn.Linear(S, num_agents * E)
                self.hyper_w2: Any = nn.Linear(S, E)
            else:
                self.hyper_w1 = nn.MLP((S, H, num_agents * E), activation="relu")
                self.hyper_w2 = nn.MLP((S, H, E), activation="relu")
            self.hyper_b1 = nn.Linear(S, E)
            self.hyper_b2 = nn.MLP((S, H, 1), activation="relu")
            params["mixer"] = {"w1": self.hyper_w1.init(self.rng), "b1": self.hyper_b1.init(self.rng),
                               "w2": self.hyper_w2.init(self.rng), "b2": self.hyper_b2.init(self.rng)}
        self.params = params
        self.target_params = engine.tree_map(np.copy, params)
        self.optimizer = optim.adam(c.learning_rate)
        self.opt_state = self.optimizer.init(params)
        self._ids = np.eye(num_agents, dtype=np.float32)
        self._q = engine.jit(self.utilities)
        self._steps = engine.jit(self._train_steps, donate_argnums=(0, 2))
        self.updates = 0

    # -- networks
    def utilities(self, params: Any, obs: Any) -> Any:
        """``(B, M, A)`` per-agent utilities of observations ``(B, M, D)``."""
        B = obs.shape[0]
        ids = ops.broadcast_to(self._ids, (B, self.num_agents, self.num_agents))
        x = ops.reshape(ops.concatenate([obs, ids], axis=2), (B * self.num_agents, self.obs_size + self.num_agents))
        return ops.reshape(self.agent_net.apply(params["agent"], x), (B, self.num_agents, self.num_actions))

    def mix(self, params: Any, q: Any, state: Any) -> Any:
        """``(B,)`` joint value of chosen utilities ``q (B, M)`` in global states ``state (B, S)``."""
        if self.config.mixer == "vdn":
            return ops.sum(q, axis=1)
        m, E = params["mixer"], self.config.mixing_embed
        B = q.shape[0]
        if not self.config.mixer_state:  # QMIX-NS: the weights are the hypernetworks' outputs at a zero state
            state = state * 0.0
        w1 = ops.abs(ops.reshape(self.hyper_w1.apply(m["w1"], state), (B, self.num_agents, E)))
        b1 = self.hyper_b1.apply(m["b1"], state)
        hidden = elu(ops.sum(ops.expand_dims(q, 2) * w1, axis=1) + b1)  # (B, E)
        w2 = ops.abs(self.hyper_w2.apply(m["w2"], state))
        b2 = ops.reshape(self.hyper_b2.apply(m["b2"], state), (B,))
        return ops.sum(hidden * w2, axis=1) + b2

    def _chosen_tot(self, params: Any, obs: Any, action: Any, state: Any) -> Any:
        """``(B,)`` mixed value of the taken joint actions."""
        q = self.utilities(params, obs)
        return self.mix(params, ops.sum(q * ops.one_hot(action, self.num_actions), axis=2), state)

    def _next_tot(self, params: Any, target_params: Any, next_obs: Any, next_state: Any, next_mask: Any) -> Any:
        """``(B,)`` the target's mixed value at the next states of the greedy legal joint action (chosen by the
        online utilities with double Q, else by the target's)."""
        penalty = (next_mask - 1.0) * 1e9  # illegal next actions never win the argmax
        next_target = self.utilities(target_params, next_obs)
        chooser = self.utilities(params, next_obs) if self.config.double_q else next_target
        next_action = ops.argmax(ops.stop_gradient(chooser) + penalty, axis=2)
        next_chosen = ops.sum(next_target * ops.one_hot(next_action, self.num_actions), axis=2)
        return self.mix(target_params, next_chosen, next_state)

    def loss(self, params: Any, target_params: Any, batch: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        q_tot = self._chosen_tot(params, batch["obs"], batch["action"], batch["state"])
        next_tot = self._next_tot(params, target_params, batch["next_obs"], batch["next_state"], batch["next_mask"])
        # n-step transitions carry their bootstrap discount gamma^k (1 - terminal); one-step ones do not
        discount = batch["discount"] if "discount" in batch else self.config.gamma * (1.0 - batch["terminal"])
        target = ops.stop_gradient(batch["reward"] + discount * next_tot)
        td = q_tot - target
        return ops.mean(td * td), {"q_tot": ops.mean(q_tot), "target": ops.mean(target)}

    def episode_loss(self, params: Any, target_params: Any, batch: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        """Mean squared TD(lambda) error over the filled steps of a batch of episodes: fields ``(B, T, ...)``,
        ``filled (B, T)`` 1 on an episode's steps, 0 on the padding after its end.

        With ``V_t`` the target's mixed value at the state after step ``t`` (double-Q greedy action) and ``d_t =
        gamma (1 - terminal_t)``, the lambda-return runs backwards from each episode's last step ``L - 1``:
        ``G_{L-1} = r_{L-1} + d_{L-1} V_{L-1}`` and ``G_t = r_t + d_t ((1 - lambda) V_t + lambda G_{t+1})``, the
        recursive form of the lambda-weighted average of the n-step returns (Sutton & Barto, 2018, eqs. 12.2-12.3;
        pymarl2's targets). A truncated episode's last step bootstraps from its last state."""
        B, T = batch["reward"].shape
        flat = lambda x: ops.reshape(x, (B * T,) + tuple(x.shape[2:]))  # noqa: E731
        q_tot = ops.reshape(self._chosen_tot(params, flat(batch["obs"]), flat(batch["action"]), flat(batch["state"])),
                            (B, T))
        next_tot = ops.reshape(self._next_tot(params, target_params, flat(batch["next_obs"]),
                                              flat(batch["next_state"]), flat(batch["next_mask"])), (B, T))
        filled, lam = batch["filled"], self.config.td_lambda
        discount = self.config.gamma * (1.0 - batch["terminal"])
        # lambda where step t + 1 belongs to the same episode, 0 at its last step (the return ends there)
        follow = lam * ops.concatenate([filled[:, 1:], ops.zeros((B, 1))], axis=1)
        step = batch["reward"] + discount * (1.0 - follow) * next_tot
        ret, returns = ops.zeros((B,)), []
        for t in range(T - 1, -1, -1):
            ret = step[:, t] + discount[:, t] * follow[:, t] * ret
            returns.append(ret)
        target = ops.stop_gradient(ops.stack(returns[::-1], axis=1))
        td = (q_tot - target) * filled
        count = ops.maximum(ops.sum(filled), 1.0)
        return ops.sum(td * td) / count, {"q_tot": ops.sum(q_tot * filled) / count,
                                          "target": ops.sum(target * filled) / count}

    def _train_step(self, params: Any, target_params: Any, opt_state: Any, batch: Mapping[str, Any]
                    ) -> tuple[Any, Any, Any]:
        loss_fn = self.episode_loss if "filled" in batch else self.loss
        (loss, aux), grads = engine.value_and_grad(loss_fn, has_aux=True)(params, target_params, batch)
        grads, grad_norm = optim.clip_by_global_norm(grads, self.config.max_grad_norm)
        params, opt_state = self.optimizer.update(grads, opt_state, params)
        return params, opt_state, dict(aux, loss=loss, grad_norm=grad_norm)

    # -- acting and learning
    def act(self, obs: np.ndarray, mask: np.ndarray, epsilon: float) -> np.ndarray:
        """Epsilon-greedy joint actions ``(n, M)`` over the legal actions ``mask (n, M, A)``."""
        q = np.asarray(self._q(self.params, obs.astype(np.float32)))
        q = np.where(mask, q, -np.inf)
        greedy = np.argmax(q, axis=2)
        if epsilon <= 0.0:  # greedy play (evaluation) draws nothing from the exploration RNG
            return np.where(mask.any(axis=2), greedy, 0)
        noise = self.rng.random(mask.shape) * mask
        explore = np.argmax(noise + mask, axis=2)
        take = self.rng.random(greedy.shape) < epsilon
        out = np.where(take, explore, greedy)
        return np.where(mask.any(axis=2), out, 0)

    def _train_steps(self, params: Any, target_params: Any, opt_state: Any, batches: tuple[Mapping[str, Any], ...]
                     ) -> tuple[Any, Any, Any]:
        """``len(batches)`` updates one after the other against the same target (one graph)."""
        for batch in batches:
            params, opt_state, aux = self._train_step(params, target_params, opt_state, batch)
        return params, opt_state, aux

    def update(self, batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        """One update on ``batch``; returns its loss, gradient norm and mean Q_tot and target."""
        return self.update_many([batch])

    def update_many(self, batches: list[Mapping[str, np.ndarray]]) -> dict[str, float]:
        """One update per batch, in order, as :meth:`update` would make them; the updates between two target
        copies run as one compiled call. Returns the last update's metrics."""
        every = self.config.target_update_every
        prepared = [{k: np.asarray(v, dtype=np.int64 if k == "action" else np.float32) for k, v in b.items()
                     if k != "indices"} for b in batches]
        i, aux = 0, {}
        while i < len(prepared):
            k = min(len(prepared) - i, every - self.updates % every)
            self.params, self.opt_state, aux = self._steps(self.params, self.target_params, self.opt_state,
                                                           tuple(prepared[i:i + k]))
            self.updates += k
            i += k
            if self.updates % every == 0:
                self.target_params = engine.tree_map(np.copy, self.params)
        return {k: float(v) for k, v in aux.items()}

    def greedy_q_tot(self, obs: np.ndarray, state: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """``(n,)`` joint value of the greedy joint action (for inspection, e.g. the two-step game's table)."""
        q = np.asarray(self._q(self.params, obs.astype(np.float32)))
        if mask is not None:
            q = np.where(mask, q, -np.inf)
        return np.asarray(self.mix(self.params, q.max(axis=2).astype(np.float32), state.astype(np.float32)))

    def q_tot(self, obs: np.ndarray, state: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """``(n,)`` joint value of the joint actions ``actions (n, M)``."""
        q = np.asarray(self._q(self.params, obs.astype(np.float32)))
        chosen = np.take_along_axis(q, actions[..., None], axis=2)[..., 0]
        return np.asarray(self.mix(self.params, chosen.astype(np.float32), state.astype(np.float32)))

    def state_dict(self) -> dict[str, Any]:
        # copies: the next update may write the new parameters and Adam moments into these arrays (donated)
        copy = lambda tree: engine.tree_map(np.copy, tree)  # noqa: E731
        return {"params": copy(self.params), "target_params": copy(self.target_params), "opt_state": copy(self.opt_state),
                "updates": self.updates, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        as_arrays = lambda tree: engine.tree_map(lambda a: np.array(a, copy=True), tree)  # noqa: E731
        self.params, self.target_params = as_arrays(state["params"]), as_arrays(state["target_params"])
        self.opt_state = as_arrays(state["opt_state"])
        self.updates = int(state["updates"])
        self.rng.bit_generator.state = rng_state_from_checkpoint(state["rng"])


class ValueDecompositionTrainer:
    """VDN/QMIX learning on a :class:`~fedarena.envs.pettingzoo_batch.ParallelEnvBatch` of a cooperative task.

    The team reward of a step is the mean of the agents' rewards (MPE's ``simple_spread`` gives every agent
    the shared coverage reward plus its own collision penalty; the two-step game gives all the same reward).
    A transition ends in a terminal state when every agent terminated; truncated episodes bootstrap from
    their last observation (all actions legal there).
    """

    def __init__(self, env: Any, config: ValueDecompositionConfig, seed: int = 0, episode_limit: int | None = None
                 ) -> None:
        from fedarena.rl.normalization import RunningMeanStd
        from fedarena.rl.replay import ReplayBuffer

        if config.buffer == "episode" and (episode_limit is None or episode_limit < 1):
            raise ValueError(f"episode_limit: buffer: episode needs the task's longest episode (steps), got "
                             f"{episode_limit!r}")
        self.env, self.config = env, config
        self.episode_limit = episode_limit
        self.obs, self.mask, self.state = env.reset()
        self.learner = ValueDecomposition(env.obs_size, self.state.shape[1], env.num_agents, env.num_actions,
                                          config, seed)
        self.buffer = ReplayBuffer(config.buffer_size, seed=np.random.default_rng([seed, 1]))
        self.reward_stats = RunningMeanStd(())
        # n-step targets: the last steps' transitions (fields with the copies first) whose n-step return is not
        # complete yet, and per copy how many of the newest of them are still open (since its episode began)
        self._window: list[dict[str, np.ndarray]] = []
        self._open = np.zeros(env.num_envs, dtype=np.int64)
        # episode buffer: per copy, the steps of its running episode (fields (copies, episode_limit, ...)) and
        # how many there are; a buffer item is one episode padded to episode_limit steps
        self._episode: dict[str, np.ndarray] = {}
        self._length = np.zeros(env.num_envs, dtype=np.int64)
        self.env_steps = 0
        self.episodes = 0
        self.last_metrics: dict[str, float] = {}

    def reset_episodes(self) -> None:
        """Start fresh episodes on every copy (``env.reset()``); the replay buffer keeps its transitions. With
        n-step targets the cut episodes' open transitions are stored first, bootstrapping from where they stop."""
        self._emit_open(np.ones(self.env.num_envs, dtype=bool))
        self._emit_episodes(self._length > 0)
        self.obs, self.mask, self.state = self.env.reset()

    def _add(self, transitions: dict[str, np.ndarray], episode_end: np.ndarray) -> None:
        """Store one batched step's transitions: as they are (one-step targets) or, with ``n_step > 1``, each
        once its n-step return is complete (n steps later or when its episode ends)."""
        n = self.config.n_step
        if self.config.buffer == "episode":
            self._add_episode_step(transitions, episode_end)
            return
        if n == 1:
            self.buffer.add(transitions)
            return
        self._window.append(transitions)
        self._open += 1
        self._emit_open(episode_end)
        self._emit_oldest(self._open == n)
        self._window = self._window[-(n - 1):]

    def _add_episode_step(self, transitions: dict[str, np.ndarray], episode_end: np.ndarray) -> None:
        """Append one batched step to every copy's running episode; store the episodes that ended."""
        T, copies = self.episode_limit, np.arange(self.env.num_envs)
        if not self._episode:
            self._episode = {f: np.zeros((len(copies), T) + a.shape[1:], dtype=a.dtype) for f, a in transitions.items()}
        if np.any(self._length >= T):
            raise RuntimeError(f"episode_limit: an episode ran past {T} steps; give the task's longest episode")
        for f, a in transitions.items():
            self._episode[f][copies, self._length] = a
        self._length += 1
        self._emit_episodes(episode_end)

    def _emit_episodes(self, copies_mask: np.ndarray) -> None:
        """Store the running episodes of the copies in ``copies_mask`` (ended or cut), zero-padded after their
        last step, with ``filled`` 1 on their steps."""
        copies = np.flatnonzero(copies_mask & (self._length > 0))
        if len(copies):
            filled = np.arange(self.episode_limit)[None, :] < self._length[copies, None]
            pad = lambda a: a * filled.reshape(filled.shape + (1,) * (a.ndim - 2)).astype(a.dtype)  # noqa: E731
            episodes = {f: pad(a[copies]) for f, a in self._episode.items()}
            episodes["filled"] = filled.astype(np.float32)
            self.buffer.add(episodes)
        self._length[copies_mask] = 0

    def _n_step(self, first: int, copies: np.ndarray) -> dict[str, np.ndarray]:
        """The transitions of ``copies`` that start at window entry ``first`` and run to the newest entry."""
        g, steps = self.config.gamma, self._window[first:]
        last, start = steps[-1], steps[0]
        ret = sum(g ** i * s["reward"][copies] for i, s in enumerate(steps))
        k = len(steps)
        out = {f: start[f][copies] for f in ("obs", "state", "action")}
        out.update({f: last[f][copies] for f in ("next_obs", "next_state", "next_mask", "terminal")})
        out["reward"] = ret.astype(np.float32)
        out["discount"] = (g ** k * (1.0 - last["terminal"][copies])).astype(np.float32)
        out["reward_weight"] = np.full(len(copies), sum(g ** i for i in range(k)), dtype=np.float32)
        return out

    def _emit_open(self, copies_mask: np.ndarray) -> None:
        """Store every open transition of the copies in ``copies_mask`` (their episodes ended or were cut)."""
        L = len(self._window)
        for count in range(1, self.config.n_step + 1):
            copies = np.flatnonzero(copies_mask & (self._open == count))
            for j in range(count) if len(copies) else ():
                self.buffer.add(self._n_step(L - count + j, copies))
        self._open[copies_mask] = 0

    def _emit_oldest(self, copies_mask: np.ndarray) -> None:
        """Store the oldest open transition of the copies in ``copies_mask`` (it has its n steps)."""
        copies = np.flatnonzero(copies_mask)
        if len(copies):
            self.buffer.add(self._n_step(len(self._window) - self.config.n_step, copies))
            self._open[copies] -= 1

    def state_dict(self) -> dict[str, Any]:
        """Learner (networks, target, Adam, update count, exploration RNG), replay buffer, counters and, for
        n-step targets or the episode buffer, the transitions not stored yet. The environments are not part of it:
        a resumed run starts fresh episodes (:meth:`reset_episodes`), which first stores those transitions."""
        window = {f: np.stack([w[f] for w in self._window]) for f in self._window[0]} if self._window else {}
        return {"learner": self.learner.state_dict(), "buffer": self.buffer.state_dict(),
                "reward_stats": self.reward_stats.state(), "env_steps": self.env_steps, "episodes": self.episodes,
                "last_metrics": dict(self.last_metrics), "n_step_window": window, "n_step_open": self._open.copy(),
                "episode_steps": {f: a.copy() for f, a in self._episode.items()}, "episode_length": self._length.copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.learner.load_state_dict(state["learner"])
        self.buffer.load_state_dict(state["buffer"])
        self.reward_stats.load(state["reward_stats"])
        self.env_steps, self.episodes = int(state["env_steps"]), int(state["episodes"])
        self.last_metrics = {k: float(v) for k, v in state["last_metrics"].items()}
        window = state.get("n_step_window") or {}  # absent in checkpoints written before n-step targets
        steps = len(next(iter(window.values()))) if window else 0
        self._window = [{f: np.array(a[i]) for f, a in window.items()} for i in range(steps)]
        self._open = np.array(state.get("n_step_open", np.zeros(self.env.num_envs)), dtype=np.int64)
        # absent in checkpoints written before the episode buffer
        self._episode = {f: np.array(a) for f, a in (state.get("episode_steps") or {}).items()}
        self._length = np.array(state.get("episode_length", np.zeros(self.env.num_envs)), dtype=np.int64)

    def step(self) -> np.ndarray:
        """One batched step of every copy plus, every ``update_every`` batched steps, ``updates_per_step``
        updates; returns the team returns of the episodes that ended."""
        c, env = self.config, self.env
        actions = self.learner.act(self.obs, self.mask, c.epsilon(self.env_steps))
        st = env.step(actions)
        alive = np.maximum(st.alive.sum(axis=1), 1)
        team_reward = (st.reward * st.alive).sum(axis=1) / alive
        finished = (st.terminated | st.truncated)[:, :, None]
        next_obs = np.where(finished, st.final_obs, st.obs)
        next_state = np.where(st.episode_end[:, None], st.final_state, st.state)
        next_mask = np.where(finished, True, st.action_mask)
        terminal = st.episode_end & st.terminated.any(axis=1) & ~st.truncated.any(axis=1)
        self._add({"obs": self.obs, "state": self.state, "action": actions, "reward": team_reward,
                   "next_obs": next_obs, "next_state": next_state, "next_mask": next_mask,
                   "terminal": terminal.astype(np.float32)}, st.episode_end)
        self.obs, self.mask, self.state = st.obs, st.action_mask, st.state
        self.env_steps += env.num_envs
        self.reward_stats.update(team_reward)
        if len(self.buffer) >= max(c.learning_starts, c.batch_size) \
                and (self.env_steps // env.num_envs) % c.update_every == 0:
            if c.updates_per_step:  # every update's batch drawn at once, the updates in one compiled call
                B = c.batch_size
                batch = self.buffer.sample(B * c.updates_per_step)
                weight = batch.pop("reward_weight", 1.0)  # n-step returns: sum_i gamma^i over their rewards
                if c.standardise_rewards:
                    std = np.sqrt(self.reward_stats.var + 1e-8)
                    # an n-step return of standardised rewards: its mean shifts by the sum of its discounts
                    batch = dict(batch, reward=(batch["reward"] - self.reward_stats.mean * weight) / std)
                self.last_metrics = self.learner.update_many(
                    [{k: v[u * B:(u + 1) * B] for k, v in batch.items()} for u in range(c.updates_per_step)])
        finished = st.episode_return[st.episode_end]
        self.episodes += len(finished)
        return finished.mean(axis=1) if len(finished) else np.zeros(0)
