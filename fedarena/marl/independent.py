"""Independent PPO (IPPO; de Witt et al., 2020, "Is independent learning all you need in the StarCraft
multi-agent challenge?") on PettingZoo parallel environments, and the action-masked PPO it and self-play use.

Every agent learns with :class:`fedarena.rl.ppo.PPO` from its own reward, treating the others as part of
the environment. ``shared=True``: one network for all agents, fed the observation plus a one-hot agent id
(parameter sharing; Gupta et al., 2017); ``shared=False``: one PPO learner per agent. Legal-action masks are
appended to the network input and added to the logits as ``log(mask)`` (``-1e9`` on illegal actions), so
sampling, log-probabilities and entropies in PPO's loss are those of the masked distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np
from gymnasium import spaces

from fedarena import engine
from fedarena.marl.value_decomposition import rng_state_from_checkpoint
from fedarena.rl.ppo import PPO, PPOConfig

ILLEGAL_LOGIT = -1e9


@dataclass(frozen=True)
class MaskedActorCritic:
    """An :class:`fedarena.rl.networks.ActorCritic` whose input ends with the ``num_actions`` legal-action
    mask; illegal actions get logit ``-1e9``."""

    base: Any
    num_actions: int

    def init(self, rng: np.random.Generator) -> Any:
        return self.base.init(rng)

    def policy(self, params: Any, x: Any) -> tuple[Any, ...]:
        (logits,) = self.base.policy(params, x)
        mask = x[:, x.shape[1] - self.num_actions:]
        return (logits + (1.0 - mask) * ILLEGAL_LOGIT,)

    def value(self, params: Any, x: Any) -> Any:
        return self.base.value(params, x)


def masked_ppo(feature_size: int, num_actions: int, config: PPOConfig, seed: int = 0,
               total_steps: int | None = None) -> PPO:
    """A PPO learner over inputs ``[features (feature_size), legal mask (num_actions)]``."""
    space = spaces.Box(-np.inf, np.inf, (feature_size + num_actions,), dtype=np.float32)
    ppo = PPO(space, spaces.Discrete(num_actions), config, seed=seed, total_steps=total_steps)
    ppo.net = MaskedActorCritic(ppo.net, num_actions)  # same parameters; traced on the first call
    return ppo


def sample_actions(ppo: PPO, x: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(actions, log_probs, values)`` for inputs ``x (B, F + A)``."""
    (logits,), value = ppo.forward(ppo.learner.params, x.astype(np.float32))
    logits = np.asarray(logits, dtype=np.float64)
    actions = ppo.dist.sample(logits, rng)
    return actions, ppo.dist.log_prob_np(logits, actions), np.asarray(value, dtype=np.float64)


