"""Acceptance runs of the federated simulation (issue 15) that are too long for the unit tests.

* ``compression``: digits IID, 100 clients, all of them a round and 10 of them a round, MLP 64-32-10,
  FedAvg E = 1, B = 10, lr 0.1, 200 rounds; dense vs 8-bit quantization both ways vs top-1 % uploads with
  error feedback, without and with the ``trajectory`` prediction (the update's difference to the mean global
  step since the client's last upload is what gets compressed; see fedarena.federated.compression): exact
  bytes each way (rounds 2..R on both sides; round 1's broadcast is the seed-derived initial model) and
  test accuracy after 50 and 200 rounds.
* ``robust``: the same task with 20 % sign-flipping clients (``-4 Delta``), 20 clients per round,
  200 rounds: FedAvg, median, trimmed mean (30 % each end), Krum (f = 6), multi-Krum (f = 6, m = 14), the
  geometric median (RFA) and median / trimmed mean (20 %) after Krum preselection of the 14 most central
  updates (Bulyan's selection stage), clean and attacked.
* ``secagg``: one SecAgg+ round of 1,000 clients (digits-MLP-sized input, 2,411 values) with 10 %
  dropouts before the masked input, through the real protocol objects; checks the sum is exact and
  prints the time.

* ``robust-error``: why the coordinate-wise rules lose points (see :func:`robust_error`).

    python benchmarks/fedsim_acceptance.py compression|robust|robust-error|secagg [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from fedarena.federated import compression as cz
from fedarena.federated import data as fd
from fedarena.federated import simulation as sim
from fedarena.federated import strategy as st

SIZES = (64, 32, 10)


def _digits_sim(seed, strategy, **kw):
    d = fd.load(fd.DataSpec("digits", partition=fd.PartitionSpec("iid", 100), held_out_fraction=0.0), seed)
    s = sim.Simulation(sim.BatchedMLP(SIZES), strategy, d.x, d.y, d.train, [f"c{i}" for i in range(100)],
                       d.num_classes, seed=seed, test=d.test_set(), eval_every=1000, **kw)
    return s


def _run(s, rounds=50):
    state, recs = s.run(rounds)
    up = sum(r.metrics["bytes_up"] for r in recs[1:])
    down = sum(r.metrics["bytes_down"] for r in recs[1:])
    return recs[-1].metrics["test_acc"], up, down


def compression(seeds) -> None:
    def variants(seed):  # fresh codec state (error-feedback residuals, broadcast reference) per run
        return {
            "dense": {},
            "8-bit both ways": dict(upload=cz.UploadCompression(cz.Codec("quantize", 8)),
                                    download=cz.Broadcast(cz.Codec("quantize", 8), seed=seed)),
            "top-1% uploads + EF": dict(upload=cz.UploadCompression(cz.Codec("topk", fraction=0.01),
                                                                    error_feedback=True)),
            "top-1% + EF + trajectory": dict(upload=cz.UploadCompression(cz.Codec("topk", fraction=0.01),
                                                                         error_feedback=True,
                                                                         prediction="trajectory")),
        }

    for per_round in (100, 10):
        fedavg = st.FedAvg(st.FitConfig(1, 10, 0.1), clients_per_round=per_round)
        for seed in seeds:
            base = None
            for name, kw in variants(seed).items():
                s = _digits_sim(seed, fedavg, **kw)
                s.eval_every = 50
                _, recs = s.run(200)
                acc50, acc = recs[49].metrics["test_acc"], recs[-1].metrics["test_acc"]
                up = sum(r.metrics["bytes_up"] for r in recs[1:])
                down = sum(r.metrics["bytes_down"] for r in recs[1:])
                if base is None:
                    base = (acc50, acc, up, down)
                print(f"{per_round:3d}/100 a round, seed {seed} {name:25s} acc@50 {acc50:.4f} "
                      f"({(acc50 - base[0]) * 100:+6.2f} pts)  acc@200 {acc:.4f} ({(acc - base[1]) * 100:+6.2f} pts)  "
                      f"up {up:9d} B ({base[2] / up:6.2f}x)  down {down:9d} B ({base[3] / down:6.2f}x)", flush=True)


def robust(seeds) -> None:
    het = sim.Heterogeneity(adversary_fraction=0.2, adversary="sign_flip", adversary_scale=4.0)
    fit = st.FitConfig(1, 10, 0.1)
    ra = lambda **kw: st.RobustAggregate(fit, clients_per_round=20, **kw)  # noqa: E731
    rules = {"fedavg": st.FedAvg(fit, clients_per_round=20),
             "median": ra(rule="median"),
             "trimmed_mean 0.3": ra(rule="trimmed_mean", trim_fraction=0.3),
             "krum f=6": ra(rule="krum", num_byzantine=6),
             "multi-krum f=6 m=14": ra(rule="krum", num_byzantine=6, krum_keep=14),
             "geometric_median": ra(rule="geometric_median"),
             "krum-presel. median": ra(rule="median", num_byzantine=6, krum_preselect=True),
             "krum-presel. trim 0.2": ra(rule="trimmed_mean", trim_fraction=0.2, num_byzantine=6,
                                         krum_preselect=True)}
    for seed in seeds:
        clean_fedavg = None
        for name, strat in rules.items():
            clean = _run(_digits_sim(seed, strat), rounds=200)[0]
            attacked = _run(_digits_sim(seed, strat, heterogeneity=het), rounds=200)[0]
            clean_fedavg = clean if clean_fedavg is None else clean_fedavg
            print(f"seed {seed} {name:22s} clean {clean:.4f}  20% sign flip {attacked:.4f}  "
                  f"(vs own clean {(attacked - clean) * 100:+.2f} pts, vs clean FedAvg "
                  f"{(attacked - clean_fedavg) * 100:+.2f} pts)", flush=True)


def robust_error(seeds) -> None:
    """Why the coordinate-wise rules lose points: one round's aggregation error against the honest mean.

    After 50 clean FedAvg rounds (20 a round), 20 rounds of 20 fresh client updates each (E = 1, B = 10)
    are aggregated with 4 of the 20 sign-flipped (-4 Delta); per rule: ||agg - mean_honest|| / ||mean_honest||
    and the projection of the error on the honest mean (negative: the rule shrinks the step), attacked and
    with the 16 honest updates alone; and the median over coordinates of the honest updates' std / |mean|."""
    ra = lambda **kw: st.RobustAggregate(st.FitConfig(1, 10, 0.1), **kw)  # noqa: E731
    rules = {"median": ra(rule="median"), "trimmed_mean 0.3": ra(rule="trimmed_mean", trim_fraction=0.3),
             "krum f=6": ra(rule="krum", num_byzantine=6),
             "multi-krum f=6 m=14": ra(rule="krum", num_byzantine=6, krum_keep=14),
             "geometric_median": ra(rule="geometric_median"),
             "krum-presel. median": ra(rule="median", num_byzantine=6, krum_preselect=True)}
    for seed in seeds:
        s = _digits_sim(seed, st.FedAvg(st.FitConfig(1, 10, 0.1), clients_per_round=20))
        state, _ = s.run(50)
        errs: dict[str, list] = {k: [] for k in rules}
        snr = []
        for r in range(20):
            ids = st.select_clients(s.client_ids, 20, seed + 100, r)
            _, deltas, _, _ = s._train(state.params, ids, 1000 + r, st.FitConfig(1, 10, 0.1), None)
            x = np.stack([np.concatenate([deltas[c][k].ravel() for k in sorted(deltas[c])]) for c in ids])
            honest, attacked = x[:16].astype(np.float64), np.concatenate([x[:16], -4.0 * x[16:]]).astype(np.float64)
            mu = honest.mean(0)
            nm = np.linalg.norm(mu)
            snr.append(np.median(honest.std(0) / np.maximum(np.abs(mu), 1e-12)))
            for name, rule in rules.items():
                e_att, e_clean = rule.robust_delta(attacked) - mu, rule.robust_delta(honest) - mu
                errs[name].append((np.linalg.norm(e_att) / nm, e_att @ mu / nm ** 2, np.linalg.norm(e_clean) / nm))
        print(f"seed {seed}: honest updates' per-coordinate std/|mean| (median over coordinates) {np.mean(snr):.2f}")
        for name, v in errs.items():
            v = np.asarray(v)
            print(f"  {name:22s} 4 of 20 flipped: error {v[:, 0].mean():.3f} of the honest mean, along it "
                  f"{v[:, 1].mean():+.3f}; honest only: error {v[:, 2].mean():.3f}", flush=True)


