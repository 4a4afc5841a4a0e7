"""The cupy backend's generated kernels, run by the CPU emulation of CUDA, equal the numpy
backend on 200 random fused programs (elementwise chains with broadcasting, reductions,
softmax/logsumexp; float32, float64, int32)."""

from __future__ import annotations

import numpy as np

from fedarena import engine

from .programs import assert_close


def test_random_programs_match_numpy_backend(compiled_programs):
    kinds = set()
    n_kernels = 0
    for p, j, ref in compiled_programs:
        exe = j.entry(*p.args)[0]
        assert exe.host_steps == [], f"{p.text}: ran {exe.host_steps} on the host"
        n_kernels += len(exe.kernels)
        kinds.update(k.name.split("_")[1] for k in exe.kernels)
        got = j(*p.args)
        assert_close(got, ref, p.text, p.args)
    assert len(compiled_programs) >= 200
    # every kernel family took part: elementwise, row and column reductions, softmax, logsumexp
    assert {"ew", "softmax", "logsumexp"} <= kinds and any(k.startswith("row") for k in kinds) and any(k.startswith("col") for k in kinds), kinds
    assert n_kernels >= 400


def test_a_ten_op_chain_is_one_kernel(emulated_device):
    """The benchmark's 10-op chain fuses into one generated kernel reading its two operands once."""
    from fedarena.engine import ops
    from fedarena.engine.backends import cupy as cb

    def chain(x, y):
        v = x * 1.5 + y
        v = ops.tanh(v) * 0.5 - y
        v = ops.exp(-ops.abs(v)) + ops.maximum(x, 0.0)
        return ops.sqrt(v ** 2 + 1.0)

    x = np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((33,)).astype(np.float32)
    j = cb.jit(chain, device=emulated_device)
    exe = j.entry(x, y)[0]
    assert [k.name.split("_")[1] for k in exe.kernels] == ["ew"]
    body = exe.graph.eqns[0].attrs["body"]
    assert len(body.eqns) >= 10 and len(body.invars) == 2
    assert_close(j(x, y), engine.jit(chain)(x, y), "10-op chain", (x,))


def test_repeated_calls_reuse_the_arena_and_return_fresh_outputs(compiled_programs):
    p, j, ref = next((c for c in compiled_programs if np.asarray(c[2]).size > 4), compiled_programs[0])
    a = j(*p.args)
    b = j(*p.args)
    assert a is not b and not np.shares_memory(a, b)
    assert_close(a, ref, p.text, p.args)
    assert_close(b, ref, p.text, p.args)
