"""Experiment kinds ``ppo``, ``dqn`` and ``impala``: train on a gymnasium env id, log return curves and
throughput, evaluate, export policies, checkpoint and resume (weights, optimizer state, counters, RNG,
normalization statistics, replay buffer if asked).

Metrics rows are written per iteration (a PPO rollout, an IMPALA trajectory, a DQN chunk of steps);
``episode_return`` is the mean undiscounted return over the last ``window`` finished training episodes
(exploring: sampled actions, DQN's epsilon-greedy). Every ``eval.every`` environment steps and at the last
iteration the row also carries ``eval_return``: the mean over ``eval.episodes`` deterministic episodes on
separate environments (:mod:`fedarena.rl.evaluation`). With evaluation on (``eval.every > 0``) a run stops early
once ``eval_return`` reaches ``target_return``; with ``eval.every = 0`` the training mean decides (the
CartPole-v1 convention is 475 over 100 episodes in gymnasium's registry; issue 9 uses the last 20).
``policies/best`` holds the parameters of the best evaluation so far and ``policies/final`` those of the last
iteration (evaluated there), each with a manifest; ``fedarena evaluate RUN_DIR`` replays them.
On resume, in-process actors on batched environments continue from the checkpoint's environment and sampler
state (the resumed run equals an uninterrupted one); other environments restart fresh.

The algorithm's typed config (``PPOConfig``, ``IMPALAConfig``, ``DQNConfig``) is passed as an object to the learner
and the actors; it becomes a dict only for the evaluator and the exported policy's manifest.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from fedarena.envs.gym_envs import EnvWrappers
from fedarena.envs.vector import check_vector_env
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop
from fedarena.rl.dqn import DQN, DQNConfig, run_dqn_steps
from fedarena.rl.evaluation import EnvOptions, EvalConfig, Evaluator, env_wrappers, eval_seed, evaluate_run, export_policy
from fedarena.rl.execution import (ALGORITHMS, EXECUTION_MODES, ActorSpec, Algorithm, build_vector_env, config_dict,
                                   make_actor_pool)
from fedarena.rl.impala import IMPALAConfig
from fedarena.rl.ppo import PPOConfig
from fedarena.rl.workers import EpisodeStats


@dataclass(frozen=True)
class WrappersConfig:
    """Per-environment wrappers (fedarena.envs.gym_envs); observation / reward normalization is learner-side:
    ``ppo.normalize_obs``, ``ppo.normalize_reward``."""

    frame_stack: int = param(1, "stack the last k observations on a new leading axis (1 = off)")
    action_repeat: int = param(1, "apply each action k times, summing rewards (1 = off)")
    time_limit: int | None = param(None, "truncate episodes after this many agent steps (null: the env's own limit)")

    def __post_init__(self) -> None:
        EnvWrappers(self.frame_stack, self.action_repeat, self.time_limit)


@dataclass(frozen=True)
class RLConfig(ExperimentConfig):
    env_id: str = param("CartPole-v1", "gymnasium id, 'module:EnvId' (module registers it) or "
                        "'package.module:make_env' (a function returning a gymnasium.Env); a named module is "
                        "imported, so a config is code: run only configs you trust")
    env_kwargs: dict[str, Any] = param(doc="keyword arguments for the environment's constructor", factory=dict)
    env_backend: str = param("auto", "auto | batched | sync | async: how the vectorized environment is built")
    wrappers: WrappersConfig = param(doc="per-environment wrappers", factory=WrappersConfig)
    eval: EvalConfig = param(doc="deterministic evaluation episodes", factory=EvalConfig)
    total_steps: int = param(200_000, "environment-step budget (summed over all environments)")
    target_return: float | None = param(475.0, "stop once eval_return (or, with eval.every = 0, the mean return of the "
                                        "last `window` training episodes) reaches this; null = never")
    window: int = param(20, "episodes in the moving mean of the training return")
    execution: str = param("local", "where actors run: local | multiprocess | ray")
    num_actors: int = param(1, "number of actors (each with its own vectorized environment)")

    def __post_init__(self) -> None:
        if self.execution not in EXECUTION_MODES:
            raise ValueError(f"execution: expected one of {', '.join(EXECUTION_MODES)}, got '{self.execution}'")
        if self.total_steps < 1 or self.window < 1 or self.num_actors < 1:
            raise ValueError("total_steps, window, num_actors: must be >= 1")
        if self.env_backend not in ("auto", "batched", "sync", "async"):
            raise ValueError(f"env_backend: expected auto, batched, sync or async, got '{self.env_backend}'")
        check_vector_env(self.env_id, self.env_backend)  # unknown ids and missing packages fail at load time


@dataclass(frozen=True)
class PPOExperimentConfig(RLConfig):
    ppo: PPOConfig = param(doc="PPO hyper-parameters (fedarena.rl.ppo.PPOConfig)", factory=PPOConfig)


@dataclass(frozen=True)
class IMPALAExperimentConfig(RLConfig):
    impala: IMPALAConfig = param(doc="IMPALA hyper-parameters (fedarena.rl.impala.IMPALAConfig)", factory=IMPALAConfig)
    inference_server: bool = param(False, "ray mode: actors send observations to one batching InferenceServer")
    inference_max_batch: int = param(256, "inference server: largest batch of observations per forward pass")
    inference_deadline_ms: float = param(2.0, "inference server: longest wait for a batch to fill, in ms")


@dataclass(frozen=True)
class DQNExperimentConfig(RLConfig):
    dqn: DQNConfig = param(doc="DQN hyper-parameters (fedarena.rl.dqn.DQNConfig)", factory=DQNConfig)
    target_return: float | None = param(450.0, "stop once eval_return (or, with eval.every = 0, the mean return of the "
                                        "last `window` training episodes) reaches this; null = never")
    steps_per_iteration: int = param(1000, "environment steps between metric rows / checkpoint opportunities")
    checkpoint_replay: bool = param(True, "store the replay buffer in checkpoints (exact resume; larger files)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.execution != "local":
            raise ValueError("execution: DQN runs its actor and learner in one process ('local')")


class _Tracker:
    """Moving-window return, time and steps at which the target was first reached, throughput."""

    def __init__(self, window: int, target: float | None) -> None:
        self.returns: deque[float] = deque(maxlen=window)
        self.window, self.target = window, target
        self.episodes = 0
        self.reached_at: tuple[int, float] | None = None

    def add(self, returns: Sequence[float], env_steps: int, wall: float) -> None:
        for r in returns:
            self.returns.append(float(r))
            self.episodes += 1
        if self.reached_at is None and self.done:
            self.reached_at = (env_steps, wall)

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("nan")

    @property
    def done(self) -> bool:
        return self.target is not None and len(self.returns) >= self.window and self.mean >= self.target

    def state(self) -> dict[str, Any]:
        return {"returns": list(self.returns), "episodes": self.episodes,
                "reached_at": list(self.reached_at) if self.reached_at else None}

    def load(self, state: Mapping[str, Any]) -> None:
        self.returns.extend(float(r) for r in state["returns"])
        self.episodes = int(state["episodes"])
        self.reached_at = tuple(state["reached_at"]) if state.get("reached_at") else None  # type: ignore[assignment]


class _Evaluation:
    """Evaluation schedule, best / last results, early stopping on them, and the policy exports of one run."""

    def __init__(self, cfg: Any, run: Any, algorithm: str, algo_config: dict) -> None:
        self.cfg, self.run, self.algorithm, self.algo_config = cfg, run, algorithm, algo_config
        self.options = EnvOptions.of(cfg)
        self.seed = eval_seed(cfg)
        self.evaluator = Evaluator(algorithm, self.options, algo_config, cfg.eval.episodes, self.seed)
        self.next_at = cfg.eval.every
        self.best: dict[str, Any] | None = None
        self.last: dict[str, Any] | None = None
        self.reached_at: tuple[int, float] | None = None

    @property
    def stops_training(self) -> bool:
        """Early stopping uses evaluation returns when evaluation runs during training."""
        return self.cfg.eval.every > 0

    def due(self, env_steps: int, last_iteration: bool) -> bool:
        return last_iteration or (self.cfg.eval.every > 0 and env_steps >= self.next_at)

    def __call__(self, params: Any, step: int, env_steps: int) -> dict[str, Any]:
        """Evaluate ``params``; export them as the best policy when they beat every earlier evaluation."""
        every = self.cfg.eval.every
        while every > 0 and self.next_at <= env_steps:
            self.next_at += every
        result = self.evaluator(params)
        record = {"step": int(step), "env_steps": int(env_steps), **result}
        self.last = record
        if self.best is None or result["eval_return"] > self.best["eval_return"]:
            self.best = record
            self._export("best", params, record)
        target = self.cfg.target_return
        if self.reached_at is None and target is not None and result["eval_return"] >= target:
            self.reached_at = (int(env_steps), float(self.run.elapsed))
        return {k: v for k, v in result.items() if k != "eval_returns"}

    @property
    def done(self) -> bool:
        return self.stops_training and self.reached_at is not None

    def _export(self, which: str, params: Any, record: Mapping[str, Any]) -> None:
        env = self.evaluator.env
        export_policy(self.run.dir / "policies" / which, params, algorithm=self.algorithm, config=self.algo_config,
                      env=self.options, observation_space=env.observation_space, action_space=env.action_space,
                      step=record["step"], env_steps=record["env_steps"], evaluation=record, seed=self.seed)

    def export_final(self, params: Any) -> None:
        if self.last is not None:
            self._export("final", params, self.last)

    def state(self) -> dict[str, Any]:
        return {"next_at": self.next_at, "best": self.best, "last": self.last,
                "reached_at": list(self.reached_at) if self.reached_at else None}

    def load(self, state: Mapping[str, Any] | None) -> None:
        if not state:
            return
        self.next_at = int(state["next_at"])
        self.best, self.last = state.get("best"), state.get("last")
        self.reached_at = tuple(state["reached_at"]) if state.get("reached_at") else None  # type: ignore[assignment]

    def close(self) -> None:
        self.evaluator.close()


def _summary(tracker: _Tracker, evaluation: _Evaluation, env_steps: int, wall: float,
             steady_sps: float) -> dict[str, Any]:
    reached = evaluation.reached_at if evaluation.stops_training else tracker.reached_at
    best, last = evaluation.best or {}, evaluation.last or {}
    return {
        "reached_target": reached is not None,
        "steps_to_target": reached[0] if reached else -1,
        "time_to_target_s": reached[1] if reached else -1.0,
        "target_measured_on": "eval_return" if evaluation.stops_training else "episode_return",
        "final_return": tracker.mean,
        "final_eval_return": last.get("eval_return", float("nan")),
        "best_eval_return": best.get("eval_return", float("nan")),
        "best_eval_env_steps": best.get("env_steps", -1),
        "env_steps": env_steps,
        "episodes": tracker.episodes,
        "env_steps_per_second": steady_sps,
    }


def _rng_state(rng: np.random.Generator) -> dict:
    return rng.bit_generator.state


def _set_rng(rng: np.random.Generator, state: Mapping[str, Any]) -> None:
    rng.bit_generator.state = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in state.items()}


# ------------------------------------------------------------------------------------------ on-policy


def _concat_envs(trajs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several actors' rollouts of equal length side by side, as one rollout over all their environments."""
    if len(trajs) == 1:
        return trajs[0]
    out: dict[str, Any] = {}
    for k in ("obs", "action", "log_prob", "value", "reward", "env_reward", "discount"):
        out[k] = np.concatenate([t[k] for t in trajs], axis=1)
    for k in ("bootstrap_value", "last_obs"):
        out[k] = np.concatenate([t[k] for t in trajs], axis=0)
    out["version"] = min(int(t["version"]) for t in trajs)
    out["env_steps"] = sum(int(t["env_steps"]) for t in trajs)
    out["episode_returns"] = np.concatenate([t["episode_returns"] for t in trajs])
    return out


