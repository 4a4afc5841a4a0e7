"""Experiment kind ``digits_robustness``: an engine MLP on scikit-learn's digits trained normally and with PGD
adversarial training (Madry et al. 2018), then evaluated under FGSM and PGD (L-inf) over a grid of epsilons.

Pixels are scaled to [0, 1], the attacks' input domain. The report has the accuracy-vs-epsilon figure, and the
summary table lists every (model, attack, epsilon) accuracy plus the PGD accuracy gain of adversarial training
at ``train_epsilon`` and its clean-accuracy cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedarena.engine import nn, optim
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.robustness.attacks import PGDConfig
from fedarena.robustness.evaluation import ATTACKS, robust_accuracy_curve
from fedarena.robustness.training import train_classifier

MODELS = ("standard", "adversarial")


@dataclass(frozen=True)
class DigitsRobustnessConfig(ExperimentConfig):
    hidden: tuple[int, ...] = param((256,), "hidden layer widths of the ReLU MLP")
    epochs: int = param(20, "training epochs of each model")
    batch_size: int = param(64, "minibatch size")
    lr: float = param(1e-3, "Adam learning rate")
    train_epsilon: float = param(0.2, "L-inf budget of the PGD adversarial training (and of the acceptance check)")
    train_steps: int = param(7, "PGD steps per minibatch during adversarial training")
    eval_epsilons: tuple[float, ...] = param((0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3), "L-inf budgets evaluated")
    eval_pgd_steps: int = param(20, "PGD steps at evaluation (step size 2.5 epsilon / steps)")
    attacks: tuple[str, ...] = param(ATTACKS, "attacks evaluated (fgsm, pgd)")
    test_fraction: float = param(0.2, "fraction of digits held out for evaluation (stratified)")

    def __post_init__(self) -> None:
        if not 0 < self.train_epsilon <= 1:
            raise ValueError(f"train_epsilon: must lie in (0, 1], got {self.train_epsilon!r}")
        if self.epochs < 1 or self.batch_size < 1 or self.train_steps < 1 or self.eval_pgd_steps < 1:
            raise ValueError("epochs, batch_size, train_steps, eval_pgd_steps: must be >= 1")
        if any(not 0 <= e <= 1 for e in self.eval_epsilons) or not self.eval_epsilons:
            raise ValueError(f"eval_epsilons: must be a non-empty list in [0, 1], got {self.eval_epsilons!r}")
        bad = sorted(set(self.attacks) - set(ATTACKS))
        if bad or not self.attacks:
            raise ValueError(f"attacks: unknown or empty {list(self.attacks)}; known: {list(ATTACKS)}")
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


def run(cfg: DigitsRobustnessConfig, run) -> dict:
    x_train, x_test, y_train, y_test = _data(cfg)
    mlp = nn.MLP([64, *[int(h) for h in cfg.hidden], 10], activation="relu")
    steps_per_epoch = -(-len(x_train) // cfg.batch_size)
    train_attack = PGDConfig(cfg.train_epsilon, 2.5 * cfg.train_epsilon / cfg.train_steps, cfg.train_steps)
    eps_grid = sorted({float(e) for e in cfg.eval_epsilons} | {float(cfg.train_epsilon)})
    summary: dict = {}
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
        run.logger.info("evaluating the %s model under %s at epsilons %s", model, list(cfg.attacks), eps_grid)
        curve = robust_accuracy_curve(mlp.apply, params, x_test, y_test, eps_grid, attacks=cfg.attacks,
                                      pgd_steps=cfg.eval_pgd_steps, seed=cfg.seed)
        for point in curve:
            summary[_key(model, point.attack, point.epsilon)] = point.accuracy
        # one row of lists per model (accuracy per epsilon), so the generic per-step plots leave them out
        run.log(step0, eval_epsilons=eps_grid,
                **{f"{model}_{a}_accuracy": [p.accuracy for p in curve if p.attack == a] for a in cfg.attacks})
    first = cfg.attacks[0]
    clean_std, clean_adv = summary[_key("standard", first, 0.0)], summary[_key("adversarial", first, 0.0)]
    out = {"standard_clean_accuracy": clean_std, "adversarial_clean_accuracy": clean_adv,
           "clean_accuracy_cost": clean_std - clean_adv}
    if "pgd" in cfg.attacks:
        e = float(cfg.train_epsilon)
        out["pgd_gain_at_train_epsilon"] = summary[_key("adversarial", "pgd", e)] - summary[_key("standard", "pgd", e)]
    out.update(summary)
    return out


def plots(rows, cfg, report_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {k: (r["eval_epsilons"], v) for r in rows if "eval_epsilons" in r
              for k, v in r.items() if k.endswith("_accuracy") and isinstance(v, list)}
    if not curves:
        return []
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = {"standard": "-", "adversarial": "--"}
    markers = {"fgsm": "s", "pgd": "o"}
    for model in MODELS:
        for attack in cfg.attacks:
            if f"{model}_{attack}_accuracy" in curves:
                eps, acc = curves[f"{model}_{attack}_accuracy"]
                ax.plot(eps, acc, styles[model], marker=markers[attack], ms=4,
                        label=f"{model} training, {attack.upper()}")
    ax.axvline(cfg.train_epsilon, color="grey", ls=":", lw=1, label=f"training epsilon {cfg.train_epsilon:g}")
    ax.set_xlabel("L-inf epsilon (pixels in [0, 1])")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"digits MLP: accuracy under attack (PGD-{cfg.eval_pgd_steps})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(report_dir) / "accuracy_vs_epsilon.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


EXPERIMENT = Experiment(config=DigitsRobustnessConfig, run=run, plots=plots,
                        summary_keys=())
