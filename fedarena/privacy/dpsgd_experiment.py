"""Experiment kind ``dpsgd_digits``: DP-SGD (Abadi et al. 2016) on scikit-learn's digits with an engine MLP,
an RDP accountant (Mironov, Talwar, Zhang 2019) or a privacy-loss-distribution accountant
(:mod:`fedarena.privacy.pld`, ``accountant: pld``), and a budget monitor that stops training at the epsilon
budget by the chosen accountant. The summary reports the epsilon of both accountants after the last step.

Every step logs the epsilon spent so far (at the configured delta); every ``eval_every`` steps the accuracy on
the held-out test split. Nothing computed on the training data (batch loss, Poisson batch size, clipped fraction,
gradient norms) is logged: the accountant does not cover it. When ``noise_multiplier`` is 0 it is calibrated so
that ``epochs`` epochs of steps spend exactly the budget. Sampling and noise come from ``os.urandom``
(:class:`fedarena.privacy.dpsgd.SecureRandom`); ``insecure_seeded_noise: true`` derives them from ``seed`` and
the step instead (bit-for-bit reproducible and resumable runs, for tests), with a loud warning, and the summary
then says the epsilon is void.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop
from fedarena.privacy.accountant import RDPAccountant
from fedarena.privacy.budget import BudgetMonitor, noise_multiplier_for_budget
from fedarena.privacy.dpsgd import DPSGD, DPSGDConfig, SecureRandom, poisson_batch
from fedarena.privacy.pld import PLDAccountant


@dataclass(frozen=True)
class DPSGDDigitsConfig(ExperimentConfig):
    epsilon_budget: float = param(8.0, "privacy budget epsilon; training stops before exceeding it")
    delta: float = param(1e-5, "delta of the (epsilon, delta) guarantee")
    accountant: Literal["rdp", "pld"] = param("rdp", "accountant of the budget: RDP or the tighter privacy loss "
                                                     "distribution (the summary reports both epsilons)")
    batch_size: int = param(64, "expected Poisson batch size (sampling rate = batch_size / training-set size)")
    epochs: float = param(15.0, "planned epochs; with noise_multiplier = 0 the noise is calibrated to spend the "
                                "budget over this many epochs")
    noise_multiplier: float = param(0.0, "noise std / clip norm; 0 calibrates it from the budget and epochs")
    clip_norm: float = param(1.0, "per-example gradient L2 clip norm C")
    lr: float = param(0.05, "SGD learning rate")
    momentum: float = param(0.9, "SGD momentum")
    hidden: tuple[int, ...] = param((128,), "hidden layer widths of the MLP")
    test_fraction: float = param(0.2, "fraction of digits held out for testing (stratified)")
    eval_every: int = param(25, "evaluate test accuracy every this many steps")
    insecure_seeded_noise: bool = param(False, "TESTS ONLY: draw batches and noise from the seed (reproducible, but "
                                               "anyone holding the config can recompute them: the epsilon is void)")


def _data(cfg: DPSGDDigitsConfig):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y.astype(np.int64), test_size=cfg.test_fraction, random_state=cfg.seed, stratify=y)


def run(cfg: DPSGDDigitsConfig, run) -> dict:
    if cfg.batch_size < 1 or cfg.eval_every < 1 or cfg.epochs <= 0:
        raise ValueError("batch_size, eval_every and epochs must be positive")
    steps = _DPSGDSteps(run, cfg)
    summary = run_loop(run, steps)
    if not any(r.get("final") and r["step"] == steps.monitor.steps for r in run.rows()):  # a resume past the
        run.log(steps.monitor.steps, test_accuracy=summary["test_accuracy"], epsilon=steps.monitor.epsilon,
                final=1)                                                              # budget keeps its final row
    return summary


class _DPSGDSteps:
    """DP-SGD under :func:`~fedarena.platform.loop.run_loop`: one noisy step a step until the budget monitor
    refuses the next one; every step logs the epsilon spent, every ``eval_every`` steps the test accuracy."""

    def __init__(self, run, cfg: DPSGDDigitsConfig):
        self.run, self.cfg = run, cfg
        self.x_train, self.x_test, self.y_train, self.y_test = _data(cfg)
        self.n = n = len(self.x_train)
        self.q = q = cfg.batch_size / n
        if not 0 < q <= 1:
            raise ValueError(f"batch_size: {cfg.batch_size} exceeds the training-set size {n}")
        planned = int(round(cfg.epochs / q))
        self.sigma = sigma = cfg.noise_multiplier or noise_multiplier_for_budget(
            cfg.epsilon_budget, cfg.delta, q, planned, accountant=cfg.accountant)
        mlp = nn.MLP([64, *[int(h) for h in cfg.hidden], 10], activation="tanh")

        def loss_fn(params, x, y):
            return ops.cross_entropy(mlp.apply(params, x), y)

        self.dp = DPSGD(loss_fn, DPSGDConfig(cfg.clip_norm, sigma, q, insecure_seeded_noise=cfg.insecure_seeded_noise),
                        n)
        self.secure = SecureRandom()
        opt = optim.sgd(cfg.lr, momentum=cfg.momentum)
        self.update = engine.jit(lambda g, s, p: opt.update(g, s, p))
        self.logits = engine.jit(lambda p, x: mlp.apply(p, x))
        self.monitor = BudgetMonitor(cfg.epsilon_budget, cfg.delta, sigma, q, accountant=cfg.accountant)
        self.params = mlp.init(cfg.seed)
        self.opt_state = opt.init(self.params)
        self.desc, self.total = "dp-sgd", self.monitor.max_steps()

    def _announce(self) -> None:
        self.run.logger.info("q=%.4f sigma=%.4f budget allows %d steps (%.1f epochs)", self.q, self.sigma, self.total,
                             self.total * self.q)

    def init(self) -> None:
        self._announce()
        return None

    def load(self, step: int, state: dict) -> None:
        self.params = engine.tree_map(lambda a, b: np.asarray(b, dtype=a.dtype), self.params, state["params"])
        self.opt_state = engine.tree_map(lambda a, b: np.asarray(b, dtype=np.asarray(a).dtype), self.opt_state,
                                         state["opt"])
        self.monitor.restore(step, list(state["epsilons"]))
        self._announce()

    def state(self) -> dict:
        return {"params": self.params, "opt": self.opt_state, "epsilons": self.monitor.history}

    def done(self) -> bool:
        return not self.monitor.can_step()

    def units(self) -> int:
        return self.monitor.steps

    def accuracy(self) -> float:
        return float(np.mean(np.argmax(self.logits(self.params, self.x_test), axis=1) == self.y_test))

    def step(self, step: int) -> dict:
        # insecure mode: a per-step stream from the seed (resumable without RNG state); else the CSPRNG
        rng = np.random.default_rng([self.cfg.seed, step]) if self.cfg.insecure_seeded_noise else self.secure
        idx = poisson_batch(rng, self.n, self.q)
        grads, _private_stats = self.dp.noisy_gradient(self.params, self.x_train[idx], self.y_train[idx],
                                                       rng)  # not logged
        self.params, self.opt_state = self.update(grads, self.opt_state, self.params)
        row = dict(epsilon=self.monitor.step())
        if step % self.cfg.eval_every == 0:
            row["test_accuracy"] = self.accuracy()
        return row

    def summary(self) -> dict:
        cfg, monitor = self.cfg, self.monitor
        both = {}
        for kind in ("rdp", "pld"):  # both accountants' epsilon after the steps taken
            acc = RDPAccountant() if kind == "rdp" else PLDAccountant()
            if monitor.steps:
                acc.step(self.sigma, self.q, monitor.steps)
            both[f"epsilon_{kind}"] = acc.epsilon(cfg.delta)
        return {"test_accuracy": self.accuracy(), "epsilon": monitor.epsilon, **both, "delta": cfg.delta,
                "steps": monitor.steps, "noise_multiplier": self.sigma, "sample_rate": self.q,
                "epochs": monitor.steps * self.q, "stopped_by_budget": not monitor.can_step(),
                "insecure_seeded_noise": cfg.insecure_seeded_noise,
                "privacy": ("void: seeded noise" if cfg.insecure_seeded_noise
                            else f"(epsilon, delta)-DP, {cfg.accountant.upper()} accountant")}


def plots(rows, cfg, report_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return []
    steps = [r["step"] for r in rows if "epsilon" in r]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    ax[0].plot(steps, [r["epsilon"] for r in rows if "epsilon" in r])
    ax[0].axhline(cfg.epsilon_budget, color="r", ls="--", label="budget")
    ax[0].set_title(f"epsilon spent (delta={cfg.delta:g})")
    ax[0].legend()
    acc = [(r["step"], r["test_accuracy"]) for r in rows if "test_accuracy" in r]
    ax[1].plot([a for a, _ in acc], [b for _, b in acc], "o-", ms=3)
    ax[1].set_title("test accuracy")
    for a in ax:
        a.set_xlabel("step")
        a.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(report_dir) / "dpsgd.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


EXPERIMENT = Experiment(config=DPSGDDigitsConfig, run=run, plots=plots,
                        summary_keys=("test_accuracy", "epsilon", "epsilon_rdp", "epsilon_pld", "steps"))