def _on_policy_run(cfg: PPOExperimentConfig | IMPALAExperimentConfig, run: Any, algo: Algorithm,
                   algo_cfg: PPOConfig | IMPALAConfig) -> dict[str, Any]:
    steps = _OnPolicySteps(cfg, run, algo, algo_cfg)
    try:
        return run_loop(run, steps)
    finally:
        steps.close()


class _OnPolicySteps:
    """PPO / IMPALA under :func:`~fedarena.platform.loop.run_loop`: a step is one learner update (PPO: on one
    rollout of every actor; IMPALA: on the next trajectory that arrives), with an evaluation when it is due."""

    def __init__(self, cfg: PPOExperimentConfig | IMPALAExperimentConfig, run: Any, algo: Algorithm,
                 algo_cfg: PPOConfig | IMPALAConfig):
        from fedarena.rl.execution import LearnerHost, RemoteLearner, _limit_blas_threads

        _limit_blas_threads()
        self.cfg, self.run, self.algo, self.algo_cfg = cfg, run, algo, algo_cfg
        self.wrappers = env_wrappers(cfg)
        learner_args = (algo.name, cfg.env_id, cfg.env_backend, algo_cfg, cfg.seed, cfg.total_steps)
        learner_kwargs = {"env_kwargs": dict(cfg.env_kwargs), "wrappers": self.wrappers}
        self.pool: Any = None
        self.learner: Any = None
        self.evaluation: _Evaluation | None = None
        if cfg.execution == "ray":
            from fedarena.platform.cluster import init_ray

            init_ray(cfg.cluster)
            self.learner = RemoteLearner(*learner_args, **learner_kwargs)  # actors, learner (and server): Ray actors
        else:
            self.learner = LearnerHost(*learner_args, **learner_kwargs)
        self.tracker = _Tracker(cfg.window, cfg.target_return)
        self.evaluation = _Evaluation(cfg, run, algo.name, config_dict(algo_cfg))
        self.iteration, self.env_steps = 0, 0
        self.steady: list[tuple[int, float]] = []
        self.desc, self.total = algo.name, cfg.total_steps
        self.startup_s = 0.0

    def _start_actors(self, actor_states: list[dict[str, Any]] | None) -> None:
        cfg, algo = self.cfg, self.algo
        assert algo.rollout_length is not None
        spec = ActorSpec(algo.name, cfg.env_id, self.algo_cfg.num_envs, algo.rollout_length(self.algo_cfg),
                         cfg.seed + 7 * self.iteration, self.algo_cfg, cfg.env_backend, dict(cfg.env_kwargs),
                         self.wrappers)
        ray_options: dict[str, Any] = {}
        if cfg.execution == "ray" and algo.asynchronous and getattr(cfg, "inference_server", False):
            ray_options = {"inference_server": True, "initial": self.learner.weights(),
                           "max_batch": cfg.inference_max_batch, "deadline_s": cfg.inference_deadline_ms / 1000.0}
        self.pool = make_actor_pool(cfg.execution, spec, cfg.num_actors, **ray_options)
        if actor_states is not None and hasattr(self.pool, "load"):
            self.pool.load(actor_states)  # environments and samplers continue exactly where the checkpoint left them
        self.startup_s = self.run.elapsed  # Ray start-up and actor creation included
        self.weights = self.learner.weights()
        for i in range(cfg.num_actors):
            self.pool.submit(i, self.weights)

    def init(self) -> None:
        self._start_actors(None)

    def load(self, step: int, state: dict[str, Any]) -> None:
        self.iteration = step
        self.learner.load(state["learner"])
        self.env_steps = int(state["env_steps"])
        self.tracker.load(state["tracker"])
        self.evaluation.load(state.get("evaluation"))
        self._start_actors(state.get("actors"))

    def state(self) -> dict[str, Any]:
        return {"learner": self.learner.state(), "env_steps": self.env_steps, "tracker": self.tracker.state(),
                "evaluation": self.evaluation.state(), "actors": _actor_states(self.pool)}

    def done(self) -> bool:
        ev = self.evaluation
        return self.env_steps >= self.cfg.total_steps or ev.done or (not ev.stops_training and self.tracker.done)

    def units(self) -> int:
        return self.env_steps

    def step(self, step: int) -> dict[str, Any]:
        pool, learner, cfg = self.pool, self.learner, self.cfg
        if not self.algo.asynchronous:  # PPO: one synchronous rollout of every actor
            trajs = [pool.next()[1] for _ in range(cfg.num_actors)]
            traj = _concat_envs(sorted(trajs, key=lambda t: int(t.get("actor", 0))))
            metrics = learner.update(traj)
            self.weights = learner.weights()
            for i in range(cfg.num_actors):
                pool.submit(i, self.weights)
        else:
            actor_index, traj = pool.next()
            metrics = learner.update(traj) or {"dropped_stale": 1.0}
            self.weights = learner.weights()
            pool.submit(actor_index, self.weights)
        self.iteration = step
        self.env_steps += int(traj["env_steps"])
        wall = self.run.elapsed
        self.tracker.add(traj["episode_returns"], self.env_steps, wall)
        self.steady.append((self.env_steps, wall))
        row = dict(env_steps=self.env_steps, episode_return=self.tracker.mean, episodes=self.tracker.episodes,
                   env_steps_per_second=_window_rate(self.steady), policy_version=self.weights.version,
                   actor_restarts=getattr(pool, "restarts", 0), **metrics)
        if self.evaluation.due(self.env_steps, self.done()):
            row.update(self.evaluation(self.weights.params, step, self.env_steps))
        return row

    def summary(self) -> dict[str, Any]:
        self.evaluation.export_final(self.weights.params)
        out = _summary(self.tracker, self.evaluation, self.env_steps, self.run.elapsed,
                       _window_rate(self.steady, whole=True))
        out["actor_restarts"] = getattr(self.pool, "restarts", 0)
        if self.algo.asynchronous:
            out["dropped_stale"] = self.learner.dropped_stale()
        out["startup_s"] = self.startup_s
        rows = self.run.rows()
        out.update({f"last_{k}": rows[-1][k] for k in ("loss", "entropy") if rows and k in rows[-1]})
        return out

    def close(self) -> None:
        for part in (self.pool, self.evaluation, self.learner):
            if part is not None:
                part.close()