class IndependentPPO:
    """IPPO on a :class:`~fedarena.envs.pettingzoo_batch.ParallelEnvBatch`; :meth:`iteration` collects
    ``ppo.num_steps`` batched steps and updates. ``ppo.num_envs`` is ignored: the batch is the env's copies
    (times the agents when ``shared``). Agents must stay alive until their episode ends (MPE tasks do).
    ``total_steps``: the environment-step budget over which ``anneal_lr`` takes the learning rate to 0; a
    shared network's rollout holds ``agents`` rows per environment step, so its PPO learner counts
    ``total_steps x agents`` rows (counting environment steps as rows annealed the rate to 0 after a third of
    the budget on 3-agent simple_spread). ``bootstrap_truncated``: a truncated episode's last reward gets
    ``gamma V(final observation)`` added (the infinite-horizon return, Pardo et al., 2018); ``False`` treats the
    time limit as terminal, the return of the episode as played (as JaxMARL's IPPO baseline)."""

    def __init__(self, env: Any, ppo: PPOConfig, shared: bool = True, seed: int = 0,
                 total_steps: int | None = None, bootstrap_truncated: bool = True) -> None:
        self.env, self.shared = env, shared
        self.bootstrap_truncated = bootstrap_truncated
        n, M = env.num_envs, env.num_agents
        rows = n * M if shared else n
        cfg = replace(ppo, num_envs=rows)
        self.config = cfg
        features = env.obs_size + (M if shared else 0)
        rows_total = None if total_steps is None else int(total_steps) * (M if shared else 1)
        self.learners = [masked_ppo(features, env.num_actions, cfg, seed=seed + k, total_steps=rows_total)
                         for k in range(1 if shared else M)]
        self.rng = np.random.default_rng([seed, 2])
        self.obs, self.mask, _ = env.reset()
        self._ids = np.eye(M, dtype=np.float32)
        self.env_steps = 0
        self.episodes = 0

    def reset_episodes(self) -> None:
        """Start fresh episodes on every copy (``env.reset()``)."""
        self.obs, self.mask, _ = self.env.reset()

    def state_dict(self) -> dict[str, Any]:
        """Every PPO learner (parameters, Adam state, update count, RNG, normalization statistics), the acting
        RNG and the counters. The environments are not part of it: a resumed run starts fresh episodes."""
        return {"learners": [{"params": p.learner.params, "opt_state": p.learner.opt_state,
                              "version": p.learner.version, "rng": p.rng.bit_generator.state,
                              "normalization": p.normalization_state()} for p in self.learners],
                "rng": self.rng.bit_generator.state, "env_steps": self.env_steps, "episodes": self.episodes}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if len(state["learners"]) != len(self.learners):
            raise ValueError(f"state: {len(state['learners'])} PPO learners saved, this run has {len(self.learners)}")
        copy = lambda tree: engine.tree_map(lambda a: np.array(a, copy=True), tree)  # noqa: E731
        for p, s in zip(self.learners, state["learners"]):
            p.learner.set_state(copy(s["params"]), copy(s["opt_state"]), int(s["version"]))
            p.rng.bit_generator.state = rng_state_from_checkpoint(s["rng"])
            p.load_normalization_state(s["normalization"])
        self.rng.bit_generator.state = rng_state_from_checkpoint(state["rng"])
        self.env_steps, self.episodes = int(state["env_steps"]), int(state["episodes"])

    def _inputs(self, obs: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
        """Per learner: its input rows ``(rows, F + A)``."""
        n, M = obs.shape[:2]
        if self.shared:
            ids = np.broadcast_to(self._ids, (n, M, M))
            return [np.concatenate([obs, ids, mask], axis=2).reshape(n * M, -1).astype(np.float32)]
        return [np.concatenate([obs[:, k], mask[:, k]], axis=1).astype(np.float32) for k in range(M)]

    def _split(self, a: np.ndarray) -> list[np.ndarray]:
        """``(n, M, ...)`` -> per learner rows."""
        n, M = a.shape[:2]
        return [a.reshape((n * M,) + a.shape[2:])] if self.shared else [a[:, k] for k in range(M)]

    def act(self, obs: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, list, list, list]:
        n, M = obs.shape[:2]
        xs = self._inputs(obs, mask)
        outs = [sample_actions(p, x, self.rng) for p, x in zip(self.learners, xs)]
        if self.shared:
            actions = outs[0][0].reshape(n, M)
        else:
            actions = np.stack([o[0] for o in outs], axis=1)
        return actions, xs, [o[1] for o in outs], [o[2] for o in outs]

    def iteration(self) -> tuple[np.ndarray, dict[str, float]]:
        """One rollout and update; returns the team returns (mean over agents) of finished episodes."""
        T, env, gamma = self.config.num_steps, self.env, self.config.gamma
        L = len(self.learners)
        buf: list[dict[str, list]] = [{k: [] for k in ("obs", "action", "log_prob", "value", "reward", "discount")}
                                      for _ in range(L)]
        finished = []
        for _ in range(T):
            actions, xs, logps, values = self.act(self.obs, self.mask)
            st = env.step(actions)
            if not st.alive.all():
                raise ValueError("env: an agent was done before its episode ended; IPPO here needs every agent "
                                 "alive until the episode's end")
            reward = st.reward.copy()
            # truncated episodes: bootstrap with gamma V(final observation) added to the last reward
            if self.bootstrap_truncated and st.truncated.any():
                fin = self._inputs(st.final_obs, np.ones_like(st.action_mask))
                for k, (p, x) in enumerate(zip(self.learners, fin)):
                    _, _, v = sample_actions(p, x, self.rng)
                    boot = gamma * v * self._split(st.truncated & ~st.terminated)[k]
                    part = self._split(reward)[k]
                    part += boot
                    if self.shared:
                        reward = part.reshape(reward.shape)
                    else:
                        reward[:, k] = part
            discount = gamma * (1.0 - (st.terminated | st.truncated))
            for k in range(L):
                b = buf[k]
                b["obs"].append(xs[k]), b["action"].append(self._split(actions)[k])
                b["log_prob"].append(logps[k]), b["value"].append(values[k])
                b["reward"].append(self._split(reward)[k]), b["discount"].append(self._split(discount)[k])
            self.obs, self.mask = st.obs, st.action_mask
            self.env_steps += env.num_envs
            if st.episode_end.any():
                finished.append(st.episode_return[st.episode_end].mean(axis=1))
        metrics: dict[str, float] = {}
        last = self._inputs(self.obs, self.mask)
        for k, p in enumerate(self.learners):
            _, _, boot = sample_actions(p, last[k], self.rng)
            rollout = {key: np.stack(v) for key, v in buf[k].items()}
            rollout["bootstrap_value"] = boot
            m = p.update(rollout)
            for key, v in m.items():
                metrics[key] = metrics.get(key, 0.0) + float(v) / L
        returns = np.concatenate(finished) if finished else np.zeros(0)
        self.episodes += len(returns)
        return returns, metrics

    def greedy_actions(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        n, M = obs.shape[:2]
        outs = []
        for p, x in zip(self.learners, self._inputs(obs, mask)):
            (logits,), _ = p.forward(p.learner.params, x)
            outs.append(np.argmax(np.asarray(logits), axis=1))
        return outs[0].reshape(n, M) if self.shared else np.stack(outs, axis=1)
