"""The engine's kernel pool (``engine.set_num_threads(2)``) against numpy's OpenBLAS threads, in one run.

For the five large matrix products of an MLP 784-512-512-10 training step at batch 128 (forward
x @ W1 and h1 @ W2, backward x^T @ dz1, h1^T @ dz2 and dz2 @ W2^T) it prints the median time of
  - ``np.dot`` with OpenBLAS limited to 1 thread,
  - ``np.dot`` with OpenBLAS's 2 threads,
  - the engine's ``gemm`` over its pool of 2 threads (``_parallel.c``: blocks of rows, OpenBLAS limited to one
    thread per block),
and the time of a jitted Adam update of a 784 x 512 weight on 1 and 2 engine threads (one multi-output
elementwise program, split over the pool in chunks of whole blocks).  OpenBLAS's idle threads spin for a
while after each multi-threaded product, so each measurement starts after a pause.

Run:  python benchmarks/engine_threads.py [--reps 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fedarena import engine
from fedarena.engine import optim
from fedarena.engine.core import cext, threads

SHAPES = [("x @ W1", (128, 784), (784, 512), False), ("x^T @ dz1", (784, 128), (128, 512), True),
          ("h1^T @ dz2", (512, 128), (128, 512), True), ("dz2 @ W2^T", (128, 512), (512, 512), False),
          ("h1 @ W2", (128, 512), (512, 512), False)]


def median_us(fn, reps: int) -> float:
    for _ in range(10):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    if not cext.available():
        raise SystemExit("the C extension is not built (pip install -e .)")
    engine.set_num_threads(2)
    if threads.numpy_openblas() is None:
        raise SystemExit("numpy's BLAS is not an OpenBLAS with openblas_set_num_threads_local (>= 0.3.27)")
    rng = np.random.default_rng(0)
    print(f"{'product':14s}{'M x K x N':>18s}{'OpenBLAS 1':>12s}{'OpenBLAS 2':>12s}{'pool 2':>10s}{'pool/OpenBLAS 2':>18s}")
    for name, sa, sb, transposed in SHAPES:
        a = rng.standard_normal(sa[::-1] if transposed else sa).astype(np.float32)
        a = a.T if transposed else a
        b = rng.standard_normal(sb).astype(np.float32)
        c = np.empty((sa[0], sb[1]), np.float32)
        engine.set_num_threads(2)
        time.sleep(0.3)
        pool = median_us(lambda: cext._native.gemm(a, b, c), args.reps)
        blas2 = median_us(lambda: np.dot(a, b, out=c), args.reps)
        engine.set_num_threads(1)
        time.sleep(0.3)
        blas1 = median_us(lambda: np.dot(a, b, out=c), args.reps)
        dims = f"{sa[0]}x{sa[1]}x{sb[1]}"
        print(f"{name:14s}{dims:>18s}{blas1:10.0f}us{blas2:10.0f}us{pool:8.0f}us{blas2 / pool:17.2f}x")
    opt = optim.adam(1e-3)
    g = {"w": rng.standard_normal((784, 512)).astype(np.float32)}
    for n in (1, 2):
        engine.set_num_threads(n)
        update = engine.jit(lambda g, s, p: opt.update(g, s, p), donate_argnums=(1, 2))
        st = {"p": {"w": rng.standard_normal((784, 512)).astype(np.float32)}}
        st["s"] = opt.init(st["p"])

        def run():
            st["p"], st["s"] = update(g, st["s"], st["p"])

        print(f"Adam update of a 784 x 512 weight, {n} engine thread(s): {median_us(run, args.reps):.0f} us")
    engine.set_num_threads(1)


if __name__ == "__main__":
    main()
