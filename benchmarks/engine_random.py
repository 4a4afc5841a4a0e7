"""The engine's PRNG under ``vmap``: ``jit(vmap(normal))`` (and ``uniform``, ``split``) over many
keys, the vectorised Philox of ``primitives/random.py`` against the per-key loop it replaced (one
numpy ``Generator(Philox(key))`` per key, a Python loop over the keys), in one run.

Each contender is timed in interleaved rounds (every round times each back to back) with the
thread CPU clock (``time.thread_time``: the machine is shared), and the median is printed:
  - ``loop``: the replaced implementation (``Generator.standard_normal`` / ``.random`` /
    ``Philox.random_raw`` per key);
  - ``native``: the C kernel of ``_native.c`` (the default when the extension is built);
  - ``numpy``: the numpy fallback (``FEDARENA_NATIVE=0``).
Ratios are loop time / new time (> 1: the new code is faster).  The uniforms and split keys are
checked equal to the loop's (the same Philox words); the normal is a different transform
(Box-Muller instead of numpy's ziggurat), so only its shape and moments are checked.

Run:  OMP_NUM_THREADS=1 python benchmarks/engine_random.py [--keys 4096] [--samples 64] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from fedarena import engine
from fedarena.engine import random as R
from fedarena.engine.core import cext
from fedarena.engine.primitives.random import SPLIT_TOP


def loop_normal(keys: np.ndarray, n: int, dtype) -> np.ndarray:
    """The replaced ``Sampler``: one numpy generator per key."""
    out = np.empty((keys.shape[0], n), dtype)
    for i in range(keys.shape[0]):
        out[i] = np.random.Generator(np.random.Philox(key=keys[i].view(np.uint64))).standard_normal(n, dtype=dtype)
    return out


def loop_uniform(keys: np.ndarray, n: int, dtype) -> np.ndarray:
    out = np.empty((keys.shape[0], n), dtype)
    for i in range(keys.shape[0]):
        out[i] = np.random.Generator(np.random.Philox(key=keys[i].view(np.uint64))).random(n, dtype=dtype)
    return out


def loop_split(keys: np.ndarray, num: int) -> np.ndarray:
    out = np.empty((keys.shape[0], num, 2), np.int64)
    counter = np.array([0, 0, 0, SPLIT_TOP], np.uint64)
    for i in range(keys.shape[0]):
        out[i] = np.random.Philox(key=keys[i].view(np.uint64), counter=counter).random_raw(2 * num).view(np.int64).reshape(num, 2)
    return out


def timed(fn, native: bool | None) -> float:
    old = os.environ.get("FEDARENA_NATIVE")
    if native is not None:
        os.environ["FEDARENA_NATIVE"] = "1" if native else "0"
    try:
        t = time.thread_time()
        fn()
        return time.thread_time() - t
    finally:
        if old is None:
            os.environ.pop("FEDARENA_NATIVE", None)
        else:
            os.environ["FEDARENA_NATIVE"] = old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    keys = np.asarray(R.split(R.key(0), a.keys))
    n = a.samples
    cases = {
        "normal float32": (engine.jit(engine.vmap(lambda k: R.normal(k, (n,)))), lambda: loop_normal(keys, n, np.float32)),
        "normal float64": (engine.jit(engine.vmap(lambda k: R.normal(k, (n,), np.float64))), lambda: loop_normal(keys, n, np.float64)),
        "uniform float32": (engine.jit(engine.vmap(lambda k: R.uniform(k, (n,)))), lambda: loop_uniform(keys, n, np.float32)),
        "split 2": (engine.jit(engine.vmap(lambda k: R.split(k))), lambda: loop_split(keys, 2)),
    }
    contenders = [("native", True)] if cext._native is not None else []
    contenders.append(("numpy", False))
    print(f"{a.keys} keys x {n} samples, median of {a.rounds} rounds (thread CPU seconds); extension built: {cext._native is not None}")
    for name, (new, old) in cases.items():
        got = np.asarray(new(keys))
        want = old()
        assert got.shape == want.shape and got.dtype == want.dtype, name
        if name.startswith("normal"):
            assert abs(got.mean()) < 5 / np.sqrt(got.size) and abs(got.var() - 1) < 5 * np.sqrt(2 / got.size), name
        else:
            np.testing.assert_array_equal(got, want)
        times: dict = {"loop": []}
        for label, _ in contenders:
            times[label] = []
        for _ in range(a.rounds):
            times["loop"].append(timed(old, None))
            for label, flag in contenders:
                times[label].append(timed(lambda: new(keys), flag))
        med = {k: statistics.median(v) for k, v in times.items()}
        parts = [f"loop {med['loop'] * 1e3:8.2f} ms"]
        for label, _ in contenders:
            parts.append(f"{label} {med[label] * 1e3:7.2f} ms (x{med['loop'] / med[label]:6.1f})")
        print(f"{name:16s} " + "   ".join(parts))


if __name__ == "__main__":
    main()
