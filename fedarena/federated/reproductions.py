"""Experiment kinds that reproduce published federated-learning results on the in-process simulation.

* ``fedavg_table`` -- McMahan et al. 2017 (AISTATS), Tables 1 and 2 layout: rounds of FedAvg until the
  global model first reaches a target test accuracy, over a grid of the client fraction C, local epochs E,
  local minibatch size B (0 = B = infinity, full-batch local gradient descent) and the split (IID vs the
  pathological non-IID split: sorted by label, cut into 2 shards per client). C = 0 means one client a
  round, as in the paper. The report has the accuracy curves of every cell and the table (rounds, and the
  speed-up over FedSGD, E = 1 and B = infinity, at the same C and split).
* ``fedprox_figure`` -- Li et al. 2020 (MLSys), Figure 1 layout: global training loss per round on
  Synthetic(alpha, beta) for 0 / 50 / 90 % stragglers, comparing FedAvg (stragglers dropped), FedProx with
  mu = 0 (stragglers' partial work kept) and FedProx with mu > 0, over several training seeds on one data
  set. The summary gives, per cell, the statistics of :func:`loss_statistics` (final loss, spread over
  seeds, round-to-round oscillation).

* ``fedsim_sweep`` -- variants of one ``fedsim`` config side by side (compression: accuracy against
  uploaded bytes; DP-FedAvg, local DP and SignDS: accuracy against the accountant's epsilon), with the
  curves and a table of final accuracy, uploaded bytes, upload reduction and epsilon.

All run :class:`fedarena.federated.simulation.Simulation` through the ``fedsim`` kind's builder, so every
option of a cell means what it means in ``fedsim``.
"""

from __future__ import annotations

import ctypes
import gc
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Mapping

import numpy as np

from fedarena.platform.config import ConfigError, merged, migrate, plain
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop


def _cell_name(partition: str, c: float, e: int, b: int) -> str:
    return f"{'iid' if partition == 'iid' else 'non-iid'} C={c:g} E={e} B={'inf' if b == 0 else b}"


# ----------------------------------------------------------------------------- FedAvg, Table 2 layout


