"""``jit`` for the cupy backend: trace per input signature, compile with :data:`.pipeline.PIPELINE`, run
on a device (:class:`.device.CupyDevice` by default).  Arguments may be numpy arrays (copied to
the device once per call) or device arrays; outputs are device arrays (``cupy.asnumpy`` them)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

from ...compiler import passes as _passes
from ...core.ir import EngineError, ShapedArray, check_dtype
from ...core.pytree import tree_flatten, tree_unflatten
from ...core.tracing import _TRACE_STACK, trace_flat
from . import control  # noqa: F401 - it defines the control-flow primitives' cupy rules
from .device import CupyDevice
from .executor import Executable
from .pipeline import PIPELINE

_PY_SCALARS = (bool, int, float)


def _static_key(v: Any) -> Any:
    return (float, repr(v)) if type(v) is float else (type(v), v)


class CupyJitted:
    """A function compiled for the cupy backend; call it like the original."""

    def __init__(self, fn: Callable, static_argnums: Sequence[int] = (), passes: Any = None, device: Any = None):
        self.fn = fn
        self.static_argnums = tuple(sorted(int(i) for i in static_argnums))
        self.pipeline = PIPELINE if passes is None else _passes.resolve(passes)
        self.device = device if device is not None else CupyDevice()
        self._device_array = type(self.device.xp.empty(0))  # cupy.ndarray (numpy.ndarray when emulated)
        self._cache: dict = {}
        functools.update_wrapper(self, fn)

    def _key(self, args: tuple, kwargs: dict):
        dyn = tuple(a for i, a in enumerate(args) if i not in self.static_argnums)
        static = tuple(args[i] for i in self.static_argnums if i < len(args))
        leaves, treedef = tree_flatten((dyn, kwargs))
        sig, arrays = [], []
        for x in leaves:
            t = type(x)
            if t is np.ndarray or t is self._device_array:
                sig.append(x.shape)
                sig.append(x.dtype)
                arrays.append(x)
            elif t in _PY_SCALARS:
                sig.append(_static_key(x))
            else:
                if not hasattr(x, "shape") or not hasattr(x, "dtype"):
                    x = np.asarray(x)
                sig.append(tuple(x.shape))
                sig.append(np.dtype(x.dtype))
                arrays.append(x)
        key = (treedef, tuple(sig), tuple(_static_key(s) for s in static), len(args))
        return key, leaves, treedef, static, arrays

    def entry(self, *args: Any, **kwargs: Any):
        """``(executable, output tree)`` for these arguments (traced and compiled on first use)."""
        key, leaves, treedef, static, _ = self._key(args, kwargs)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._compile(args, leaves, treedef, static)
        return got

    def _compile(self, args, leaves, treedef, static):
        is_arr = [type(x) not in _PY_SCALARS for x in leaves]
        avals = []
        for x, a in zip(leaves, is_arr):
            if a:
                avals.append(ShapedArray(tuple(x.shape) if hasattr(x, "shape") else np.shape(x), check_dtype(np.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype, "jit argument")))
        out_tree: list = []
        n_args, sa = len(args), self.static_argnums

        def flat_fn(tracers):
            it = iter(tracers)
            vals = [next(it) if a else x for x, a in zip(leaves, is_arr)]
            dyn, kwargs = tree_unflatten(treedef, vals)
            di, si, full = iter(dyn), iter(static), []
            for i in range(n_args):
                full.append(next(si) if i in sa else next(di))
            out_leaves, td = tree_flatten(self.fn(*full, **kwargs))
            out_tree.append(td)
            return out_leaves

        graph, captured = trace_flat(flat_fn, avals)
        if captured:  # pragma: no cover - only with leaked tracers
            raise EngineError("jit(backend='cupy'): the function closes over values traced by an enclosing transformation")
        if self.pipeline is not None:
            graph = self.pipeline(graph)
        return Executable(graph, self.device), out_tree[0]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _TRACE_STACK:
            return self.fn(*args, **kwargs)  # inside another transformation: inline
        key, leaves, treedef, static, arrays = self._key(args, kwargs)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._compile(args, leaves, treedef, static)
        exe, out_tree = got
        return tree_unflatten(out_tree, exe(*arrays))

    def source(self, *args: Any, **kwargs: Any) -> str:
        """The CUDA module generated for these arguments."""
        return self.entry(*args, **kwargs)[0].source

    def graph(self, *args: Any, **kwargs: Any):
        """The graph compiled for these arguments (after the cupy pipeline)."""
        return self.entry(*args, **kwargs)[0].graph

    def memory(self, *args: Any, **kwargs: Any):
        """The memory plan of the device arena for these arguments."""
        return self.entry(*args, **kwargs)[0].memory

    @property
    def cache_size(self) -> int:
        return len(self._cache)


def jit(fn: Callable | None = None, static_argnums: int | Sequence[int] = (), passes: Any = None, device: Any = None) -> Any:
    """Compile ``fn`` for the GPU (``device``: a :class:`.device.CupyDevice` by default, or an
    :class:`.device.EmulatedDevice`); raises :class:`.device.GpuUnavailableError` when cupy or a
    CUDA device is missing."""
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if fn is None:
        return lambda f: CupyJitted(f, static_argnums, passes, device)
    return CupyJitted(fn, static_argnums, passes, device)
