"""MAPPO (Yu et al., 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games") on the
vectorised MPE (:class:`fedarena.envs.mpe.MPEVecEnv`), with heterogeneous agents.

Agents are split into groups of one type (the name without its index: ``speaker``/``listener``,
``adversary``/``agent``, ...); agents of a group share one actor and one critic (parameter sharing within
the group, with a one-hot of the agent's index in its group as an extra input when the group has several
agents). ``share="all"`` puts every agent in one group (their observation sizes and action counts must then
agree); ``share="none"`` gives each agent its own networks. Each agent acts on its own observation
(decentralised execution); the critic sees the global state -- every agent's observation concatenated
(the paper's "CL" state for MPE) plus the one-hot of the agent among all agents -- or, with
``centralised_critic=False``, the agent's own observation (IPPO, de Witt et al., 2020, with the same code).

Following the paper's MPE settings: GAE (gamma 0.99, lambda 0.95), clipped ratio (0.2), entropy 0.01,
10 epochs over one minibatch, Adam 7e-4 (eps 1e-5) for actor and critic, each network's gradient clipped
to norm 10, value normalisation (the critic predicts returns standardised by a debiased running mean and
variance with decay 0.99999, "ValueNorm"), a clipped Huber value loss (delta 10), ReLU MLPs with an output
gain of 0.01 on the policy head. Episodes cut by ``max_cycles`` bootstrap with the critic's value of the last
state. Differences from the paper: feed-forward networks (the paper's MPE runs use recurrent ones), no input
layer normalisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from fedarena import engine
from fedarena.engine import initializers, nn, ops, optim
from fedarena.envs.mpe import MPEVecEnv
from fedarena.envs.overcooked import OvercookedVecEnv, is_overcooked
from fedarena.marl.value_decomposition import rng_state_from_checkpoint
from fedarena.platform.experiment import param
from fedarena.rl.returns import gae

SHARING = ("group", "all", "none")


@dataclass(frozen=True)
class MAPPOConfig:
    num_steps: int = param(25, "rollout length per env copy before each update (one MPE episode by default)")
    update_epochs: int = param(10, "passes over each rollout (the paper's ppo_epoch for MPE)")
    num_minibatches: int = param(1, "minibatches per epoch (the paper: 1)")
    learning_rate: float = param(7e-4, "Adam learning rate of actor and critic")
    gamma: float = param(0.99, "discount factor")
    gae_lambda: float = param(0.95, "GAE lambda")
    clip_coef: float = param(0.2, "PPO ratio clipping; also the value clipping range")
    ent_coef: float = param(0.01, "entropy bonus coefficient")
    vf_coef: float = param(1.0, "value loss coefficient")
    huber_delta: float = param(10.0, "Huber value loss threshold")
    max_grad_norm: float = param(10.0, "per-network gradient-norm clipping")
    value_norm: bool = param(True, "value normalisation (ValueNorm: the critic predicts standardised returns)")
    hidden: tuple[int, ...] = param((64, 64), "hidden layer sizes of actor and critic (ReLU)")
    share: str = param("group", "parameter sharing: group (one network per agent type), all (one network; "
                       "needs equal observation sizes and action counts), none (one per agent)")
    centralised_critic: bool = param(True, "critic on the global state (MAPPO); false: on the agent's own "
                                     "observation (IPPO)")

    def __post_init__(self) -> None:
        checks = {"num_steps": self.num_steps >= 1, "update_epochs": self.update_epochs >= 1,
                  "num_minibatches": self.num_minibatches >= 1, "learning_rate": self.learning_rate > 0,
                  "gamma": 0.0 <= self.gamma <= 1.0, "gae_lambda": 0.0 <= self.gae_lambda <= 1.0,
                  "clip_coef": self.clip_coef > 0, "huber_delta": self.huber_delta > 0,
                  "max_grad_norm": self.max_grad_norm > 0, "hidden": all(h >= 1 for h in self.hidden)}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"mappo.{name}: invalid value {getattr(self, name)!r}")
        if self.share not in SHARING:
            raise ValueError(f"mappo.share: expected one of {', '.join(SHARING)}, got '{self.share}'")


def agent_type(name: str) -> str:
    """``"adversary_2"`` -> ``"adversary"``: the name without its trailing index."""
    base, _, idx = name.rpartition("_")
    return base if base and idx.isdigit() else name


def agent_groups(agents: list[str], obs_sizes: list[int], action_sizes: list[int], share: str) -> list[list[int]]:
    """Agent indices per network, by ``share``; raises ``ValueError`` (one line) where one network cannot
    take a group's agents."""
    if share == "none":
        return [[i] for i in range(len(agents))]
    keys = [agent_type(a) for a in agents] if share == "group" else ["all"] * len(agents)
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    for members in groups.values():
        if len({obs_sizes[i] for i in members}) > 1 or len({action_sizes[i] for i in members}) > 1:
            detail = ", ".join(f"{agents[i]}: {obs_sizes[i]} obs / {action_sizes[i]} actions" for i in members)
            raise ValueError(f"mappo.share: '{share}' puts agents of different observation sizes or action counts "
                             f"in one network ({detail}); use share: group or none")
    return list(groups.values())