@dataclass(frozen=True)
class FedAvgTableConfig(ExperimentConfig):
    dataset: Literal["digits", "mnist"] = param("digits", "digits (scikit-learn) or mnist (local IDX files at path)")
    path: str = param("", "folder with the MNIST IDX files (dataset: mnist)")
    num_clients: int = param(100, "number of clients K")
    shards_per_client: int = param(2, "label shards per client of the non-IID split")
    model: Literal["mlp", "cnn"] = param("mlp", "mlp, or cnn: the paper's CNN (5x5 convs of cnn_channels, 2x2 max "
                                         "pools, cnn_hidden ReLU units, softmax)")
    hidden: list[int] = param(doc="MLP hidden sizes (the paper's 2NN is [200, 200])", factory=lambda: [32])
    cnn_channels: list[int] = param(doc="cnn: channels of the two 5x5 convolutions (paper: 32, 64)",
                                    factory=lambda: [32, 64])
    cnn_hidden: int = param(512, "cnn: fully connected ReLU units (paper: 512)")
    lr: float = param(0.1, "local SGD learning rate")
    target: float = param(0.95, "test accuracy whose first crossing is counted")
    max_rounds: int = param(500, "a cell that has not reached the target after this many rounds is reported '>'")
    client_fractions: list[float] = param(doc="C values (C = 0: one client a round)", factory=lambda: [0.0, 0.1, 0.2])
    epochs: list[int] = param(doc="E values", factory=lambda: [1, 5])
    batch_sizes: list[int] = param(doc="B values (0 = infinity: the client's whole data)", factory=lambda: [10, 0])
    partitions: list[str] = param(doc="splits: iid and/or shards", factory=lambda: ["iid", "shards"])
    test_fraction: float = param(0.2, "global test set fraction (digits)")

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1:
            raise ValueError(f"target: must lie in (0, 1], got {self.target}")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds: must be >= 1, got {self.max_rounds}")
        for c in self.client_fractions:
            if not 0 <= c <= 1:
                raise ValueError(f"client_fractions: {c} must lie in [0, 1]")
        if any(e < 1 for e in self.epochs):
            raise ValueError(f"epochs: every E must be >= 1, got {self.epochs}")
        if any(b < 0 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes: every B must be >= 0 (0 = infinity), got {self.batch_sizes}")
        for p in self.partitions:
            if p not in ("iid", "shards"):
                raise ValueError(f"partitions: '{p}' is not iid or shards")
        if not (self.client_fractions and self.epochs and self.batch_sizes and self.partitions):
            raise ValueError("client_fractions/epochs/batch_sizes/partitions: each needs at least one value")
        self.cell_config(self.partitions[0], self.client_fractions[0], self.epochs[0], 10)  # validates the rest

    def clients_per_round(self, c: float) -> int:
        return max(1, int(round(c * self.num_clients)))

    def cell_config(self, partition: str, c: float, e: int, b: int):
        from fedarena.federated.fedsim_experiment import FedSimConfig

        from fedarena.federated import config as fc

        return FedSimConfig(
            kind="fedsim", seed=self.seed, rounds=self.max_rounds,
            data=fc.DataConfig(dataset=self.dataset, path=self.path, num_clients=self.num_clients, partition=partition,
                               shards_per_client=self.shards_per_client, test_fraction=self.test_fraction,
                               held_out_fraction=0.0),
            model=fc.ModelConfig(arch=self.model, hidden=list(self.hidden), cnn_channels=list(self.cnn_channels),
                                 cnn_hidden=self.cnn_hidden),
            clients=fc.SimClientsConfig(per_round=self.clients_per_round(c), epochs=e, batch_size=max(b, 1),
                                        lr=self.lr),
            privacy=fc.SimPrivacyConfig(seed=0))


def _fedavg_cells(cfg: FedAvgTableConfig) -> list[tuple[str, float, int, int]]:
    return [(p, c, e, b) for p in cfg.partitions for c in cfg.client_fractions for e in cfg.epochs
            for b in cfg.batch_sizes]


def run_fedavg_table(cfg: FedAvgTableConfig, run) -> dict[str, Any]:
    return run_loop(run, _FedAvgCells(cfg, run))


class _FedAvgCells:
    """fedavg_table under :func:`~fedarena.platform.loop.run_loop`: a step is one cell of the table (FedAvg until
    the target accuracy or ``max_rounds``); the checkpoint keeps the finished cells."""

    def __init__(self, cfg: FedAvgTableConfig, run: Any):
        self.cfg, self.run = cfg, run
        self.cells = _fedavg_cells(cfg)
        self.curves: dict[str, list[float]] = {}
        self.rounds_to: dict[str, int | None] = {}
        self.updates: dict[str, float] = {}
        self.done_cells, self.desc, self.total = 0, "fedavg cells", len(self.cells)

    def init(self) -> None:
        return None

    def load(self, step: int, state: dict[str, Any]) -> None:
        self.done_cells = step
        self.curves, self.rounds_to, self.updates = state["curves"], state["rounds"], state["updates"]

    def state(self) -> dict[str, Any]:
        return {"curves": self.curves, "rounds": self.rounds_to, "updates": self.updates}

    def done(self) -> bool:
        return self.done_cells >= len(self.cells)

    def units(self) -> int:
        return self.done_cells

    def step(self, step: int) -> dict[str, Any]:
        from fedarena.federated.fedsim_experiment import build

        cfg = self.cfg
        p, c, e, b = self.cells[step - 1]
        d, sim = build(cfg.cell_config(p, c, e, b))
        if b == 0:  # B = infinity: one batch of the client's whole data per epoch
            bmax = int(max(len(t) for t in d.train))
            sim.strategy = replace(sim.strategy, fit=replace(sim.strategy.fit, batch_size=bmax))
        sizes = np.array([len(t) for t in d.train], float)
        name = _cell_name(p, c, e, b)
        self.updates[name] = float(e * np.mean(sizes / (sizes if b == 0 else b)))
        state = sim.init_state()
        sim.final_round = cfg.max_rounds
        accs: list[float] = []
        hit = None
        for r in range(1, cfg.max_rounds + 1):
            state, rec = sim.round(state)
            accs.append(float(rec.metrics["test_acc"]))
            if accs[-1] >= cfg.target:
                hit = r
                break
        self.curves[name], self.rounds_to[name] = accs, hit
        self.done_cells = step
        return {"rounds_to_target": float(hit) if hit else float("nan"), "final_test_acc": accs[-1],
                "best_test_acc": max(accs)}

    def summary(self) -> dict[str, Any]:
        cfg = self.cfg
        (self.run.dir / "fedavg_curves.json").write_text(json.dumps(
            {"curves": self.curves, "rounds": self.rounds_to, "updates_per_round": self.updates,
             "cells": self.cells}), encoding="utf-8")
        out: dict[str, Any] = {"target": cfg.target}
        for name, r in self.rounds_to.items():
            out[f"rounds[{name}]"] = r if r else f">{cfg.max_rounds}"
        return out


def fedavg_table_rows(result: dict[str, Any], max_rounds: int) -> list[tuple[str, str, str, str, str, str]]:
    """(split, C, E, B, u = E n / B, rounds (speed-up over FedSGD at the same C and split)) per cell."""
    rows = []
    for p, c, e, b in result["cells"]:
        name = _cell_name(p, c, e, b)
        r = result["rounds"][name]
        base = result["rounds"].get(_cell_name(p, c, 1, 0))
        speed = f" ({base / r:.1f}x)" if r and base else ""
        rows.append(("IID" if p == "iid" else "non-IID", f"{c:g}", str(e), "inf" if b == 0 else str(b),
                     f"{result['updates_per_round'][name]:.1f}", (str(r) if r else f">{max_rounds}") + speed))
    return rows


def plots_fedavg_table(rows, cfg: FedAvgTableConfig, report_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, StrMethodFormatter

    report_dir = Path(report_dir)
    path = report_dir.parent / "fedavg_curves.json"
    if not path.exists():
        return []
    res = json.loads(path.read_text(encoding="utf-8"))
    out = []
    fig, ax = plt.subplots(len(cfg.partitions), len(cfg.client_fractions),
                           figsize=(4.6 * len(cfg.client_fractions), 3.6 * len(cfg.partitions)), squeeze=False)
    for i, p in enumerate(cfg.partitions):
        for j, c in enumerate(cfg.client_fractions):
            a = ax[i, j]
            for e in cfg.epochs:
                for b in cfg.batch_sizes:
                    name = _cell_name(p, c, e, b)
                    acc = res["curves"].get(name, [])
                    a.plot(np.arange(1, len(acc) + 1), acc, lw=1.3, label=f"E={e} B={'inf' if b == 0 else b}")
            a.axhline(cfg.target, color="k", ls="--", lw=0.8)
            a.set_xscale("log")
            # rounds are integers: label 1, 2, 5, 10, 20, ... rather than powers of ten
            a.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            a.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
            a.xaxis.set_minor_formatter(NullFormatter())
            a.set_ylim(0, 1)
            split = "IID" if p == "iid" else f"non-IID ({cfg.shards_per_client} shards)"
            k = cfg.clients_per_round(c)
            a.set_title(f"{split}, C={c:g} ({k} client{'s' if k > 1 else ''} a round)", fontsize=10)
            a.set_xlabel("round (log scale)")
            a.set_ylabel("global model, test accuracy")
            a.grid(alpha=0.3)
            a.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{report_dir.parent.name}: FedAvg on {cfg.dataset}, {cfg.num_clients} clients, MLP {cfg.hidden}, "
                 f"lr {cfg.lr:g}: test accuracy per round until the target {cfg.target:g} (dashed)", fontsize=10)
    fig.tight_layout()
    fig.savefig(report_dir / "fedavg_curves.png", dpi=110)
    plt.close(fig)
    out.append(str(report_dir / "fedavg_curves.png"))
    table = fedavg_table_rows(res, cfg.max_rounds)
    head = ("split", "C", "E", "B", "u = E n/B", f"rounds to {cfg.target:g} (speed-up vs FedSGD)")
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in table]
    (report_dir / "fedavg_table.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    fig, a = plt.subplots(figsize=(8.5, 0.3 * len(table) + 1.0))
    a.axis("off")
    t = a.table(cellText=[list(r) for r in table], colLabels=list(head), loc="center", cellLoc="center",
                colWidths=[0.13, 0.08, 0.07, 0.08, 0.14, 0.5])  # the last header is long
    t.auto_set_font_size(False)
    t.set_fontsize(8)
    t.scale(1, 1.25)
    a.set_title(f"{report_dir.parent.name}: FedAvg rounds to {cfg.target:g} test accuracy ({cfg.dataset}, "
                f"{cfg.num_clients} clients; '>{cfg.max_rounds}': not reached within max_rounds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(report_dir / "fedavg_table.png", dpi=110)
    plt.close(fig)
    out.append(str(report_dir / "fedavg_table.png"))
    return out


FEDAVG_TABLE = Experiment(config=FedAvgTableConfig, run=run_fedavg_table, plots=plots_fedavg_table,
                          summary_keys=("rounds_to_target", "final_test_acc"))


# ----------------------------------------------------------------------------- FedProx, Figure 1 layout


METHODS = ("fedavg", "fedprox_mu0", "fedprox")
"""FedAvg drops stragglers; FedProx mu = 0 keeps their partial work; FedProx mu > 0 keeps it and adds the
proximal term."""


@dataclass(frozen=True)
class FedProxFigureConfig(ExperimentConfig):
    synthetic: list[list[float]] = param(doc="(alpha, beta) of each Synthetic data set",
                                         factory=lambda: [[0.0, 0.0], [0.5, 0.5], [1.0, 1.0]])
    num_clients: int = param(30, "devices")
    clients_per_round: int = param(10, "devices selected per round")
    straggler_fractions: list[float] = param(doc="fractions of each round's devices that are stragglers",
                                             factory=lambda: [0.0, 0.5, 0.9])
    mu: float = param(1.0, "FedProx proximal coefficient of the 'fedprox' method")
    rounds: int = param(100, "rounds")
    epochs: int = param(20, "local epochs E (stragglers finish U{1..E-1}); ignored when local_steps > 0")
    local_steps: int = param(0, "> 0: K local steps instead of E epochs (stragglers finish U{1..K-1})")
    batch_size: int = param(10, "local minibatch size")
    lr: float = param(0.01, "local SGD learning rate")
    size_mean: float = param(4.0, "examples per device ~ floor(lognormal(size_mean, size_sigma)) + size_min")
    size_sigma: float = param(2.0, "see size_mean")
    size_min: int = param(50, "see size_mean")
    size_max: int = param(0, "cap on examples per device (0 = none)")
    train_seeds: list[int] = param(doc="training seeds (selection, stragglers, minibatches) per cell; the data "
                                   "set is drawn once from `seed`", factory=lambda: [0, 1, 2])
    workers: int = param(1, "processes running (cell, seed) jobs in parallel (1 = this process)")

    def __post_init__(self) -> None:
        for ab in self.synthetic:
            if len(ab) != 2 or min(ab) < 0:
                raise ValueError(f"synthetic: each entry is [alpha, beta] with both >= 0, got {ab}")
        for f in self.straggler_fractions:
            if not 0 <= f <= 1:
                raise ValueError(f"straggler_fractions: {f} must lie in [0, 1]")
        if self.mu <= 0:
            raise ValueError(f"mu: the 'fedprox' method needs mu > 0, got {self.mu}")
        if self.workers < 1:
            raise ValueError(f"workers: must be >= 1, got {self.workers}")
        if not self.train_seeds:
            raise ValueError("train_seeds: at least one seed needed")
        if not self.synthetic or not self.straggler_fractions:
            raise ValueError("synthetic/straggler_fractions: each needs at least one value")
        self.cell_config(self.synthetic[0], self.straggler_fractions[0], "fedprox", self.train_seeds[0])

    def cell_config(self, ab, fraction: float, method: str, train_seed: int):
        from fedarena.federated.fedsim_experiment import FedSimConfig

        from fedarena.federated import config as fc

        return FedSimConfig(
            kind="fedsim", seed=train_seed, rounds=self.rounds,
            data=fc.DataConfig(dataset="synthetic", num_clients=self.num_clients, synthetic_alpha=float(ab[0]),
                               synthetic_beta=float(ab[1]), synthetic_size_mean=self.size_mean,
                               synthetic_size_sigma=self.size_sigma, synthetic_size_min=self.size_min,
                               synthetic_size_max=self.size_max, held_out_fraction=0.2),
            model=fc.ModelConfig(hidden=[], zero_init=True),
            clients=fc.SimClientsConfig(per_round=self.clients_per_round, epochs=self.epochs,
                                        local_steps=self.local_steps, batch_size=self.batch_size, lr=self.lr,
                                        prox_mu=self.mu if method == "fedprox" else 0.0),
            heterogeneity=fc.HeterogeneityConfig(straggler_fraction=fraction, partial_work=method != "fedavg"),
            privacy=fc.SimPrivacyConfig(seed=0))


def _prox_name(ab, fraction: float, method: str) -> str:
    return f"synthetic({ab[0]:g},{ab[1]:g}) stragglers={fraction:g} {method}"


def fedprox_curve(cfg: FedProxFigureConfig, ab, fraction: float, method: str, train_seed: int) -> list[float]:
    """Global training loss (mean cross-entropy over every device's training examples) after each round of
    one method on the data set of ``cfg.seed`` with the training draws of ``train_seed``."""
    from fedarena.federated.fedsim_experiment import build
    from fedarena.federated.simulation import evaluate_params

    d, sim = build(cfg.cell_config(ab, fraction, method, cfg.seed))  # the data set of `seed` ...
    sim.seed = train_seed  # ... and the training draws (selection, stragglers, minibatches) of train_seed
    train_all = np.concatenate(d.train)
    state = sim.init_state({k: np.zeros_like(v) for k, v in sim.model.init_params(cfg.seed).items()})
    sim.eval_every = cfg.rounds + 1  # the global training loss below is the metric
    curve = []
    for _ in range(cfg.rounds):
        state, _ = sim.round(state)
        curve.append(evaluate_params(sim.model, state.params, d.x[train_all], d.y[train_all])[0])
    return curve


def loss_statistics(curves: np.ndarray) -> dict[str, float]:
    """Of a (seeds, rounds) array of loss curves: the final loss (mean over seeds), the spread over seeds
    (standard deviation across seeds, mean over the last half of the rounds) and the oscillation (standard
    deviation of the round-to-round change over the last half, mean over seeds)."""
    half = curves[:, curves.shape[1] // 2:]
    osc = float(np.diff(half, axis=1).std(1).mean()) if half.shape[1] > 1 else 0.0
    return {"final_train_loss": float(curves[:, -1].mean()), "seed_spread": float(half.std(0).mean()),
            "loss_oscillation": osc}


def run_fedprox_figure(cfg: FedProxFigureConfig, run) -> dict[str, Any]:
    steps = _FedProxSteps(cfg, run)
    try:
        return run_loop(run, steps)
    finally:
        steps.close()


class _FedProxSteps:
    """fedprox_figure under :func:`~fedarena.platform.loop.run_loop`: a step is one (cell, training seed) loss
    curve, or ``workers`` of them computed in parallel worker processes; the checkpoint holds the curves so far."""

    def __init__(self, cfg: FedProxFigureConfig, run: Any):
        self.cfg, self.run = cfg, run
        self.cells = [(ab, f, m) for ab in cfg.synthetic for f in cfg.straggler_fractions for m in METHODS]
        # no stragglers: keeping partial work changes nothing, so FedProx mu = 0 is the FedAvg run
        self.jobs = [(ab, f, m, s) for ab, f, m in self.cells if not (m == "fedprox_mu0" and f == 0)
                     for s in cfg.train_seeds]
        self.results: dict[tuple, list[float]] = {}
        self.desc, self.total = "fedprox runs", len(self.jobs)
        self._pool: Any = None

    def init(self) -> None:
        return None

    def load(self, step: int, state: dict[str, Any]) -> None:
        if int(state["rounds"]) != self.cfg.rounds:
            raise ConfigError(f"rounds: the checkpoint's curves have {state['rounds']} rounds; resume with "
                              f"rounds={state['rounds']} (or start a new run)")
        self.results = {_key(([a, b], f, m, int(s))): [float(x) for x in curve]
                        for (a, b, f, m, s), curve in state["curves"]}

    def state(self) -> dict[str, Any]:
        return {"rounds": self.cfg.rounds, "curves": [[list(k), v] for k, v in self.results.items()]}

    def _todo(self) -> list[tuple]:
        return [job for job in self.jobs if _key(job) not in self.results]

    def done(self) -> bool:
        return not self._todo()

    def units(self) -> int:
        return len(self.jobs) - len(self._todo())

    def step(self, step: int) -> dict[str, Any]:
        batch = self._todo()[:self.cfg.workers]
        if self.cfg.workers > 1:
            if self._pool is None:
                import multiprocessing

                self._pool = multiprocessing.get_context("spawn").Pool(self.cfg.workers)
            curves = self._pool.starmap(fedprox_curve, [(self.cfg, *job) for job in batch])
        else:
            curves = [fedprox_curve(self.cfg, *job) for job in batch]
        for job, curve in zip(batch, curves):
            self.results[_key(job)] = curve
        return {"curves_done": self.units(), "final_train_loss_of_step": float(np.mean([c[-1] for c in curves]))}

    def summary(self) -> dict[str, Any]:
        cfg = self.cfg
        losses: dict[str, list[list[float]]] = {}
        summary: dict[str, Any] = {}
        for ab, f, m in self.cells:
            src = "fedavg" if (m == "fedprox_mu0" and f == 0) else m
            losses[_prox_name(ab, f, m)] = [self.results[_key((ab, f, src, s))] for s in cfg.train_seeds]
            for k, v in loss_statistics(np.asarray(losses[_prox_name(ab, f, m)])).items():
                summary[f"{k}[{_prox_name(ab, f, m)}]"] = round(v, 5)
        (self.run.dir / "fedprox_losses.json").write_text(json.dumps({"losses": losses}), encoding="utf-8")
        return summary

    def close(self) -> None:
        if self._pool is not None:  # every result is in by now, or the run was stopped: end the workers at once
            self._pool.terminate()
            self._pool.join()


def _key(job) -> tuple:
    ab, f, m, s = job
    return (float(ab[0]), float(ab[1]), float(f), m, int(s))


def plots_fedprox_figure(rows, cfg: FedProxFigureConfig, report_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report_dir = Path(report_dir)
    path = report_dir.parent / "fedprox_losses.json"
    if not path.exists():
        return []
    losses = json.loads(path.read_text(encoding="utf-8"))["losses"]
    from matplotlib.ticker import MaxNLocator

    colors = {"fedavg": "tab:green", "fedprox_mu0": "tab:blue", "fedprox": "tab:red"}
    # with no stragglers FedAvg and FedProx mu=0 are the same algorithm: a wide pale line under a dashed one
    styles = {"fedavg": dict(lw=3.0, alpha=0.55), "fedprox_mu0": dict(lw=1.3, ls="--"), "fedprox": dict(lw=1.3)}
    labels = {"fedavg": "FedAvg (stragglers dropped)", "fedprox_mu0": "FedProx mu=0 (partial work)",
              "fedprox": f"FedProx mu={cfg.mu:g}"}
    fig, ax = plt.subplots(len(cfg.straggler_fractions), len(cfg.synthetic),
                           figsize=(4.4 * len(cfg.synthetic), 3.2 * len(cfg.straggler_fractions)), squeeze=False)
    for i, f in enumerate(cfg.straggler_fractions):
        for j, ab in enumerate(cfg.synthetic):
            a = ax[i, j]
            for m in METHODS:
                arr = np.asarray(losses.get(_prox_name(ab, f, m), []))
                if arr.size == 0:
                    continue
                r = np.arange(1, arr.shape[1] + 1)
                a.plot(r, arr.mean(0), color=colors[m], label=labels[m], **styles[m])
                a.fill_between(r, arr.min(0), arr.max(0), color=colors[m], alpha=0.18)
            a.set_title(f"Synthetic({ab[0]:g},{ab[1]:g}), {100 * f:g}% stragglers", fontsize=10)
            a.set_xlabel("round")
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
            a.set_ylabel("global training loss")
            a.grid(alpha=0.3)
            if i == 0 and j == 0:
                a.legend(fontsize=7)
    n = len(cfg.train_seeds)
    seeds = "one training seed" if n == 1 else f"mean over {n} training seeds, band = min..max"
    local = f"{cfg.local_steps} local steps" if cfg.local_steps else f"E={cfg.epochs}"
    fig.suptitle(f"{report_dir.parent.name}: FedProx Figure 1 layout, {cfg.num_clients} devices, "
                 f"{cfg.clients_per_round} a round, {local}, B={cfg.batch_size}, lr {cfg.lr:g}; {seeds}", fontsize=10)
    fig.tight_layout()
    fig.savefig(report_dir / "fedprox_figure.png", dpi=110)
    plt.close(fig)
    return [str(report_dir / "fedprox_figure.png")]


FEDPROX_FIGURE = Experiment(config=FedProxFigureConfig, run=run_fedprox_figure, plots=plots_fedprox_figure,
                            summary_keys=("final_train_loss", "seed_spread", "loss_oscillation"))


# ----------------------------------------------------------------------------- fedsim variants side by side


@dataclass(frozen=True)
class FedSimSweepConfig(ExperimentConfig):
    base: dict[str, Any] = param(doc="fedsim sections shared by every variant (see `fedarena show` of a fedsim "
                                 "config)", factory=dict)
    variants: list[dict[str, Any]] = param(doc="one mapping per variant: `label` plus the fedsim fields it "
                                           "changes, in their sections (merged into base section by section)",
                                           factory=lambda: [{"label": "fedavg"}])
    x_metric: Literal["round", "bytes_up", "bytes_total"] = param(
        "round", "x axis of the accuracy curves: round, cumulative uploaded bytes, or bytes up + down")
    privacy_plot: bool = param(False, "also draw accuracy against each variant's cumulative epsilon")

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError("variants: at least one variant needed")
        labels = [v.get("label") for v in self.variants]
        for i, v in enumerate(self.variants):
            if not isinstance(v.get("label"), str) or not v["label"]:
                raise ValueError(f"variants[{i}].label: each variant needs a non-empty label")
        if len(set(labels)) != len(labels):
            raise ValueError(f"variants: labels must be unique, got {labels}")
        for i in range(len(self.variants)):
            self.variant_config(i)

    @classmethod
    def migrate(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """An old sweep file with flat fedsim fields in ``base`` and ``variants``, moved into the sections."""
        from fedarena.federated.fedsim_experiment import FedSimConfig

        out = dict(plain(data))
        out["base"] = migrate(FedSimConfig, out.get("base") or {})
        out["variants"] = [{"label": v.get("label"), **migrate(FedSimConfig, {k: x for k, x in v.items()
                                                                              if k != "label"})}
                           for v in out.get("variants") or []]
        return out

    def variant_config(self, i: int):
        from fedarena.federated.fedsim_experiment import FedSimConfig
        from fedarena.platform.config import build as build_config

        fields = {k: v for k, v in self.variants[i].items() if k != "label"}
        for k in ("kind", "seed", "seeds", "name"):
            if k in self.base or k in fields:
                raise ValueError(f"variants[{i}].{k}: set {k} on the sweep, not on a variant or the base")
        data = {**merged(self.base, fields), "kind": "fedsim", "seed": self.seed}
        try:
            return build_config(FedSimConfig, data, f"variants[{i}]")
        except (ConfigError, ValueError) as e:
            raise ValueError(f"variants[{i}] ({self.variants[i]['label']}): {e}") from None


def run_fedsim_sweep(cfg: FedSimSweepConfig, run) -> dict[str, Any]:
    return run_loop(run, _SweepVariants(cfg, run))


class _SweepVariants:
    """fedsim_sweep under :func:`~fedarena.platform.loop.run_loop`: a step is one variant's whole fedsim run; the
    checkpoint keeps the finished variants' curves."""

    FINAL = ("test_acc", "bytes_up", "bytes_total", "epsilon")

    def __init__(self, cfg: FedSimSweepConfig, run: Any):
        self.cfg, self.run = cfg, run
        self.curves: dict[str, dict[str, Any]] = {}
        self.done_variants, self.desc, self.total = 0, "fedsim variants", len(cfg.variants)

    def init(self) -> None:
        return None

    def load(self, step: int, state: dict[str, Any]) -> None:
        self.done_variants, self.curves = step, dict(state["curves"])

    def state(self) -> dict[str, Any]:
        return {"curves": self.curves}

    def done(self) -> bool:
        return self.done_variants >= len(self.cfg.variants)

    def units(self) -> int:
        return self.done_variants

    def step(self, step: int) -> dict[str, Any]:
        from fedarena.federated.fedsim_experiment import build

        i = step - 1
        fcfg = self.cfg.variant_config(i)
        d, sim = build(fcfg)
        try:
            rec = self._variant(fcfg, sim)
        finally:
            close = getattr(d.x, "close", None)  # a lazily read population's prefetch threads
            if close is not None:
                close()
            del d, sim
            return_freed_heap()
        self.curves[self.cfg.variants[i]["label"]] = rec
        self.done_variants = step
        return self._final(rec)

    def _variant(self, fcfg: Any, sim: Any) -> dict[str, Any]:
        from fedarena.federated.fedsim_experiment import ldp_cumulative_epsilon

        params = fcfg.model.init_params(sim.model, fcfg.seed)
        state = sim.init_state(params)
        sim.final_round = fcfg.rounds
        rec: dict[str, Any] = {k: [] for k in ("round", *self.FINAL)}
        rec["epsilon_kind"] = privacy_kind(fcfg)
        uploads: dict[str, int] = {}
        for r in range(1, fcfg.rounds + 1):
            state, rr = sim.round(state)
            for c in rr.reporting:
                uploads[c] = uploads.get(c, 0) + 1
            if "test_acc" not in rr.metrics:
                continue
            rec["round"].append(r)
            rec["test_acc"].append(float(rr.metrics["test_acc"]))
            for k in TOKEN_METRICS:  # a language model's every-token accuracies
                if k in rr.metrics:
                    rec.setdefault(k, []).append(float(rr.metrics[k]))
            rec["bytes_up"].append(float(sim.bytes_up_total))
            rec["bytes_total"].append(float(sim.bytes_up_total + sim.bytes_down_total))
            most = max(uploads.values()) if uploads else 0
            rec["epsilon"].append(
                float(rr.metrics.get("dp_epsilon", float("nan"))) if rec["epsilon_kind"] == "dp_fedavg" else
                ldp_cumulative_epsilon(fcfg, most) if rec["epsilon_kind"] == "ldp" and most else
                most * fcfg.privacy.signds.epsilon if rec["epsilon_kind"] == "signds" else float("nan"))
        return rec

    def _final(self, rec: dict[str, list]) -> dict[str, float]:
        """A variant's last values of ``FINAL`` and of the every-token accuracies it recorded."""
        return {k: rec[k][-1] for k in (*self.FINAL, *TOKEN_METRICS) if rec.get(k)}

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for v in self.cfg.variants[:self.done_variants]:
            _sweep_summary(out, v["label"], self._final(self.curves[v["label"]]))
        (self.run.dir / "sweep_curves.json").write_text(json.dumps(self.curves, allow_nan=True), encoding="utf-8")
        return out


def return_freed_heap() -> None:
    """Collect garbage and hand the C heap's free pages back to the OS (glibc's ``malloc_trim``; nothing where
    the C library has none). A sweep variant's compiled programs and buffers, freed when it ends, otherwise stay
    in the process's RSS as fragments the next variant's buffers do not fill: on the scaled-down Reddi et al.
    2021 EMNIST sweep (3,400 writers, 4 rounds a variant) the RSS after each variant was 310-358 MiB, and 116-122
    MiB after the trim."""
    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


TOKEN_METRICS = ("test_token_acc", "test_token_acc_with_oov_eos")
"""a language model's every-token test accuracies (:func:`fedarena.federated.datasets.token_accuracy_masks`),
kept per variant beside ``test_acc`` when its evaluations report them"""


def _sweep_summary(out: dict[str, Any], label: str, final: dict[str, float]) -> None:
    out[f"test_acc[{label}]"] = round(final["test_acc"], 4)
    for k in TOKEN_METRICS:
        if k in final:
            out[f"{k}[{label}]"] = round(final[k], 4)
    out[f"bytes_up[{label}]"] = int(final["bytes_up"])
    if np.isfinite(final["epsilon"]):
        out[f"epsilon[{label}]"] = round(final["epsilon"], 4)


def sweep_accuracy(curves: dict[str, dict[str, list[float]]]) -> tuple[str, str]:
    """The accuracy a sweep's report shows, and its axis label: a language model's every-token accuracy
    (``test_token_acc``, the measure of Reddi et al. 2021's table) where every variant reports it, else the
    global test accuracy."""
    if all(rec.get("test_token_acc") for rec in curves.values()):
        return "test_token_acc", "every-token test accuracy"
    return "test_acc", "global test accuracy"


def sweep_table(curves: dict[str, dict[str, list[float]]], key: str = "test_acc") -> list[tuple[str, ...]]:
    """(label, final accuracy ``key``, uploaded MB, upload reduction vs the first variant, epsilon) per variant."""
    first = next(iter(curves.values()))
    ref = first["bytes_up"][-1]
    rows = []
    for label, rec in curves.items():
        eps = rec["epsilon"][-1]
        rows.append((label, f"{rec[key][-1]:.4f}", f"{rec['bytes_up'][-1] / 1e6:.3f}",
                     f"{ref / rec['bytes_up'][-1]:.1f}x" if rec["bytes_up"][-1] else "-",
                     f"{eps:.3g} ({rec['epsilon_kind']})" if np.isfinite(eps) else "-"))
    return rows


def plots_fedsim_sweep(rows, cfg: FedSimSweepConfig, report_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report_dir = Path(report_dir)
    path = report_dir.parent / "sweep_curves.json"
    if not path.exists():
        return []
    curves = json.loads(path.read_text(encoding="utf-8"))
    key, ylabel = sweep_accuracy(curves)
    out = []
    fig, a = plt.subplots(figsize=(7.5, 4.5))
    for label, rec in curves.items():
        x = np.asarray(rec[cfg.x_metric], float) / (1e6 if cfg.x_metric != "round" else 1)
        a.plot(x, rec[key], "-o", ms=2.5, lw=1.3, label=label)
    a.set_xlabel({"round": "round", "bytes_up": "total uploaded MB (exact encoded bytes)",
                  "bytes_total": "total MB up + down"}[cfg.x_metric])
    if cfg.x_metric != "round":
        a.set_xscale("log")
    else:
        from matplotlib.ticker import MaxNLocator

        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    a.set_ylabel(ylabel)
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    title = f"{report_dir.parent.name}:\n{_sweep_setup(cfg)}"  # two lines: a run name and the setup overflow one
    a.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(report_dir / "sweep_accuracy.png", dpi=110)
    plt.close(fig)
    out.append(str(report_dir / "sweep_accuracy.png"))
    if cfg.privacy_plot:
        fig, a = plt.subplots(figsize=(6.5, 4.2))
        for label, rec in curves.items():
            eps, acc = np.asarray(rec["epsilon"], float), np.asarray(rec[key], float)
            if np.isfinite(eps).any():
                a.plot(eps, acc, "-", lw=1, label=f"{label} ({rec['epsilon_kind']})")
            else:
                a.axhline(acc[-1], ls="--", color="k", lw=0.8, label=f"{label}: final accuracy")
        a.set_xscale("log")
        a.set_xlabel("cumulative epsilon (DP-FedAvg: RDP accountant, user level; LDP / SignDS: most frequent uploader)",
                     fontsize=8)
        a.set_ylabel(ylabel)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
        a.set_title(f"{title}\naccuracy against the accountant's cumulative epsilon, per round", fontsize=9)
        fig.tight_layout()
        fig.savefig(report_dir / "sweep_epsilon.png", dpi=110)
        plt.close(fig)
        out.append(str(report_dir / "sweep_epsilon.png"))
    table = sweep_table(curves, key)
    head = ("variant", "final every-token acc" if key == "test_token_acc" else "final test acc", "uploaded MB",
            "upload reduction", "epsilon")
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in table]
    (report_dir / "sweep_table.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    fig, a = plt.subplots(figsize=(9, 0.35 * len(table) + 1.1))
    a.axis("off")
    t = a.table(cellText=[list(r) for r in table], colLabels=list(head), loc="center", cellLoc="center",
                colWidths=[0.38, 0.14, 0.13, 0.15, 0.2])  # variant labels are long
    t.auto_set_font_size(False)
    t.set_fontsize(8)
    t.scale(1, 1.3)
    a.set_title(f"{title}\nfinal round; upload reduction relative to '{table[0][0]}'", fontsize=9)
    fig.tight_layout()
    fig.savefig(report_dir / "sweep_table.png", dpi=110)
    plt.close(fig)
    out.append(str(report_dir / "sweep_table.png"))
    return out


FEDSIM_SWEEP = Experiment(config=FedSimSweepConfig, run=run_fedsim_sweep, plots=plots_fedsim_sweep,
                          summary_keys=("test_acc", "bytes_up", "epsilon"))


def eval_path(config: Any, path: str) -> Any:
    """The value at the dotted ``path`` of a config (``"data.num_clients"``)."""
    for part in path.split("."):
        config = getattr(config, part)
    return config


def _sweep_setup(cfg: FedSimSweepConfig) -> str:
    """What the variants of a sweep share: data set, split, clients, clients a round and rounds (a setting
    the variants do not share is left out)."""
    vs = [cfg.variant_config(i) for i in range(len(cfg.variants))]
    get = lambda v, path: eval_path(v, path)  # noqa: E731
    same = lambda path: all(get(v, path) == get(vs[0], path) for v in vs)  # noqa: E731
    v = vs[0]
    parts = [f"{len(vs)} fedsim variants"]
    if same("data.dataset") and same("data.partition"):
        parts.append(f"{v.data.dataset} ({v.data.partition})")
    if same("data.num_clients"):
        parts.append(f"{v.data.num_clients} clients")
    if same("clients.per_round"):
        parts.append(f"{'all' if v.clients.per_round == 0 else v.clients.per_round} a round")
    if same("rounds"):
        parts.append(f"{v.rounds} rounds")
    return ", ".join(parts + [f"seed {cfg.seed}"])


def privacy_kind(cfg) -> str:
    """Which epsilon a fedsim config's run accumulates: ``dp_fedavg`` (the RDP accountant of DP-FedAvg over
    rounds, sampled Gaussian, at ``privacy.dp.delta``), ``ldp`` (the RDP composition of the most frequent
    uploader's Gaussian releases, at ``privacy.ldp.delta``), ``signds`` (pure epsilon-LDP reports composed by basic
    composition: reports x ``privacy.signds.epsilon``) or ``none``."""
    if cfg.privacy.dp.on:
        return "dp_fedavg"
    if cfg.privacy.ldp.on:
        return "ldp"
    if cfg.privacy.signds.on:
        return "signds"
    return "none"
