"""The cupy backend's generated kernels, run by the CPU emulation of CUDA, equal the numpy
backend on 200 random fused programs (elementwise chains with broadcasting, reductions,
softmax/logsumexp; float32, float64, int32)."""

from __future__ import annotations

import numpy as np

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


def test_programs_fuse_into_few_kernels(compiled_programs):
    """A chain of elementwise operations is one kernel, not one per operation."""
    for p, j, _ in compiled_programs[:50]:
        exe = j.entry(*p.args)[0]
        n_ew_eqns = sum(len(e.attrs["body"].eqns) for e in exe.graph.eqns if e.prim.name == "fused_elementwise")
        n_ew_kernels = sum(1 for k in exe.kernels if k.name.startswith("fe_ew_"))
        assert n_ew_kernels <= max(1, n_ew_eqns)


def test_repeated_calls_reuse_the_arena_and_return_fresh_outputs(compiled_programs):
    p, j, ref = next((c for c in compiled_programs if np.asarray(c[2]).size > 4), compiled_programs[0])
    a = j(*p.args)
    b = j(*p.args)
    assert a is not b and not np.shares_memory(a, b)
    assert_close(a, ref, p.text, p.args)
    assert_close(b, ref, p.text, p.args)
