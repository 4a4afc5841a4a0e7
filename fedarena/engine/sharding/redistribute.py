"""Tensor redistribution: the collectives that turn one layout of a tensor into another over a 1-D mesh
(MindSpore's tensor redistribution between operators whose strategies disagree; Su et al. 2021).

Each step is a :class:`Collective` run on one rank's block with that rank's communicator:
``all_gather[axis]`` (split -> replicated), ``all_reduce[op]`` (partial -> replicated), ``reduce_scatter[axis]``
(partial sum -> split), ``shard_slice[axis]`` (replicated -> split, no communication) and ``to_partial``
(replicated -> partial sum: rank 0 keeps the value, the others hold zeros). :func:`plan` gives the steps for
a pair of layouts and :func:`plan_time` their alpha-beta time (``collectives.cost_model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..collectives import cost_model
from ..primitives.sharding import Layout, R, S


@dataclass(frozen=True)
class Collective:
    """One redistribution step; ``name`` is what the sharded program's text shows."""

    name: str
    axis: int | None = None
    op: str | None = None

    @property
    def attrs(self) -> dict:
        return {k: v for k, v in (("axis", self.axis), ("op", self.op)) if v is not None}

    def out_layout(self, src: Layout) -> Layout:
        if self.name in ("all_gather", "all_reduce"):
            return R
        if self.name in ("reduce_scatter", "shard_slice"):
            return S(self.axis)
        return Layout(partial="sum")  # to_partial

    def run(self, comm: Any, x: np.ndarray) -> np.ndarray:
        n, rank = comm.world_size, comm.rank
        x = np.asarray(x)
        if self.name == "all_gather":
            blocks = comm.all_gather(np.ascontiguousarray(x))
            return np.concatenate(list(blocks), axis=self.axis)
        if self.name == "all_reduce":
            return comm.all_reduce(x, op=self.op)
        if self.name == "reduce_scatter":
            return comm.reduce_scatter(np.stack(np.split(x, n, axis=self.axis)), op="sum")
        if self.name == "shard_slice":
            return np.ascontiguousarray(np.split(x, n, axis=self.axis)[rank])
        if self.name == "to_partial":
            return np.array(x, copy=True) if rank == 0 else np.zeros_like(x)
        raise AssertionError(self.name)

    def time(self, nbytes: float, n: int, alpha: float, beta: float, chunk_bytes: int) -> float:
        """Predicted seconds for a tensor of ``nbytes`` (global size) on ``n`` ranks."""
        coll = {"all_gather": "all_gather", "all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter"}.get(self.name)
        if coll is None:
            return 0.0
        alg = cost_model.choose(coll, nbytes, n, alpha, beta, chunk_bytes)
        return cost_model.predict(coll, alg, nbytes, n, alpha, beta, chunk_bytes)

    def bytes_sent(self, nbytes: float, n: int, alpha: float, beta: float, chunk_bytes: int) -> float:
        """Bytes on the critical path of the chosen algorithm (what each rank sends for the ring)."""
        coll = {"all_gather": "all_gather", "all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter"}.get(self.name)
        if coll is None:
            return 0.0
        alg = cost_model.choose(coll, nbytes, n, alpha, beta, chunk_bytes)
        return cost_model.coefficients(coll, alg, nbytes, n, chunk_bytes)[1]


def plan(src: Layout, dst: Layout) -> list[Collective]:
    """The steps that turn a tensor laid out as ``src`` into ``dst``."""
    if src == dst:
        return []
    if src.replicated:
        if dst.axis is not None:
            return [Collective("shard_slice", axis=dst.axis)]
        if dst.partial == "sum":
            return [Collective("to_partial")]
        return []  # every rank holding x is a max (min) partial of x
    if src.axis is not None:
        return [Collective("all_gather", axis=src.axis)] + plan(R, dst)
    # partial source
    if src.partial == "sum" and dst.axis is not None:
        return [Collective("reduce_scatter", axis=dst.axis)]
    return [Collective("all_reduce", op=src.partial)] + plan(R, dst)


def plan_time(src: Layout, dst: Layout, nbytes: float, n: int, alpha: float, beta: float,
              chunk_bytes: int = 1 << 20) -> float:
    return sum(c.time(nbytes, n, alpha, beta, chunk_bytes) for c in plan(src, dst))


__all__ = ["Collective", "plan", "plan_time"]
