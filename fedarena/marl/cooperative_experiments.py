"""Experiment kind ``cooperative_marl``: QMIX, VDN and independent PPO side by side on a cooperative
PettingZoo parallel task (MPE ``simple_spread_v3`` from ``mpe2``, or the QMIX paper's two-step game
``two_step_v0``), over several seeds. MPE tasks run on fedarena's vectorised copy of ``mpe2``
(:mod:`fedarena.envs.mpe`) unless ``vectorised: false``; ``overcooked.<layout>`` is fedarena's vectorised
Overcooked (:mod:`fedarena.envs.overcooked`), learnt by ``mappo``.

Every (algorithm, seed) learner runs on its own batch of environment copies; they advance in rounds of
``steps_per_round`` environment steps so the metric rows line up. Every round starts fresh episodes on all
copies, seeded by the learner's seed and the round, which is what makes a resumed run continue exactly as
an uninterrupted one (episodes still running at a round's end are cut there and not counted; with
``steps_per_round / num_envs`` a multiple of the episode length, as in the shipped configs, none is).
Checkpoints (metric step = environment steps per learner) hold every learner's networks, optimizer state,
RNGs, counters, wall time and, with ``checkpoint_replay``, its replay buffer; ``fedarena run --resume RUN_DIR``
continues from the newest. Logged per learner: the mean team return
(mean over agents, undiscounted) of the episodes finished in the chunk, episodes so far, learner wall time
and CPU time (training and evaluation, ``time.process_time`` of its process),
and every ``eval_every`` rounds the greedy team return over ``eval_episodes`` episodes. The report plots
training and greedy returns against episodes and against learner wall time (mean over seeds, min-max
band) and, for the two-step game, counts the seeds whose greedy policy reaches the optimal return 8.
``workers`` spreads the learners over processes; the results do not depend on it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fedarena import engine
from fedarena.envs.mpe import MPEVecEnv
from fedarena.envs.mpe.batch import MPEBatch
from fedarena.envs.overcooked import OvercookedVecEnv, UnknownLayoutError, is_overcooked
from fedarena.envs.pettingzoo_adapters import UnknownEnvError, make_env
from fedarena.envs.pettingzoo_batch import ParallelEnvBatch, observation_size
from fedarena.marl.independent import IndependentPPO
from fedarena.marl.mappo import MAPPO, MAPPOConfig, agent_groups
from fedarena.marl.value_decomposition import ValueDecompositionConfig, ValueDecompositionTrainer
from fedarena.platform.errors import RunError
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop
from fedarena.rl.ppo import PPOConfig

ALGORITHMS = ("qmix", "vdn", "ippo", "mappo")
STACKED = ("qmix", "vdn", "ippo")  # one network over all agents' stacked observations


@dataclass(frozen=True)
class CooperativeConfig(ExperimentConfig):
    env_id: str = param("mpe2.simple_spread_v3", "PettingZoo parallel env id (or two_step_v0, the QMIX paper's game)")
    max_cycles: int | None = param(25, "episode length of MPE tasks (passed as max_cycles); null for envs without it")
    env_options: dict[str, Any] = param(doc="further keyword arguments of the env (e.g. Overcooked's "
                                        "shaped_reward_coef, shaped_reward_horizon)", factory=dict)
    algorithms: list[str] = param(doc="algorithms run side by side: qmix, vdn, ippo, mappo (mappo: vectorised MPE "
                                  "tasks and Overcooked only)", factory=lambda: list(STACKED))
    learner_seeds: list[int] = param(doc="seeds per algorithm inside this one run, so the report compares them "
                                     "(the run's seed is added to each)", factory=lambda: [0])
    num_envs: int = param(8, "environment copies per learner")
    env_steps: int = param(102_400, "environment steps per learner (summed over its copies)")
    steps_per_round: int = param(4_096, "environment steps per learner between metric rows: a multiple of "
                                 "num_envs (of num_envs x ppo.num_steps with ippo) that divides env_steps")
    eval_every: int = param(5, "greedy evaluation every this many rounds (and at the end)")
    eval_episodes: int = param(16, "episodes per greedy evaluation")
    value_decomposition: ValueDecompositionConfig = param(
        doc="QMIX/VDN hyper-parameters (mixer is set per algorithm)", factory=ValueDecompositionConfig)
    ppo: PPOConfig = param(doc="IPPO's PPO hyper-parameters (num_envs is the env copies)", factory=PPOConfig)
    mappo: MAPPOConfig = param(doc="MAPPO's hyper-parameters (Yu et al. 2022's MPE defaults)", factory=MAPPOConfig)
    random_agents: list[str] = param(doc="agents that act uniformly at random in one more greedy evaluation at "
                                     "the end, a baseline in the summary (e.g. [listener_0] in speaker-listener)",
                                     factory=list)
    ippo_shared: bool = param(True, "IPPO: one network for all agents (agent-id input) instead of one per agent")
    workers: int = param(1, "processes the learners are spread over (round-robin); 1 runs them all in this "
                         "process. Results do not depend on it: every learner has its own environments and RNGs")
    checkpoint_replay: bool = param(True, "store QMIX/VDN replay buffers in checkpoints (without them a resumed "
                                    "run re-fills its buffers from empty)")
    engine_threads: int = param(1, "BLAS and engine threads per learner process: 1 avoids the oversubscription "
                                "that makes small-network updates many times slower when processes share the cores")
    vectorised: bool = param(True, "MPE tasks (mpe2.*): run fedarena's vectorised numpy MPE (fedarena.envs.mpe, "
                             "step for step equal to mpe2) instead of mpe2's Python envs through the PettingZoo "
                             "batch runner; episodes start from other draws of the same distribution")

    def __post_init__(self) -> None:
        if is_overcooked(self.env_id):  # fedarena.envs.overcooked, learnt by mappo
            if set(self.algorithms) - {"mappo"}:
                raise ValueError(f"algorithms: '{self.env_id}' runs with mappo only, got {self.algorithms}")
            try:
                vec = OvercookedVecEnv(self.env_id, 1, **self.env_kwargs())
            except UnknownLayoutError as e:
                raise ValueError(f"env_id: {e}") from None
            except (TypeError, ValueError) as e:  # options the env rejects
                raise ValueError(f"env_options: {str(e).replace('OvercookedVecEnv.__init__() ', '')}") from None
            agents, sizes, acts = list(vec.agents), sorted(set(vec.observation_sizes)), sorted(set(vec.action_sizes))
        elif self.uses_vectorised_mpe():
            try:
                vec = MPEVecEnv(self.env_id, 1, **self.env_kwargs())
            except ValueError as e:  # unknown scenario (with a did-you-mean), bad scenario options
                raise ValueError(str(e)) from None
            agents = list(vec.agents)
            sizes, acts = sorted(set(vec.observation_sizes)), sorted(set(vec.action_sizes))
            if "mappo" in self.algorithms:
                agent_groups(agents, vec.observation_sizes, vec.action_sizes, self.mappo.share)
        else:
            if "mappo" in self.algorithms:
                raise ValueError(f"algorithms: mappo runs on the vectorised MPE tasks (env_id mpe2.*, vectorised: "
                                 f"true) and Overcooked (overcooked.<layout>), not on '{self.env_id}'")
            try:
                env = make_env(self.env_id, api="parallel", **self.env_kwargs())
            except UnknownEnvError as e:
                raise ValueError(str(e)) from None
            except TypeError as e:
                raise ValueError(f"env_id: '{self.env_id}' rejects its arguments {self.env_kwargs()}: {e}") from None
            agents = list(env.possible_agents)
            sizes = sorted({observation_size(env.observation_space(a)) for a in agents})
            acts = sorted({getattr(env.action_space(a), "n", -1) for a in agents})
        stacked = [a for a in self.algorithms if a in STACKED]
        if stacked and (len(sizes) != 1 or len(acts) != 1):
            raise ValueError(f"algorithms: {', '.join(stacked)} share one network over all agents, but '{self.env_id}' "
                             f"has agents of different observation sizes {sizes} or action counts {acts}; use "
                             "mappo, which shares a network per group of like agents")
        if self.value_decomposition.buffer == "episode" and self.max_cycles is None \
                and set(self.algorithms) & {"qmix", "vdn"}:
            raise ValueError("value_decomposition.buffer: episode pads every episode to max_cycles steps, but "
                             f"max_cycles is null for '{self.env_id}'")
        for a in self.random_agents:
            if a not in agents:
                raise ValueError(f"random_agents: no agent '{a}' in {self.env_id}; agents: {', '.join(agents)}")
        if not self.algorithms:
            raise ValueError("algorithms: give at least one of " + ", ".join(ALGORITHMS))
        for a in self.algorithms:
            if a not in ALGORITHMS:
                raise ValueError(f"algorithms: unknown algorithm '{a}'; known: {', '.join(ALGORITHMS)}")
        if len(set(self.algorithms)) != len(self.algorithms):
            raise ValueError(f"algorithms: listed twice in {self.algorithms}")
        if not self.learner_seeds or len(set(self.learner_seeds)) != len(self.learner_seeds):
            raise ValueError(f"learner_seeds: expected distinct seeds, got {self.learner_seeds}")
        for name in ("num_envs", "env_steps", "steps_per_round", "eval_every", "eval_episodes", "workers",
                     "engine_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        rollout = math.lcm(self.ppo.num_steps if "ippo" in self.algorithms else 1,
                           self.mappo.num_steps if "mappo" in self.algorithms else 1)
        chunk = self.num_envs * rollout
        if self.steps_per_round % chunk or self.env_steps % self.steps_per_round:
            what = "num_envs x the rollout lengths (ppo.num_steps, mappo.num_steps)" if rollout > 1 else "num_envs"
            raise ValueError(f"steps_per_round: {self.steps_per_round} must be a multiple of {what} ({chunk}) and "
                             f"divide env_steps ({self.env_steps}), so every round ends on the same step")

    def env_kwargs(self) -> dict[str, Any]:
        return {**({} if self.max_cycles is None else {"max_cycles": self.max_cycles}), **self.env_options}

    def uses_vectorised_mpe(self) -> bool:
        return self.vectorised and self.env_id.startswith("mpe2.")


class _Learner:
    """One (algorithm, seed) learner with its environments, counters and evaluation."""

    def __init__(self, algorithm: str, seed: int, cfg: CooperativeConfig) -> None:
        self.algorithm, self.seed = algorithm, seed
        n_eval = min(cfg.num_envs, cfg.eval_episodes)
        self.rng = np.random.default_rng([seed, 7])  # random agents of the baseline evaluation
        self.random_agents = tuple(cfg.random_agents)
        if algorithm == "mappo":
            self.env = self.eval_env = None
        elif cfg.uses_vectorised_mpe():
            self.env: Any = MPEBatch(cfg.env_id, cfg.num_envs, seed=seed, **cfg.env_kwargs())
            self.eval_env: Any = MPEBatch(cfg.env_id, n_eval, seed=10_000 + seed, **cfg.env_kwargs())
        else:
            make = lambda: make_env(cfg.env_id, api="parallel", **cfg.env_kwargs())  # noqa: E731
            self.env = ParallelEnvBatch(make, cfg.num_envs, seed=seed)
            self.eval_env = ParallelEnvBatch(make, n_eval, seed=10_000 + seed)
        if algorithm == "mappo":
            self.impl: Any = MAPPO(cfg.env_id, cfg.num_envs, cfg.mappo, seed=seed, eval_envs=n_eval,
                                   **cfg.env_kwargs())
        elif algorithm == "ippo":
            self.impl = IndependentPPO(self.env, cfg.ppo, shared=cfg.ippo_shared, seed=seed,
                                            total_steps=cfg.env_steps)
        else:
            self.impl = ValueDecompositionTrainer(self.env, replace(cfg.value_decomposition, mixer=algorithm), seed,
                                                  episode_limit=cfg.max_cycles)
        self.wall = 0.0
        self.cpu = 0.0  # CPU seconds of this learner's process spent training and evaluating it
        self.returns: list[float] = []
        self.greedy = float("nan")

    def start_round(self, k: int) -> None:
        """Fresh episodes on every copy, seeded by the learner's seed and the round ``k``."""
        if self.algorithm == "mappo":
            self.impl.reset_episodes(self.seed * 100_003 + k)
            return
        self.env.seed = self.seed * 100_003 + k
        self.impl.reset_episodes()

    def state_dict(self, replay: bool) -> dict[str, Any]:
        state = self.impl.state_dict()
        if not replay:
            state.pop("buffer", None)
        return {"impl": state, "wall": self.wall, "cpu": self.cpu, "greedy": self.greedy}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        impl = state["impl"]
        if "buffer" not in impl and self.algorithm in ("qmix", "vdn"):  # saved without it: re-filled from empty
            impl = dict(impl, buffer=self.impl.buffer.state_dict())
        self.impl.load_state_dict(impl)
        self.wall, self.greedy = float(state["wall"]), float(state["greedy"])
        self.cpu = float(state.get("cpu", 0.0))  # absent in checkpoints written before it was logged

    @property
    def env_steps(self) -> int:
        return self.impl.env_steps

    @property
    def episodes(self) -> int:
        return self.impl.episodes

    def advance(self, until: int) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        while self.env_steps < until:
            if self.algorithm in ("ippo", "mappo"):
                r, _ = self.impl.iteration()
            else:
                r = self.impl.step()
            self.returns.extend(float(x) for x in r)
        self.wall += time.perf_counter() - t0
        self.cpu += time.process_time() - c0

    def greedy_return(self, episodes: int, random_agents: tuple[str, ...] = ()) -> float:
        """Mean team return of ``episodes`` greedy episodes; agents in ``random_agents`` act uniformly at random."""
        if self.algorithm == "mappo":
            return self.impl.greedy_return(episodes, random_agents)
        env = self.eval_env
        columns = [env.agents.index(a) for a in random_agents]
        obs, mask, state = env.reset()
        done: list[float] = []
        while len(done) < episodes:
            if self.algorithm == "ippo":
                actions = self.impl.greedy_actions(obs, mask)
            else:
                actions = self.impl.learner.act(obs, mask, 0.0)
            for k in columns:  # legal actions uniformly at random
                u = self.rng.random((len(actions), 1)) * mask[:, k].sum(axis=1, keepdims=True)
                actions[:, k] = (np.cumsum(mask[:, k], axis=1) <= u).sum(axis=1)
            st = env.step(actions)
            obs, mask = st.obs, st.action_mask
            done.extend(st.episode_return[st.episode_end].mean(axis=1).tolist())
        return float(np.mean(done[:episodes]))


