"""``engine_backend`` of the FL simulation: one round of vmapped local training on the cupy backend (its
generated CUDA kernels run on the CPU emulation) equals the numpy backend's, for plain FedAvg steps and
FedProx's proximal steps, with clients of unequal sizes (grouping and masks); bad settings name the field
and ``fedarena run`` exits 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedarena.engine.backends.cupy import CupyJitted, emulation, gpu_unavailable_reason
from fedarena.federated import simulation as sim
from fedarena.federated import strategy as st
from fedarena.federated.fedsim_experiment import FedSimConfig
from fedarena.platform.cli import main
from fedarena.platform.config import ConfigError, build

REPO = Path(__file__).resolve().parents[2]
needs_cxx = pytest.mark.skipif(emulation.host_compiler() is None, reason="no C++ compiler for the CUDA emulation")
_NO_GPU = gpu_unavailable_reason()
DEVICE_BACKENDS = ["cupy-emulated", pytest.param("cupy", marks=[
    pytest.mark.gpu, pytest.mark.skipif(_NO_GPU is not None, reason=f"no CUDA device: {_NO_GPU}")])]
"""The emulated device everywhere; the CUDA device with ``-m gpu`` where there is one."""


def _data(seed=0):
    rng = np.random.default_rng(seed)
    sizes = [5, 7, 12, 9, 6, 11]
    x = rng.standard_normal((sum(sizes), 4)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    bounds = np.cumsum([0, *sizes])
    return x, y, [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])], [f"c{i}" for i in range(len(sizes))]


def _round(strategy, engine_backend):
    x, y, train, ids = _data()
    s = sim.Simulation(sim.BatchedMLP((4, 5, 3)), strategy, x, y, train, ids, 3, seed=2, test=(x, y),
                       eval_clients=False, engine_backend=engine_backend)
    state = s.init_state()
    new, rec = s.round(state)
    return s, state, new, rec


@needs_cxx
@pytest.mark.parametrize("strategy", [st.FedAvg(st.FitConfig(2, 4, 0.2), clients_per_round=5),
                                      st.fedprox(0.5, st.FitConfig(1, 3, 0.2), clients_per_round=4)],
                         ids=["fedavg", "fedprox"])
@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_fedsim_round_on_the_device_backend_equals_the_numpy_backend(strategy, backend):
    _, start, ref, rec_ref = _round(strategy, "numpy")
    s, _, got, rec = _round(strategy, backend)
    step = s.model._step_plain if strategy.fit.prox_mu == 0 else s.model._step
    assert isinstance(step, CupyJitted) and step.cache_size >= 1
    assert all(exe.host_steps == [] for exe, _ in step._cache.values())  # local training: device kernels only
    assert rec.selected == rec_ref.selected
    moved = max(float(np.abs(ref.params[k] - start.params[k]).max()) for k in ref.params)
    assert moved > 1e-3
    for k in ref.params:
        assert type(got.params[k]) is np.ndarray
        np.testing.assert_allclose(got.params[k], ref.params[k], rtol=1e-5, atol=1e-5, err_msg=k)
    np.testing.assert_allclose(rec.metrics["train_loss"], rec_ref.metrics["train_loss"], rtol=1e-5, atol=1e-5)


def test_engine_backend_settings_name_the_field():
    with pytest.raises(ConfigError, match=r"^execution.engine_backend: expected numpy, cupy or cupy-emulated, "
                                          r"got 'gpu'$"):
        build(FedSimConfig, {"execution": {"engine_backend": "gpu"}})
    if emulation.host_compiler() is not None:
        with pytest.raises(ConfigError, match=r"^execution.engine_backend: cupy-emulated runs with backend vmap, "
                                              r"got ray"):
            build(FedSimConfig, {"execution": {"engine_backend": "cupy-emulated", "backend": "ray"}})
        with pytest.raises(ConfigError, match=r"^execution.engine_backend: strategy.server_mode threshold runs "
                                              r"plain FedAvg"):
            build(FedSimConfig, {"execution": {"engine_backend": "cupy-emulated"},
                                 "strategy": {"server_mode": "threshold"}})
        x, y, train, ids = _data()
        with pytest.raises(ValueError, match=r"^engine_backend: cupy-emulated runs with backend vmap"):
            sim.Simulation(sim.BatchedMLP((4, 5, 3)), st.FedAvg(st.FitConfig(1, 4, 0.1), clients_per_round=2), x, y,
                           train, ids, 3, backend="ray", engine_backend="cupy-emulated")


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="a CUDA device is visible: cupy is available")
def test_fedarena_run_without_a_gpu_exits_2_with_one_line(tmp_path, capsys):
    rc = main(["run", str(REPO / "experiments" / "fedsim_digits.yaml"),
               "--set", "execution.engine_backend=cupy", "--out", str(tmp_path / "r")])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, lines
    assert "engine_backend: cupy selected but " in lines[0]
