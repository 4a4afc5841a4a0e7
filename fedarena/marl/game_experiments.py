"""Experiment kinds for the exact game-theory solvers: ``xfp`` (Heinrich et al., 2015), ``cfr`` (CFR/CFR+,
Zinkevich et al., 2007; Tammelin et al., 2015) and ``psro`` (Lanctot et al., 2017, several meta-solvers
side by side). Each logs exploitability per iteration with wall time, checkpoints the solver state, and
plots exploitability against iteration and against wall time on log scales (from the first positive value:
iteration 0 and solver time 0 are not drawn).

Tie-breaking of best responses (XFP, PSRO's exact oracle), and why trajectories differ from OpenSpiel's on
Kuhn poker: fedarena treats action values within a relative 1e-12 of the best as tied and takes the lowest
such action (:data:`fedarena.marl.best_response.TIE_TOLERANCE`); OpenSpiel's ``BestResponsePolicy`` takes
Python's ``max`` over the legal actions, i.e. the strictly largest float (the lowest action only among
bit-identical values). Kuhn poker has many exactly tied best responses whose sums differ by rounding, so the
two pick different actions there and XFP/PSRO trajectories diverge after a few iterations; both are exact best
responses, and exploitability values of the same policy agree to 1e-12 (``benchmarks/games_vs_openspiel.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedarena.envs import load_game
from fedarena.marl.cfr import CFRSolver
from fedarena.marl.exploitability import exploitability
from fedarena.marl.meta_solvers import META_SOLVERS
from fedarena.marl.policy_export import POLICY_FILE, evaluate_exported, export_policy
from fedarena.marl.psro import PSRO, check_meta_solver
from fedarena.marl.xfp import XFPSolver
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop


def _check_common(cfg: Any) -> None:
    try:
        load_game(cfg.game)
    except (KeyError, TypeError) as e:
        raise ValueError(str(e).strip("'\"")) from None
    if cfg.iterations < 1:
        raise ValueError(f"iterations: must be at least 1, got {cfg.iterations}")
    if cfg.eval_every < 1:
        raise ValueError(f"eval_every: must be at least 1, got {cfg.eval_every}")


def _check_meta_solvers(name: str, meta_solvers: list[str]) -> None:
    """Each meta-solver must be able to solve the game's meta-games (``nash`` needs a two-player zero-sum game;
    ``prd``, ``uniform`` and ``last`` also solve general-sum and n-player ones; see :mod:`fedarena.marl.psro`)."""
    game = load_game(name)
    for m in meta_solvers:
        try:
            check_meta_solver(game, m)
        except ValueError as e:
            raise ValueError(f"meta_solvers: {str(e).split(': ', 1)[1]} (game '{name}')") from None


def _milestones(rows: list[dict], key: str, at: tuple[int, ...]) -> dict[str, float]:
    by_step = {r["step"]: r[key] for r in rows if key in r}
    return {f"{key}@{k}": float(by_step[k]) for k in at if k in by_step}


# ----------------------------------------------------------------------------- XFP


@dataclass(frozen=True)
class XFPConfig(ExperimentConfig):
    game: str = param("kuhn_poker", "game by name (kuhn_poker, leduc_poker, or a matrix game)")
    iterations: int = param(100, "number of XFP iterations")
    eval_every: int = param(1, "compute the exploitability of the average policy every this many iterations")

    def __post_init__(self) -> None:
        _check_common(self)


def run_xfp(cfg: XFPConfig, run) -> dict[str, Any]:
    game = load_game(cfg.game)
    steps = _SolverSteps(run, cfg, game, XFPSolver(game), "xfp", log_first=True)
    return run_loop(run, steps, eval_every=cfg.eval_every) | _milestones(run.rows(), "exploitability",
                                                                          (10, 100, 1000))


class _SolverSteps:
    """XFP and CFR under :func:`~fedarena.platform.loop.run_loop`: one solver iteration a step, the exact
    exploitability of the average policy on the loop's evaluation cadence, the solver's own time beside it."""

    def __init__(self, run: Any, cfg: Any, game: Any, solver: Any, name: str, log_first: bool):
        self.run, self.cfg, self.game, self.solver, self.name = run, cfg, game, solver, name
        self.log_first = log_first
        self.desc = f"{name} {cfg.game}"
        self.total = cfg.iterations
        self.it, self.solver_time = 0, 0.0

    def init(self) -> dict[str, float] | None:
        if not self.log_first:
            return None
        return {"exploitability": exploitability(self.game, self.solver.average_policy()), "solver_time": 0.0}

    def load(self, step: int, state: dict[str, Any]) -> None:
        self.it = step
        self.solver.load_state_dict(state["solver"])
        self.solver_time = float(state["solver_time"])

    def state(self) -> dict[str, Any]:
        return {"solver": self.solver.state_dict(), "solver_time": self.solver_time}

    def done(self) -> bool:
        return self.it >= self.cfg.iterations

    def units(self) -> int:
        return self.it

    def step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        self.solver.iteration()
        self.solver_time += time.perf_counter() - t0
        self.it = step
        return {}

    def evaluate(self, step: int) -> dict[str, float]:
        return {"exploitability": exploitability(self.game, self.solver.average_policy()),
                "solver_time": self.solver_time}

    def summary(self) -> dict[str, Any]:
        logged = [r["exploitability"] for r in self.run.rows() if "exploitability" in r]
        return {"game": self.cfg.game, "iterations": self.it,
                "exploitability": logged[-1] if logged else float("nan"),
                "solver_seconds_per_iteration": self.solver_time / max(self.it, 1)}


# ----------------------------------------------------------------------------- CFR / CFR+


@dataclass(frozen=True)
class CFRConfig(ExperimentConfig):
    game: str = param("leduc_poker", "game by name (kuhn_poker, leduc_poker, or a matrix game)")
    iterations: int = param(1000, "number of iterations")
    plus: bool = param(True, "CFR+: regret matching+ (cumulative regrets clipped at 0), linear averaging by "
                       "default; false: vanilla CFR")
    linear_averaging: bool | None = param(None, "weight iteration t's policy by t in the average (null: as `plus`)")
    alternating: bool = param(True, "alternating updates (each player updates against the other's newest "
                              "policy); false: simultaneous updates")
    eval_every: int = param(10, "compute the exploitability of the average policy every this many iterations")

    def __post_init__(self) -> None:
        _check_common(self)


def run_cfr(cfg: CFRConfig, run) -> dict[str, Any]:
    game = load_game(cfg.game)
    solver = CFRSolver(game, plus=cfg.plus, linear_averaging=cfg.linear_averaging, alternating=cfg.alternating)
    name = _cfr_name(cfg)
    summary = run_loop(run, _SolverSteps(run, cfg, game, solver, name, log_first=False), eval_every=cfg.eval_every,
                       eval_first=True)
    export_policy(run.dir / POLICY_FILE, cfg.game, solver.average_policy(), algorithm=name,
                  iterations=summary.get("iterations", cfg.iterations))
    return {"game": summary.pop("game"), "algorithm": name, **summary,
            **_milestones(run.rows(), "exploitability", (100, 1000, 10000))}


def _cfr_name(cfg: "CFRConfig") -> str:
    name = "cfr+" if cfg.plus else "cfr"
    linear = cfg.plus if cfg.linear_averaging is None else cfg.linear_averaging
    if linear != cfg.plus:
        name += " linear-avg" if linear else " uniform-avg"
    if not cfg.alternating:
        name += " simultaneous"
    return name


# ----------------------------------------------------------------------------- PSRO


@dataclass(frozen=True)
class PSROConfig(ExperimentConfig):
    game: str = param("kuhn_poker", "game by name (two-player zero-sum for nash; prd/uniform/last also general-sum "
                      "and n-player)")
    iterations: int = param(30, "PSRO iterations (one new policy per player each)")
    meta_solvers: list[str] = param(doc="meta-solvers run side by side (nash, prd, regret_matching, uniform, last)",
                                    factory=lambda: ["nash", "prd", "uniform", "last"])
    oracle: str = param("exact_best_response", "response oracle (exact_best_response)")
    sample_episodes: int = param(0, "episodes per empirical-game entry; 0 computes the entries exactly")
    eval_every: int = param(1, "compute exploitability every this many iterations")

    def __post_init__(self) -> None:
        _check_common(self)
        if not self.meta_solvers:
            raise ValueError("meta_solvers: give at least one of " + ", ".join(sorted(META_SOLVERS)))
        for m in self.meta_solvers:
            if m not in META_SOLVERS:
                raise ValueError(f"meta_solvers: unknown meta-solver '{m}'; known: {', '.join(sorted(META_SOLVERS))}")
        if len(set(self.meta_solvers)) != len(self.meta_solvers):
            raise ValueError(f"meta_solvers: listed twice in {self.meta_solvers}")
        _check_meta_solvers(self.game, self.meta_solvers)
        if self.oracle != "exact_best_response":
            raise ValueError(f"oracle: unknown oracle '{self.oracle}'; known: exact_best_response")
        if self.sample_episodes < 0:
            raise ValueError(f"sample_episodes: must be >= 0 (0 = exact), got {self.sample_episodes}")


def run_psro(cfg: PSROConfig, run) -> dict[str, Any]:
    steps = _PSROSteps(run, cfg)
    summary = run_loop(run, steps, eval_every=cfg.eval_every)
    for m, s in steps.solvers.items():  # each meta-solver's mixture of the populations, as policy_<meta-solver>.json
        export_policy(run.dir / f"policy_{m}.json", cfg.game, s.joint_policy(), algorithm=f"psro {m}",
                      iterations=steps.it)
    return summary


class _PSROSteps:
    """PSRO under :func:`~fedarena.platform.loop.run_loop`: one iteration of every meta-solver's PSRO a step."""

    def __init__(self, run: Any, cfg: PSROConfig):
        self.run, self.cfg = run, cfg
        game = load_game(cfg.game)
        self.solvers = {m: PSRO(game, meta_solver=m, sample_episodes=cfg.sample_episodes,
                                seed=np.random.default_rng([cfg.seed, k])) for k, m in enumerate(cfg.meta_solvers)}
        self.times = {m: 0.0 for m in self.solvers}
        self.desc, self.total, self.it = f"psro {cfg.game}", cfg.iterations, 0

    def init(self) -> dict[str, float]:
        return {**{f"{m}/exploitability": s.exploitability() for m, s in self.solvers.items()},
                **{f"{m}/solver_time": 0.0 for m in self.solvers}}

    def load(self, step: int, state: dict[str, Any]) -> None:
        self.it = step
        for m, s in self.solvers.items():
            s.load_state_dict(state[m]["psro"])
            self.times[m] = float(state[m]["solver_time"])

    def state(self) -> dict[str, Any]:
        return {m: {"psro": s.state_dict(), "solver_time": self.times[m]} for m, s in self.solvers.items()}

    def done(self) -> bool:
        return self.it >= self.cfg.iterations

    def units(self) -> int:
        return self.it

    def step(self, step: int) -> dict[str, float]:
        for m, s in self.solvers.items():
            t0 = time.perf_counter()
            s.iteration()
            self.times[m] += time.perf_counter() - t0
        self.it = step
        return {}

    def evaluate(self, step: int) -> dict[str, float]:
        row: dict[str, float] = {}
        for m, s in self.solvers.items():
            row[f"{m}/exploitability"] = s.exploitability()
            row[f"{m}/solver_time"] = self.times[m]
            row[f"{m}/meta_strategy_support"] = int(sum((x > 1e-9).sum() for x in s.meta_strategies))
        return row

    def summary(self) -> dict[str, Any]:
        rows = [r for r in self.run.rows() if r["step"] > 0]
        summary: dict[str, Any] = {"game": self.cfg.game, "iterations": self.it,
                                   "sampled": self.cfg.sample_episodes > 0}
        for m in self.solvers:
            logged = [r[f"{m}/exploitability"] for r in rows if f"{m}/exploitability" in r]
            summary[f"{m}/exploitability"] = logged[-1] if logged else None
            summary.update(_milestones(rows, f"{m}/exploitability", (10, 20, 50, 100)))
            below = [r["step"] for r in rows if r.get(f"{m}/exploitability", 1.0) < 1e-9]
            summary[f"{m}/first_iteration_below_1e-9"] = below[0] if below else None
        return summary


