"""Robustness of aggregation rules and defences against the built-in attacks (issue 36, deliverable 3).

Setting (issue 36's acceptance): scikit-learn digits over 100 clients with Dirichlet(0.5) label skew (the default
split of ``experiments/fedsim_digits.yaml``; ``--partition iid`` for the sign-flip section's IID split),
20 clients per round, 200 rounds, MLP 64-32-10, FedAvg's local training (E = 1, B = 10, lr 0.1), 20 attackers (20 %) drawn per seed; the robust rules assume f = 4 per round. Attack
parameters: ALIE's z from Baruch et al.'s z_max formula, IPM's epsilon 0.5 (its small-epsilon regime; ``--epsilon``),
scaling and sign flip by 4. The server's FLTrust root set is 100 examples of the global test split, removed from the test set
of every cell so all cells are scored on the same examples. For each attack x defence x seed the test accuracy
after the final round (``test_acc``) and after each of the last ``--last`` rounds (``test_acc_last``, default 10)
are recorded; the table prints the accuracy drop against clean FedAvg of the same seed (mean and standard
deviation over seeds) and, for the backdoor, the attack success rate (triggered non-target test examples
classified as the target). ``--metric final`` (the default) reads the final accuracy; ``--metric last`` reads,
for every cell alike, the mean of the last rounds' accuracies, which averages out the round-to-round wobble of a
259-image test set (one image is 0.39 points).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/fedsim_robustness.py                 # the whole grid
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/fedsim_robustness.py --subset acceptance --out acc.jsonl
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/fedsim_robustness.py --subset rest --out rest.jsonl
    python benchmarks/fedsim_robustness.py --results acc.jsonl rest.jsonl     # the table of both
    python benchmarks/fedsim_robustness.py --seeds 100 --attacks alie ipm --defences cc_bucketing --tau 0.5
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/fedsim_robustness.py --defences fedavg cc_bucketing_momentum
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/fedsim_robustness.py --defences fedavg cc_bucketing --weighted \
        --out w.jsonl && python benchmarks/fedsim_robustness.py --results w.jsonl --metric last

``--weighted``: CC + bucketing with ``strategy.defence.weighted`` (bucket means and the clipped steps weighed by
FedAvg's example counts). ``--tau-quantile q``: the radius is the round's q-quantile of the bucket means' distances
from the centre; ``--center-momentum beta``: the centre is the server's momentum of the aggregates (rule and
wrapper parameters of :mod:`fedarena.federated.rules` / :class:`~fedarena.federated.defences.Defended`, not
config fields). ``--clip-stats``: each CC + bucketing cell also records, per quarter / quarter / half of the
rounds, how often honest-only and attacker-holding bucket means lie beyond the radius and the attackers' and the
median honest update's distances from the centre (:class:`ClipProbe`).

``cc_bucketing_momentum`` (off the grid): CC + bucketing over per-client momenta kept by the server
(:class:`ClientMomentum`, ``--beta``), the worker momentum Karimireddy et al. pair centered clipping with.

``--subset acceptance``: every defence against ALIE and IPM, and centered clipping with bucketing and FedAvg
against every attack. The acceptance checks printed at the end: some defence within 3 points of clean FedAvg
against each of ALIE and IPM, and CC + bucketing losing less than FedAvg against every attack run, with the
two rules' accuracy difference paired by seed (mean and standard error) to tell a loss from a tie.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedarena.federated import data, rules  # noqa: E402
from fedarena.federated.attacks import AttackConfig, Backdoor, attack_success_rate  # noqa: E402
from fedarena.federated.defences import DefenceConfig, RootSet  # noqa: E402
from fedarena.federated.simulation import BatchedMLP, Simulation  # noqa: E402
from fedarena.federated.strategy import FedAvg, FitConfig, RobustAggregate  # noqa: E402
from fedarena.federated.wrappers import StrategyWrapper  # noqa: E402

ATTACKS = ["none", "sign_flip", "scale", "alie", "ipm", "min_max", "min_sum", "label_flip", "backdoor"]
DEFENCES = ["fedavg", "median", "trimmed_mean", "krum", "multi_krum", "geometric_median", "cc_bucketing",
            "norm_bound", "fltrust"]
VARIANTS = ["cc_bucketing_momentum"]  # run only when named with --defences; not part of the grid
NUM_CLIENTS, PER_ROUND, ATTACKERS, ROOT = 100, 20, 20, 100
F_ROUND = PER_ROUND * ATTACKERS // NUM_CLIENTS  # the rules' assumed Byzantine count per round (4)


@dataclass
class ClientMomentum(StrategyWrapper):
    """Worker momentum (Karimireddy, He & Jaggi, ICML 2021) in a round where clients keep no state: the server keeps
    client ``i``'s momentum ``m_i <- beta m_i + (1 - beta) Delta_i`` across its participations (``m_i = Delta_i`` at
    the first) and hands the momenta to ``inner`` as the round's updates. Placed outside :class:`Attacked`, so the
    coalition sees the honest momenta and uploads its own in place of its members' (the paper's threat model)."""

    inner: Any
    beta: float = 0.9
    momenta: dict[str, dict] = field(default_factory=dict, init=False)

    @property
    def linear(self) -> bool:
        return False

    def init_state(self, params):
        self.momenta = {}
        return self.inner.init_state(params)

    def aggregate(self, state, updates, num_clients):
        out = []
        for u in updates:
            m = self.momenta.get(u.client_id)
            m = dict(u.delta) if m is None else {k: self.beta * m[k] + (1 - self.beta) * np.asarray(u.delta[k])
                                                 for k in u.delta}
            self.momenta[u.client_id] = m
            out.append(replace(u, delta=m))
        return self.inner.aggregate(state, out, num_clients)


@dataclass
class ClipProbe(StrategyWrapper):
    """Measures, around a :class:`~fedarena.federated.defences.Defended` CC + bucketing (``inner``; placed inside
    the attack, so it sees the coalition's uploads), how often the bucket means holding only honest updates and
    those holding an attacker lie beyond the fixed radius ``tau`` from the centre, and the distances of the first
    attacker's upload (the coalition uploads one vector under ALIE, IPM, min-max and min-sum) and of the median
    honest update from the centre, per round (``rows``). It recomputes the buckets from the same permutation
    ``(seed, round)``; it does not change the aggregate."""

    inner: Any
    attacker_ids: frozenset = frozenset()
    rows: list = field(default_factory=list, init=False)

    @property
    def linear(self) -> bool:
        return False

    def aggregate(self, state, updates, num_clients):
        d = self.inner
        ordered = sorted(updates, key=lambda u: u.client_id)
        names = sorted(state.params)
        x = np.stack([np.concatenate([np.asarray(u.delta[k], np.float64).ravel() for k in names]) for u in ordered])
        w = np.array([d.inner.weight(u.num_examples) for u in ordered], np.float64)
        bad = np.array([u.client_id in self.attacker_ids for u in ordered])
        center = d.previous if d.previous is not None else np.zeros(x.shape[1])
        means, groups = rules.bucket_means(x, w, d.params["bucket_size"], [d.seed, state.round],
                                           bool(d.params.get("weighted")))
        far = np.linalg.norm(means - center, axis=1) > d.params["rule_params"]["tau"]
        held = np.array([bad[g].any() for g in groups])
        self.rows.append({"round": state.round,
                          "honest_clipped": float(far[~held].mean()) if (~held).any() else float("nan"),
                          "attacked_clipped": float(far[held].mean()) if held.any() else float("nan"),
                          "attacker_distance": float(np.linalg.norm(x[bad][0] - center)) if bad.any() else float("nan"),
                          "honest_distance": float(np.median(np.linalg.norm(x[~bad] - center, axis=1)))})
        return d.aggregate(state, updates, num_clients)

    def summary(self, windows: list[tuple[int, int]]) -> list[dict]:
        out = []
        for lo, hi in windows:
            rs = [r for r in self.rows if lo <= r["round"] <= hi]
            keys = [k for k in rs[0] if k != "round"]
            out.append({"rounds": [lo, hi], **{k: float(np.nanmean([r[k] for r in rs])) for k in keys}})
        return out


def defended(name: str, fit: FitConfig, root: RootSet, seed: int, tau: float, bucket: int, iterations: int,
             tau_quantile: float = 0.0, center_momentum: float = 0.0, weighted: bool = False):
    base = dict(fit=fit, clients_per_round=PER_ROUND)
    if name == "fedavg":
        return FedAvg(**base)
    if name in ("median", "trimmed_mean", "geometric_median"):
        return RobustAggregate(**base, rule=name, trim_fraction=0.2)
    if name == "krum":
        return RobustAggregate(**base, rule="krum", num_byzantine=F_ROUND)
    if name == "multi_krum":
        return RobustAggregate(**base, rule="krum", num_byzantine=F_ROUND, krum_keep=PER_ROUND - F_ROUND)
    if name in ("cc_bucketing", "cc_bucketing_momentum"):
        d = DefenceConfig("bucketing", tau=tau, iterations=iterations, bucket_size=bucket,
                          weighted=weighted).build(FedAvg(**base), seed=seed)
        d.params["rule_params"]["tau_quantile"] = tau_quantile
        d.center_momentum = center_momentum
        return d
    if name == "norm_bound":
        return DefenceConfig("norm_bound").build(FedAvg(**base), seed=seed)
    if name == "fltrust":
        return DefenceConfig("fltrust", root_size=len(root.y)).build(FedAvg(**base), root=root, seed=seed)
    raise ValueError(f"defence: unknown '{name}'")


def run_cell(attack: str, defence: str, seed: int, rounds: int, tau: float, bucket: int, beta: float = 0.9,
             partition: str = "dirichlet", alpha: float = 0.5, iterations: int = DefenceConfig.iterations,
             tau_quantile: float = 0.0, center_momentum: float = 0.0, last: int = 10, weighted: bool = False,
             clip_stats: bool = False, **attack_params) -> dict:
    d = data.load(data.DataSpec("digits", partition=data.PartitionSpec(partition, NUM_CLIENTS, alpha=alpha),
                                test_fraction=0.2, held_out_fraction=0.0), seed)
    test = np.asarray(d.test)
    pick = np.random.default_rng([seed, 31]).permutation(len(test))
    root_idx, test_idx = test[pick[:ROOT]], test[pick[ROOT:]]
    ids = [f"c{i}" for i in range(d.num_clients)]
    model = BatchedMLP((d.num_features, 32, d.num_classes))
    fit = FitConfig(1, 10, 0.1)
    root = RootSet(model, d.x[root_idx], d.y[root_idx], d.num_classes, seed)
    plan = AttackConfig(attack, 0 if attack == "none" else ATTACKERS, **attack_params).build(ids, d.num_classes, seed)
    x, y, train = plan.data(d.x, d.y, d.train, ids)
    inner = defended(defence, fit, root, seed, tau, bucket, iterations, tau_quantile, center_momentum, weighted)
    probe = ClipProbe(inner, plan.attacker_ids) if clip_stats and defence == "cc_bucketing" else None
    strategy = plan.strategy(probe or inner)
    if defence == "cc_bucketing_momentum":
        strategy = ClientMomentum(strategy, beta)
    sim = Simulation(model, strategy, x, y, train, ids, d.num_classes, seed=seed,
                     test=(d.x[test_idx], d.y[test_idx]), eval_clients=False, eval_every=rounds)
    lasts: list[float] = []
    done = [0]

    def on_round(st, rec):  # the test accuracy after each of the last ``last`` rounds
        done[0] += 1
        if done[0] > rounds - last:
            m = rec.metrics if "test_acc" in rec.metrics else sim.evaluate(st, rec.round)
            lasts.append(float(m["test_acc"]))

    t0 = time.perf_counter()
    state, records = sim.run(rounds, on_round=on_round)
    out = {"attack": attack, "defence": defence, "seed": seed, "test_acc": records[-1].metrics["test_acc"],
           "test_acc_last": lasts,
           "seconds": time.perf_counter() - t0, "attack_params": attack_params, "tau": tau, "bucket": bucket,
           "iterations": iterations, "tau_quantile": tau_quantile, "center_momentum": center_momentum,
           "weighted": weighted,
           "partition": partition if partition == "iid" else f"{partition}({alpha})"}
    if defence == "cc_bucketing_momentum":
        out["beta"] = beta
    if probe is not None:
        out["clip_stats"] = probe.summary([(1, rounds // 4), (rounds // 4 + 1, rounds // 2), (rounds // 2 + 1, rounds)])
    if attack == "backdoor" or attack == "none":
        out["backdoor_success"] = attack_success_rate(lambda v: model.logits(state.params, v), d.x[test_idx],
                                                      d.y[test_idx], Backdoor())
    return out


def cells(subset: str, attacks: list[str] | None, defences: list[str] | None) -> list[tuple[str, str]]:
    if attacks or defences:
        return [(a, x) for a in (attacks or ATTACKS) for x in (defences or DEFENCES)]
    grid = [(a, x) for a in ATTACKS for x in DEFENCES]
    if subset == "all":
        return grid
    acc = [("none", "fedavg")] + [(a, x) for a in ("alie", "ipm") for x in DEFENCES]
    acc += [(a, x) for a in ATTACKS if a not in ("alie", "ipm") for x in ("fedavg", "cc_bucketing")]
    acc = list(dict.fromkeys(acc))
    return acc if subset == "acceptance" else [("none", "fedavg")] + [c for c in grid if c not in acc]


METRIC = ["final"]  # the accuracy the table reads: "final" or "last" (mean of the last rounds' test accuracies)


def score(r: dict) -> float:
    """A cell's accuracy: the final test accuracy, or the mean test accuracy of its last rounds."""
    if METRIC[0] == "final":
        return float(r["test_acc"])
    if not r.get("test_acc_last"):
        print(f"--metric: last needs each cell's test_acc_last; cell {r['attack']} x {r['defence']} seed "
              f"{r['seed']} has none (written by an older version): use --metric final", file=sys.stderr)
        sys.exit(2)
    return float(np.mean(r["test_acc_last"]))


def table(results: list[dict]) -> str:
    clean = {r["seed"]: score(r) for r in results if r["attack"] == "none" and r["defence"] == "fedavg"}
    attacks = [a for a in ATTACKS if any(r["attack"] == a for r in results)]
    defences = [x for x in DEFENCES + VARIANTS if any(r["defence"] == x for r in results)]
    splits = ", ".join(sorted({r.get("partition", "iid") for r in results}))
    metric = "final test accuracy" if METRIC[0] == "final" else "mean test accuracy of the last rounds"
    lines = [f"split {splits}; {metric}; accuracy drop vs clean FedAvg, points (mean +- std over seeds); backdoor: "
             "drop / success rate %",
             "| attack | " + " | ".join(defences) + " |", "|---" * (len(defences) + 1) + "|"]
    for a in attacks:
        row = []
        for x in defences:
            rs = [r for r in results if r["attack"] == a and r["defence"] == x and r["seed"] in clean]
            if not rs:
                row.append("")
                continue
            drop = np.array([100 * (clean[r["seed"]] - score(r)) for r in rs])
            cell = f"{drop.mean():.1f} +- {drop.std():.1f}"
            if a == "backdoor":
                cell += f" / {100 * np.mean([r['backdoor_success'] for r in rs]):.0f}%"
            row.append(cell)
        lines.append(f"| {a} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def acceptance(results: list[dict]) -> list[str]:
    clean = {r["seed"]: score(r) for r in results if r["attack"] == "none" and r["defence"] == "fedavg"}

    def drop(a, x):
        rs = [r for r in results if r["attack"] == a and r["defence"] == x and r["seed"] in clean]
        return float(np.mean([100 * (clean[r["seed"]] - score(r)) for r in rs])) if rs else None

    out = []
    for a in ("alie", "ipm"):
        ds = {x: drop(a, x) for x in DEFENCES if x != "fedavg" and drop(a, x) is not None}
        if ds:
            best = min(ds, key=ds.get)
            out.append(f"{a}: best defence {best} drops {ds[best]:.2f} points -> "
                       f"{'PASS' if ds[best] <= 3.0 else 'FAIL'} (<= 3)")
    for a in ATTACKS:
        if a == "none":
            continue
        cc, fa = drop(a, "cc_bucketing"), drop(a, "fedavg")
        if cc is not None and fa is not None:
            out.append(f"{a}: cc_bucketing {cc:.2f} vs fedavg {fa:.2f} -> {'PASS' if cc < fa else 'FAIL'}"
                       + paired(results, a))
    return out


def paired(results: list[dict], attack: str) -> str:
    """CC + bucketing's accuracy minus FedAvg's under ``attack``, paired by seed: mean +- standard error, points."""
    acc = {(r["defence"], r["seed"]): score(r) for r in results if r["attack"] == attack}
    diff = np.array([100 * (acc["cc_bucketing", s] - acc["fedavg", s]) for d, s in acc
                     if d == "fedavg" and ("cc_bucketing", s) in acc])
    if len(diff) < 2:
        return ""
    return (f" (paired accuracy difference {diff.mean():+.2f} +- {diff.std(ddof=1) / np.sqrt(len(diff)):.2f} "
            f"s.e. over {len(diff)} seeds)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subset", choices=["all", "acceptance", "rest"], default="all",
                   help="rest: the grid's cells not in the acceptance subset")
    p.add_argument("--results", nargs="*", default=[],
                   help="print the table of these JSON-lines files (from --out) instead of running")
    p.add_argument("--attacks", nargs="*", choices=ATTACKS)
    p.add_argument("--defences", nargs="*", choices=DEFENCES + VARIANTS,
                   help="cc_bucketing_momentum: CC + bucketing over per-client momenta (ClientMomentum, --beta)")
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--tau", type=float, default=DefenceConfig.tau, help="centered clipping's radius")
    p.add_argument("--iterations", type=int, default=DefenceConfig.iterations,
                   help="centered clipping's iterations per round")
    p.add_argument("--tau-quantile", type=float, default=0.0,
                   help="centered clipping's radius as this quantile of the distances from the centre (0 = --tau)")
    p.add_argument("--center-momentum", type=float, default=0.0,
                   help="centered clipping's centre: the server's momentum of the aggregates (0 = the previous one)")
    p.add_argument("--weighted", action="store_true",
                   help="CC + bucketing weighs updates by the strategy's client weights (FedAvg's example counts)")
    p.add_argument("--clip-stats", action="store_true",
                   help="record how often CC + bucketing clips honest-only and attacker-holding buckets (ClipProbe)")
    p.add_argument("--last", type=int, default=10,
                   help="the metric averages the test accuracy of this many last rounds")
    p.add_argument("--bucket", type=int, default=DefenceConfig.bucket_size, help="bucketing's s")
    p.add_argument("--epsilon", type=float, default=AttackConfig.epsilon, help="IPM's epsilon")
    p.add_argument("--z", type=float, default=AttackConfig.z, help="ALIE's z (0 = Baruch et al.'s z_max)")
    p.add_argument("--scale", type=float, default=AttackConfig.scale, help="sign flip's and scaling's factor")
    p.add_argument("--beta", type=float, default=0.9, help="cc_bucketing_momentum's momentum (the paper's 0.9)")
    p.add_argument("--partition", choices=["iid", "dirichlet"], default="dirichlet",
                   help="the clients' split: Dirichlet label skew (alpha: --alpha) or IID")
    p.add_argument("--alpha", type=float, default=0.5, help="the Dirichlet label skew's concentration")
    p.add_argument("--out", default="", help="also write every cell's result as JSON lines here")
    p.add_argument("--metric", choices=["final", "last"], default="final",
                   help="the table's accuracy: mean test accuracy of the last --last rounds, or the final round's")
    a = p.parse_args()
    METRIC[0] = a.metric
    if a.clip_stats and a.tau_quantile > 0:
        print("--clip-stats: measures the fixed radius --tau; not with --tau-quantile", file=sys.stderr)
        sys.exit(2)
    if not 1 <= a.last <= a.rounds:
        print(f"--last: must lie in [1, --rounds = {a.rounds}], got {a.last}", file=sys.stderr)
        sys.exit(2)
    if a.results:
        results = [json.loads(line) for f in a.results for line in open(f) if line.strip()]
        results = list({(r["attack"], r["defence"], r["seed"]): r for r in results}.values())
        print(table(results))
        print()
        print("\n".join(acceptance(results)))
        return
    todo = cells(a.subset, a.attacks, a.defences)
    if ("none", "fedavg") not in todo:
        todo.insert(0, ("none", "fedavg"))
    results = []
    t0 = time.perf_counter()
    for seed in a.seeds:
        for atk, dfn in todo:
            r = run_cell(atk, dfn, seed, a.rounds, a.tau, a.bucket, a.beta, a.partition, a.alpha, a.iterations,
                         a.tau_quantile, a.center_momentum, a.last, a.weighted, a.clip_stats,
                         epsilon=a.epsilon, z=a.z, scale=a.scale)
            results.append(r)
            print(json.dumps(r), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
    print(f"\n{len(results)} runs, {time.perf_counter() - t0:.0f} s; seeds {a.seeds}, {a.rounds} rounds, "
          f"tau {a.tau}, bucket size {a.bucket}, ipm epsilon {a.epsilon}, alie z {a.z or 'z_max'}, scale {a.scale}\n")
    print(table(results))
    print()
    print("\n".join(acceptance(results)))


if __name__ == "__main__":
    main()