class _Group:
    """The learners one process owns: advances them round by round and gathers their metric columns."""

    def __init__(self, specs: list[tuple[str, int]], cfg: CooperativeConfig) -> None:
        engine.set_num_threads(cfg.engine_threads)
        self.cfg = cfg
        self.learners = [_Learner(a, s, cfg) for a, s in specs]

    def round(self, k: int, evaluate: bool) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for L in self.learners:
            seen = len(L.returns)
            L.start_round(k)
            L.advance(k * self.cfg.steps_per_round)
            tag = f"{L.algorithm}/seed{L.seed}"
            new = L.returns[seen:]
            if new:
                row[f"{tag}/return"] = float(np.mean(new))
            row[f"{tag}/episodes"] = L.episodes
            row[f"{tag}/wall_time"] = L.wall
            if evaluate:
                c0 = time.process_time()
                L.greedy = row[f"{tag}/greedy_return"] = L.greedy_return(self.cfg.eval_episodes)
                L.cpu += time.process_time() - c0
                if L.algorithm == "mappo" and len(L.impl.greedy_by_type) > 1:  # mixed games: each side's return
                    for t, v in L.impl.greedy_by_type.items():
                        row[f"{tag}/greedy_return_{t}"] = v
            row[f"{tag}/cpu_time"] = L.cpu
        return row

    def state(self, replay: bool) -> list[dict[str, Any]]:
        return [L.state_dict(replay) for L in self.learners]

    def load(self, states: list[dict[str, Any]]) -> None:
        for L, s in zip(self.learners, states):
            L.load_state_dict(s)

    def results(self, random_agents: list[str]) -> list[tuple[str, int, int, float, float, float, float]]:
        """Per learner: algorithm, seed, episodes, wall time, greedy return, the greedy return with
        ``random_agents`` acting at random (nan without any) and CPU time."""
        return [(L.algorithm, L.seed, L.episodes, L.wall, L.greedy,
                 L.greedy_return(self.cfg.eval_episodes, tuple(random_agents)) if random_agents else float("nan"),
                 L.cpu)
                for L in self.learners]