def secagg(seeds) -> None:
    from fedarena.federated.stages import SecureAggregation
    from fedarena.privacy.secagg.quantization import quantize

    n, d = 1000, 2411
    for seed in seeds:
        rng = np.random.default_rng(seed)
        inputs = {u: rng.uniform(-0.01, 0.01, d) for u in range(1, n + 1)}
        stage = SecureAggregation(None, neighbours=14, threshold=0.5, clip=1.0, dropout=0.1,
                                  seed=seed)
        t0 = time.perf_counter()
        rep = stage.secure_sum(inputs, round_id=1)
        dt = time.perf_counter() - t0
        surv = rep.result.survivors
        scale = stage.secagg_config(n, d).scale  # the runtime's fixed point (scale rounded to a multiple of W)
        want = np.zeros(d, np.uint64)
        for u in surv:
            want = (want + quantize(inputs[u], 1.0, scale, 32).astype(np.uint64)) % 2 ** 32
        exact = np.array_equal(want.astype(np.uint32), rep.result.total)
        print(f"seed {seed}: SecAgg+ (k=14) {n} clients, {n - len(surv)} dropped, {len(surv)} survivors: "
              f"exact sum {exact}, {dt:.2f} s per round (server {rep.server_seconds:.2f} s, "
              f"mean client {np.mean(list(rep.client_seconds.values())) * 1e3:.1f} ms)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["compression", "robust", "robust-error", "secagg"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    a = ap.parse_args()
    {"compression": compression, "robust": robust, "robust-error": robust_error, "secagg": secagg}[a.what](a.seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
