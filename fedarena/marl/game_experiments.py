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
    solver = XFPSolver(game)
    start, solver_time = 0, 0.0
    restored = run.restore()
    if restored:
        start, state = restored
        solver.load_state_dict(state["solver"])
        solver_time = float(state["solver_time"])
    else:
        run.log(0, exploitability=exploitability(game, solver.average_policy()), solver_time=0.0)
    rows = []
    e = float("nan")
    with run.progress(total=cfg.iterations, initial=start, desc=f"xfp {cfg.game}") as bar:
        for it in range(start + 1, cfg.iterations + 1):
            t0 = time.perf_counter()
            solver.iteration()
            solver_time += time.perf_counter() - t0
            if it % cfg.eval_every == 0 or it == cfg.iterations:
                e = exploitability(game, solver.average_policy())
                run.log(it, exploitability=e, solver_time=solver_time)
                rows.append({"step": it, "exploitability": e})
            if run.should_checkpoint(it) or it == cfg.iterations:
                run.save_checkpoint(it, {"solver": solver.state_dict(), "solver_time": solver_time})
            bar.update(1, expl=e)
    return {"game": cfg.game, "iterations": cfg.iterations, "exploitability": e,
            "solver_seconds_per_iteration": solver_time / max(cfg.iterations, 1),
            **_milestones(rows, "exploitability", (10, 100, 1000))}


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
    start, solver_time = 0, 0.0
    restored = run.restore()
    if restored:
        start, state = restored
        solver.load_state_dict(state["solver"])
        solver_time = float(state["solver_time"])
    rows = []
    e = float("nan")
    name = _cfr_name(cfg)
    with run.progress(total=cfg.iterations, initial=start, desc=f"{name} {cfg.game}") as bar:
        for it in range(start + 1, cfg.iterations + 1):
            t0 = time.perf_counter()
            solver.iteration()
            solver_time += time.perf_counter() - t0
            if it % cfg.eval_every == 0 or it == cfg.iterations or it == 1:
                e = exploitability(game, solver.average_policy())
                run.log(it, exploitability=e, solver_time=solver_time)
                rows.append({"step": it, "exploitability": e})
            if run.should_checkpoint(it) or it == cfg.iterations:
                run.save_checkpoint(it, {"solver": solver.state_dict(), "solver_time": solver_time})
            bar.update(1, expl=e)
    export_policy(run.dir / POLICY_FILE, cfg.game, solver.average_policy(), algorithm=name, iterations=cfg.iterations)
    return {"game": cfg.game, "algorithm": name, "iterations": cfg.iterations, "exploitability": e,
            "solver_seconds_per_iteration": solver_time / max(cfg.iterations, 1),
            **_milestones(rows, "exploitability", (100, 1000, 10000))}


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
    game = load_game(cfg.game)
    solvers = {m: PSRO(game, meta_solver=m, sample_episodes=cfg.sample_episodes,
                       seed=np.random.default_rng([cfg.seed, k])) for k, m in enumerate(cfg.meta_solvers)}
    times = {m: 0.0 for m in solvers}
    start = 0
    restored = run.restore()
    if restored:
        start, state = restored
        for m, s in solvers.items():
            s.load_state_dict(state[m]["psro"])
            times[m] = float(state[m]["solver_time"])
    else:
        run.log(0, **{f"{m}/exploitability": s.exploitability() for m, s in solvers.items()},
                **{f"{m}/solver_time": 0.0 for m in solvers})
    rows: list[dict] = []
    last: dict[str, float] = {}
    with run.progress(total=cfg.iterations, initial=start, desc=f"psro {cfg.game}") as bar:
        for it in range(start + 1, cfg.iterations + 1):
            for m, s in solvers.items():
                t0 = time.perf_counter()
                s.iteration()
                times[m] += time.perf_counter() - t0
            if it % cfg.eval_every == 0 or it == cfg.iterations:
                row = {}
                for m, s in solvers.items():
                    last[m] = row[f"{m}/exploitability"] = s.exploitability()
                    row[f"{m}/solver_time"] = times[m]
                    row[f"{m}/meta_strategy_support"] = int(sum((x > 1e-9).sum() for x in s.meta_strategies))
                run.log(it, **row)
                rows.append({"step": it, **row})
            if run.should_checkpoint(it) or it == cfg.iterations:
                run.save_checkpoint(it, {m: {"psro": s.state_dict(), "solver_time": times[m]}
                                         for m, s in solvers.items()})
            bar.update(1, **{m[:4]: last.get(m, float("nan")) for m in solvers})
    for m, s in solvers.items():  # each meta-solver's mixture of the populations, as policy_<meta-solver>.json
        export_policy(run.dir / f"policy_{m}.json", cfg.game, s.joint_policy(), algorithm=f"psro {m}",
                      iterations=cfg.iterations)
    summary: dict[str, Any] = {"game": cfg.game, "iterations": cfg.iterations,
                               "sampled": cfg.sample_episodes > 0}
    for m in solvers:
        summary[f"{m}/exploitability"] = last.get(m)
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