def _serve(conn: Any, specs: list[tuple[str, int]], cfg: CooperativeConfig) -> None:
    """A worker process: builds its :class:`_Group` and answers ``(method, args)`` requests until ``close``."""
    try:
        group = _Group(specs, cfg)
    except Exception as e:  # noqa: BLE001 -- reported to the parent as one line
        conn.send((False, f"{type(e).__name__}: {e}"))
        return
    conn.send((True, None))
    while True:
        method, args = conn.recv()
        if method == "close":
            return
        try:
            conn.send((True, getattr(group, method)(*args)))
        except Exception as e:  # noqa: BLE001
            conn.send((False, f"{type(e).__name__}: {e}"))


class _RemoteGroup:
    """A :class:`_Group` in a worker process (spawned); requests are sent to all groups before any reply is
    read, so the groups run their rounds at the same time."""

    def __init__(self, specs: list[tuple[str, int]], cfg: CooperativeConfig) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, specs, cfg), daemon=True)
        self.proc.start()
        child.close()

    def send(self, method: str, *args: Any) -> None:
        self.conn.send((method, args))

    def recv(self) -> Any:
        try:
            ok, out = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"cooperative_marl worker {self.proc.pid} exited (code {self.proc.exitcode})") from None
        if not ok:
            raise RuntimeError(f"cooperative_marl worker: {out}")
        return out

    def close(self) -> None:
        if self.proc.is_alive():
            self.conn.send(("close", ()))
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()


