"""NCCL collectives on CUDA arrays through cupy (``cupy.cuda.nccl``), one GPU per rank.

NCCL runs its own ring/tree algorithms on the GPUs; this module gives it the communicator interface used
elsewhere (``all_reduce``, ``reduce``, ``broadcast``, ``all_gather``, ``reduce_scatter``, ``gather``,
``scatter`` (grouped point-to-point sends), ``barrier``) on cupy arrays. The NCCL unique id is exchanged over
a host-side :class:`~.communicator.Communicator` (any transport): rank 0 creates it and broadcasts its bytes.
``available()`` says whether cupy with NCCL and a CUDA device are present; nothing here is imported by the
package unless used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .communicator import Communicator


def available() -> bool:
    try:
        import cupy
        from cupy.cuda import nccl  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no cupy, no NCCL build, or no driver
        return False


_DTYPES = {np.dtype(np.int8): "NCCL_INT8", np.dtype(np.uint8): "NCCL_UINT8", np.dtype(np.int32): "NCCL_INT32",
           np.dtype(np.uint32): "NCCL_UINT32", np.dtype(np.int64): "NCCL_INT64",
           np.dtype(np.uint64): "NCCL_UINT64", np.dtype(np.float16): "NCCL_FLOAT16",
           np.dtype(np.float32): "NCCL_FLOAT32", np.dtype(np.float64): "NCCL_FLOAT64"}
_OPS = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX", "min": "NCCL_MIN"}


class NCCLCommunicator:
    """One rank's NCCL communicator on CUDA device ``device`` (default: ``rank % device count``)."""

    def __init__(self, bootstrap: Communicator, device: int | None = None) -> None:
        import cupy
        from cupy.cuda import nccl

        self.cp, self.nccl = cupy, nccl
        self.rank, self.world_size = bootstrap.rank, bootstrap.world_size
        self.device = cupy.cuda.Device(self.rank % cupy.cuda.runtime.getDeviceCount() if device is None else device)
        uid = np.zeros(nccl.get_unique_id().__len__(), dtype=np.int64)
        if self.rank == 0:
            uid[:] = nccl.get_unique_id()
        uid = bootstrap.broadcast(uid, 0)
        with self.device:
            self.comm = nccl.NcclCommunicator(self.world_size, tuple(int(v) for v in uid), self.rank)
            self.stream = cupy.cuda.Stream(non_blocking=True)

    def _type(self, x: Any) -> int:
        try:
            return getattr(self.nccl, _DTYPES[np.dtype(x.dtype)])
        except KeyError:
            raise TypeError(f"dtype {x.dtype} has no NCCL type (supported: "
                            f"{', '.join(str(d) for d in _DTYPES)})") from None

    def _op(self, op: str) -> int:
        if op not in _OPS and op != "mean":
            raise ValueError(f"op: {op!r} is not a reduction NCCL has (choose from sum, mean, prod, max, min; "
                             "NCCL has no bitwise reductions)")
        return getattr(self.nccl, _OPS.get(op, "NCCL_SUM"))

    def _done(self, out: Any, op: str = "sum") -> Any:
        self.stream.synchronize()
        if op == "mean":
            out /= self.world_size
        return out

    def all_reduce(self, x: Any, op: str = "sum") -> Any:
        with self.device:
            x = self.cp.ascontiguousarray(x)
            out = self.cp.empty_like(x)
            self.comm.allReduce(x.data.ptr, out.data.ptr, x.size, self._type(x), self._op(op), self.stream.ptr)
            return self._done(out, op)

    def reduce(self, x: Any, op: str = "sum", root: int = 0) -> Any | None:
        with self.device:
            x = self.cp.ascontiguousarray(x)
            out = self.cp.empty_like(x)
            self.comm.reduce(x.data.ptr, out.data.ptr, x.size, self._type(x), self._op(op), root, self.stream.ptr)
            out = self._done(out, op)
            return out if self.rank == root else None

    def broadcast(self, x: Any, root: int = 0) -> Any:
        with self.device:
            out = self.cp.array(x, copy=True, order="C")
            self.comm.broadcast(out.data.ptr, out.data.ptr, out.size, self._type(out), root, self.stream.ptr)
            return self._done(out)

    def all_gather(self, x: Any) -> Any:
        with self.device:
            x = self.cp.ascontiguousarray(x)
            out = self.cp.empty((self.world_size,) + x.shape, dtype=x.dtype)
            self.comm.allGather(x.data.ptr, out.data.ptr, x.size, self._type(x), self.stream.ptr)
            return self._done(out)

    def reduce_scatter(self, x: Any, op: str = "sum") -> Any:
        with self.device:
            x = self.cp.ascontiguousarray(x)
            if x.ndim == 0 or x.shape[0] != self.world_size:
                raise ValueError(f"reduce_scatter: input needs a leading axis of {self.world_size}, got {x.shape}")
            out = self.cp.empty(x.shape[1:], dtype=x.dtype)
            self.comm.reduceScatter(x.data.ptr, out.data.ptr, out.size, self._type(x), self._op(op),
                                    self.stream.ptr)
            return self._done(out, op)

    def gather(self, x: Any, root: int = 0) -> Any | None:
        with self.device:
            x = self.cp.ascontiguousarray(x)
            out = self.cp.empty((self.world_size,) + x.shape, dtype=x.dtype) if self.rank == root else None
            self.nccl.groupStart()
            if self.rank == root:
                for src in range(self.world_size):
                    if src == root:
                        out[src] = x
                    else:
                        self.comm.recv(out[src].data.ptr, x.size, self._type(x), src, self.stream.ptr)
            else:
                self.comm.send(x.data.ptr, x.size, self._type(x), root, self.stream.ptr)
            self.nccl.groupEnd()
            self.stream.synchronize()
            return out

    def scatter(self, x: Any, like: Any, root: int = 0) -> Any:
        """Rank ``i`` gets ``x[i]`` of the root's ``x``; ``like`` gives the block's shape and dtype on every rank."""
        with self.device:
            out = self.cp.empty(like.shape, dtype=like.dtype)
            self.nccl.groupStart()
            if self.rank == root:
                x = self.cp.ascontiguousarray(x)
                for dst in range(self.world_size):
                    if dst == root:
                        out[...] = x[dst]
                    else:
                        self.comm.send(x[dst].data.ptr, out.size, self._type(out), dst, self.stream.ptr)
            else:
                self.comm.recv(out.data.ptr, out.size, self._type(out), root, self.stream.ptr)
            self.nccl.groupEnd()
            return self._done(out)

    def barrier(self) -> None:
        self.all_reduce(self.cp.zeros(1, dtype=self.cp.float32))

    def close(self) -> None:
        self.comm.destroy()
