"""Experiment kind ``dpsgd_membership``: membership inference against DP-SGD models, per epsilon, over trials.

Each trial splits the digits (stratified, from ``seed`` and the trial number) into disjoint sets of ``members``
examples: the target's members (its training set) and non-members (held out), and an in and an out set for each
of ``shadows`` shadow models. For each target epsilon, the target and every shadow are trained with
:class:`fedarena.privacy.dpsgd.DPSGD` for the same number of epochs, the noise multiplier calibrated by the RDP
accountant so that each training run spends exactly that epsilon at ``delta``; with ``include_nonprivate`` a model
trained by the same code with noise 0 (clipping kept, epsilon infinite) comes first. The small training set and the
long training without weight decay make the noise-free target overfit, as in the membership-inference literature.

Two attacks score every member and non-member of the target:

- ``loss``: Yeom et al.'s loss threshold (:func:`fedarena.privacy.attacks.membership.loss_threshold_attack`);
- ``shadow``: Shokri et al.'s shadow-model attack, per-class attack models trained on the shadows' log-softmax
  vectors (:func:`fedarena.privacy.attacks.membership.train_attack_models`); the shadows are trained at the same
  epsilon as the target (the attacker knows the training procedure).

The summary has, per setting and attack, the AUC and advantage averaged over ``trials`` with their standard error
across trials (std / sqrt(trials)), the (epsilon, delta) bound ``(e^eps - 1 + 2 delta) / (e^eps + 1)`` on any
attack's advantage (:func:`fedarena.privacy.attacks.membership.dp_advantage_bound`), the drop of the AUC from
the noise-free model to the smallest epsilon, and the trend over the DP settings (the least-squares slope of the
AUC on log2 epsilon, i.e. the AUC gained per doubling of epsilon), each with its standard error across trials. Batches and noise come from ``os.urandom``
unless ``insecure_seeded_noise`` (tests) derives them from the seed.
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
from fedarena.privacy.attacks.membership import (ShadowAttackConfig, attack_features, attack_model_scores,
                                                 dp_advantage_bound, loss_threshold_attack, membership_attack,
                                                 per_example_loss, train_attack_models)
from fedarena.privacy.budget import noise_multiplier_for_budget
from fedarena.privacy.dpsgd import DPSGD, DPSGDConfig, SecureRandom, poisson_batch

DIGITS = 1797
ATTACKS = ("loss", "shadow")


@dataclass(frozen=True)
class DPSGDMembershipConfig(ExperimentConfig):
    epsilons: tuple[float, ...] = param((8.0, 4.0, 2.0, 1.0), "target epsilons of the DP-SGD models")
    include_nonprivate: bool = param(True, "also train and attack a model with noise 0 (epsilon infinite)")
    delta: float = param(1e-5, "delta of the (epsilon, delta) guarantee and of the bound")
    members: int = param(100, "training-set size of the target and of each shadow; as many non-members each")
    shadows: int = param(2, "shadow models of the shadow-model attack (0: the loss-threshold attack only)")
    trials: int = param(4, "repetitions with a fresh data split, initialisation and noise; the summary averages them")
    epochs: float = param(150.0, "epochs of DP-SGD for every model (the noise is calibrated to them)")
    batch_size: int = param(25, "expected Poisson batch size")
    clip_norm: float = param(1.0, "per-example gradient L2 clip norm C")
    lr: float = param(0.1, "SGD learning rate")
    momentum: float = param(0.9, "SGD momentum")
    hidden: tuple[int, ...] = param((256,), "hidden layer widths of the tanh MLP")
    attack_steps: int = param(300, "full-batch Adam steps of each per-class attack model")
    insecure_seeded_noise: bool = param(False, "TESTS ONLY: batches and noise from the seed (the epsilons are void)")

    def __post_init__(self) -> None:
        if not self.epsilons and not self.include_nonprivate:
            raise ValueError("epsilons: empty and include_nonprivate is false: nothing to train")
        if any(not (math.isfinite(e) and e > 0) for e in self.epsilons):
            raise ValueError(f"epsilons: must be finite numbers > 0, got {list(self.epsilons)!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta: must lie in (0, 1), got {self.delta!r}")
        if self.shadows < 0 or self.trials < 1:
            raise ValueError(f"shadows, trials: need shadows >= 0 and trials >= 1, got {self.shadows}, {self.trials}")
        if self.members < 20 or 2 * self.members * (self.shadows + 1) > DIGITS:
            raise ValueError(f"members: need >= 20 and 2 * members * (shadows + 1) <= {DIGITS} (disjoint digits "
                             f"sets), got members={self.members}, shadows={self.shadows}")
        if not 1 <= self.batch_size <= self.members:
            raise ValueError(f"batch_size: must lie in [1, members], got {self.batch_size!r}")
        if not self.epochs > 0:
            raise ValueError(f"epochs: must be > 0, got {self.epochs!r}")
        if self.attack_steps < 1:
            raise ValueError(f"attack_steps: must be >= 1, got {self.attack_steps!r}")


def disjoint_splits(y: np.ndarray, size: int, parts: int, seed) -> list[np.ndarray]:
    """``parts`` disjoint index sets of ``size`` examples each, every one stratified by ``y``."""
    from sklearn.model_selection import train_test_split

    base = int(np.random.default_rng(seed).integers(2 ** 31 - parts))
    rest = np.arange(len(y))
    out = []
    for i in range(parts):
        if i == parts - 1 and len(rest) == size:
            out.append(rest)
            break
        take, rest = train_test_split(rest, train_size=size, stratify=y[rest], random_state=base + i)
        out.append(np.sort(take))
    return out


def _tag(target: float) -> str:
    return "nonprivate" if math.isinf(target) else f"eps{target:g}"


def run(cfg: DPSGDMembershipConfig, run) -> dict:
    from sklearn.datasets import load_digits

    x_all, y_all = load_digits(return_X_y=True)
    x_all, y_all = (x_all / 16.0).astype(np.float32), y_all.astype(np.int64)
    n = cfg.members
    q = cfg.batch_size / n
    steps = max(1, int(round(cfg.epochs / q)))
    mlp = nn.MLP([64, *[int(h) for h in cfg.hidden], 10], activation="tanh")

    def loss_fn(params, x, y):
        return ops.cross_entropy(mlp.apply(params, x), y)

    losses = per_example_loss(mlp.apply)
    log_probs = engine.jit(lambda p, x: ops.log_softmax(mlp.apply(p, x), axis=-1))
    settings = ([math.inf] if cfg.include_nonprivate else []) + sorted((float(e) for e in cfg.epsilons), reverse=True)
    sigmas = {t: 0.0 if math.isinf(t) else noise_multiplier_for_budget(t, cfg.delta, q, steps) for t in settings}
    attacks = ATTACKS if cfg.shadows > 0 else ATTACKS[:1]
    shadow_cfg = ShadowAttackConfig(steps=cfg.attack_steps)
    secure = SecureRandom()

    def train(sigma: float, x: np.ndarray, y: np.ndarray, init_seed, noise_seed, bar) -> object:
        dp = DPSGD(loss_fn, DPSGDConfig(cfg.clip_norm, sigma, q, insecure_seeded_noise=cfg.insecure_seeded_noise), n)
        opt = optim.sgd(cfg.lr, momentum=cfg.momentum)
        update = engine.jit(lambda g, s, p: opt.update(g, s, p))
        params = mlp.init(np.random.default_rng(init_seed))
        state = opt.init(params)
        rng = np.random.default_rng(noise_seed) if cfg.insecure_seeded_noise else secure
        for _ in range(steps):
            idx = poisson_batch(rng, n, q)
            grads, _private = dp.noisy_gradient(params, x[idx], y[idx], rng)
            params, state = update(grads, state, params)
            bar.update(1)
        return params

    per_trial: dict = {(t, a, m): [] for t in settings for a in attacks for m in ("auc", "advantage")}
    accuracy: dict = {(t, s): [] for t in settings for s in ("train", "test")}
    total = cfg.trials * len(settings) * (1 + cfg.shadows) * steps
    with run.progress(total=total, desc="dp-sgd target + shadows") as bar:
        for trial in range(cfg.trials):
            parts = disjoint_splits(y_all, n, 2 * (1 + cfg.shadows), [cfg.seed, trial])
            (t_in, t_out), shadow_sets = parts[:2], [parts[2 + 2 * i: 4 + 2 * i] for i in range(cfg.shadows)]
            row: dict = {"trial": trial, "epsilon": []}
            for k, target in enumerate(settings):
                sigma, base = sigmas[target], [cfg.seed, trial, k]
                params = train(sigma, x_all[t_in], y_all[t_in], base + [0], base + [0, 1], bar)
                results = {"loss": loss_threshold_attack(np.asarray(losses(params, x_all[t_in], y_all[t_in])),
                                                         np.asarray(losses(params, x_all[t_out], y_all[t_out])))}
                if cfg.shadows:
                    feats, labels, member = [], [], []
                    for s, (s_in, s_out) in enumerate(shadow_sets, start=1):
                        sp = train(sigma, x_all[s_in], y_all[s_in], base + [s], base + [s, 1], bar)
                        for idx, flag in ((s_in, 1), (s_out, 0)):
                            feats.append(attack_features(log_probs(sp, x_all[idx])))
                            labels.append(y_all[idx])
                            member.append(np.full(len(idx), flag))
                    models = train_attack_models(np.concatenate(feats), np.concatenate(labels), np.concatenate(member),
                                                 10, shadow_cfg, seed=cfg.seed + trial)
                    score = {name: attack_model_scores(models, attack_features(log_probs(params, x_all[idx])),
                                                       y_all[idx], shadow_cfg.hidden)
                             for name, idx in (("in", t_in), ("out", t_out))}
                    results["shadow"] = membership_attack(score["in"], score["out"])
                preds = {name: np.argmax(np.asarray(log_probs(params, x_all[idx])), axis=1) == y_all[idx]
                         for name, idx in (("train", t_in), ("test", t_out))}
                for s, ok in preds.items():
                    accuracy[(target, s)].append(float(np.mean(ok)))
                for a, r in results.items():
                    per_trial[(target, a, "auc")].append(r.auc)
                    per_trial[(target, a, "advantage")].append(r.advantage)
                    row.setdefault(f"{a}_auc", []).append(r.auc)
                    row.setdefault(f"{a}_advantage", []).append(r.advantage)
                row["epsilon"].append(target)
                run.logger.info("trial %d, epsilon %g (sigma %.3g): %s; test accuracy %.3f", trial, target, sigma,
                                ", ".join(f"{a} AUC {r.auc:.3f} adv {r.advantage:.3f}" for a, r in results.items()),
                                accuracy[(target, "test")][-1])
            run.log(trial, **row)

    def mean_se(v: list[float]) -> tuple[float, float]:
        v = np.asarray(v, float)
        return float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")

    summary: dict = {"steps": steps, "sample_rate": q, "trials": cfg.trials, "members": n, "shadows": cfg.shadows}
    table: dict = {"epsilon": [], "noise_multiplier": [], "advantage_bound": [], "train_accuracy": [],
                   "test_accuracy": []}
    for target in settings:
        tag, sigma = _tag(target), sigmas[target]
        if sigma == 0:
            spent = math.inf
        else:
            accountant = RDPAccountant()
            accountant.step(sigma, q, steps)
            spent = accountant.epsilon(cfg.delta)
        bound = dp_advantage_bound(spent, cfg.delta)
        summary.update({f"{tag}_epsilon_spent": spent, f"{tag}_noise_multiplier": sigma,
                        f"{tag}_advantage_bound": bound,
                        f"{tag}_train_accuracy": mean_se(accuracy[(target, "train")])[0],
                        f"{tag}_test_accuracy": mean_se(accuracy[(target, "test")])[0]})
        for key, val in (("epsilon", spent), ("noise_multiplier", sigma), ("advantage_bound", bound),
                         ("train_accuracy", summary[f"{tag}_train_accuracy"]),
                         ("test_accuracy", summary[f"{tag}_test_accuracy"])):
            table[key].append(val)
        for a in attacks:
            for m in ("auc", "advantage"):
                mu, se = mean_se(per_trial[(target, a, m)])
                summary[f"{tag}_{a}_{m}"], summary[f"{tag}_{a}_{m}_stderr"] = mu, se
                table.setdefault(f"{a}_{m}", []).append(mu)
                table.setdefault(f"{a}_{m}_stderr", []).append(se)
    if cfg.include_nonprivate and cfg.epsilons:
        low = min(settings)
        for a in attacks:
            drop = np.subtract(per_trial[(math.inf, a, "auc")], per_trial[(low, a, "auc")])
            summary[f"{a}_auc_drop_nonprivate_to_eps{low:g}"], summary[f"{a}_auc_drop_stderr"] = mean_se(list(drop))
    finite = [t for t in settings if math.isfinite(t)]
    if len(finite) >= 2:  # the trend over the DP settings: least-squares slope of AUC on log2(epsilon), per trial
        x = np.log2(finite)
        for a in attacks:
            aucs = np.array([per_trial[(t, a, "auc")] for t in finite])  # (settings, trials)
            slopes = [float(np.polyfit(x, aucs[:, i], 1)[0]) for i in range(cfg.trials)]
            summary[f"{a}_auc_slope_per_doubling"], summary[f"{a}_auc_slope_stderr"] = mean_se(slopes)
    # one row of lists (a column per quantity, an entry per setting), so the generic per-step plots leave it out
    run.log(cfg.trials, summary_table=True, **table)
    summary["privacy"] = ("void: seeded noise" if cfg.insecure_seeded_noise
                          else "(epsilon, delta)-DP per model, RDP accountant")
    return summary


def plots(rows, cfg, report_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = next((r for r in reversed(rows) if r.get("summary_table")), None)
    if last is None:
        return []
    attacks = [a for a in ATTACKS if f"{a}_auc" in last]
    eps = last["epsilon"]
    finite = [i for i, e in enumerate(eps) if math.isfinite(e)]
    inf = [i for i, e in enumerate(eps) if not math.isfinite(e)]
    xs = [eps[i] for i in finite]
    names = {"loss": "loss threshold (Yeom)", "shadow": f"shadow models (Shokri), k={cfg.shadows}"}
    colors = {"loss": "C0", "shadow": "C2"}
    fig, ax = plt.subplots(1, 2, figsize=(11.5, 4.3))
    for a in attacks:
        for j, metric in enumerate(("auc", "advantage")):
            mu, se = last[f"{a}_{metric}"], last[f"{a}_{metric}_stderr"]
            ax[j].errorbar(xs, [mu[i] for i in finite], yerr=[se[i] for i in finite], fmt="o-", capsize=3,
                           color=colors[a], label=f"{names[a]} (+- 1 s.e.)")
            for i in inf:
                ax[j].axhline(mu[i], color=colors[a], ls="--", lw=1, label=f"{a}, no noise: {mu[i]:.3f}")
                ax[j].axhspan(mu[i] - se[i], mu[i] + se[i], color=colors[a], alpha=0.12)
    ax[0].axhline(0.5, color="grey", ls=":", label="chance (0.5)")
    ax[1].plot(xs, [last["advantage_bound"][i] for i in finite], "s--", color="r",
               label=f"DP bound (e^eps - 1 + 2 delta)/(e^eps + 1), delta={cfg.delta:g}")
    titles = (f"membership-inference AUC, mean of {cfg.trials} trials", "membership advantage vs the DP bound")
    for a, t in zip(ax, titles):
        a.set_xscale("log")
        a.set_xticks(xs)
        a.set_xticklabels([f"{eps[i]:.3g}\ntest acc {last['test_accuracy'][i]:.2f}" for i in finite], fontsize=8)
        a.minorticks_off()
        acc = "".join(f", test acc {last['test_accuracy'][i]:.2f}" for i in inf)
        a.set_xlabel(f"DP-SGD epsilon (log scale); dashed: no noise{acc}")
        a.set_title(t, fontsize=10)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    ax[1].set_ylim(0, 1.02)
    fig.tight_layout()
    path = Path(report_dir) / "membership_vs_epsilon.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


EXPERIMENT = Experiment(config=DPSGDMembershipConfig, run=run, plots=plots, resumable=False)
