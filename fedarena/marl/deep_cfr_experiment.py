"""The ``deep_cfr`` experiment kind: Single Deep CFR (Steinberger, 2019) or Deep CFR (Brown et al., 2019) on a
game that compiles (:mod:`fedarena.marl.deep_cfr`), with the exact exploitability of the average strategy against
iterations, histories touched by the traversals and solver wall time, and the average strategy exported as
``policy.json`` (:mod:`fedarena.marl.policy_export`; ``fedarena evaluate RUN`` scores it exactly).

``average: mixture`` scores Single Deep CFR's average strategy: the mixture of every iteration's advantage
networks, evaluated exactly at every information state. ``average: network`` scores Deep CFR's average-strategy
network, trained afresh on the strategy memory at every evaluation (its training time is not solver time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedarena.envs import load_game
from fedarena.marl.deep_cfr import AVERAGES, DeepCFR, DeepCFRConfig
from fedarena.marl.exploitability import exploitability
from fedarena.marl.game_experiments import _check_common, _SolverSteps
from fedarena.marl.policy_export import POLICY_FILE, evaluate_exported, export_policy
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop


@dataclass(frozen=True)
class DeepCFRExperimentConfig(ExperimentConfig):
    game: str = param("leduc_poker", "game by name (kuhn_poker, leduc_poker, or an OpenSpiel game string) whose "
                      "tree compiles and which has information-state tensors")
    average: str = param("mixture", "mixture: Single Deep CFR (every iteration's advantage networks, weighted by "
                         "iteration); network: Deep CFR's average-strategy network")
    iterations: int = param(100, "iterations; each trains every player's advantage network once")
    traversals: int = param(2048, "external-sampling traversals per player per iteration")
    hidden: list[int] = param(doc="hidden layer sizes of the networks (ReLU MLP)", factory=lambda: [64, 64])
    advantage_steps: int = param(1000, "Adam steps of each advantage network, trained from scratch every iteration")
    policy_steps: int = param(2000, "Adam steps of the average-strategy network (average: network)")
    batch_size: int = param(1024, "rows per step; a memory that merges to at most this many information states "
                            "trains full-batch")
    learning_rate: float = param(1e-3, "Adam learning rate")
    max_grad_norm: float = param(1.0, "gradients clipped to this global norm")
    eval_every: int = param(5, "exact exploitability of the average strategy every this many iterations")

    def __post_init__(self) -> None:
        _check_common(self)
        if self.average not in AVERAGES:
            raise ValueError(f"average: expected one of {', '.join(AVERAGES)}, got '{self.average}'")
        self.solver_config()   # validates the solver's fields

    def solver_config(self) -> DeepCFRConfig:
        return DeepCFRConfig(traversals=self.traversals, hidden=tuple(int(h) for h in self.hidden),
                             advantage_steps=self.advantage_steps, policy_steps=self.policy_steps,
                             batch_size=self.batch_size, learning_rate=self.learning_rate,
                             max_grad_norm=self.max_grad_norm, average=self.average)


def run_deep_cfr(cfg: DeepCFRExperimentConfig, run: Any) -> dict[str, Any]:
    game = load_game(cfg.game)
    solver = DeepCFR(game, cfg.solver_config(), seed=cfg.seed)
    steps = _DeepCFRSteps(run, cfg, game, solver)
    summary = run_loop(run, steps, eval_every=cfg.eval_every, eval_first=True)
    export_policy(run.dir / POLICY_FILE, cfg.game, steps.last_policy or solver.average_policy(),
                  algorithm=steps.name, iterations=steps.it, traversals=cfg.traversals)
    return summary


class _DeepCFRSteps(_SolverSteps):
    """Deep CFR under :func:`~fedarena.platform.loop.run_loop`: one iteration a step; on the evaluation cadence the
    solver time, histories touched and the exact exploitability of the average strategy."""

    def __init__(self, run: Any, cfg: DeepCFRExperimentConfig, game: Any, solver: DeepCFR):
        name = "Single Deep CFR" if cfg.average == "mixture" else "Deep CFR"
        super().__init__(run, cfg, game, solver, name, log_first=False)
        self.desc = f"deep_cfr {cfg.game}"
        self.last_policy: Any = None   # the average strategy last scored (Deep CFR's network is trained per call)

    def evaluate(self, step: int) -> dict[str, float]:
        self.last_policy = self.solver.average_policy()
        return {"solver_time": self.solver_time, "nodes_touched": self.solver.nodes_touched,
                "exploitability": exploitability(self.game, self.last_policy)}

    def step(self, step: int) -> dict[str, float]:
        self.last_policy = None
        return super().step(step)

    def summary(self) -> dict[str, Any]:
        rows = [r for r in self.run.rows() if "exploitability" in r]
        summary: dict[str, Any] = {"game": self.cfg.game, "algorithm": self.name, "iterations": self.it,
                                   "nodes_touched": int(self.solver.nodes_touched),
                                   "solver_seconds": self.solver_time,
                                   "exploitability": rows[-1]["exploitability"] if rows else float("nan"),
                                   "policy": str(self.run.dir / POLICY_FILE)}
        below = [r for r in rows if r["exploitability"] <= 0.1]
        if below:
            summary.update({"first_below_0.1/iteration": below[0]["step"],
                            "first_below_0.1/nodes_touched": below[0]["nodes_touched"],
                            "first_below_0.1/solver_seconds": below[0]["solver_time"]})
        return summary


def plots_deep_cfr(rows, cfg: DeepCFRExperimentConfig, report_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(r["step"], r["nodes_touched"], r["solver_time"], r["exploitability"]) for r in rows
           if "exploitability" in r]
    if not pts:
        return []
    steps, nodes, wall, expl = (np.array(v, dtype=float) for v in zip(*pts))
    name = "Single Deep CFR (mixture)" if cfg.average == "mixture" else "Deep CFR (average network)"
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, x, label in zip(axes, (nodes, steps, wall), ("histories touched by the traversals", "iteration",
                                                         "solver wall time (s)")):
        ok = (x > 0) & (expl > 0)
        ax.plot(x[ok], expl[ok], "o-", ms=3, lw=1.4, label=f"{name}, {cfg.traversals} traversals")
        ax.axhline(0.1, color="gray", ls=":", lw=1, label="0.1")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("exact exploitability of the average strategy")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"{name} on {cfg.game}")
    fig.tight_layout()
    path = f"{report_dir}/exploitability.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


EXPERIMENT = Experiment(config=DeepCFRExperimentConfig, run=run_deep_cfr, plots=plots_deep_cfr,
                        evaluate=evaluate_exported, x_axis="nodes_touched",
                        summary_keys=("exploitability", "nodes_touched", "solver_time"))