class _LocalGroup:
    """A :class:`_Group` in this process behind the same send/recv interface."""

    def __init__(self, specs: list[tuple[str, int]], cfg: CooperativeConfig) -> None:
        self.group, self._out = _Group(specs, cfg), None

    def send(self, method: str, *args: Any) -> None:
        self._out = getattr(self.group, method)(*args)

    def recv(self) -> Any:
        return self._out

    def close(self) -> None:
        pass


def _call(groups: list[Any], method: str, *per_group_args: Any) -> list[Any]:
    for i, g in enumerate(groups):
        g.send(method, *(a[i] if isinstance(a, _PerGroup) else a for a in per_group_args))
    return [g.recv() for g in groups]


class _PerGroup(list):
    """An argument of :func:`_call` that differs per group."""


def run_cooperative(cfg: CooperativeConfig, run) -> dict[str, Any]:
    specs = [(a, cfg.seed + s) for a in cfg.algorithms for s in cfg.learner_seeds]
    n = min(cfg.workers, len(specs))
    parts = [specs[i::n] for i in range(n)]  # learner j lives in group j % n, at position j // n
    make = _LocalGroup if n == 1 else _RemoteGroup
    groups: list[Any] = []
    try:
        for part in parts:
            groups.append(make(part, cfg))
        if n > 1:
            for g in groups:
                g.recv()  # built (or the one-line error of why not)
        # the loop counts rounds; metric rows and checkpoints are numbered in environment steps per learner
        return run_loop(_RoundsRun(run, cfg.steps_per_round), _CooperativeSteps(cfg, specs, groups))
    finally:
        for g in groups:
            g.close()


