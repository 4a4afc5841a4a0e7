"""Experiment kind ``digits_robustness``: an engine MLP on scikit-learn's digits trained normally and with PGD
adversarial training (Madry et al. 2018), evaluated under FGSM and PGD (L-inf) and PGD-L2 and Carlini-Wagner L2 over
grids of budgets, and a feature-squeezing detector (Xu et al., NDSS 2018) against FGSM, PGD and CW on the
standard model.

Pixels are scaled to [0, 1], the attacks' input domain. The held-out digits are split in two stratified halves:
the accuracy curves use all of them; the detector's threshold is set on the clean *calibration* half at
``detector_fpr``, and its false-positive rate and detection rates are measured on the other (*evaluation*) half,
the detection rate over the successful adversarial examples (clean input classified correctly, adversarial one
not), as Xu et al. report it. The report has the accuracy-vs-epsilon figure (L-inf and L2 panels), the detector
figure (score distributions and detection rates), and the summary table lists every (model, attack, epsilon)
accuracy, the PGD accuracy gain of adversarial training at ``train_epsilon`` and its clean-accuracy cost, CW's
success rate and mean L2, and every squeezer's clean accuracy, false-positive rate and detection rates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.robustness.attacks import PGDConfig, fgsm, input_gradient, pgd
from fedarena.robustness.carlini_wagner import CWConfig, carlini_wagner_l2
from fedarena.robustness.evaluation import ATTACKS, L2_ATTACKS, robust_accuracy_curve
from fedarena.robustness.feature_squeezing import FeatureSqueezingDetector, Squeezer, squeezing_scores
from fedarena.robustness.training import train_classifier

MODELS = ("standard", "adversarial")
DETECTED = ("fgsm", "pgd", "cw")
IMAGE = (8, 8)
_SQUEEZER = re.compile(r"^(bit_depth)_(\d+)$|^(median)_(\d+)x(\d+)$")


def parse_squeezer(name: str) -> Squeezer:
    """``bit_depth_<bits>`` or ``median_<k>x<k>`` -> :class:`Squeezer`."""
    m = _SQUEEZER.match(str(name))
    if not m or (m.group(3) and m.group(4) != m.group(5)):
        raise ValueError(f"squeezers: {name!r} is not bit_depth_<bits> or median_<k>x<k>")
    return Squeezer("bit_depth", int(m.group(2))) if m.group(1) else Squeezer("median", int(m.group(4)))


@dataclass(frozen=True)
class DigitsRobustnessConfig(ExperimentConfig):
    model: str = param("mlp", "mlp (ReLU MLP of `hidden`) or cnn (two 3x3 ReLU convolutions of `channels` on the "
                       "8x8 image, 2x2 max pool after each, a linear layer)")
    hidden: tuple[int, ...] = param((256,), "hidden layer widths of the ReLU MLP")
    channels: tuple[int, ...] = param((16, 32), "cnn: channels of its two convolutions")
    epochs: int = param(20, "training epochs of each model")
    batch_size: int = param(64, "minibatch size")
    lr: float = param(1e-3, "Adam learning rate")
    train_epsilon: float = param(0.2, "L-inf budget of the PGD adversarial training (and of the acceptance check)")
    train_steps: int = param(7, "PGD steps per minibatch during adversarial training")
    eval_epsilons: tuple[float, ...] = param((0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3), "L-inf budgets evaluated")
    l2_epsilons: tuple[float, ...] = param((0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0), "L2 budgets of pgd_l2 and cw")
    eval_pgd_steps: int = param(20, "PGD steps at evaluation (step size 2.5 epsilon / steps)")
    attacks: tuple[str, ...] = param(ATTACKS, "attacks evaluated (fgsm, pgd: L-inf; pgd_l2, cw: L2)")
    cw_steps: int = param(100, "Adam steps of CW-L2 per binary-search round")
    cw_search_steps: int = param(5, "binary-search rounds over CW's constant c")
    cw_lr: float = param(0.05, "CW's Adam learning rate")
    cw_initial_const: float = param(1.0, "CW's initial constant c")
    squeezers: tuple[str, ...] = param(("bit_depth_1", "bit_depth_2", "bit_depth_3", "median_2x2", "median_3x3"),
                                       "squeezers reported one by one (bit_depth_<bits>, median_<k>x<k>)")
    joint_squeezers: tuple[str, ...] = param(("bit_depth_2", "bit_depth_3"),
                                             "squeezers of the joint detector (max of their scores)")
    detector_fpr: float = param(0.05, "false-positive rate on clean calibration digits that sets each threshold")
    test_fraction: float = param(0.2, "fraction of digits held out for evaluation (stratified)")

    def __post_init__(self) -> None:
        if self.model not in ("mlp", "cnn"):
            raise ValueError(f"model: expected mlp or cnn, got {self.model!r}")
        if len(self.channels) != 2 or any(int(c) < 1 for c in self.channels):
            raise ValueError(f"channels: two positive channel counts expected, got {list(self.channels)}")
        if not 0 < self.train_epsilon <= 1:
            raise ValueError(f"train_epsilon: must lie in (0, 1], got {self.train_epsilon!r}")
        if self.epochs < 1 or self.batch_size < 1 or self.train_steps < 1 or self.eval_pgd_steps < 1:
            raise ValueError("epochs, batch_size, train_steps, eval_pgd_steps: must be >= 1")
        if any(not 0 <= e <= 1 for e in self.eval_epsilons) or not self.eval_epsilons:
            raise ValueError(f"eval_epsilons: must be a non-empty list in [0, 1], got {self.eval_epsilons!r}")
        if any(not 0 <= e <= 8 for e in self.l2_epsilons) or not self.l2_epsilons:
            raise ValueError(f"l2_epsilons: must be a non-empty list in [0, 8] (the L2 diameter of [0, 1]^64), "
                             f"got {self.l2_epsilons!r}")
        bad = sorted(set(self.attacks) - set(ATTACKS))
        if bad or not self.attacks:
            raise ValueError(f"attacks: unknown or empty {list(self.attacks)}; known: {list(ATTACKS)}")
        if self.cw_steps < 1 or self.cw_search_steps < 1 or not self.cw_lr > 0 or not self.cw_initial_const > 0:
            raise ValueError("cw_steps, cw_search_steps: must be >= 1; cw_lr, cw_initial_const: must be > 0")
        for name in self.squeezers + self.joint_squeezers:
            parse_squeezer(name)
        if not self.joint_squeezers:
            raise ValueError("joint_squeezers: need at least one squeezer")
        if not 0 < self.detector_fpr < 0.5:
            raise ValueError(f"detector_fpr: must lie in (0, 0.5), got {self.detector_fpr!r}")
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"test_fraction: must lie in (0, 1), got {self.test_fraction!r}")


def _data(cfg: DigitsRobustnessConfig):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y.astype(np.int64), test_size=cfg.test_fraction, random_state=cfg.seed, stratify=y)


def _key(model: str, attack: str, eps: float) -> str:
    return f"{model}_{attack}_eps{eps:g}"


def _detection(cfg: DigitsRobustnessConfig, apply, params, x: np.ndarray, y: np.ndarray, cw_adv: np.ndarray,
               run) -> tuple[dict, dict]:
    """Feature squeezing on the standard model: thresholds on the calibration half, rates on the evaluation half.

    Returns the summary entries and the metrics row the report's detector figure is drawn from."""
    from sklearn.model_selection import train_test_split

    calib, held = train_test_split(np.arange(len(x)), test_size=0.5, random_state=cfg.seed, stratify=y)
    grad = input_gradient(apply)
    e = float(cfg.train_epsilon)
    pgd_cfg = PGDConfig(e, 2.5 * e / cfg.eval_pgd_steps, cfg.eval_pgd_steps)
    xe, ye = x[held], y[held]
    adversarial = {"fgsm": fgsm(grad, params, xe, ye, e), "pgd": pgd(grad, params, xe, ye, pgd_cfg, seed=cfg.seed),
                   "cw": cw_adv[held]}
    logits = engine.jit(apply)

    def correct(a: np.ndarray) -> np.ndarray:
        return np.argmax(np.asarray(logits(params, a)), axis=1) == ye

    clean_ok = correct(xe)
    successful = {a: clean_ok & ~correct(adv) for a, adv in adversarial.items()}
    names = list(dict.fromkeys(list(cfg.squeezers) + list(cfg.joint_squeezers)))
    squeezers = [parse_squeezer(n) for n in names]
    calib_scores = squeezing_scores(apply, params, x[calib], squeezers, IMAGE)
    eval_scores = squeezing_scores(apply, params, xe, squeezers, IMAGE)
    adv_scores = {a: squeezing_scores(apply, params, adv, squeezers, IMAGE) for a, adv in adversarial.items()}
    out: dict = {"detector_calibration_digits": int(len(calib)), "detector_evaluation_digits": int(len(held))}
    for a in adversarial:
        out[f"detector_successful_{a}"] = int(successful[a].sum())
    detectors = [(s.name, [j]) for j, s in enumerate(squeezers) if s.name in cfg.squeezers]
    detectors.append(("joint", [names.index(n) for n in cfg.joint_squeezers]))
    row: dict = {"detector_names": [d for d, _ in detectors]}
    for name, cols in detectors:
        det = FeatureSqueezingDetector.fit(apply, params, x[calib],
                                           [squeezers[j] for j in cols], IMAGE, cfg.detector_fpr)
        thr = det.threshold
        clean_joint = eval_scores[:, cols].max(axis=1)
        out[f"detector_{name}_threshold"] = thr
        out[f"detector_{name}_false_positive_rate"] = float(np.mean(clean_joint > thr))
        if name != "joint":
            squeezed = squeezers[cols[0]](xe, IMAGE)
            out[f"detector_{name}_clean_accuracy"] = float(np.mean(correct(squeezed)))
        row.setdefault("detector_false_positive_rate", []).append(out[f"detector_{name}_false_positive_rate"])
        for a in adversarial:
            s = adv_scores[a][:, cols].max(axis=1)[successful[a]]
            rate = float(np.mean(s > thr)) if s.size else float("nan")
            out[f"detector_{name}_detection_{a}"] = rate
            row.setdefault(f"detection_{a}", []).append(rate)
        run.logger.info("feature squeezing %s: threshold %.4g, FPR %.3f, detection %s", name, thr,
                        out[f"detector_{name}_false_positive_rate"],
                        {a: round(out[f"detector_{name}_detection_{a}"], 3) for a in adversarial})
    # the joint detector's score distributions, for the report's histogram
    jc = [names.index(n) for n in cfg.joint_squeezers]
    row["joint_clean_scores"] = eval_scores[:, jc].max(axis=1).tolist()
    for a in adversarial:
        row[f"joint_{a}_scores"] = adv_scores[a][:, jc].max(axis=1)[successful[a]].tolist()
    row["joint_threshold"] = out["detector_joint_threshold"]
    return out, row