class ValueNorm:
    """Running mean and variance of value targets with decay ``beta`` and bias correction (MAPPO's ValueNorm)."""

    def __init__(self, beta: float = 0.99999, epsilon: float = 1e-5) -> None:
        self.beta, self.epsilon = beta, epsilon
        self.mean = self.mean_sq = self.debias = 0.0

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64)
        self.mean = self.beta * self.mean + (1 - self.beta) * float(x.mean())
        self.mean_sq = self.beta * self.mean_sq + (1 - self.beta) * float(np.square(x).mean())
        self.debias = self.beta * self.debias + (1 - self.beta)

    def stats(self) -> tuple[float, float]:
        d = max(self.debias, self.epsilon)
        mean = self.mean / d
        var = max(self.mean_sq / d - mean * mean, 1e-2)
        return mean, float(np.sqrt(var))

    def normalize(self, x: np.ndarray) -> np.ndarray:
        m, s = self.stats()
        return (x - m) / s

    def denormalize(self, x: np.ndarray) -> np.ndarray:
        m, s = self.stats()
        return x * s + m

    def state(self) -> dict[str, float]:
        return {"mean": self.mean, "mean_sq": self.mean_sq, "debias": self.debias}

    def load(self, s: Mapping[str, Any]) -> None:
        self.mean, self.mean_sq, self.debias = float(s["mean"]), float(s["mean_sq"]), float(s["debias"])


