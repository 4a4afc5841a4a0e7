"""Experiment kind ``dpsgd_membership``: membership-inference AUC and advantage against DP-SGD models, per epsilon.

The digits are split into a member set (the training data) and an equally large non-member set (held out). For
each target epsilon, an engine MLP is trained with :class:`fedarena.privacy.dpsgd.DPSGD` for the same number of
epochs, its noise multiplier calibrated by the RDP accountant so that the run spends exactly that epsilon at
``delta``; with ``include_nonprivate`` a model trained by the same code with noise 0 (clipping kept, epsilon
infinite) comes first. Then Yeom et al.'s loss-threshold attack scores every member and non-member and the report
shows its AUC and advantage next to the bound ``(e^eps - 1 + 2 delta) / (e^eps + 1)`` that (epsilon, delta)-DP
places on any attack's advantage (:func:`fedarena.privacy.attacks.membership.dp_advantage_bound`).

Batches and noise come from ``os.urandom`` unless ``insecure_seeded_noise`` (tests) derives them from the seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.privacy.accountant import RDPAccountant
from fedarena.privacy.attacks.membership import dp_advantage_bound, loss_threshold_attack, per_example_loss
from fedarena.privacy.budget import noise_multiplier_for_budget
from fedarena.privacy.dpsgd import DPSGD, DPSGDConfig, SecureRandom, poisson_batch


@dataclass(frozen=True)
class DPSGDMembershipConfig(ExperimentConfig):
    epsilons: tuple[float, ...] = param((8.0, 4.0, 2.0, 1.0), "target epsilons of the DP-SGD models")
    include_nonprivate: bool = param(True, "also train and attack a model with noise 0 (epsilon infinite)")
    delta: float = param(1e-5, "delta of the (epsilon, delta) guarantee and of the bound")
    members: int = param(300, "training-set size (members); as many held-out digits are the non-members")
    epochs: float = param(60.0, "epochs of DP-SGD for every model (the noise is calibrated to them)")
    batch_size: int = param(60, "expected Poisson batch size")
    clip_norm: float = param(1.0, "per-example gradient L2 clip norm C")
    lr: float = param(0.5, "SGD learning rate")
    momentum: float = param(0.9, "SGD momentum")
    hidden: tuple[int, ...] = param((256,), "hidden layer widths of the tanh MLP")
    insecure_seeded_noise: bool = param(False, "TESTS ONLY: batches and noise from the seed (the epsilons are void)")

    def __post_init__(self) -> None:
        if not self.epsilons and not self.include_nonprivate:
            raise ValueError("epsilons: empty and include_nonprivate is false: nothing to train")
        if any(not (math.isfinite(e) and e > 0) for e in self.epsilons):
            raise ValueError(f"epsilons: must be finite numbers > 0, got {list(self.epsilons)!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta: must lie in (0, 1), got {self.delta!r}")
        if not 2 <= self.members <= 898:
            raise ValueError(f"members: must lie in [2, 898] (digits has 1797 examples), got {self.members!r}")
        if not 1 <= self.batch_size <= self.members:
            raise ValueError(f"batch_size: must lie in [1, members], got {self.batch_size!r}")
        if not self.epochs > 0:
            raise ValueError(f"epochs: must be > 0, got {self.epochs!r}")


def _data(cfg: DPSGDMembershipConfig):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_in, x_out, y_in, y_out = train_test_split(x, y.astype(np.int64), train_size=cfg.members,
                                                test_size=cfg.members, random_state=cfg.seed, stratify=y)
    return x_in, y_in, x_out, y_out


def run(cfg: DPSGDMembershipConfig, run) -> dict:
    x_in, y_in, x_out, y_out = _data(cfg)
    n = len(x_in)
    q = cfg.batch_size / n
    steps = max(1, int(round(cfg.epochs / q)))
    mlp = nn.MLP([64, *[int(h) for h in cfg.hidden], 10], activation="tanh")

    def loss_fn(params, x, y):
        return ops.cross_entropy(mlp.apply(params, x), y)

    losses = per_example_loss(mlp.apply)
    logits = engine.jit(lambda p, x: mlp.apply(p, x))
    settings = ([math.inf] if cfg.include_nonprivate else []) + sorted((float(e) for e in cfg.epsilons), reverse=True)
    secure = SecureRandom()
    summary: dict = {"steps": steps, "sample_rate": q}
    table: list[dict] = []
    for k, target in enumerate(settings):
        sigma = 0.0 if math.isinf(target) else noise_multiplier_for_budget(target, cfg.delta, q, steps)
        dp = DPSGD(loss_fn, DPSGDConfig(cfg.clip_norm, sigma, q, insecure_seeded_noise=cfg.insecure_seeded_noise), n)
        opt = optim.sgd(cfg.lr, momentum=cfg.momentum)
        update = engine.jit(lambda g, s, p: opt.update(g, s, p))
        params = mlp.init(cfg.seed)
        state = opt.init(params)
        with run.progress(total=steps, desc=f"dp-sgd eps={target:g}") as bar:
            for step in range(1, steps + 1):
                rng = np.random.default_rng([cfg.seed, k, step]) if cfg.insecure_seeded_noise else secure
                idx = poisson_batch(rng, n, q)
                grads, _private = dp.noisy_gradient(params, x_in[idx], y_in[idx], rng)
                params, state = update(grads, state, params)
                bar.update(1)
        accountant = RDPAccountant()
        accountant.step(sigma, q, steps)
        spent = math.inf if sigma == 0 else accountant.epsilon(cfg.delta)
        attack = loss_threshold_attack(np.asarray(losses(params, x_in, y_in)), np.asarray(losses(params, x_out, y_out)))
        train_acc = float(np.mean(np.argmax(logits(params, x_in), axis=1) == y_in))
        test_acc = float(np.mean(np.argmax(logits(params, x_out), axis=1) == y_out))
        bound = dp_advantage_bound(spent, cfg.delta)
        table.append(dict(epsilon=spent, noise_multiplier=sigma, auc=attack.auc, auc_stderr=attack.auc_stderr,
                          advantage=attack.advantage, advantage_bound=bound, train_accuracy=train_acc,
                          test_accuracy=test_acc))
        run.logger.info("epsilon %g: AUC %.4f +- %.4f, advantage %.4f (bound %.4f), test accuracy %.3f",
                        spent, attack.auc, attack.auc_stderr, attack.advantage, bound, test_acc)
        tag = "nonprivate" if math.isinf(target) else f"eps{target:g}"
        summary.update({f"{tag}_auc": attack.auc, f"{tag}_auc_stderr": attack.auc_stderr, f"{tag}_advantage": attack.advantage,
                        f"{tag}_advantage_bound": bound, f"{tag}_epsilon_spent": spent,
                        f"{tag}_noise_multiplier": sigma, f"{tag}_test_accuracy": test_acc,
                        f"{tag}_train_accuracy": train_acc})
    # one row of lists (a column per quantity, an entry per model), so the generic per-step plots leave it out
    run.log(len(settings), **{key: [row[key] for row in table] for key in table[0]})
    summary["privacy"] = ("void: seeded noise" if cfg.insecure_seeded_noise
                          else "(epsilon, delta)-DP per model, RDP accountant")
    return summary


def plots(rows, cfg, report_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = next((r for r in reversed(rows) if isinstance(r.get("auc"), list)), None)
    if last is None:
        return []
    pts = [{k: last[k][i] for k in ("epsilon", "auc", "auc_stderr", "advantage", "advantage_bound")}
           for i in range(len(last["auc"]))]
    finite = [r for r in pts if math.isfinite(r["epsilon"])]
    inf = [r for r in pts if not math.isfinite(r["epsilon"])]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    xs = [r["epsilon"] for r in finite]
    ax[0].errorbar(xs, [r["auc"] for r in finite], yerr=[r.get("auc_stderr", 0.0) for r in finite], fmt="o-",
                   capsize=3, label="loss-threshold attack AUC (+- 1 s.e.)")
    ax[0].axhline(0.5, color="grey", ls=":", label="chance (0.5)")
    ax[1].plot(xs, [r["advantage"] for r in finite], "o-", label="attack advantage (TPR - FPR)")
    ax[1].plot(xs, [r["advantage_bound"] for r in finite], "s--", color="r",
               label=f"DP bound (e^eps - 1 + 2 delta)/(e^eps + 1), delta={cfg.delta:g}")
    for r in inf:
        ax[0].axhline(r["auc"], color="k", ls="--", lw=1, label=f"no noise (eps = inf): {r['auc']:.3f}")
        ax[1].axhline(r["advantage"], color="k", ls="--", lw=1, label=f"no noise: {r['advantage']:.3f}")
    for a, t in zip(ax, ("membership-inference AUC", "membership advantage vs bound")):
        a.set_xscale("log")
        a.set_xticks(xs)
        a.set_xticklabels([f"{e:.3g}" for e in xs])
        a.minorticks_off()
        a.set_xlabel("DP-SGD epsilon (log scale)")
        a.set_title(t)
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    ax[1].set_ylim(0, 1.02)
    fig.tight_layout()
    path = Path(report_dir) / "membership_vs_epsilon.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


EXPERIMENT = Experiment(config=DPSGDMembershipConfig, run=run, plots=plots)