# ----------------------------------------------------------------------------- plots


def _exploitability_plots(rows, report_dir: str, title: str, series: dict[str, tuple[str, str]]) -> list[str]:
    """``series``: label -> (exploitability key, time key)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, (ekey, tkey) in series.items():
        pts = [(r["step"], r[ekey], r.get(tkey, r.get("wall_time"))) for r in rows if ekey in r]
        if not pts:
            continue
        steps, expl, wall = (np.array(v, dtype=float) for v in zip(*pts))
        ok = expl > 0  # log axes start at the first positive value: no fake positions for 0
        axes[0].plot(steps[ok & (steps > 0)], expl[ok & (steps > 0)], "-", lw=1.4, label=label)
        axes[1].plot(wall[ok & (wall > 0)], expl[ok & (wall > 0)], "-", lw=1.4, label=label)
    axes[0].set_xlabel("iteration")
    axes[1].set_xlabel("solver wall time (s)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylabel("exploitability (NashConv / 2)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = f"{report_dir}/exploitability.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def plots_xfp(rows, cfg: XFPConfig, report_dir: str) -> list[str]:
    return _exploitability_plots(rows, report_dir, f"XFP on {cfg.game}", {"XFP average policy": ("exploitability", "solver_time")})


def plots_cfr(rows, cfg: CFRConfig, report_dir: str) -> list[str]:
    name = _cfr_name(cfg).upper()
    return _exploitability_plots(rows, report_dir, f"{name} on {cfg.game}",
                                 {f"{name} average policy": ("exploitability", "solver_time")})


def plots_psro(rows, cfg: PSROConfig, report_dir: str) -> list[str]:
    how = f"sampled payoffs ({cfg.sample_episodes} episodes/entry)" if cfg.sample_episodes else "exact payoffs"
    return _exploitability_plots(rows, report_dir, f"PSRO on {cfg.game}, exact best responses, {how}",
                                 {m: (f"{m}/exploitability", f"{m}/solver_time") for m in cfg.meta_solvers})


XFP_EXPERIMENT = Experiment(config=XFPConfig, run=run_xfp, plots=plots_xfp)
CFR_EXPERIMENT = Experiment(config=CFRConfig, run=run_cfr, plots=plots_cfr, evaluate=evaluate_exported)
PSRO_EXPERIMENT = Experiment(config=PSROConfig, run=run_psro, plots=plots_psro, evaluate=evaluate_exported)
