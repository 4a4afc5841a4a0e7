"""Random fused programs for checking the cupy backend's generated kernels against the numpy
backend: chains of elementwise operations over operands that broadcast against each other, with
row/column reductions (sum, mean, max, min), softmax and logsumexp mixed in.  Domains are kept
safe (logarithms of 1 + |x|, divisions by 1 + |y|, exponentials of bounded values) so that both
backends compute finite numbers and the comparison measures the kernels, not overflow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from fedarena.engine import ops


@dataclass
class Program:
    seed: int
    fn: Callable
    args: tuple
    text: str


_UNARY_F = [
    ("tanh", lambda x: ops.tanh(x)),
    ("sin", lambda x: ops.sin(x)),
    ("cos", lambda x: ops.cos(x)),
    ("exp_tanh", lambda x: ops.exp(ops.tanh(x))),
    ("log1abs", lambda x: ops.log(ops.abs(x) + 1.0)),
    ("log1p_abs", lambda x: ops.log1p(ops.abs(x))),
    ("sqrt_abs", lambda x: ops.sqrt(ops.abs(x))),
    ("sigmoid", lambda x: ops.sigmoid(x)),
    ("neg", lambda x: -x),
    ("relu", lambda x: ops.relu(x)),
    ("square_tanh", lambda x: ops.tanh(x) ** 2),
    ("rsqrt1", lambda x: ops.rsqrt(ops.abs(x) + 1.0)),
    ("erf", lambda x: ops.erf(x)),
    ("sign_mul", lambda x: ops.sign(x) * x),
    ("scale", lambda x: x * 0.5 + 0.25),
    ("softplus", lambda x: ops.softplus(ops.tanh(x))),
]
_BINARY_F = [
    ("add", lambda x, y: x + y),
    ("sub", lambda x, y: x - y),
    ("mul", lambda x, y: x * y),
    ("div", lambda x, y: x / (ops.abs(y) + 1.0)),
    ("max", lambda x, y: ops.maximum(x, y)),
    ("min", lambda x, y: ops.minimum(x, y)),
    ("where", lambda x, y: ops.where(x > y, x, y * 0.5)),
    ("clip", lambda x, y: ops.clip(x + y, -0.75, 0.8)),
    ("mod", lambda x, y: x % (ops.abs(y) + 0.5)),
    ("fdiv", lambda x, y: x // (ops.abs(y) + 0.5)),
    ("pow", lambda x, y: (ops.abs(x) + 0.5) ** ops.tanh(y)),
]
_UNARY_I = [("neg", lambda x: -x), ("abs", lambda x: ops.abs(x)), ("scale", lambda x: x * 3 - 2)]
_BINARY_I = [
    ("add", lambda x, y: x + y),
    ("sub", lambda x, y: x - y),
    ("mul", lambda x, y: x * y),
    ("max", lambda x, y: ops.maximum(x, y)),
    ("min", lambda x, y: ops.minimum(x, y)),
    ("fdiv", lambda x, y: x // y),  # numpy: 0 where y == 0
    ("mod", lambda x, y: x % y),
    ("where", lambda x, y: ops.where(x >= y, x, -y)),
]


def _shape_like(rng: np.random.Generator, base: tuple) -> tuple:
    """A shape that broadcasts to ``base``: some axes 1, maybe fewer leading axes."""
    s = [d if rng.random() < 0.6 else 1 for d in base]
    drop = int(rng.integers(0, len(base))) if rng.random() < 0.3 else 0
    return tuple(s[drop:])


def make_program(seed: int) -> Program:
    rng = np.random.default_rng(seed)
    kind = rng.choice(["f32", "f32", "f32", "f64", "i32"])
    dt = {"f32": np.float32, "f64": np.float64, "i32": np.int32}[kind]
    nd = int(rng.integers(1, 4))
    base = tuple(int(rng.integers(1, 9)) for _ in range(nd))
    if rng.random() < 0.15 and kind != "i32":  # a long last axis: the row kernels
        base = base[:-1] + (int(rng.integers(32, 80)),)
    n_in = int(rng.integers(1, 4))
    shapes = [base] + [_shape_like(rng, base) for _ in range(n_in - 1)]
    if kind == "i32":
        args = tuple(rng.integers(-9, 10, size=s).astype(dt) for s in shapes)
    else:
        args = tuple((rng.standard_normal(s) * 1.5).astype(dt) for s in shapes)
    unary, binary = (_UNARY_I, _BINARY_I) if kind == "i32" else (_UNARY_F, _BINARY_F)
    steps = []
    n_ops = int(rng.integers(2, 12))
    for _ in range(n_ops):
        r = rng.random()
        if r < 0.35:
            steps.append(("u", int(rng.integers(len(unary)))))
        elif r < 0.8:
            steps.append(("b", int(rng.integers(len(binary))), int(rng.integers(n_in)), bool(rng.random() < 0.2)))
        elif r < 0.92 or kind == "i32":
            steps.append(("r", str(rng.choice(["sum", "max", "min", "mean"] if kind != "i32" else ["sum", "max", "min"])), int(rng.integers(0, 8))))
        else:
            steps.append(("s", str(rng.choice(["softmax", "logsumexp"]))))
    literal = float(np.round(rng.uniform(-2, 2), 3)) if kind != "i32" else int(rng.integers(-3, 4))

    def fn(*xs):
        v = xs[0]
        for st in steps:
            if st[0] == "u":
                v = unary[st[1]][1](v)
            elif st[0] == "b":
                other = literal if st[3] else xs[st[2]]
                v = binary[st[1]][1](v, other)
            elif st[0] == "r":
                shape = np.shape(v) if not hasattr(v, "shape") else v.shape
                if len(shape) == 0:
                    continue
                axis = st[2] % len(shape)
                red = {"sum": ops.sum, "max": ops.max, "min": ops.min, "mean": ops.mean}[st[1]]
                m = red(v, axis=axis, keepdims=True)
                if kind == "i32":
                    v = v - m
                else:
                    v = ops.tanh(v - m) if st[1] in ("sum", "mean") else v - m
            else:
                if len(v.shape) == 0:
                    continue
                if st[1] == "softmax":
                    v = ops.softmax(v, axis=-1)
                else:
                    v = v - ops.logsumexp(v, axis=-1, keepdims=True) * 0.5
        return v

    text = f"seed={seed} {kind} base={base} shapes={shapes} steps={steps} literal={literal}"
    return Program(seed, fn, args, text)


def assert_close(got: np.ndarray, ref: np.ndarray, what: str, inputs: tuple = ()) -> None:
    """|got - ref| <= tol (1 + |ref|) with tol 1e-6 when the result or an input is float32 (a
    float32 step's rounding carries into a float64 result), else 1e-12; integers exactly."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape and got.dtype == ref.dtype, f"{what}: {got.shape} {got.dtype} vs {ref.shape} {ref.dtype}"
    if ref.dtype.kind in "iub":
        np.testing.assert_array_equal(got, ref, err_msg=what)
        return
    single = ref.dtype == np.float32 or any(np.asarray(x).dtype == np.float32 for x in inputs)
    tol = 1e-6 if single else 1e-12
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    bound = tol * (1.0 + np.abs(ref.astype(np.float64)))
    same_nan = np.isnan(got) & np.isnan(ref)
    bad = ~((err <= bound) | same_nan)
    assert not bad.any(), f"{what}: max error {np.nanmax(err):.3g} at {np.argwhere(bad)[0]} (got {got[bad][0]!r}, numpy {ref[bad][0]!r})"