def _actor_states(pool: Any) -> list[dict[str, Any]] | None:
    """The actors' states when the pool can export them between rollouts (in-process actors on batched
    environments), so a resumed run continues exactly; otherwise None and a resume re-seeds the actors."""
    return pool.state() if hasattr(pool, "state") else None


def _window_rate(points: list[tuple[int, float]], whole: bool = False) -> float:
    """Environment steps per second over the last 10 iterations (or all but the first, ``whole``)."""
    if len(points) < 2:
        return float("nan")
    a = points[1] if whole and len(points) > 2 else points[max(0, len(points) - 11)]
    b = points[-1]
    return (b[0] - a[0]) / max(b[1] - a[1], 1e-9)


def run_ppo(cfg: PPOExperimentConfig, run: Any) -> dict[str, Any]:
    return _on_policy_run(cfg, run, ALGORITHMS["ppo"], cfg.ppo)


def run_impala(cfg: IMPALAExperimentConfig, run: Any) -> dict[str, Any]:
    return _on_policy_run(cfg, run, ALGORITHMS["impala"], cfg.impala)


# ------------------------------------------------------------------------------------------ DQN


def run_dqn(cfg: DQNExperimentConfig, run: Any) -> dict[str, Any]:
    steps = _DQNSteps(cfg, run)
    try:
        return run_loop(run, steps)
    finally:
        steps.close()


