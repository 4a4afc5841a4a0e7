"""Session fixtures of the cupy backend's CPU checks: one emulated device whose compiled kernels
are cached for the session, and the 200 random programs built once and compiled in one batch."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine.backends import cupy as cb
from fedarena.engine.backends.cupy import emulation

from .programs import make_program

N_PROGRAMS = 200


@pytest.fixture(scope="session")
def emulated_device(tmp_path_factory):
    if emulation.host_compiler() is None:
        pytest.skip("no C++ compiler for the CUDA emulation")
    return cb.EmulatedDevice(cache_dir=tmp_path_factory.mktemp("cuda_emu"))


@pytest.fixture(scope="session")
def compiled_programs(emulated_device):
    """``[(program, cupy-backend jitted fn, numpy-backend outputs)]``, every generated kernel
    compiled in one C++ translation unit."""
    out = []
    for seed in range(N_PROGRAMS):
        p = make_program(seed)
        ref = np.asarray(engine.jit(p.fn)(*p.args))
        j = cb.jit(p.fn, device=emulated_device)
        j.entry(*p.args)  # trace and generate (no compile yet)
        out.append((p, j, ref))
    emulated_device.prepare([j.entry(*p.args)[0].kernels for p, j, _ in out])
    return out
