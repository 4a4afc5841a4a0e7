"""Experiment kinds ``vfl_lr`` and ``vfl_splitnn``: PSI alignment, then encrypted vertical training.

``vfl_lr``: scikit-learn's breast-cancer set split feature-wise between A (features + labels) and B,
with only ``shared_fraction`` of the users held by both; RSA-blind-signature PSI aligns them, hetero
LR (Hardy et al. 2017; coordinator or two-party) trains, and every epoch logs the Taylor loss, test
AUC by joint inference, the centralized LR baseline's AUC (same batches, l2, epochs), seconds spent in
crypto / compute / communication and the bytes exchanged.
``vfl_splitnn``: scikit-learn digits, pixel columns split between A and B, the split NN with an
encrypted interactive layer; logs loss, test accuracy, the same time split and bytes.
Both run under the platform's loop (:func:`fedarena.platform.loop.run_loop`), one step per epoch.
Checkpoints hold the models (and optimizer states); a resumed run re-runs PSI (deterministic result)
and draws fresh Paillier keys.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop


@dataclass(frozen=True)
class VflLRConfig(ExperimentConfig):
    dataset: Literal["breast_cancer"] = param("breast_cancer", "data set (scikit-learn's breast cancer)")
    features_a: int = param(15, "columns held by A (the rest by B)")
    shared_fraction: float = param(0.8, "fraction of users held by both parties")
    test_fraction: float = param(0.25, "fraction of aligned rows held out for AUC")
    psi_key_bits: int = param(2048, "RSA modulus bits of the PSI")
    psi_workers: int = param(0, "processes for A's RSA work (0 = all cores)")
    coordinator: bool = param(True, "three parties with coordinator C; False = two-party protocol")
    epochs: int = param(5, "training epochs")
    batch_size: int = param(64, "minibatch size")
    learning_rate: float = param(0.1, "SGD step size")
    l2: float = param(1e-3, "L2 regularization (not on the intercept)")
    key_bits: int = param(2048, "Paillier modulus bits")
    pack_decryption: bool = param(True, "pack masked values before the key holder decrypts them")
    pool_size: int = param(1024, "obfuscation pool of B (three-party run), 0 = off")
    max_rows: int = param(0, "use at most this many aligned rows (0 = all; for quick runs)")
    allow_insecure_keys: bool = param(False, "accept RSA/Paillier keys below 2048 bits (fast tests only)")

    def __post_init__(self) -> None:
        from fedarena.federated.vertical.rsa_blind import check_key_bits

        check_key_bits(self.psi_key_bits, self.allow_insecure_keys, "psi_key_bits")
        if not 0.0 < self.shared_fraction <= 1.0:
            raise ValueError(f"shared_fraction: must be in (0, 1], got {self.shared_fraction}")
        if not 1 <= self.features_a < 30:
            raise ValueError(f"features_a: must be in 1..29 for breast cancer, got {self.features_a}")
        if self.psi_workers < 0:
            raise ValueError(f"psi_workers: must be >= 0, got {self.psi_workers}")
        self.lr_config()  # validates the training fields


    def lr_config(self):
        from fedarena.federated.vertical.hetero_lr import HeteroLRConfig

        return HeteroLRConfig(epochs=self.epochs, batch_size=self.batch_size, learning_rate=self.learning_rate,
                              l2=self.l2, key_bits=self.key_bits, pack_decryption=self.pack_decryption,
                              pool_size=self.pool_size if self.coordinator else 0, seed=self.seed,
                              allow_insecure_keys=self.allow_insecure_keys)


@dataclass(frozen=True)
class VflSplitNNConfig(ExperimentConfig):
    dataset: Literal["digits"] = param("digits", "data set (scikit-learn's digits, 8x8 pixels)")
    features_a: int = param(32, "pixel columns held by A (the rest by B)")
    shared_fraction: float = param(0.9, "fraction of users held by both parties")
    test_fraction: float = param(0.2, "fraction of aligned rows held out for accuracy")
    psi_key_bits: int = param(2048, "RSA modulus bits of the PSI")
    psi_workers: int = param(0, "processes for A's RSA work (0 = all cores)")
    epochs: int = param(3, "training epochs")
    batch_size: int = param(64, "minibatch size")
    optimizer: Literal["adam", "sgd"] = param("adam", "optimizer of every part")
    learning_rate: float = param(0.03, "learning rate")
    bottom_hidden: int = param(32, "hidden units of each bottom model")
    bottom_out_a: int = param(8, "output units of A's bottom model")
    bottom_out_b: int = param(4, "output units of B's bottom model (encrypted per row)")
    interactive_out: int = param(16, "units of the interactive layer")
    top_hidden: int = param(32, "hidden units of A's top model (0 = linear)")
    key_bits: int = param(2048, "Paillier modulus bits (B's key)")
    pack_decryption: bool = param(True, "pack masked values before decryption")
    max_rows: int = param(0, "use at most this many aligned rows (0 = all; for quick runs)")
    allow_insecure_keys: bool = param(False, "accept RSA/Paillier keys below 2048 bits (fast tests only)")

    def __post_init__(self) -> None:
        from fedarena.federated.vertical.rsa_blind import check_key_bits

        check_key_bits(self.psi_key_bits, self.allow_insecure_keys, "psi_key_bits")
        if not 0.0 < self.shared_fraction <= 1.0:
            raise ValueError(f"shared_fraction: must be in (0, 1], got {self.shared_fraction}")
        if not 1 <= self.features_a < 64:
            raise ValueError(f"features_a: must be in 1..63 for digits, got {self.features_a}")
        self.nn_config()

    def nn_config(self):
        from fedarena.federated.vertical.split_nn import SplitNNConfig

        return SplitNNConfig(epochs=self.epochs, batch_size=self.batch_size, optimizer=self.optimizer,
                             learning_rate=self.learning_rate, bottom_hidden=self.bottom_hidden,
                             bottom_out_a=self.bottom_out_a, bottom_out_b=self.bottom_out_b,
                             interactive_out=self.interactive_out, top_hidden=self.top_hidden, num_classes=10,
                             key_bits=self.key_bits, pack_decryption=self.pack_decryption, seed=self.seed,
                             allow_insecure_keys=self.allow_insecure_keys)


def _align(cfg, x, y, run):
    """Partition, PSI, train/test split; logs the PSI cost and checks it against the true intersection."""
    from fedarena.federated.vertical import psi
    from fedarena.federated.vertical.channel import Link
    from fedarena.federated.vertical.partition import train_test_rows, vertical_partition

    a, b = vertical_partition(x, y, cfg.features_a, cfg.shared_fraction, cfg.seed)
    link = Link()
    t0 = time.perf_counter()
    ra, rb = psi.intersect(a.ids, b.ids, key_bits=cfg.psi_key_bits, workers=cfg.psi_workers or None,
                           transfer=link.transfer, allow_insecure_keys=cfg.allow_insecure_keys)
    psi_s = time.perf_counter() - t0
    exact = set(ra.ids) == set(a.ids) & set(b.ids) and ra.ids == rb.ids
    if not exact:
        raise RuntimeError("PSI result differs from the true intersection")
    run.logger.info("PSI: %d x %d IDs -> %d shared in %.2fs, %d bytes", len(a.ids), len(b.ids), len(ra.ids), psi_s,
                    link.stats.total_bytes)
    xa, ya, xb = a.x[ra.indices], a.y[ra.indices], b.x[rb.indices]
    if cfg.max_rows < 0:
        raise ValueError(f"max_rows: must be >= 0, got {cfg.max_rows}")
    if cfg.max_rows:
        xa, ya, xb = xa[: cfg.max_rows], ya[: cfg.max_rows], xb[: cfg.max_rows]
    train, test = train_test_rows(len(xa), cfg.test_fraction, cfg.seed)
    info = {"psi_seconds": psi_s, "psi_bytes": link.stats.total_bytes, "ids_a": len(a.ids), "ids_b": len(b.ids),
            "aligned": len(ra.ids), "train_rows": len(train), "test_rows": len(test)}
    return xa, ya, xb, train, test, info


# ----------------------------------------------------------------------------- vfl_lr


def _central_lr(xa, y, xb, cfg, epochs):
    """Centralized LR on the joined rows: true log-loss gradient, same batches, l2 and epochs."""
    from fedarena.federated.vertical.hetero_lr import _batches

    x = np.hstack([xa, np.ones((len(xa), 1)), xb])
    bias = xa.shape[1]
    th = np.zeros(x.shape[1])
    out = []
    for epoch in range(1, epochs + 1):
        for idx in _batches(len(x), cfg, epoch):
            d = 1.0 / (1.0 + np.exp(-(x[idx] @ th))) - y[idx]
            reg = cfg.l2 * th
            reg[bias] = 0.0
            th = th - cfg.learning_rate * (x[idx].T @ d / len(idx) + reg)
        out.append(th.copy())
    return out, bias


def run_lr(cfg: VflLRConfig, run) -> dict:
    from sklearn.datasets import load_breast_cancer

    from fedarena.federated.vertical.hetero_lr import HeteroLR
    from fedarena.federated.vertical.partition import standardize

    x, y = load_breast_cancer(return_X_y=True)
    xa, ya, xb, train, test, info = _align(cfg, x, y, run)
    xa, xb = standardize(xa, train), standardize(xb, train)
    lr_cfg = cfg.lr_config()
    model = HeteroLR(xa[train], ya[train], xb[train], lr_cfg, coordinator=cfg.coordinator)
    try:
        central, _ = _central_lr(xa[train], ya[train], xb[train], lr_cfg, cfg.epochs)
        summary = run_loop(run, _LRSteps(cfg, run, model, central, xa[test], ya[test], xb[test]))
    finally:
        model.close()
    return {**summary, **info}


def _last(run, keys) -> dict[str, float]:
    """The latest logged value of each of ``keys`` (rows before a resume included; 0.0 when none was logged)."""
    final: dict[str, float] = {}
    for row in run.rows():
        final.update({k: row[k] for k in keys if k in row})
    return {k: float(final.get(k, 0.0)) for k in keys}


class _LRSteps:
    """vfl_lr under :func:`~fedarena.platform.loop.run_loop`: a step is one epoch of hetero LR, then joint
    inference on the held-out rows and the centralized baseline's AUC after the same epoch."""

    def __init__(self, cfg: VflLRConfig, run, model, central, xa_test, y_test, xb_test):
        self.cfg, self.run, self.model, self.central = cfg, run, model, central
        self.xa_test = np.hstack([xa_test, np.ones((len(xa_test), 1))])
        self.y_test, self.xb_test = y_test, xb_test
        self.epoch = 0
        self.desc, self.total = "vfl_lr", cfg.epochs

    def init(self) -> None:
        return None

    def load(self, step: int, state: dict) -> None:
        theta_a = np.asarray(state["theta_a"], np.float64)
        theta_b = np.asarray(state["theta_b"], np.float64)
        self.model.a.state.theta, self.model.b.state.theta = theta_a, theta_b
        self.model.epoch = self.epoch = step

    def state(self) -> dict:
        return {"theta_a": self.model.a.state.theta, "theta_b": self.model.b.state.theta}

    def done(self) -> bool:
        return self.epoch >= self.cfg.epochs

    def units(self) -> int:
        return self.epoch

    def step(self, epoch: int) -> dict:
        from sklearn.metrics import roc_auc_score

        model = self.model
        rep = model.train_epoch()
        self.epoch = epoch
        # joint inference on held-out rows: B sends its partial scores x_B theta_B only
        train_a, train_b = model.a.x, model.b.x
        model.a.x, model.b.x = self.xa_test, self.xb_test
        try:
            probs = model.predict(np.arange(len(self.y_test)))
        finally:
            model.a.x, model.b.x = train_a, train_b
        auc = float(roc_auc_score(self.y_test, probs))
        joined = np.hstack([self.xa_test, self.xb_test])
        central_auc = float(roc_auc_score(self.y_test, joined @ self.central[epoch - 1]))
        return {"loss": rep.loss, "test_auc": auc, "central_auc": central_auc, "auc_gap": central_auc - auc,
                "crypto_s": rep.seconds.get("crypto", 0.0), "compute_s": rep.seconds.get("compute", 0.0),
                "comm_s": rep.seconds.get("comm", 0.0), "bytes": rep.bytes, "epoch_s": sum(rep.seconds.values())}

    def summary(self) -> dict:
        return _last(self.run, ("test_auc", "central_auc", "auc_gap"))


