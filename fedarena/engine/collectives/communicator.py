"""A communicator: this rank's view of a group, with the collective operations over one transport.

All ranks must call the same collectives in the same order with the same algorithm, op and shapes (as in MPI);
a mismatch is reported by the transport's header check as a one-line error. Inputs are never modified; results
are new arrays. Reductions apply the numpy ufunc (``sum``: ``np.add``, ``prod``: ``np.multiply``, ``max``:
``np.maximum``, ``min``: ``np.minimum``; for integer and boolean arrays only, the bitwise ``band``:
``np.bitwise_and``, ``bor``: ``np.bitwise_or``, ``bxor``: ``np.bitwise_xor``, MPI's ``MPI_BAND``/``BOR``/``BXOR``)
elementwise in the array's dtype, so integer sums and products wrap around as in numpy, a boolean sum is a
logical or and a boolean product a logical and; ``mean`` is the sum divided by ``world_size`` (in float64 for
integer and boolean inputs, like ``np.mean``). The ufunc is applied by the receiving rank as each message
arrives, so every transport (threads, shared memory, TCP, Ray) supports every op. A rank that fails inside a collective calls ``transport.abort`` so the others stop waiting.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import algorithms as alg
from .cost_model import ALGORITHMS, choose
from .transport import contiguous, CollectiveError, PeerFailure, Transport

OPS: dict[str, Callable[..., np.ndarray]] = {"sum": np.add, "mean": np.add, "prod": np.multiply, "max": np.maximum,
                                             "min": np.minimum, "band": np.bitwise_and, "bor": np.bitwise_or,
                                             "bxor": np.bitwise_xor}
BITWISE = frozenset({"band", "bor", "bxor"})
"""The reductions defined for integer and boolean arrays only."""


class Communicator:
    """Collectives for one rank. ``algorithm``: ``"auto"`` (the alpha-beta model's cheapest for the message
    size, see :mod:`.cost_model`) or a fixed name; ``chunk_bytes``: the pipelining unit of large transfers."""

    def __init__(self, transport: Transport, algorithm: str = "auto", chunk_bytes: int = 1 << 20) -> None:
        if chunk_bytes < 64:
            raise ValueError(f"chunk_bytes: must be >= 64, got {chunk_bytes}")
        self.transport = transport
        self.algorithm = algorithm
        self.chunk_bytes = int(chunk_bytes)
        self._scratch = np.empty(0, dtype=np.uint8)

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def world_size(self) -> int:
        return self.transport.world_size

    # ----------------------------------------------------------------------------------------------- helpers
    def _pick(self, collective: str, algorithm: str | None, nbytes: int) -> str:
        name = algorithm or self.algorithm
        if name == "auto":
            t = self.transport
            return choose(collective, nbytes, self.world_size, t.alpha, t.beta, self.chunk_bytes)
        if name not in ALGORITHMS[collective]:
            raise ValueError(f"algorithm: {name!r} is not an algorithm of {collective} "
                             f"(choose from auto, {', '.join(ALGORITHMS[collective])})")
        return name

    def _chunk(self, dtype: np.dtype) -> int:
        return max(1, self.chunk_bytes // max(1, dtype.itemsize))

    def _root(self, root: int) -> int:
        if not 0 <= root < self.world_size:
            raise ValueError(f"root: {root} is not a rank of this group (world_size {self.world_size})")
        return root

    def _guard(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return fn()
        except PeerFailure as exc:
            self.transport.abort(f"{what} failed: {exc}")
            raise PeerFailure(f"rank {self.rank}: {what}: {exc}") from None
        except Exception as exc:
            self.transport.abort(f"{what} failed: {type(exc).__name__}: {exc}")
            raise

    @staticmethod
    def _op(op: str, x: Any = None) -> Callable[..., np.ndarray]:
        if op not in OPS:
            raise ValueError(f"op: {op!r} is not a reduction (choose from {', '.join(OPS)})")
        if op in BITWISE:
            dtype = np.asarray(x).dtype
            if dtype.kind not in "biu":
                raise ValueError(f"op: {op!r} is a bitwise reduction, for integer or boolean arrays; got {dtype}")
        return OPS[op]

    def _work(self, x: Any, op: str, out: np.ndarray | None = None) -> np.ndarray:
        a = np.asarray(x)
        dtype = np.dtype(np.float64) if op == "mean" and a.dtype.kind not in "fc" else a.dtype
        if out is None:
            return np.array(a, dtype=dtype, order="C", copy=True)
        if not isinstance(out, np.ndarray) or out.shape != a.shape or out.dtype != dtype \
                or not out.flags.c_contiguous:
            raise ValueError(f"out: needs a C-contiguous {dtype}{list(a.shape)} array")
        if not (out.__array_interface__["data"][0] == a.__array_interface__["data"][0] and a.flags.c_contiguous):
            np.copyto(out, a)
        return out

    def _workspace(self, like: np.ndarray) -> np.ndarray:
        """A reusable working copy of ``like`` (the communicator's scratch, grown as needed)."""
        if self._scratch.nbytes < like.nbytes:
            self._scratch = np.empty(like.nbytes, dtype=np.uint8)
        work = self._scratch[:like.nbytes].view(like.dtype).reshape(like.shape)
        np.copyto(work, like)
        return work

    def _finish(self, buf: np.ndarray, op: str) -> np.ndarray:
        if op == "mean" and self.world_size > 1:
            buf /= self.world_size
        return buf

    # --------------------------------------------------------------------------------------------- collectives
    def all_reduce(self, x: Any, op: str = "sum", algorithm: str | None = None,
                   out: np.ndarray | None = None) -> np.ndarray:
        """The reduction on every rank; ``out`` (optional, may be ``x`` itself) receives it."""
        fn = self._op(op, x)
        out = self._work(x, op, out)
        if self.world_size == 1:
            return out
        name = self._pick("all_reduce", algorithm, out.nbytes)
        flat = out.reshape(-1)
        run = {"ring": alg.ring_all_reduce, "tree": alg.tree_all_reduce,
               "halving_doubling": alg.halving_doubling_all_reduce}[name]
        self._guard(lambda: run(self.transport, flat, fn, self._chunk(out.dtype)), f"all_reduce[{name}]")
        return self._finish(out, op)

    def reduce(self, x: Any, op: str = "sum", root: int = 0, algorithm: str | None = None) -> np.ndarray | None:
        """The reduction on ``root``; ``None`` on the other ranks."""
        fn = self._op(op, x)
        root = self._root(root)
        out = self._work(x, op)
        if self.world_size > 1:
            name = self._pick("reduce", algorithm, out.nbytes)
            run = {"tree": alg.tree_reduce, "ring": alg.chain_reduce}[name]
            self._guard(lambda: run(self.transport, out.reshape(-1), root, fn, self._chunk(out.dtype)),
                        f"reduce[{name}]")
        return self._finish(out, op) if self.rank == root else None

    def broadcast(self, x: Any, root: int = 0, algorithm: str | None = None) -> np.ndarray:
        """``root``'s array on every rank; the other ranks pass an array of the same shape and dtype (its
        values are ignored)."""
        root = self._root(root)
        out = np.array(x, order="C", copy=True)
        if self.world_size > 1:
            name = self._pick("broadcast", algorithm, out.nbytes)
            run = {"tree": alg.tree_broadcast, "ring": alg.chain_broadcast}[name]
            self._guard(lambda: run(self.transport, out.reshape(-1), root, self._chunk(out.dtype)),
                        f"broadcast[{name}]")
        return out

    def gather(self, x: Any, root: int = 0, algorithm: str | None = None) -> np.ndarray | None:
        """``np.stack`` of every rank's array on ``root`` (rank order); ``None`` elsewhere."""
        root = self._root(root)
        block = contiguous(x)
        if self.world_size == 1:
            return block[None].copy()
        name = self._pick("gather", algorithm, block.nbytes * self.world_size)
        run = {"tree": alg.tree_gather, "linear": alg.linear_gather}[name]
        return self._guard(lambda: run(self.transport, block, root), f"gather[{name}]")

    def scatter(self, x: Any | None, root: int = 0, algorithm: str | None = None) -> np.ndarray:
        """Rank ``i`` gets ``x[i]`` of the root's ``x`` (leading axis ``world_size``); the other ranks may pass
        ``None`` (dtype and shape arrive in the message headers)."""
        root = self._root(root)
        blocks = None
        if self.rank == root:
            blocks = np.asarray(x)
            if blocks.ndim == 0 or blocks.shape[0] != self.world_size:
                raise ValueError(f"scatter: the root's array needs a leading axis of {self.world_size}, "
                                 f"got shape {blocks.shape}")
        if self.world_size == 1:
            return np.array(blocks[0, ...])
        # "auto" means tree here: only the root knows the size, and every rank must pick the same algorithm
        name = self._pick("scatter", algorithm, 0) if (algorithm or self.algorithm) != "auto" else "tree"
        run = {"tree": alg.tree_scatter, "linear": alg.linear_scatter}[name]
        return self._guard(lambda: run(self.transport, blocks, root), f"scatter[{name}]")

    def all_gather(self, x: Any, algorithm: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """``np.stack`` of every rank's array, on every rank (into ``out`` when given)."""
        block = contiguous(x)
        n = self.world_size
        if out is None:
            out = np.empty((n,) + block.shape, dtype=block.dtype)
        elif out.shape != (n,) + block.shape or out.dtype != block.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out: needs a C-contiguous {block.dtype}{[n, *block.shape]} array")
        out[self.rank, ...] = block
        if n == 1:
            return out
        name = self._pick("all_gather", algorithm, out.nbytes)
        flat, m = out.reshape(-1), block.size

        def run() -> None:
            if name == "ring":
                alg.ring_all_gather(self.transport, flat, [i * m for i in range(n + 1)], self._chunk(out.dtype),
                                    self.rank)
            elif name == "halving_doubling":
                alg.doubling_block_all_gather(self.transport, flat, m, self._chunk(out.dtype))
            else:
                g = alg.tree_gather(self.transport, block, 0)
                if g is not None:
                    out[...] = g
                alg.tree_broadcast(self.transport, flat, 0, self._chunk(out.dtype))

        self._guard(run, f"all_gather[{name}]")
        return out

    def reduce_scatter(self, x: Any, op: str = "sum", algorithm: str | None = None) -> np.ndarray:
        """Rank ``i`` gets the reduction over ranks of ``x[i]`` (leading axis ``world_size``)."""
        a = np.asarray(x)
        fn = self._op(op, a)
        n = self.world_size
        if a.ndim == 0 or a.shape[0] != n:
            raise ValueError(f"reduce_scatter: input needs a leading axis of {n}, got shape {a.shape}")
        if n == 1:
            return self._finish(self._work(a, op)[0, ...].copy(), op)
        work = self._workspace(a.astype(np.float64) if op == "mean" and a.dtype.kind not in "fc" else a)
        name = self._pick("reduce_scatter", algorithm, work.nbytes)
        flat, m = work.reshape(-1), work[0].size
        chunk = self._chunk(work.dtype)

        def run() -> np.ndarray:
            if name == "ring":
                alg.ring_reduce_scatter(self.transport, flat, [i * m for i in range(n + 1)], fn, chunk, offset=-1)
                return work[self.rank, ...].copy()
            if name == "halving_doubling":
                alg.halving_block_reduce_scatter(self.transport, flat, m, fn, chunk)
                return work[self.rank, ...].copy()
            alg.tree_reduce(self.transport, flat, 0, fn, chunk)
            return alg.tree_scatter(self.transport, work if self.rank == 0 else None, 0)

        return self._finish(self._guard(run, f"reduce_scatter[{name}]"), op)

    def barrier(self) -> None:
        if self.world_size > 1:
            self._guard(lambda: alg.dissemination_barrier(self.transport), "barrier")

    def close(self) -> None:
        self.transport.close()


__all__ = ["BITWISE", "Communicator", "CollectiveError", "PeerFailure", "OPS"]
