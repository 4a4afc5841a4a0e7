"""Whole-graph native code (compiler/codegen_c.py, backends/numpy/native_executor.py) against the
per-equation executor on the same graph: equal bit for bit on the registry's random programs and
their gradients, on a PPO-style training step, and the fallbacks (no compiler, unsupported
equations, non-contiguous inputs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops
from fedarena.engine.backends.numpy import native_executor
from fedarena.engine.backends.numpy.executor import Executable
from fedarena.engine.compiler import cbuild, codegen_c
from fedarena.engine.compiler.passes import NATIVE_PIPELINE

from .test_memory_plan_exec import _loss_of
from .test_passes import _random_program

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None, reason="no C compiler")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FEDARENA_NATIVE_CACHE", str(tmp_path_factory.getbasetemp() / "native-cache"))


def _bitwise(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes(), np.max(np.abs(a.astype(float) - b.astype(float)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_random_programs_and_gradients_equal_the_executor_bit_for_bit(dtype):
    lowered = 0
    for seed in range(16):
        rng = np.random.default_rng(200 + seed)
        fn = _random_program(rng, n_ops=10)
        x, y = rng.standard_normal((3, 4)).astype(dtype), rng.standard_normal((3, 4)).astype(dtype)
        for f in (fn, engine.value_and_grad(_loss_of(fn), argnums=(0, 1))):
            g = NATIVE_PIPELINE(engine.make_graph(f)(x, y))
            exe = native_executor.native_executable(g)
            if exe is None:
                with pytest.raises(codegen_c.Unsupported):
                    codegen_c.lower(g)
                continue
            lowered += 1
            want = Executable(exe.graph)(x, y)
            for _ in range(2):  # nothing a call leaves in the arena leaks into the next
                _bitwise(exe(x, y), want)
    assert lowered >= 24  # most programs lower (``pad`` does not)
