"""int8 vs float32 on the digits MLP and a digits CNN, in one run: test accuracy of the float model,
of post-training int8 (min-max and percentile calibration), of quantization-aware training converted
to int8 (beside the float model trained for the same extra epochs, and the same at 4 bits); whether the native int8 forward equals the numpy int8 reference bit for bit; the
model file sizes; and the forward latency at batch 1 and 64 of the float32 model (jitted engine
forward) and of the int8 model (native kernel), interleaved, with their ratio.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/int8_inference.py [--json out.json] [--quick]

Latency is the median of interleaved repeats (float, int8, float, ...) in one process; on a loaded
machine absolute times are inflated, the ratio is the number to read.  The int8 kernel's
instruction path is printed (``isa``); the CPU's flags (``lscpu``) decide it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.engine.quantization import calibrate, float_bytes, isa, qat_model, quantize_model
from fedarena.engine.serialization import save_params


def digits_split(seed: int = 0):
    from fedarena.federated.data import load_digits

    x, y = load_digits()
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 5
    te, tr = order[:n_test], order[n_test:]
    return x[tr], y[tr], x[te], y[te]


def digits_mlp() -> nn.Module:
    return nn.MLP([64, 64, 10], activation="relu")


def digits_cnn() -> nn.Module:
    return nn.Sequential([
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 2 * 2, 64), nn.ReLU(), nn.Linear(64, 10),
    ])


def as_input(model: nn.Module, x: np.ndarray) -> np.ndarray:
    return x.reshape(-1, 1, 8, 8) if isinstance(model, nn.Sequential) else x


def train_float(model: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, seed: int = 0, lr: float = 3e-3, params=None):
    params = model.init(seed) if params is None else params
    opt = optim.adam(lr)
    state = opt.init(params)

    def loss(p, xb, yb):
        return ops.cross_entropy(model.apply(p, xb), yb)

    @engine.jit
    def step(p, s, xb, yb):
        v, g = engine.value_and_grad(loss)(p, xb, yb)
        p, s = opt.update(g, s, p)
        return p, s, v

    rng = np.random.default_rng(seed)
    xi = as_input(model, x)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for i in range(0, len(x) - 31, 32):
            idx = order[i : i + 32]
            params, state, _ = step(params, state, xi[idx], y[idx])
    return params


def train_qat(model: nn.Module, params, x: np.ndarray, y: np.ndarray, epochs: int, seed: int = 1, lr: float = 5e-4,
              bits: int = 8):
    qat = qat_model(model, weight_bits=bits, activation_bits=bits)
    xi = as_input(model, x)
    ranges = qat.init_ranges(params, xi)
    opt = optim.adam(lr)
    state = opt.init(params)
    step = qat.train_step(opt)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for i in range(0, len(x) - 31, 32):
            idx = order[i : i + 32]
            params, state, ranges, _ = step(params, state, ranges, xi[idx], y[idx])
    return qat.to_int8(params, ranges)


def accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(np.asarray(logits), axis=1) == y))


def latency(fns: dict, x: np.ndarray, repeats: int) -> dict:
    """Median seconds per call of each function, measured interleaved."""
    times = {k: [] for k in fns}
    for f in fns.values():  # warm up (compile, first-use kernel build)
        f(x)
    for _ in range(repeats):
        for k, f in fns.items():
            t = time.perf_counter()
            f(x)
            times[k].append(time.perf_counter() - t)
    return {k: float(np.median(v)) for k, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="fewer epochs and repeats (a smoke run)")
    args = ap.parse_args(argv)
    epochs, qat_epochs, repeats = (5, 1, 20) if args.quick else (30, 5, 300)
    xtr, ytr, xte, yte = digits_split()
    out = {"isa": isa(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "models": {}}
    print(f"int8 kernel: {out['isa']}")
    for name, model in (("mlp", digits_mlp()), ("cnn", digits_cnn())):
        params = train_float(model, xtr, ytr, epochs)
        xt = as_input(model, xte)
        xc = as_input(model, xtr[:512])  # calibration set: 512 training examples
        fwd = engine.jit(lambda p, x: model.apply(p, x), shape_varies=True)
        acc_f = accuracy(fwd(params, xt), yte)
        row = {"float32": acc_f}
        qm = None
        for method in ("minmax", "percentile"):
            q = quantize_model(model, params, calibrate(model, params, xc, method=method))
            row[f"ptq_{method}"] = accuracy(q.forward(xt), yte)
            row[f"ptq_{method}_bit_exact"] = bool(np.array_equal(q.forward_int8(xt, "native")[0], q.forward_int8(xt, "reference")[0]))
            qm = qm or q
        row["qat"] = accuracy(train_qat(model, params, xtr, ytr, qat_epochs).forward(xt), yte)
        # the control for QAT: the float model trained for the same extra epochs at the same rate
        tuned = train_float(model, xtr, ytr, qat_epochs, seed=1, lr=5e-4, params=params)
        row["float32_same_extra_epochs"] = accuracy(fwd(tuned, xt), yte)
        # 4 bits, where post-training quantization loses accuracy and QAT has something to recover
        row["ptq_4bit"] = accuracy(quantize_model(model, params, xc, weight_bits=4, activation_bits=4).forward(xt), yte)
        row["qat_4bit"] = accuracy(train_qat(model, params, xtr, ytr, qat_epochs, bits=4).forward(xt), yte)
        with tempfile.TemporaryDirectory() as d:
            row["file_int8_bytes"] = qm.save(os.path.join(d, "m.int8"))
            save_params(os.path.join(d, "m.npz"), params)
            row["file_float32_npz_bytes"] = os.path.getsize(os.path.join(d, "m.npz"))
        row["float32_param_bytes"] = float_bytes(params)
        row["int8_param_bytes"] = qm.weight_bytes
        row["size_ratio_params"] = row["float32_param_bytes"] / row["int8_param_bytes"]
        row["size_ratio_files"] = row["file_float32_npz_bytes"] / row["file_int8_bytes"]
        for batch in (1, 64):
            xb = np.ascontiguousarray(xt[:batch])
            t = latency({"float32": lambda x: np.asarray(fwd(params, x)), "int8": lambda x: qm.forward(x)}, xb, repeats)
            row[f"latency_b{batch}_float32_us"] = t["float32"] * 1e6
            row[f"latency_b{batch}_int8_us"] = t["int8"] * 1e6
            row[f"latency_b{batch}_int8_over_float32"] = t["int8"] / t["float32"]
        out["models"][name] = row
        print(f"\n{name}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