class _Group:
    """One shared actor and critic for the agents ``members``; builds their inputs from per-agent arrays."""

    def __init__(self, members: list[int], env: MPEVecEnv, cfg: MAPPOConfig, rng: np.random.Generator) -> None:
        self.members, self.cfg = members, cfg
        A = env.num_agents
        self.obs_size = env.observation_sizes[members[0]]
        self.num_actions = env.action_sizes[members[0]]
        self.ids = np.eye(len(members), dtype=np.float32) if len(members) > 1 else np.zeros((1, 0), np.float32)
        self.agent_ids = np.eye(A, dtype=np.float32)[members]
        actor_in = self.obs_size + self.ids.shape[1]
        critic_in = (env.state_size + A) if cfg.centralised_critic else actor_in
        orth = initializers.orthogonal  # the paper's initialisation: orthogonal, zero biases
        self.actor = nn.MLP((actor_in,) + tuple(cfg.hidden) + (self.num_actions,), activation="relu",
                            w_init=orth(np.sqrt(2)), b_init=initializers.zeros(), last_w_init=orth(0.01))
        self.critic = nn.MLP((critic_in,) + tuple(cfg.hidden) + (1,), activation="relu",
                             w_init=orth(np.sqrt(2)), b_init=initializers.zeros(), last_w_init=orth(1.0))
        self.params = {"actor": self.actor.init(rng), "critic": self.critic.init(rng)}
        self.optimizer = optim.adam(cfg.learning_rate, eps=1e-5)
        self.opt_state = self.optimizer.init(self.params)
        self.value_norm = ValueNorm()
        self._policy = engine.jit(lambda p, x: self.actor.apply(p["actor"], x))
        self._value = engine.jit(lambda p, x: self.critic.apply(p["critic"], x))
        self._step = engine.jit(self._train_step)

    # -- inputs: rows are (copy, member) flattened, copy-major
    def actor_inputs(self, obs: list[np.ndarray]) -> np.ndarray:
        x = np.stack([obs[i] for i in self.members], axis=1)  # (n, g, D)
        n, g = x.shape[:2]
        ids = np.broadcast_to(self.ids, (n, g, self.ids.shape[1]))
        return np.concatenate([x, ids], axis=2).reshape(n * g, -1).astype(np.float32)

    def critic_inputs(self, obs: list[np.ndarray], state: np.ndarray) -> np.ndarray:
        if not self.cfg.centralised_critic:
            return self.actor_inputs(obs)
        n, g = len(state), len(self.members)
        s = np.broadcast_to(state[:, None], (n, g, state.shape[1]))
        ids = np.broadcast_to(self.agent_ids, (n, g, self.agent_ids.shape[1]))
        return np.concatenate([s, ids], axis=2).reshape(n * g, -1).astype(np.float32)

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._policy(self.params, x), dtype=np.float64)

    def values(self, x: np.ndarray) -> np.ndarray:
        """Critic values in return units (denormalised with ValueNorm)."""
        v = np.asarray(self._value(self.params, x), dtype=np.float64)[:, 0]
        return self.value_norm.denormalize(v) if self.cfg.value_norm else v

    # -- learning
    def loss(self, params: Any, mb: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        c = self.cfg
        logp_all = ops.log_softmax(self.actor.apply(params["actor"], mb["obs"]), axis=1)
        new_logp = ops.sum(logp_all * mb["action_onehot"], axis=1)
        entropy = ops.mean(-ops.sum(ops.exp(logp_all) * logp_all, axis=1))
        ratio = ops.exp(new_logp - mb["log_prob"])
        adv = mb["advantage"]
        pg_loss = -ops.mean(ops.minimum(ratio * adv, ops.clip(ratio, 1.0 - c.clip_coef, 1.0 + c.clip_coef) * adv))
        v = ops.reshape(self.critic.apply(params["critic"], mb["critic_in"]), (-1,))
        v_clipped = mb["value"] + ops.clip(v - mb["value"], -c.clip_coef, c.clip_coef)

        def huber(e: Any) -> Any:
            a = ops.abs(e)
            return ops.where(a <= c.huber_delta, 0.5 * e * e, c.huber_delta * (a - 0.5 * c.huber_delta))

        v_loss = ops.mean(ops.maximum(huber(mb["target"] - v), huber(mb["target"] - v_clipped)))
        loss = pg_loss - c.ent_coef * entropy + c.vf_coef * v_loss
        return loss, {"pg_loss": pg_loss, "v_loss": v_loss, "entropy": entropy}

    def _train_step(self, params: Any, opt_state: Any, mb: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        (loss, aux), grads = engine.value_and_grad(self.loss, has_aux=True)(params, mb)
        ga, na = optim.clip_by_global_norm(grads["actor"], self.cfg.max_grad_norm)
        gc, nc = optim.clip_by_global_norm(grads["critic"], self.cfg.max_grad_norm)
        params, opt_state = self.optimizer.update({"actor": ga, "critic": gc}, opt_state, params)
        return params, opt_state, dict(aux, loss=loss, actor_grad_norm=na, critic_grad_norm=nc)

    def update(self, roll: Mapping[str, np.ndarray], rng: np.random.Generator) -> dict[str, float]:
        c = self.cfg
        adv, returns = gae(roll["reward"], roll["value"], roll["bootstrap"], roll["discount"], c.gae_lambda)
        T, N = roll["reward"].shape
        if c.value_norm:
            self.value_norm.update(returns)
            target = self.value_norm.normalize(returns)
            old_v = self.value_norm.normalize(roll["value"])  # the critic's own outputs (normalised units)
        else:
            target, old_v = returns, roll["value"]
        flat = lambda a: np.asarray(a).reshape((T * N,) + np.shape(a)[2:])  # noqa: E731
        adv = flat(adv)
        data = {"obs": flat(roll["obs"]), "critic_in": flat(roll["critic_in"]),
                "action_onehot": np.eye(self.num_actions, dtype=np.float32)[flat(roll["action"])],
                "log_prob": flat(roll["log_prob"]).astype(np.float32),
                "advantage": ((adv - adv.mean()) / (adv.std() + 1e-5)).astype(np.float32),
                "value": flat(old_v).astype(np.float32), "target": flat(target).astype(np.float32)}
        size = T * N // c.num_minibatches
        sums: dict[str, float] = {}
        for _ in range(c.update_epochs):
            perm = rng.permutation(T * N)
            for k in range(c.num_minibatches):
                idx = perm[k * size:(k + 1) * size]
                self.params, self.opt_state, aux = self._step(self.params, self.opt_state,
                                                              {key: v[idx] for key, v in data.items()})
                for key, v in aux.items():
                    sums[key] = sums.get(key, 0.0) + float(v) / (c.update_epochs * c.num_minibatches)
        return sums


class MAPPO:
    """MAPPO (or IPPO with ``centralised_critic=False``) on ``num_envs`` copies of an MPE scenario or an Overcooked
    layout (``overcooked.<layout>``, :mod:`fedarena.envs.overcooked`)."""

    def __init__(self, env_id: str, num_envs: int, config: MAPPOConfig, seed: int = 0, max_cycles: int = 25,
                 eval_envs: int = 16, **scenario_kwargs: Any) -> None:
        self.config = config
        if is_overcooked(env_id):  # evaluated on the sparse (delivery) reward only
            self.env: Any = OvercookedVecEnv(env_id, num_envs, max_cycles=max_cycles, seed=seed, **scenario_kwargs)
            self.eval_env: Any = OvercookedVecEnv(env_id, eval_envs, max_cycles=max_cycles, seed=10_000 + seed,
                                                  **dict(scenario_kwargs, shaped_reward_coef=0.0))
        else:
            self.env = MPEVecEnv(env_id, num_envs, max_cycles=max_cycles, seed=seed, **scenario_kwargs)
            self.eval_env = MPEVecEnv(env_id, eval_envs, max_cycles=max_cycles, seed=10_000 + seed, **scenario_kwargs)
        e = self.env
        self.group_members = agent_groups(list(e.agents), e.observation_sizes, e.action_sizes, config.share)
        init_rng = np.random.default_rng([seed, 0])
        self.groups = [_Group(m, e, config, init_rng) for m in self.group_members]
        self.rng = np.random.default_rng([seed, 1])
        self.seed = seed
        self.obs = e.reset(seed)
        self._returns = np.zeros((num_envs, e.num_agents))
        self.env_steps = 0
        self.episodes = 0
        self.greedy_by_type: dict[str, float] = {}

    def reset_episodes(self, seed: int | None = None) -> None:
        self.obs = self.env.reset(seed)
        self._returns[:] = 0.0

    def _act(self, obs: list[np.ndarray], greedy: bool = False) -> tuple[list[np.ndarray], list[dict[str, np.ndarray]]]:
        n = len(obs[0])
        actions: list[np.ndarray] = [np.zeros(0)] * self.env.num_agents
        state = np.concatenate(obs, axis=1) if self.config.centralised_critic else None
        outs = []
        for g in self.groups:
            x = g.actor_inputs(obs)
            logits = g.logits(x)
            z = logits - logits.max(axis=1, keepdims=True)
            logp_all = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            if greedy:
                a = logits.argmax(axis=1)
            else:
                u = self.rng.random((len(x), 1))
                a = np.minimum((np.exp(logp_all).cumsum(axis=1) < u).sum(axis=1), logits.shape[1] - 1)
            a2 = a.reshape(n, len(g.members))
            for k, i in enumerate(g.members):
                actions[i] = a2[:, k]
            if not greedy:
                ci = g.critic_inputs(obs, state)
                outs.append({"obs": x, "critic_in": ci, "action": a, "log_prob": logp_all[np.arange(len(a)), a],
                             "value": g.values(ci)})
        return actions, outs

    def _rows(self, g: _Group, a: np.ndarray) -> np.ndarray:
        """``(n, A)`` per-agent numbers -> the group's rows (copy-major, as its inputs)."""
        return a[:, g.members].reshape(-1)

    def iteration(self) -> tuple[np.ndarray, dict[str, float]]:
        """One rollout of ``num_steps`` batched steps and one update per group; returns the team returns (mean
        over agents) of the episodes finished in it."""
        c, env = self.config, self.env
        buf: list[dict[str, list]] = [{k: [] for k in ("obs", "critic_in", "action", "log_prob", "value", "reward",
                                                       "discount")} for _ in self.groups]
        finished = []
        for _ in range(c.num_steps):
            actions, outs = self._act(self.obs)
            st = env.step(actions)
            reward = st.reward.copy()
            done = st.terminated | st.truncated
            self._returns += st.reward
            cut = st.truncated & ~st.terminated
            if cut.any():  # bootstrap the cut episodes with the critic's value of their last state
                state = np.concatenate(st.obs, axis=1) if c.centralised_critic else None
                for g in self.groups:
                    v = g.values(g.critic_inputs(st.obs, state)).reshape(-1, len(g.members))
                    reward[:, g.members] += c.gamma * v * cut[:, g.members]
            for g, o, b in zip(self.groups, outs, buf):
                for k in ("obs", "critic_in", "action", "log_prob", "value"):
                    b[k].append(o[k])
                b["reward"].append(self._rows(g, reward))
                b["discount"].append(c.gamma * (1.0 - self._rows(g, done)))
            self.env_steps += env.num_envs
            if done.all(axis=1).any():  # copies end together (MPE): new episodes in every copy
                finished.append(self._returns.mean(axis=1))
                self._returns[:] = 0.0
                self.obs = env.reset()
            else:
                self.obs = st.obs
        metrics: dict[str, float] = {}
        _, last = self._act(self.obs)
        for g, b, o in zip(self.groups, buf, last):
            roll = {k: np.stack(v) for k, v in b.items()}
            roll["bootstrap"] = o["value"]
            for k, v in g.update(roll, self.rng).items():
                metrics[k] = metrics.get(k, 0.0) + v / len(self.groups)
        returns = np.concatenate(finished) if finished else np.zeros(0)
        self.episodes += len(returns)
        return returns, metrics

    def greedy_return(self, episodes: int, random_agents: tuple[str, ...] = ()) -> float:
        """Mean team return (mean over agents) of ``episodes`` episodes on the evaluation copies (same starts
        each call), every agent acting greedily except those in ``random_agents``, which act uniformly at
        random. The mean return of each agent type is left in :attr:`greedy_by_type`."""
        env, out = self.eval_env, []
        rng = np.random.default_rng(12345)
        obs = env.reset(10_000 + self.seed)
        while len(out) < episodes:
            if out:
                obs = env.reset()
            total = np.zeros((env.num_envs, env.num_agents))
            for _ in range(env.max_cycles):
                actions, _ = self._act(obs, greedy=True)
                for i, a in enumerate(env.agents):
                    if a in random_agents:
                        actions[i] = rng.integers(0, env.action_sizes[i], env.num_envs)
                st = env.step(actions)
                total += st.reward
                obs = st.obs
            out.extend(total.tolist())
        per_agent = np.array(out[:episodes])
        types = [agent_type(a) for a in env.agents]
        self.greedy_by_type = {t: float(per_agent[:, [i for i, u in enumerate(types) if u == t]].mean())
                               for t in dict.fromkeys(types)}
        return float(per_agent.mean())

    def state_dict(self) -> dict[str, Any]:
        return {"groups": [{"params": g.params, "opt_state": g.opt_state, "value_norm": g.value_norm.state()}
                           for g in self.groups],
                "rng": self.rng.bit_generator.state, "env_rng": self.env.rng.bit_generator.state,
                "env_steps": self.env_steps, "episodes": self.episodes}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if len(state["groups"]) != len(self.groups):
            raise ValueError(f"state: {len(state['groups'])} groups saved, this run has {len(self.groups)}")
        copy = lambda tree: engine.tree_map(lambda a: np.array(a, copy=True), tree)  # noqa: E731
        for g, s in zip(self.groups, state["groups"]):
            g.params, g.opt_state = copy(s["params"]), copy(s["opt_state"])
            g.value_norm.load(s["value_norm"])
        self.rng.bit_generator.state = rng_state_from_checkpoint(state["rng"])
        self.env.rng.bit_generator.state = rng_state_from_checkpoint(state["env_rng"])
        self.env_steps, self.episodes = int(state["env_steps"]), int(state["episodes"])
        if isinstance(self.env, OvercookedVecEnv):  # the shaped-reward anneal's clock
            self.env.total_steps = self.env_steps
