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


from fedarena.envs import load_game
from fedarena.marl.deep_cfr import AVERAGES, DeepCFR, DeepCFRConfig
from fedarena.marl.exploitability import exploitability
from fedarena.marl.game_experiments import _check_common, _SolverSteps
from fedarena.marl.mccfr_experiment import exploitability_panels, first_below
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
        summary.update(first_below(rows, 0.1))
        return summary


def plots_deep_cfr(rows, cfg: DeepCFRExperimentConfig, report_dir: str) -> list[str]:
    name = "Single Deep CFR (mixture)" if cfg.average == "mixture" else "Deep CFR (average network)"
    return exploitability_panels(rows, report_dir, title=f"{name} on {cfg.game}", target=0.1, marker="o-",
                                 label=f"{name}, {cfg.traversals} traversals")


EXPERIMENT = Experiment(config=DeepCFRExperimentConfig, run=run_deep_cfr, plots=plots_deep_cfr,
                        evaluate=evaluate_exported, x_axis="nodes_touched",
                        summary_keys=("exploitability", "nodes_touched", "solver_time"))
