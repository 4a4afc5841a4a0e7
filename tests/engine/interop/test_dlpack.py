"""DLPack exchange: engine (numpy) arrays and torch CPU tensors share memory both ways (checked by
data pointers, ``np.shares_memory`` and writes seen through the other side); the cupy path runs only
with cupy and a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import interop

torch = pytest.importorskip("torch")


def test_engine_array_to_torch_shares_memory():
    a = engine.jit(lambda x: x * 2.0)(np.arange(12, dtype=np.float32).reshape(3, 4))  # an engine output
    t = interop.to_torch(a)
    assert t.data_ptr() == a.ctypes.data and t.dtype == torch.float32 and tuple(t.shape) == (3, 4)
    t[0, 0] = -1.0
    assert a[0, 0] == -1.0
    view = a[:, ::2]  # strided views travel as strides, not copies
    tv = torch.from_dlpack(view)
    assert tv.stride() == (4, 2) and tv.data_ptr() == view.ctypes.data


def test_torch_tensor_to_engine_shares_memory_and_runs_in_jit():
    t = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    a = engine.from_dlpack(t)
    assert isinstance(a, np.ndarray) and a.ctypes.data == t.data_ptr()
    assert np.shares_memory(a, t.numpy())
    t += 1.0
    np.testing.assert_array_equal(a, np.arange(1, 7, dtype=np.float64).reshape(2, 3))
    np.testing.assert_array_equal(engine.jit(lambda x: x.sum(axis=1))(a), [6.0, 15.0])


def test_tensor_that_requires_grad_is_exported_through_detach():
    p = torch.ones(4, requires_grad=True)
    a = engine.from_dlpack(p)
    assert a.ctypes.data == p.data_ptr()


def test_capsules_for_legacy_consumers():
    a = np.linspace(0, 1, 5)
    t = torch.utils.dlpack.from_dlpack(engine.to_dlpack(a))
    assert t.data_ptr() == a.ctypes.data
    ro = a.copy()
    ro.flags.writeable = False
    with pytest.raises(engine.EngineError, match="to_dlpack: .*readonly.*pass a writable array"):
        engine.to_dlpack(ro)


def test_traced_values_and_non_arrays_are_refused():
    with pytest.raises(engine.EngineError, match="traced value inside jit"):
        engine.jit(lambda x: engine.to_dlpack(x))(np.ones(2))
    with pytest.raises(TypeError, match="list does not implement __dlpack__"):
        engine.from_dlpack([1.0, 2.0])


def _cuda_cupy():
    try:
        import cupy
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:
        return None


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_cupy() is None, reason="needs cupy and a CUDA device")
def test_cuda_tensors_cross_to_cupy_without_copies():
    cupy = _cuda_cupy()
    x = cupy.arange(8, dtype=cupy.float32)
    assert engine.from_dlpack(x).data.ptr == x.data.ptr
    if torch.cuda.is_available():
        t = torch.arange(8, dtype=torch.float32, device="cuda")
        c = engine.from_dlpack(t)
        assert isinstance(c, cupy.ndarray) and c.data.ptr == t.data_ptr()
        back = interop.to_torch(c)
        assert back.is_cuda and back.data_ptr() == t.data_ptr()
