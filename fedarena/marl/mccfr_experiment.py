"""The ``mccfr`` experiment kind: external- or outcome-sampling MCCFR (Lanctot et al., 2009;
:mod:`fedarena.marl.mccfr`) with the exact exploitability of the average policy against iterations, histories
touched and solver wall time, and the average policy exported as ``policy.json``
(:mod:`fedarena.marl.policy_export`; ``fedarena evaluate RUN`` scores it exactly).

Games whose tree fits ``max_tree_nodes`` run on the compiled tree (batched samples, exact exploitability);
larger games (chess, oshi_zumo, 3-player Leduc) run on :class:`~fedarena.marl.mccfr.LazyMCCFRSolver`, which
walks the game one sample at a time, logs histories touched and time, skips the exploitability (no exact
best response exists at that size) and exports the information states it met (``complete: false`` in the file).
``lazy: true`` forces the lazy walk on a small game too; there the states it never met play uniformly in the
exploitability and the export. The lazy walk is bounded: external sampling is refused before the run (config
error, exit status 2) where Knuth's estimate of one iteration is above ``max_traversal_nodes`` (chess, oshi_zumo:
use outcome sampling), and a run stops with a one-line error when an iteration touches more histories than that or
the tables reach ``max_infostates`` information states (the rows logged so far and the last checkpoint stay; no
policy is exported). Both walks checkpoint and resume (the lazy one packs its tables into flat arrays).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedarena.envs import load_game
from fedarena.envs.efg import TreeTooLargeError, check_tree_size
from fedarena.marl.exploitability import exploitability
from fedarena.marl.game_experiments import _check_common, _SolverSteps
from fedarena.marl.game_tree import game_tree
from fedarena.marl.mccfr import (DEFAULT_MAX_INFOSTATES, DEFAULT_MAX_TRAVERSAL_NODES, LazyMCCFRSolver,
                                 LazyWalkLimitError, MCCFROptions, MCCFRSolver, check_external_traversal)
from fedarena.marl.policy_export import FORMAT, POLICY_FILE, evaluate_exported, export_policy
from fedarena.platform.errors import ConfigError, RunError
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop


@dataclass(frozen=True)
class MCCFRConfig(ExperimentConfig):
    game: str = param("leduc_poker", "game by name (kuhn_poker, leduc_poker, or an OpenSpiel game string)")
    sampling: str = param("external", "external (sample chance and the others, explore the updating player) "
                          "or outcome (sample one terminal history per episode)")
    iterations: int = param(300, "iterations; each updates every player in turn from `batch` samples")
    batch: int = param(512, "samples per player per iteration on the compiled tree (1: textbook MCCFR)")
    averaging: str = param("uniform", "average-policy weights: uniform (1 per iteration) or linear (t)")
    discount: list[float] | None = param(None, "[alpha, beta, gamma] of discounted CFR applied after every "
                                         "iteration (Brown & Sandholm 2019); null: none")
    exploration: float = param(0.6, "outcome sampling: epsilon of the updating player's sampling policy")
    lazy: bool | None = param(None, "walk the game lazily (one sample at a time, no compiled tree); "
                              "null: only when the tree is above max_tree_nodes")
    max_tree_nodes: int | None = param(None, "histories the compiled tree may have (null: "
                                       "$FEDARENA_MAX_TREE_NODES or 1,000,000)")
    max_traversal_nodes: int = param(DEFAULT_MAX_TRAVERSAL_NODES, "lazy walk: histories one iteration may touch; "
                                     "external sampling is refused before the run when Knuth's estimate of one "
                                     "iteration is above it, and any iteration stops the run when it touches more")
    max_infostates: int = param(DEFAULT_MAX_INFOSTATES, "lazy walk: information states it may store (measured: "
                                "531 bytes each on 3-player Leduc, 2,059 on chess, several times that while a "
                                "checkpoint is written or read); more stops the run with an error")
    eval_every: int = param(10, "compute the exact exploitability of the average policy every this many iterations")

    def __post_init__(self) -> None:
        _check_common(self)  # game, iterations, eval_every: as the exact solvers' kinds check them
        if self.max_tree_nodes is not None and self.max_tree_nodes < 1:
            raise ValueError(f"max_tree_nodes: must be at least 1 or null, got {self.max_tree_nodes}")
        for name in ("max_traversal_nodes", "max_infostates"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)}")
        self.options()   # validates sampling, averaging, discount, exploration, batch

    def options(self, lazy: bool = False) -> MCCFROptions:
        return MCCFROptions(sampling=self.sampling, averaging=self.averaging,
                            discount=None if self.discount is None else tuple(float(x) for x in self.discount),
                            exploration=self.exploration, batch=1 if lazy else self.batch)


def _fits(game: Any, max_tree_nodes: int | None) -> bool:
    try:
        check_tree_size(game, max_tree_nodes)
    except TreeTooLargeError:
        return False
    return True


def _average(solver: Any, game: Any, exact: bool) -> dict[str, np.ndarray]:
    """The average policy; where the tree fits, the information states a lazy walk never met play uniformly."""
    policy = solver.average_policy_dict()
    if exact and isinstance(solver, LazyMCCFRSolver):
        tree = game_tree(game)
        uniform = tree.uniform_probs()
        policy = {s: policy.get(s, uniform[j]) for j, s in enumerate(tree.infostates)}
    return policy


def run_mccfr(cfg: MCCFRConfig, run) -> dict[str, Any]:
    game = load_game(cfg.game)
    exact = _fits(game, cfg.max_tree_nodes)        # exact exploitability only where the tree fits
    lazy = (not exact) if cfg.lazy is None else cfg.lazy
    if lazy:
        if cfg.sampling == "external":
            try:
                check_external_traversal(game, cfg.max_traversal_nodes)
            except LazyWalkLimitError as e:
                raise ConfigError(str(e)) from None
        solver: Any = LazyMCCFRSolver(game, cfg.options(lazy=True), seed=cfg.seed,
                                      max_traversal_nodes=cfg.max_traversal_nodes, max_infostates=cfg.max_infostates)
    else:
        solver = MCCFRSolver(game, cfg.options(), seed=cfg.seed, max_tree_nodes=cfg.max_tree_nodes)
    steps = _MCCFRSteps(run, cfg, game, solver, exact)
    summary = run_loop(run, steps, eval_every=cfg.eval_every, eval_first=True)
    meta = dict(algorithm=steps.name, iterations=steps.it, batch=1 if lazy else cfg.batch, averaging=cfg.averaging,
                complete=exact)
    if exact:
        export_policy(run.dir / POLICY_FILE, cfg.game, _average(solver, game, exact), **meta)
        return summary
    entries = solver.num_infostates * game.num_distinct_actions
    if entries > MAX_EXPORT_ENTRIES:
        summary["policy"] = (f"not exported: {solver.num_infostates:,} information states x "
                             f"{game.num_distinct_actions:,} actions, above {MAX_EXPORT_ENTRIES:,} entries")
        run.logger.warning("policy.json %s", summary["policy"])
        return summary
    _stream_policy(run.dir / POLICY_FILE, cfg.game, solver, meta)
    return summary


MAX_EXPORT_ENTRIES = 20_000_000
"""Probabilities (information states x the game's actions) a lazy run may write to ``policy.json`` (about 100 MB
of JSON); the format stores every action of every state, so chess passes it within a few iterations."""


def _stream_policy(path: Any, game: str, solver: LazyMCCFRSolver, meta: dict[str, Any]) -> None:
    """Write the lazy walk's average policy in :func:`~fedarena.marl.policy_export.export_policy`'s format one row at
    a time, so the file never sits in memory whole."""
    head = json.dumps({"format": FORMAT, "game": game, "num_actions": solver.game.num_distinct_actions, **meta})
    with open(path, "w", encoding="utf-8") as f:
        f.write(head[:-1] + ', "policy": {')
        for k, (key, row) in enumerate(solver.average_policy_rows()):
            f.write((", " if k else "") + json.dumps(str(key)) + ": " + json.dumps([float(x) for x in row]))
        f.write("}}")


class _MCCFRSteps(_SolverSteps):
    """MCCFR under :func:`~fedarena.platform.loop.run_loop`: the exact solvers' steps (one solver iteration a step,
    its time, the checkpointed state); on the loop's evaluation cadence the solver time, histories touched and the
    exact exploitability (or, where no exact best response exists, the information states met)."""

    def __init__(self, run: Any, cfg: MCCFRConfig, game: Any, solver: Any, exact: bool):
        super().__init__(run, cfg, game, solver, f"{cfg.sampling}-sampling MCCFR", log_first=False)
        self.exact, self.lazy = exact, isinstance(solver, LazyMCCFRSolver)
        self.desc = f"mccfr {cfg.game}"

    def step(self, step: int) -> dict[str, float]:
        try:
            return super().step(step)
        except LazyWalkLimitError as e:   # the tables of this iteration are partial: the last checkpoint stays
            raise RunError(str(e)) from None

    def evaluate(self, step: int) -> dict[str, float]:
        row = {"solver_time": self.solver_time, "nodes_touched": self.solver.nodes_touched}
        if self.exact:
            row["exploitability"] = exploitability(self.game, _average(self.solver, self.game, self.exact))
        else:
            row["information_states"] = self.solver.num_infostates
        return row

    def summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"game": self.cfg.game, "algorithm": self.name,
                                   "walk": "lazy" if self.lazy else "compiled tree", "iterations": self.it,
                                   "nodes_touched": int(self.solver.nodes_touched),
                                   "solver_seconds": self.solver_time, "policy": str(self.run.dir / POLICY_FILE)}
        if self.exact:
            rows = [r for r in self.run.rows() if "exploitability" in r]
            summary["exploitability"] = rows[-1]["exploitability"] if rows else float("nan")
            summary.update(first_below(rows, 0.05))
        return summary


def first_below(rows: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """The iteration, histories touched and solver time of the first row whose exploitability is at most
    ``threshold`` (``first_below_<threshold>/...`` summary keys; empty when none is)."""
    below = [r for r in rows if r["exploitability"] <= threshold]
    if not below:
        return {}
    return {f"first_below_{threshold:g}/iteration": below[0]["step"],
            f"first_below_{threshold:g}/nodes_touched": below[0]["nodes_touched"],
            f"first_below_{threshold:g}/solver_seconds": below[0]["solver_time"]}


def exploitability_panels(rows, report_dir: str, *, title: str, label: str, target: float | None = None,
                          marker: str = "-") -> list[str]:
    """``exploitability.png``: exploitability against iterations, histories touched and solver time (log-log),
    with a dotted line at ``target`` when given; no figure when no row has an exploitability."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(r["step"], r["nodes_touched"], r["solver_time"], r["exploitability"]) for r in rows
           if "exploitability" in r]
    if not pts:
        return []
    steps, nodes, wall, expl = (np.array(v, dtype=float) for v in zip(*pts))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, x, xlabel in zip(axes, (steps, nodes, wall), ("iteration", "histories touched", "solver wall time (s)")):
        ok = (x > 0) & (expl > 0)
        ax.plot(x[ok], expl[ok], marker, ms=3, lw=1.4, label=label)
        if target is not None:
            ax.axhline(target, color="gray", ls=":", lw=1, label=f"{target:g}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("exact exploitability of the average policy")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = f"{report_dir}/exploitability.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def plots_mccfr(rows, cfg: MCCFRConfig, report_dir: str) -> list[str]:
    return exploitability_panels(rows, report_dir, title=f"MCCFR on {cfg.game}",
                                 label=f"{cfg.sampling} sampling, batch {cfg.batch}")


EXPERIMENT = Experiment(config=MCCFRConfig, run=run_mccfr, plots=plots_mccfr, evaluate=evaluate_exported,
                        summary_keys=("exploitability", "nodes_touched", "solver_time"))
