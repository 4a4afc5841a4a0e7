"""Whole-graph native code vs the per-equation executor (fedarena.engine, numpy backend), same run.

Each workload is jitted twice in one process: once with the whole-graph native path (the default)
and once with ``FEDARENA_NATIVE_GRAPH=0`` at compile time (today's per-equation executor); calls
are interleaved round by round and timed with this thread's CPU time (robust on a shared, loaded
machine; everything here is single-threaded).  Workloads, from ``engine_vs_torch.py``:
  (a) the PPO step (MLP 8-64-64, batch 64, Adam);  (b) the actor's B=1 forward pass;
  (d) MLP 784-512-512-10, batch 128, Adam (no donation);
  (e) the digits CNN epoch (28 steps of batch 64).
(d) and (e) show that jit's choice keeps today's speed there: the MLP's graph holds more than
``native_executor.MAX_ARENA_BYTES`` of values and the CNN's convolutions and pooling (no C
lowering) split it into more than ``MAX_PYTHON_RUNS`` runs, so both keep the per-equation executor
(the last column names the executables).  Prints the median per-call time of each and the ratio
(executor / native; > 1: native faster).

Run:  python benchmarks/engine_vs_executor.py [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_vs_torch as B  # noqa: E402

from fedarena import engine  # noqa: E402
from fedarena.engine import ops, optim  # noqa: E402


def _jit_both(fn, *args):
    """``(native, executor)`` jitted copies of ``fn``, compiled on ``args``."""
    out = []
    for flag in ("1", "0"):
        os.environ["FEDARENA_NATIVE_GRAPH"] = flag
        j = engine.jit(fn)
        j(*args)
        out.append(j)
    os.environ.pop("FEDARENA_NATIVE_GRAPH")
    return out


def workloads():
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((B.BATCH, B.OBS)).astype(np.float32)
    act = rng.integers(0, B.ACT, B.BATCH).astype(np.int32)
    adv = rng.standard_normal(B.BATCH).astype(np.float32)
    lp = (np.log(1 / B.ACT) + 0.1 * rng.standard_normal(B.BATCH)).astype(np.float32)
    ret = rng.standard_normal(B.BATCH).astype(np.float32)
    p = B.ppo_init(0)
    s = B.ppo_opt.init(p)
    ppo = _jit_both(B.ppo_step, p, s, obs, act, adv, lp, ret)
    fwd = _jit_both(B.actor_forward, p, obs[:1].copy())
    yield "(a) PPO train step B=64", [lambda j=j: j(p, s, obs, act, adv, lp, ret) for j in ppo], ppo

    obs1 = obs[:1].copy()
    yield "(b) actor forward B=1", [lambda j=j: j(p, obs1) for j in fwd], fwd

    opt = optim.adam(1e-3)

    def step_of(module):
        def step(params, state, x, y):
            loss, g = engine.value_and_grad(lambda q: ops.cross_entropy(module.apply(q, x), y))(params)
            params, state = opt.update(g, state, params)
            return params, state, loss

        return step

    x = rng.standard_normal((B.MLP_BATCH, B.MLP_SIZES[0])).astype(np.float32)
    y = rng.integers(0, 10, B.MLP_BATCH)
    mp = B.large_mlp.init(0)
    ms = opt.init(mp)
    mlp = _jit_both(step_of(B.large_mlp), mp, ms, x, y)
    yield "(d) MLP 784-512-512-10 B=128", [lambda j=j: j(mp, ms, x, y) for j in mlp], mlp

    xs, ys = B._digits()
    n = len(xs) // B.DIGITS_BATCH
    batches = [(xs[i * B.DIGITS_BATCH : (i + 1) * B.DIGITS_BATCH], ys[i * B.DIGITS_BATCH : (i + 1) * B.DIGITS_BATCH]) for i in range(n)]
    cp = B.digits_cnn.init(0)
    cs = opt.init(cp)
    cnn = _jit_both(step_of(B.digits_cnn), cp, cs, *batches[0])

    def epoch(j):
        st = [cp, cs]
        for bx, by in batches:
            st[0], st[1], _ = j(st[0], st[1], bx, by)

    yield "(e) digits CNN epoch B=64", [lambda j=j: epoch(j) for j in cnn], cnn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    engine.set_num_threads(1)
    budget = 0.1 if args.quick else 0.4  # seconds of CPU per side per round
    print(f"fedarena.engine whole-graph native code vs the per-equation executor; median over {args.rounds} interleaved "
          f"rounds, CPU time of this thread; load average before: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"{'':32s}{'native':>12s}{'executor':>12s}{'ratio':>8s}{'range':>16s}   executables")
    for name, (native, executor), jits in workloads():
        t0 = time.thread_time()
        native()
        reps = max(1, int(budget / max(time.thread_time() - t0, 1e-6)))
        for fn in (native, executor):
            for _ in range(3):
                fn()
        samples: tuple = ([], [])
        for _ in range(args.rounds):
            for fn, out in ((native, samples[0]), (executor, samples[1])):
                t0 = time.thread_time()
                for _ in range(reps):
                    fn()
                out.append((time.thread_time() - t0) / reps)
        ratios = [e / n for n, e in zip(*samples)]
        kinds = "/".join(type(j._fast[0][1]).__name__ for j in jits)
        print(
            f"{name:32s}{statistics.median(samples[0]) * 1e6:10.1f}us{statistics.median(samples[1]) * 1e6:10.1f}us"
            f"{statistics.median(ratios):7.2f}x{min(ratios):7.2f}x-{max(ratios):.2f}x   {kinds}"
        )
    print(f"ratio = executor time / native time (> 1: native faster); load average after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