class _ImageCNN:
    """The cnn classifier on flat 64-pixel digits (reshaped to 1x8x8): conv-relu-pool twice, then linear."""

    def __init__(self, channels: tuple[int, ...]) -> None:
        c1, c2 = (int(c) for c in channels)
        self.net = nn.Sequential([nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Flatten(), nn.Linear(c2 * 2 * 2, 10)])

    def init(self, seed: int) -> Any:
        return self.net.init(seed)

    def apply(self, params: Any, x: Any) -> Any:
        return self.net.apply(params, ops.reshape(x, (-1, 1, 8, 8)))


def classifier(cfg: DigitsRobustnessConfig) -> Any:
    """The model of ``cfg`` (``init(seed)``, ``apply(params, x)`` on flat 64-pixel inputs in [0, 1])."""
    if cfg.model == "cnn":
        return _ImageCNN(cfg.channels)
    return nn.MLP([64, *[int(h) for h in cfg.hidden], 10], activation="relu")


def run(cfg: DigitsRobustnessConfig, run) -> dict:
    x_train, x_test, y_train, y_test = _data(cfg)
    mlp = classifier(cfg)
    steps_per_epoch = -(-len(x_train) // cfg.batch_size)
    train_attack = PGDConfig(cfg.train_epsilon, 2.5 * cfg.train_epsilon / cfg.train_steps, cfg.train_steps)
    eps_grid = sorted({float(e) for e in cfg.eval_epsilons} | {float(cfg.train_epsilon)})
    l2_grid = sorted({float(e) for e in cfg.l2_epsilons})
    cw_cfg = CWConfig(steps=cfg.cw_steps, binary_search_steps=cfg.cw_search_steps, initial_const=cfg.cw_initial_const,
                      learning_rate=cfg.cw_lr)
    summary: dict = {}
    detection: dict = {}
    step0 = 0
    for m, model in enumerate(MODELS):
        attack = train_attack if model == "adversarial" else None
        with run.progress(total=cfg.epochs * steps_per_epoch, desc=f"train {model}") as bar:
            def on_step(step: int, loss: float, _bar=bar, _m=model, _o=step0) -> None:
                _bar.update(1, loss=loss)
                if step % steps_per_epoch == 0:
                    run.log(_o + step, **{f"{_m}_train_loss": loss})

            params = train_classifier(mlp.apply, mlp.init(cfg.seed), optim.adam(cfg.lr), x_train, y_train,
                                      epochs=cfg.epochs, batch_size=cfg.batch_size, seed=cfg.seed + m,
                                      attack=attack, on_step=on_step)
        step0 += cfg.epochs * steps_per_epoch
        cw = None
        if "cw" in cfg.attacks or model == "standard":
            run.logger.info("CW-L2 on the %s model (%d digits)", model, len(x_test))
            cw = carlini_wagner_l2(mlp.apply, params, x_test, y_test, cw_cfg)
            summary[f"{model}_cw_success_rate"], summary[f"{model}_cw_mean_l2"] = cw.success_rate, cw.mean_l2
        run.logger.info("evaluating the %s model under %s", model, list(cfg.attacks))
        curve = robust_accuracy_curve(mlp.apply, params, x_test, y_test, eps_grid, attacks=cfg.attacks,
                                      l2_epsilons=l2_grid, pgd_steps=cfg.eval_pgd_steps, cw_result=cw,
                                      seed=cfg.seed)
        for point in curve:
            summary[_key(model, point.attack, point.epsilon)] = point.accuracy
        # one row of lists per model (accuracy per epsilon), so the generic per-step plots leave them out
        run.log(step0, eval_epsilons=eps_grid, l2_epsilons=l2_grid,
                **{f"{model}_{a}_accuracy": [p.accuracy for p in curve if p.attack == a] for a in cfg.attacks})
        if model == "standard":
            detection, row = _detection(cfg, mlp.apply, params, x_test, y_test, cw.adversarial, run)
            run.log(step0, detector=True, **row)
    first = cfg.attacks[0]
    clean_std, clean_adv = summary[_key("standard", first, 0.0)], summary[_key("adversarial", first, 0.0)]
    out = {"standard_clean_accuracy": clean_std, "adversarial_clean_accuracy": clean_adv,
           "clean_accuracy_cost": clean_std - clean_adv}
    if "pgd" in cfg.attacks:
        e = float(cfg.train_epsilon)
        out["pgd_gain_at_train_epsilon"] = summary[_key("adversarial", "pgd", e)] - summary[_key("standard", "pgd", e)]
    out.update(summary)
    out.update(detection)
    return out


def plots(rows, cfg, report_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    curves = {k: (r["l2_epsilons"] if k[:-len("_accuracy")].split("_", 1)[1] in L2_ATTACKS else r["eval_epsilons"], v)
              for r in rows if "eval_epsilons" in r
              for k, v in r.items() if k.endswith("_accuracy") and isinstance(v, list)}
    if curves:
        panels = [a for a in (("fgsm", "pgd"), ("pgd_l2", "cw")) if set(a) & set(cfg.attacks)]
        fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.2), squeeze=False)
        styles = {"standard": "-", "adversarial": "--"}
        markers = {"fgsm": "s", "pgd": "o", "pgd_l2": "o", "cw": "^"}
        labels = {"fgsm": "FGSM", "pgd": f"PGD-{cfg.eval_pgd_steps}", "pgd_l2": f"PGD-L2-{cfg.eval_pgd_steps}",
                  "cw": "CW-L2"}
        for ax, panel in zip(axes[0], panels):
            for model in MODELS:
                for attack in panel:
                    if f"{model}_{attack}_accuracy" in curves:
                        eps, acc = curves[f"{model}_{attack}_accuracy"]
                        ax.plot(eps, acc, styles[model], marker=markers[attack], ms=4,
                                label=f"{model} training, {labels[attack]}")
            if panel[0] == "fgsm":
                ax.axvline(cfg.train_epsilon, color="grey", ls=":", lw=1,
                           label=f"training epsilon {cfg.train_epsilon:g}")
                ax.set_xlabel("L-inf epsilon (pixels in [0, 1])")
                ax.set_title("L-inf attacks", fontsize=10)
            else:
                ax.set_xlabel("L2 epsilon (64 pixels in [0, 1])")
                ax.set_title("L2 attacks (CW: minimum-distance, thresholded at epsilon)", fontsize=10)
            ax.set_ylabel("test accuracy")
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"digits {cfg.model.upper()}: accuracy under attack, standard vs PGD adversarial training", fontsize=10)
        fig.tight_layout()
        path = Path(report_dir) / "accuracy_vs_epsilon.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    det = next((r for r in reversed(rows) if r.get("detector")), None)
    if det is not None:
        fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
        series = [("clean", det["joint_clean_scores"])] + [(a, det[f"joint_{a}_scores"]) for a in DETECTED]
        lo = max(1e-6, min(min(v) for _, v in series if v) if any(v for _, v in series) else 1e-6)
        bins = np.logspace(np.log10(lo), np.log10(2.0), 30)
        for name, v in series:
            ax[0].hist(np.maximum(v, lo), bins=bins, histtype="step", lw=1.5,
                       label=f"{name} ({len(v)})" if name == "clean" else f"{name.upper()} successful ({len(v)})")
        ax[0].axvline(det["joint_threshold"], color="k", ls="--", lw=1,
                      label=f"threshold (FPR {cfg.detector_fpr:g} on calibration)")
        ax[0].set_xscale("log")
        ax[0].set_xlabel("joint score: max L1(softmax(x), softmax(squeezed x)) over " + ", ".join(cfg.joint_squeezers))
        ax[0].set_ylabel("evaluation digits")
        ax[0].set_title("feature-squeezing scores, standard model", fontsize=10)
        ax[0].legend(fontsize=8)
        names = det["detector_names"]
        width = 0.8 / (len(DETECTED) + 1)
        pos = np.arange(len(names))
        ax[1].bar(pos - 0.4 + width / 2, det["detector_false_positive_rate"], width, color="grey",
                  label="false-positive rate (clean)")
        for i, a in enumerate(DETECTED, start=1):
            ax[1].bar(pos - 0.4 + width / 2 + i * width, det[f"detection_{a}"], width,
                      label=f"detection rate, {a.upper()} (eps {cfg.train_epsilon:g})" if a != "cw" else
                      "detection rate, CW-L2")
        ax[1].set_xticks(pos)
        ax[1].set_xticklabels(names, rotation=20, fontsize=8)
        ax[1].set_ylim(0, 1.3)
        ax[1].set_yticks(np.linspace(0, 1, 6))
        ax[1].set_title("detection rate on successful adversarial examples", fontsize=10)
        ax[1].grid(axis="y", alpha=0.3)
        ax[1].legend(fontsize=7, loc="upper center", ncol=2)
        fig.tight_layout()
        path = Path(report_dir) / "feature_squeezing.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths


EXPERIMENT = Experiment(config=DigitsRobustnessConfig, run=run, plots=plots, resumable=False,
                        summary_keys=())