# ----------------------------------------------------------------------------- vfl_splitnn


def run_splitnn(cfg: VflSplitNNConfig, run) -> dict:
    from sklearn.datasets import load_digits

    from fedarena.federated.vertical.split_nn import SplitNN

    x, y = load_digits(return_X_y=True)
    xa, ya, xb, train, test, info = _align(cfg, x / 16.0, y, run)
    model = SplitNN(xa[train], ya[train], xb[train], cfg.nn_config())
    summary = run_loop(run, _SplitNNSteps(cfg, run, model, (xa[train], ya[train], xb[train]),
                                          (xa[test], ya[test], xb[test])))
    return {**summary, **info}


class _SplitNNSteps:
    """vfl_splitnn under :func:`~fedarena.platform.loop.run_loop`: a step is one epoch of the split NN, then
    joint inference on the held-out rows."""

    def __init__(self, cfg: VflSplitNNConfig, run, model, train, test):
        self.cfg, self.run, self.model, self.train, self.test = cfg, run, model, train, test
        self.epoch = 0
        self.desc, self.total = "vfl_splitnn", cfg.epochs

    def init(self) -> None:
        return None

    def load(self, step: int, st: dict) -> None:
        a, b = self.model.a, self.model.b
        loaded = (st["a_params"], st["a_opt"], np.asarray(st["w_b"]), st["b_w_opt"], st["b_params"], st["b_opt"])
        a.params, a.opt_state, a.w_b, a.opt_b_state, b.params, b.opt_state = loaded
        self.model.epoch = self.epoch = step

    def state(self) -> dict:
        a, b = self.model.a, self.model.b
        return {"a_params": a.params, "a_opt": a.opt_state, "w_b": a.w_b, "b_w_opt": a.opt_b_state,
                "b_params": b.params, "b_opt": b.opt_state}

    def done(self) -> bool:
        return self.epoch >= self.cfg.epochs

    def units(self) -> int:
        return self.epoch

    def step(self, epoch: int) -> dict:
        model = self.model
        model.a.x, model.a.y, model.b.x = self.train
        rep = model.train_epoch()
        self.epoch = epoch
        y_test = self.test[1]
        model.a.x, model.a.y, model.b.x = self.test
        t0 = time.perf_counter()
        probs = model.predict(np.arange(len(y_test)))
        infer_s = time.perf_counter() - t0
        acc = float((probs.argmax(1) == y_test).mean())
        return {"loss": rep.loss, "test_accuracy": acc, "crypto_s": rep.seconds.get("crypto", 0.0),
                "compute_s": rep.seconds.get("compute", 0.0), "comm_s": rep.seconds.get("comm", 0.0),
                "bytes": rep.bytes, "epoch_s": sum(rep.seconds.values()), "inference_s": infer_s}

    def summary(self) -> dict:
        return _last(self.run, ("test_accuracy",))


