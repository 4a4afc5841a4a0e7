"""Experiment kind ``fl_gradient_inversion``: DLG with iDLG labels (Zhu et al. 2019; Zhao et al. 2020) against one
FedAvg update of a digits client, unprotected, under LDP at several epsilons, under SignDS, and under SecAgg.

Round 1 of FedAvg: the server sends the initial global model (a sigmoid MLP, as in DLG's experiments); each client
holds one training digit and runs one local SGD step of ``client_lr``, so its update is ``client_lr`` times its
gradient. The attacking server divides what it receives by ``client_lr`` and runs gradient matching:

- ``plain``: the target client's update as sent;
- ``ldp_eps<e>``: the update after :class:`fedarena.privacy.ldp.GaussianMechanism` (clip to ``ldp_clip_norm``,
  analytic-Gaussian noise for (e, ``ldp_delta``)); the noise comes from ``os.urandom`` unless
  ``insecure_seeded_noise``;
- ``signds_eps<e>``: the client uploads a SignDS report instead (:func:`fedarena.privacy.signds.signds_report`:
  a random sign ``s`` and ``signds_h`` of the ``d`` dimensions chosen by EM-MDS from the top ``signds_k`` of
  ``s * update``, epsilon-LDP; the FL chapter's SignDS upload stage), and the server sees the dense update
  :func:`fedarena.privacy.signds.signds_aggregate` builds from it, ``s * 1[J]`` (times the global learning rate).
  Its magnitudes carry no information, so the attack switches to the scale-free cosine distance of Geiping et al.
  (2020) and is given the true label (the attacker's best case: iDLG's sign argument does not apply to a
  sign-only report); the report's randomness comes from ``os.urandom`` unless ``insecure_seeded_noise``;
- ``secagg``: the server learns only the sum of ``secagg_clients`` clients' updates, computed by the real
  SecAgg protocol (:func:`fedarena.privacy.secagg.secure_aggregate`); the attack inverts the sum as if it came
  from one example, and the MSE is taken to the *closest* of the clients' digits (the attacker's best case).

A reconstruction counts as recovered when its per-pixel MSE to the true digit (pixels in [0, 1]) is below
``mse_threshold`` (default 0.01, an RMS error of 0.1 = 1.6 of digits' 16 grey levels); the summary also reports
the mean MSE between each target and the other digits of its class, the scale of "a different digit of the same
class", which sits far above the threshold.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedarena import engine
from fedarena.engine import nn, ops
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.privacy.attacks.gradient_inversion import infer_label, reconstruct
from fedarena.privacy.dpsgd import warn_insecure
from fedarena.privacy.ldp import GaussianMechanism
from fedarena.privacy.secagg import SecAggConfig, secure_aggregate
from fedarena.privacy.signds import SignDSConfig, signds_aggregate, signds_report


@dataclass(frozen=True)
class GradientInversionConfig(ExperimentConfig):
    targets: int = param(4, "number of target clients attacked (one digit each, distinct classes)")
    hidden: tuple[int, ...] = param((64,), "hidden layer widths of the sigmoid MLP")
    client_lr: float = param(0.1, "the client's local SGD learning rate (update = client_lr * gradient)")
    ldp_epsilons: tuple[float, ...] = param((8.0, 1.0), "LDP epsilons of the Gaussian mechanism on the update")
    ldp_delta: float = param(1e-5, "LDP delta")
    ldp_clip_norm: float = param(0.1, "L2 clip norm of the update before LDP noise")
    signds_epsilons: tuple[float, ...] = param((8.0, 1.0), "SignDS epsilons of the EM-MDS dimension selection")
    signds_k: int = param(500, "SignDS top-k set size (of the model's d parameters)")
    signds_h: int = param(50, "SignDS output size: dimensions uploaded per report")
    secagg_clients: int = param(4, "clients whose updates SecAgg sums (the target plus others, one digit each)")
    max_iterations: int = param(300, "L-BFGS iterations of the gradient matching")
    mse_threshold: float = param(0.01, "per-pixel MSE below which a reconstruction counts as recovered")
    insecure_seeded_noise: bool = param(False, "TESTS ONLY: LDP noise and SignDS reports from the seed, not os.urandom")

    def __post_init__(self) -> None:
        if not 1 <= self.targets <= 10:
            raise ValueError(f"targets: must lie in [1, 10] (one per class), got {self.targets!r}")
        if not self.client_lr > 0 or not self.ldp_clip_norm > 0:
            raise ValueError("client_lr, ldp_clip_norm: must be > 0")
        if any(not (math.isfinite(e) and e > 0) for e in self.ldp_epsilons):
            raise ValueError(f"ldp_epsilons: must be finite numbers > 0, got {list(self.ldp_epsilons)!r}")
        if any(not (math.isfinite(e) and e > 0) for e in self.signds_epsilons):
            raise ValueError(f"signds_epsilons: must be finite numbers > 0, got {list(self.signds_epsilons)!r}")
        if not 1 <= self.signds_h <= self.signds_k or self.signds_k < 1:
            raise ValueError(f"signds_h, signds_k: need 1 <= signds_h <= signds_k, got {self.signds_h}, "
                             f"{self.signds_k}")
        if self.secagg_clients < 3:
            raise ValueError(f"secagg_clients: must be >= 3 (SecAgg's threshold is at least 2), got {self.secagg_clients}")
        if self.max_iterations < 1 or not self.mse_threshold > 0:
            raise ValueError("max_iterations: must be >= 1; mse_threshold: must be > 0")


def _flatten(tree) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in engine.tree_leaves(tree)])


def _unflatten(flat: np.ndarray, like):
    leaves, treedef = engine.tree_flatten(like)
    out, i = [], 0
    for leaf in leaves:
        n = int(np.size(leaf))
        out.append(flat[i:i + n].reshape(np.shape(leaf)))
        i += n
    return engine.tree_unflatten(treedef, out)


def _defences(cfg: GradientInversionConfig) -> list[str]:
    return (["plain"] + [f"ldp_eps{e:g}" for e in cfg.ldp_epsilons] + [f"signds_eps{e:g}" for e in cfg.signds_epsilons]
            + ["secagg"])


def run(cfg: GradientInversionConfig, run) -> dict:
    from sklearn.datasets import load_digits

    if cfg.insecure_seeded_noise:
        warn_insecure("fl_gradient_inversion")
    x_all, y_all = load_digits(return_X_y=True)
    x_all = x_all / 16.0
    rng = np.random.default_rng(cfg.seed)
    classes = rng.permutation(10)[:cfg.targets]
    target_idx = [int(rng.choice(np.flatnonzero(y_all == c))) for c in classes]
    mlp = nn.MLP([64, *[int(h) for h in cfg.hidden], 10], activation="sigmoid")
    params = mlp.init(cfg.seed, dtype=np.float64)
    grad_fn = engine.jit(engine.grad(lambda p, x, y: ops.cross_entropy(mlp.apply(p, x), y)))

    def update(i: int) -> np.ndarray:
        return cfg.client_lr * _flatten(grad_fn(params, x_all[i:i + 1], y_all[i:i + 1]))

    dim = update(target_idx[0]).size
    defences = _defences(cfg)
    if cfg.signds_epsilons and cfg.signds_k >= dim:
        raise ValueError(f"signds_k: must be below the model's {dim} parameters, got {cfg.signds_k}")
    secure_seed = lambda: int.from_bytes(os.urandom(8), "little")  # noqa: E731
    summary: dict = {"parameters": dim}
    recon: dict = {}
    step = 0
    with run.progress(total=len(defences) * cfg.targets, desc="gradient inversion") as bar:
        for t, idx in enumerate(target_idx):
            others = [int(j) for j in rng.choice(np.flatnonzero(np.arange(len(x_all)) != idx),
                                                 cfg.secagg_clients - 1, replace=False)]
            same = np.flatnonzero((y_all == y_all[idx]) & (np.arange(len(x_all)) != idx))
            summary[f"target{t}_same_class_mse"] = float(np.mean((x_all[same] - x_all[idx]) ** 2))
            for d in defences:
                truths = [idx]
                distance, label = "l2", None
                if d == "plain":
                    seen = update(idx)
                elif d.startswith("signds_eps"):
                    sd = SignDSConfig(d=dim, k=cfg.signds_k, h=cfg.signds_h, epsilon=float(d[len("signds_eps"):]))
                    report_rng = np.random.default_rng([cfg.seed, t, step]) if cfg.insecure_seeded_noise else None
                    seen = signds_aggregate([signds_report(update(idx), sd, report_rng)], dim, cfg.client_lr)
                    distance, label = "cosine", int(y_all[idx])
                elif d == "secagg":
                    truths = [idx, *others]
                    inputs = {u + 1: update(j) for u, j in enumerate(truths)}
                    clip = float(max(np.max(np.abs(v)) for v in inputs.values())) * 1.01
                    sa = SecAggConfig(dimension=dim, threshold=cfg.secagg_clients // 2 + 1, clip=clip,
                                      scale=2.0 ** 24 / clip / cfg.secagg_clients)
                    seen = np.asarray(secure_aggregate(inputs, sa).result.values, dtype=np.float64)
                else:
                    eps = float(d[len("ldp_eps"):])
                    mech = GaussianMechanism(eps, cfg.ldp_delta, cfg.ldp_clip_norm)
                    noise_seed = [cfg.seed, t, step] if cfg.insecure_seeded_noise else secure_seed()
                    seen = mech(update(idx), np.random.default_rng(noise_seed))
                observed = _unflatten(seen / cfg.client_lr, params)
                if label is None:
                    label = infer_label(observed[-1]["b"])
                r = reconstruct(mlp.apply, params, observed, (64,), label, max_iterations=cfg.max_iterations,
                                seed=cfg.seed + t, distance=distance)
                errs = [float(np.mean((r.x - x_all[j]) ** 2)) for j in truths]
                mse = min(errs)
                recon[(d, t)] = r.x
                summary[f"{d}_target{t}_mse"] = mse
                if distance == "l2":  # the label was inferred (iDLG); SignDS's attack is given it
                    summary[f"{d}_target{t}_label_correct"] = int(label == y_all[idx])
                run.logger.info("target %d, %s: MSE %.3g, label %s, matching loss %.3g", t, d, mse,
                                "correct" if label == y_all[idx] else "wrong", r.matching_loss)
                step += 1
                bar.update(1, defence=d)
    for d in defences:
        mses = [summary[f"{d}_target{t}_mse"] for t in range(cfg.targets)]
        summary[f"{d}_mean_mse"] = float(np.mean(mses))
        summary[f"{d}_recovered"] = int(sum(m < cfg.mse_threshold for m in mses))
    summary["mse_threshold"] = cfg.mse_threshold
    # one row of lists (an entry per target), so the generic per-step plots leave them out
    run.log(step, **{f"{d}_mse": [summary[f"{d}_target{t}_mse"] for t in range(cfg.targets)] for d in defences})
    np.savez(Path(run.dir) / "reconstructions.npz", targets=x_all[target_idx],
             **{f"{d}_{t}": recon[(d, t)] for d in defences for t in range(cfg.targets)})
    return summary


def plots(rows, cfg, report_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(report_dir).parent / "reconstructions.npz"
    if not path.exists():
        return []
    data = np.load(path)
    defences = _defences(cfg)
    last = next((r for r in reversed(rows) if "plain_mse" in r), {})
    mse = {(d, t): v for d in defences for t, v in enumerate(last.get(f"{d}_mse", []))}
    k = len(data["targets"])
    fig, axes = plt.subplots(len(defences) + 1, k, figsize=(1.9 * k, 1.9 * (len(defences) + 1)), squeeze=False)
    for t in range(k):
        axes[0, t].imshow(data["targets"][t].reshape(8, 8), cmap="gray_r", vmin=0, vmax=1)
        axes[0, t].set_title("client digit", fontsize=8)
        for row, d in enumerate(defences, start=1):
            axes[row, t].imshow(data[f"{d}_{t}"].reshape(8, 8), cmap="gray_r", vmin=0, vmax=1)
            axes[row, t].set_title(f"{d}: MSE {mse.get((d, t), float('nan')):.3g}", fontsize=7)
    for a in axes.ravel():
        a.set_xticks([])
        a.set_yticks([])
    fig.suptitle(f"DLG + iDLG from one FedAvg update\n(recovered: MSE < {cfg.mse_threshold:g}; SignDS: cosine DLG)",
                 fontsize=9)
    fig.tight_layout()
    out = Path(report_dir) / "reconstructions.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return [str(out)]


EXPERIMENT = Experiment(config=GradientInversionConfig, run=run, plots=plots, resumable=False)
