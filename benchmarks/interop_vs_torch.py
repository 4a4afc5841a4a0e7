"""A torch model converted by ``engine.from_torch`` vs the same model in PyTorch eager and vs the engine's
own hand-written network, one training step each, measured in the same run (CPU).

Models (the same architecture in all three columns):
  (a) PPO-sized MLP 8 -> 64 -> 64 -> 4 (tanh), batch 64;
  (b) the Nature-DQN CNN torso (Mnih et al., 2015: 32 8x8/4, 64 4x4/2, 64 3x3/1, 512 ReLU) with a 6-way
      head on 4x84x84 frames, batch 32.
A step is the mean cross-entropy on random labels, its gradient and a plain SGD update. Columns: PyTorch
eager (``torch.set_num_threads(1)``), the converted function under ``engine.jit`` and the engine's own
network (``nn.MLP`` / ``fedarena.rl.networks.Torso("cnn")``) under ``engine.jit``, all with one BLAS thread.
Prints the median time per step over ``--repeats`` rounds and the ratios (> 1: the engine is faster), and
checks that the converted step computes torch's loss.

Run:  python benchmarks/interop_vs_torch.py [--repeats 5] [--steps 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from fedarena import engine
from fedarena.engine import nn as enn
from fedarena.engine import ops
from fedarena.rl.networks import NATURE_CNN_FEATURES, Torso, dense, dense_init

LR = 1e-3


def torch_models():
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 4))
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(4, 32, 8, 4), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 4, 2), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, 1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(3136, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 6))
    return {"mlp": (mlp, (64, 8), 4), "nature_cnn": (cnn, (32, 4, 84, 84), 6)}


def engine_native(name: str):
    """The engine's own network of the same shape: (apply, params)."""
    rng = np.random.default_rng(0)
    if name == "mlp":
        net = enn.MLP([8, 64, 64, 4], activation="tanh")
        return net.apply, net.init(0)
    torso = Torso("cnn", (4, 84, 84), (NATURE_CNN_FEATURES,), "relu")
    params = {"torso": torso.init(rng), "head": dense_init(rng, NATURE_CNN_FEATURES, 6, 0.01)}
    return (lambda p, x: dense(p["head"], torso.apply(p["torso"], x))), params


def sgd_step(apply):
    def loss_fn(p, x, y):
        return ops.cross_entropy(apply(p, x), y)

    def step(p, x, y):
        loss, g = engine.value_and_grad(loss_fn)(p, x, y)
        return engine.tree_map(lambda a, b: a - LR * b, p, g), loss

    return engine.jit(step)


def median_step_time(run, steps: int, repeats: int) -> float:
    run()  # warm-up (compiles)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            run()
        times.append((time.perf_counter() - t0) / steps)
    return statistics.median(times), min(times), max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    print(f"{'model':<12} {'torch eager':>14} {'from_torch+jit':>16} {'engine native':>15} {'torch/conv':>11} {'native/conv':>12}")
    for name, (module, shape, classes) in torch_models().items():
        x = rng.uniform(0, 1, shape).astype(np.float32)
        y = rng.integers(classes, size=shape[0])
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        opt = torch.optim.SGD(module.parameters(), lr=LR)

        def torch_step():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(module(xt), yt)
            loss.backward()
            opt.step()
            return loss

        fn, params = engine.from_torch(module, xt)
        conv_step = sgd_step(fn)
        _, loss = conv_step(params, x, y)
        with torch.no_grad():
            ref = torch.nn.functional.cross_entropy(module(xt), yt).item()
        assert abs(float(loss) - ref) <= 1e-5 * max(1.0, abs(ref)), (float(loss), ref)
        state = {"conv": params}
        native_apply, native_params = engine_native(name)
        native_step = sgd_step(native_apply)
        state["native"] = native_params

        def run_conv():
            state["conv"], _ = conv_step(state["conv"], x, y)

        def run_native():
            state["native"], _ = native_step(state["native"], x, y)

        t_torch = median_step_time(torch_step, args.steps, args.repeats)
        t_conv = median_step_time(run_conv, args.steps, args.repeats)
        t_native = median_step_time(run_native, args.steps, args.repeats)
        fmt = lambda t: f"{t[0] * 1e6:9.0f} us".rjust(14)  # noqa: E731
        print(f"{name:<12} {fmt(t_torch)} {fmt(t_conv):>16} {fmt(t_native):>15} {t_torch[0] / t_conv[0]:11.2f} "
              f"{t_native[0] / t_conv[0]:12.2f}")
        spread = lambda t: f"{t[1] * 1e6:.0f}-{t[2] * 1e6:.0f} us"  # noqa: E731
        print(f"{'':<12} spread (min-max of {args.repeats} rounds): torch {spread(t_torch)}, "
              f"converted {spread(t_conv)}, native {spread(t_native)}")


if __name__ == "__main__":
    main()
