"""DP-SGD with fedarena's engine vs Opacus on CPU, measured in the same run: CPU time over whole trainings.

The task: scikit-learn's digits (all 1797 images, pixels / 16), MLP 64 -> 128 -> 10 (tanh), cross-entropy,
DP-SGD (Abadi et al., CCS 2016) with Poisson sampling at q = 64/1797, clip norm 1, noise multiplier 1,
then SGD with lr 0.05 and momentum 0.9; ``--steps`` (300) steps. Columns:

* ``engine``: :class:`fedarena.privacy.dpsgd.DPSGD` (the fused path: per-example gradients, norms, clipping
  and sum in one compiled program per batch-size bucket), batches and noise from ``os.urandom``
  (:class:`~fedarena.privacy.secure_random.SecureRandom`, the default), the update a jitted
  ``optim.sgd``;
* ``loop``: the same with ``DPSGD(..., fused=False)`` (the per-example path before the fusion: one jit
  signature per Poisson batch size and a Python loop over the examples for the clipping);
* ``opacus``: Opacus's ``GradSampleModule`` and ``DPOptimizer`` (the pieces ``PrivacyEngine.make_private``
  assembles) driven directly: each step draws its Poisson batch with ``torch.rand(N) < q`` and indexes the
  tensors, which skips the DataLoader's per-example fetching and collation (the fastest way we found to
  drive Opacus); Opacus's noise comes from torch's default generator (``secure_mode=False``, its default),
  so it does less work per step than the engine's CSPRNG draws.

Each training runs in a fresh process (one framework per process, so neither inherits the other's
allocator state) with one thread (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``, the engine's
BLAS at one thread); the processes alternate ``engine, opacus, loop`` for ``--rounds`` rounds. Each process
measures its own CPU time (``time.process_time``) from building the DP-SGD objects (the engine's traces and
compiles included) to the end of the last step, data loading and imports excluded, and reports the
programs the engine compiled for the clipped sum. Printed: CPU seconds per training, the ratio opacus /
engine per round (> 1: the engine is faster) and its median, the compiles, and the epsilon of the
configuration at delta 1e-5 from fedarena's RDP accountant and from Opacus's.

Run:  OMP_NUM_THREADS=1 python benchmarks/dpsgd_vs_opacus.py [--rounds 3] [--steps 300] [--no-loop]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

BATCH, CLIP, SIGMA, LR, MOMENTUM, DELTA = 64, 1.0, 1.0, 0.05, 0.9, 1e-5


def _digits():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


def run_engine(steps: int, fused: bool) -> dict:
    from fedarena import engine
    from fedarena.engine import nn, ops, optim
    from fedarena.privacy.dpsgd import DPSGD, DPSGDConfig, poisson_batch

    engine.set_num_threads(1)
    x, y = _digits()
    n = len(x)
    q = BATCH / n
    mlp = nn.MLP([64, 128, 10], activation="tanh")
    params = mlp.init(0)

    def loss_fn(p, xb, yb):
        return ops.cross_entropy(mlp.apply(p, xb), yb)

    t0 = time.process_time()
    dp = DPSGD(loss_fn, DPSGDConfig(CLIP, SIGMA, q), n, fused=fused)
    opt = optim.sgd(LR, momentum=MOMENTUM)
    update = engine.jit(lambda g, s, p: opt.update(g, s, p))
    state = opt.init(params)
    sizes = set()
    for _ in range(steps):
        idx = poisson_batch(None, n, q)  # os.urandom
        sizes.add(len(idx))
        grads, _ = dp.noisy_gradient(params, x[idx], y[idx])  # noise from os.urandom
        params, state = update(grads, state, params)
    cpu = time.process_time() - t0
    acc = float(np.mean(np.argmax(np.asarray(mlp.apply(params, x)), axis=1) == y))
    out = {"cpu_s": cpu, "batch_sizes": len(sizes), "train_accuracy": acc}
    if fused:  # the loop path compiles one vmapped gradient per batch size (its jit is not exposed)
        out.update(compiles=dp.compiles, buckets=list(dp.buckets))
    return out


def run_opacus(steps: int) -> dict:
    import warnings

    import torch
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    warnings.filterwarnings("ignore", message="Full backward hook is firing")  # inputs need no gradient
    torch.set_num_threads(1)
    torch.manual_seed(0)
    xn, yn = _digits()
    x, y = torch.from_numpy(xn), torch.from_numpy(yn)
    n = len(x)
    q = BATCH / n
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 10))
    t0 = time.process_time()
    module = GradSampleModule(model)
    opt = DPOptimizer(torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM), noise_multiplier=SIGMA,
                      max_grad_norm=CLIP, expected_batch_size=BATCH)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(steps):
        idx = torch.nonzero(torch.rand(n) < q).flatten()
        opt.zero_grad()
        loss_fn(module(x[idx]), y[idx]).backward()
        opt.step()
    cpu = time.process_time() - t0
    with torch.no_grad():
        acc = float((module(x).argmax(1) == y).float().mean())
    return {"cpu_s": cpu, "train_accuracy": acc}


def epsilons(steps: int) -> dict:
    from fedarena.privacy.accountant import RDPAccountant

    q = BATCH / 1797
    ours = RDPAccountant()
    ours.step(SIGMA, q, steps)
    out = {"fedarena_rdp": ours.epsilon(DELTA)}
    try:
        from opacus.accountants import RDPAccountant as OpacusRDP

        theirs = OpacusRDP()
        theirs.history = [(SIGMA, q, steps)]
        out["opacus_rdp"] = theirs.get_epsilon(DELTA)
    except ImportError:  # pragma: no cover - opacus missing
        pass
    return out


def worker(column: str, steps: int) -> None:
    result = run_opacus(steps) if column == "opacus" else run_engine(steps, fused=column == "engine")
    print(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--no-loop", action="store_true", help="skip the per-example loop column (slow)")
    ap.add_argument("--worker", choices=["engine", "loop", "opacus"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    columns = ["engine", "opacus"] + ([] if args.no_loop else ["loop"])
    results: dict[str, list[dict]] = {c: [] for c in columns}
    print(f"digits MLP 64-128-10, q = {BATCH}/1797, sigma {SIGMA}, C {CLIP}, {args.steps} steps, CPU time per "
          f"training (one thread, fresh process each)")
    for r in range(args.rounds):
        for c in columns:
            out = subprocess.run([sys.executable, __file__, "--worker", c, "--steps", str(args.steps)], env=env,
                                 check=True, capture_output=True, text=True).stdout
            res = json.loads(out.strip().splitlines()[-1])
            results[c].append(res)
            extra = f"  {res['batch_sizes']} batch sizes" if "batch_sizes" in res else ""
            extra += f", compiles {res['compiles']} (buckets {res['buckets']})" if "compiles" in res else ""
            print(f"round {r + 1} {c:7s} {res['cpu_s']:7.3f} s  train acc {res['train_accuracy']:.3f}{extra}",
                  flush=True)
    ratios = [o["cpu_s"] / e["cpu_s"] for o, e in zip(results["opacus"], results["engine"])]
    print("opacus / engine per round: " + ", ".join(f"{x:.2f}x" for x in ratios)
          + f"  (median {statistics.median(ratios):.2f}x)")
    if "loop" in results:
        old = [lp["cpu_s"] / e["cpu_s"] for lp, e in zip(results["loop"], results["engine"])]
        vs = [o["cpu_s"] / lp["cpu_s"] for o, lp in zip(results["opacus"], results["loop"])]
        print("loop / engine per round: " + ", ".join(f"{x:.2f}x" for x in old)
              + f"  (median {statistics.median(old):.2f}x); opacus / loop median {statistics.median(vs):.2f}x")
    print("max compiles of the fused clipped sum:", max(e["compiles"] for e in results["engine"]))
    print("epsilon at delta 1e-5:", {k: round(v, 6) for k, v in epsilons(args.steps).items()})


if __name__ == "__main__":
    main()