class _DQNSteps:
    """DQN under :func:`~fedarena.platform.loop.run_loop`: a step is ``steps_per_iteration`` environment steps
    (acting, replay, learning), with an evaluation when it is due."""

    def __init__(self, cfg: DQNExperimentConfig, run: Any):
        from fedarena.rl.execution import _limit_blas_threads

        _limit_blas_threads()
        c = cfg.dqn
        self.cfg, self.run = cfg, run
        self.evaluation: _Evaluation | None = None
        self.env = build_vector_env(cfg.env_id, c.num_envs, cfg.seed, cfg.env_backend, dict(cfg.env_kwargs),
                                    env_wrappers(cfg))
        self.agent = DQN(self.env.observation_space, self.env.action_space, c, seed=cfg.seed)
        self.tracker = _Tracker(cfg.window, cfg.target_return)
        self.evaluation = _Evaluation(cfg, run, ALGORITHMS["dqn"].name, config_dict(c))
        self.stats = EpisodeStats()
        self.ep = {"ret": np.zeros(c.num_envs), "len": np.zeros(c.num_envs, dtype=np.int64)}
        self.steady: list[tuple[int, float]] = []
        self.per_iter = max(1, cfg.steps_per_iteration // c.num_envs)
        self.metrics: dict[str, float] | None = None
        self.obs: Any = None
        self.desc, self.total = "dqn", cfg.total_steps

    def init(self) -> None:
        self.obs = self.env.reset(seed=self.cfg.seed)

    def load(self, step: int, state: dict[str, Any]) -> None:
        agent = self.agent
        agent.learner.set_state(state["params"], state["opt_state"], int(state["version"]))
        agent.target_params = state["target_params"]
        agent.env_steps = int(state["env_steps"])
        agent._last_train = int(state["last_train"])
        agent._last_target_update = int(state["last_target_update"])
        self.tracker.load(state["tracker"])
        self.evaluation.load(state.get("evaluation"))
        _set_rng(agent.rng, state["rng"])
        if "replay" in state:
            agent.replay.load_state_dict(state["replay"])
        self.obs = self.env.reset(seed=self.cfg.seed + step)  # environments restart fresh

    def state(self) -> dict[str, Any]:
        agent = self.agent
        state = {"params": agent.learner.params, "opt_state": agent.learner.opt_state,
                 "target_params": agent.target_params, "version": agent.learner.version,
                 "env_steps": agent.env_steps, "last_train": agent._last_train,
                 "last_target_update": agent._last_target_update, "tracker": self.tracker.state(),
                 "evaluation": self.evaluation.state(), "rng": _rng_state(agent.rng)}
        if self.cfg.checkpoint_replay:
            state["replay"] = agent.replay.state_dict()
        return state

    def done(self) -> bool:
        ev = self.evaluation
        return self.agent.env_steps >= self.cfg.total_steps or ev.done or (
            not ev.stops_training and self.tracker.done)

    def units(self) -> int:
        return self.agent.env_steps

    def step(self, step: int) -> dict[str, Any]:
        agent, total = self.agent, self.cfg.total_steps
        self.obs, m = run_dqn_steps(agent, self.env, self.obs, self.per_iter, lambda s: s / total, self.stats, self.ep)
        self.metrics = m or self.metrics
        wall = self.run.elapsed
        returns, _ = self.stats.drain()
        self.tracker.add(returns, agent.env_steps, wall)
        self.steady.append((agent.env_steps, wall))
        row = dict(env_steps=agent.env_steps, episode_return=self.tracker.mean, episodes=self.tracker.episodes,
                   env_steps_per_second=_window_rate(self.steady), epsilon=agent.epsilon(agent.env_steps / total),
                   replay_size=len(agent.replay), **(self.metrics or {}))
        if self.evaluation.due(agent.env_steps, self.done()):
            row.update(self.evaluation(agent.learner.params, step, agent.env_steps))
        return row

    def summary(self) -> dict[str, Any]:
        self.evaluation.export_final(self.agent.learner.params)
        return _summary(self.tracker, self.evaluation, self.agent.env_steps, self.run.elapsed,
                        _window_rate(self.steady, whole=True))

    def close(self) -> None:
        if self.evaluation is not None:
            self.evaluation.close()
        if hasattr(self.env, "close"):
            self.env.close()


def plots(rows: Sequence[Mapping[str, Any]], cfg: Any, report_dir: str) -> list[str]:
    """Return vs environment steps, return vs wall time, and throughput vs environment steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "env_steps" in r]
    if not rows:
        return []
    steps = np.array([r["env_steps"] for r in rows], dtype=float)
    wall = np.array([r["wall_time"] for r in rows], dtype=float)
    ret = np.array([r.get("episode_return", np.nan) for r in rows], dtype=float)
    sps = np.array([r.get("env_steps_per_second", np.nan) for r in rows], dtype=float)
    paths = []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ev = np.array([r.get("eval_return", np.nan) for r in rows], dtype=float)
    lo = np.array([r.get("eval_return_min", np.nan) for r in rows], dtype=float)
    hi = np.array([r.get("eval_return_max", np.nan) for r in rows], dtype=float)
    has_eval = np.isfinite(ev)
    for ax, x, xlabel in ((axes[0], steps, "environment steps"), (axes[1], wall, "wall time (s)")):
        ax.plot(x, ret, lw=1.5, label=f"training (mean of last {cfg.window} episodes)")
        if has_eval.any():
            xe = x[has_eval]
            ax.errorbar(xe, ev[has_eval], yerr=[ev[has_eval] - lo[has_eval], hi[has_eval] - ev[has_eval]],
                        fmt="o-", ms=4, lw=1.2, capsize=2, color="tab:orange",
                        label=f"evaluation (deterministic, {cfg.eval.episodes} episodes, min-max)")
        if cfg.target_return is not None:
            ax.axhline(cfg.target_return, color="k", ls="--", lw=0.8, label=f"target {cfg.target_return:g}")
        ax.legend(fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("episode return")
        ax.grid(alpha=0.3)
    axes[2].plot(steps, sps, lw=1.2, color="tab:green")
    axes[2].set_xlabel("environment steps")
    axes[2].set_ylabel("environment steps / s")
    axes[2].grid(alpha=0.3)
    fig.suptitle(f"{cfg.kind} on {cfg.env_id} (seed {cfg.seed}, {cfg.execution})")
    fig.tight_layout()
    paths.append(f"{report_dir}/return_and_throughput.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


_SUMMARY = ("episode_return", "eval_return", "env_steps", "env_steps_per_second")
_COMMON = dict(plots=plots, summary_keys=_SUMMARY, x_axis="env_steps", group_metrics=("eval_return", "episode_return"),
               evaluate=evaluate_run)
PPO_EXPERIMENT = Experiment(config=PPOExperimentConfig, run=run_ppo, **_COMMON)
IMPALA_EXPERIMENT = Experiment(config=IMPALAExperimentConfig, run=run_impala, **_COMMON)
DQN_EXPERIMENT = Experiment(config=DQNExperimentConfig, run=run_dqn, **_COMMON)