# ----------------------------------------------------------------------------- plots


def _plots(rows, report_dir, metric: str, baseline: str | None, name: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "loss" in r]
    if not rows:
        return []
    ep = [r["step"] for r in rows]
    fig, ax = plt.subplots(1, 4, figsize=(17, 3.8))
    ax[0].plot(ep, [r["loss"] for r in rows], "o-")
    ax[0].set_title("training loss")
    ax[1].plot(ep, [r[metric] for r in rows], "o-", label="vertical FL")
    if baseline:
        ax[1].plot(ep, [r[baseline] for r in rows], "s--", label="centralized")
        ax[1].legend()
    ax[1].set_title(metric.replace("_", " "))
    bottom = np.zeros(len(ep))
    for key, label in (("crypto_s", "crypto"), ("compute_s", "compute"), ("comm_s", "communication")):
        vals = np.array([r.get(key, 0.0) for r in rows])
        ax[2].bar(ep, vals, bottom=bottom, label=label)
        bottom += vals
    ax[2].set_title("seconds per epoch")
    ax[2].legend()
    ax[3].bar(ep, [r["bytes"] / 1e6 for r in rows])
    ax[3].set_title("MB exchanged per epoch")
    for a in ax:
        a.set_xlabel("epoch")
        a.grid(alpha=0.3)
    fig.subplots_adjust(left=0.04, right=0.99, wspace=0.25, bottom=0.14)
    path = Path(report_dir) / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


def plots_lr(rows, cfg, report_dir) -> list[str]:
    return _plots(rows, report_dir, "test_auc", "central_auc", "vfl_lr")


def plots_splitnn(rows, cfg, report_dir) -> list[str]:
    return _plots(rows, report_dir, "test_accuracy", None, "vfl_splitnn")


LR_EXPERIMENT = Experiment(config=VflLRConfig, run=run_lr, plots=plots_lr,
                           summary_keys=("loss", "test_auc", "central_auc", "auc_gap", "epoch_s", "bytes"))
SPLITNN_EXPERIMENT = Experiment(config=VflSplitNNConfig, run=run_splitnn, plots=plots_splitnn,
                                summary_keys=("loss", "test_accuracy", "epoch_s", "bytes"))