class _RoundsRun:
    """The run as :func:`~fedarena.platform.loop.run_loop` sees it: its step ``k`` is round ``k``, which the
    run's metric rows and checkpoints number ``k * steps_per_round`` (environment steps per learner), so
    ``checkpoint.every`` counts environment steps as before."""

    def __init__(self, run: Any, steps_per_round: int) -> None:
        self.run, self.per = run, steps_per_round

    def __getattr__(self, name: str) -> Any:   # logger, progress, final_checkpoint, ...
        return getattr(self.run, name)

    def restore(self, accept: Any = None) -> tuple[int, Any] | None:
        load = None if accept is None else lambda step, state: accept(step // self.per, state)
        restored = self.run.restore(accept=load)
        return None if restored is None else (restored[0] // self.per, restored[1])

    def log(self, step: int, **metrics: Any) -> None:
        self.run.log(step * self.per, **metrics)

    def checkpoint(self, step: int, state: Any) -> Any:
        return self.run.checkpoint(step * self.per, state)


class _CooperativeSteps:
    """Every learner under :func:`~fedarena.platform.loop.run_loop`: one round of ``steps_per_round`` environment
    steps per learner a step, all groups at once; the greedy evaluation (every ``eval_every`` rounds and on the
    last) runs inside the round, in the learners' processes."""

    KNOWN = ("return", "episodes", "wall_time", "cpu_time", "greedy_return")

    def __init__(self, cfg: CooperativeConfig, specs: list[tuple[str, int]], groups: list[Any]) -> None:
        self.cfg, self.specs, self.groups, self.n = cfg, specs, groups, len(groups)
        self.total = cfg.env_steps // cfg.steps_per_round
        self.desc = f"cooperative {cfg.env_id}"
        self.rounds = 0

    def init(self) -> None:
        return None

    def load(self, step: int, state: dict[str, Any]) -> None:
        if len(state["learners"]) != len(self.specs):
            raise RunError(f"checkpoint: {len(state['learners'])} learners saved, the config has {len(self.specs)}")
        _call(self.groups, "load", _PerGroup(state["learners"][i::self.n] for i in range(self.n)))
        self.rounds = step

    def state(self) -> dict[str, Any]:
        states = _call(self.groups, "state", self.cfg.checkpoint_replay)
        return {"learners": [states[j % self.n][j // self.n] for j in range(len(self.specs))]}

    def done(self) -> bool:
        return self.rounds >= self.total

    def units(self) -> int:
        return self.rounds

    def step(self, step: int) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for part in _call(self.groups, "round", step, step % self.cfg.eval_every == 0 or step == self.total):
            row.update(part)
        self.rounds = step
        return {**{f"{a}/seed{s}/{key}": row[f"{a}/seed{s}/{key}"] for a, s in self.specs for key in self.KNOWN
                   if f"{a}/seed{s}/{key}" in row},
                **{key: v for key, v in row.items() if "/greedy_return_" in key}}

    def summary(self) -> dict[str, Any]:
        cfg = self.cfg
        parts = _call(self.groups, "results", cfg.random_agents)
        results = {(a, s): (e, w, g, b) for part in parts for a, s, e, w, g, b, _ in part}
        greedy = {key: r[2] for key, r in results.items()}
        episodes = {key: r[0] for key, r in results.items()}
        walls = {key: r[1] for key, r in results.items()}
        summary: dict[str, Any] = {"env_id": cfg.env_id, "env_steps_per_learner": self.rounds * cfg.steps_per_round,
                                   # each worker's learners run one after the other: on idle cores the run's
                                   # wall time is about the largest of these
                                   "learner_cpu_seconds_per_worker": [round(sum(r[6] for r in part), 1)
                                                                      for part in parts]}
        for a in cfg.algorithms:
            finals = [greedy[(a, cfg.seed + s)] for s in cfg.learner_seeds]
            summary[f"{a}/greedy_return_per_seed"] = finals
            summary[f"{a}/greedy_return_mean"] = float(np.mean(finals))
            if cfg.random_agents:
                base = [results[(a, cfg.seed + s)][3] for s in cfg.learner_seeds]
                tag = "+".join(cfg.random_agents)
                summary[f"{a}/greedy_return_with_random_{tag}_per_seed"] = base
                summary[f"{a}/greedy_return_with_random_{tag}_mean"] = float(np.mean(base))
            if cfg.env_id.endswith("two_step_v0"):
                summary[f"{a}/seeds_reaching_8"] = int(sum(abs(f - 8.0) < 1e-6 for f in finals))
            mine = [x for x in self.specs if x[0] == a]
            summary[f"{a}/episodes"] = int(np.mean([episodes[x] for x in mine]))
            summary[f"{a}/wall_seconds"] = float(np.mean([walls[x] for x in mine]))
        return summary


def plots_cooperative(rows, cfg: CooperativeConfig, report_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 2, figsize=(12, 8.4))
    axes = grid.ravel()
    panels = {"return": (axes[0], axes[1]), "greedy_return": (axes[2], axes[3])}
    for a in cfg.algorithms:
        for key, (ax_ep, ax_wall) in panels.items():
            xs_ep, xs_wall, ys = [], [], []
            for s in cfg.learner_seeds:
                tag = f"{a}/seed{cfg.seed + s}"
                pts = [(r[f"{tag}/episodes"], r[f"{tag}/wall_time"], r[f"{tag}/{key}"]) for r in rows
                       if f"{tag}/{key}" in r]
                if pts:
                    e, w, y = (np.array(v, dtype=float) for v in zip(*pts))
                    xs_ep.append(e), xs_wall.append(w), ys.append(y)
            if not ys:
                continue
            n = min(len(y) for y in ys)
            Y = np.stack([y[:n] for y in ys])
            E = np.mean([e[:n] for e in xs_ep], axis=0)
            W = np.mean([w[:n] for w in xs_wall], axis=0)
            name = {"ippo": "IPPO", "mappo": "MAPPO"}.get(a, a.upper())
            label = f"{name} ({len(ys)} seed{'s' if len(ys) > 1 else ''})"
            style = "-" if key == "return" else "o-"
            for ax, x in ((ax_ep, E), (ax_wall, W)):
                ax.plot(x, Y.mean(axis=0), style, lw=1.4, ms=3, label=label)
                ax.fill_between(x, Y.min(axis=0), Y.max(axis=0), alpha=0.2)
    for ax in axes[::2]:
        ax.set_xlabel("episodes (per learner)")
    for ax in axes[1::2]:
        ax.set_xlabel("learner wall time (s, mean over seeds)")
    for ax in axes[:2]:
        ax.set_ylabel("team return (training episodes, exploring)")
    for ax in axes[2:]:
        ax.set_ylabel("greedy team return (evaluation)")
    if cfg.env_id.endswith("two_step_v0"):
        for ax in axes:
            ax.axhline(8.0, color="k", ls=":", lw=0.8)
            ax.axhline(7.0, color="gray", ls=":", lw=0.8)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    names = " / ".join({"qmix": "QMIX", "vdn": "VDN", "ippo": "independent PPO", "mappo": "MAPPO"}[a] for a in cfg.algorithms)
    fig.suptitle(f"{cfg.env_id}: {names} (mean over seeds, min-max band)")
    fig.tight_layout()
    path = f"{report_dir}/returns.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


EXPERIMENT = Experiment(config=CooperativeConfig, run=run_cooperative, plots=plots_cooperative)
