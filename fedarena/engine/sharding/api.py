"""``shard_jit``: trace a function once per signature, shard its graph over a 1-D mesh of ranks and run this
rank's part (named after JAX's ``jit(fn, in_shardings=..., out_shardings=...)`` over a ``Mesh``; the layouts
are MindSpore's operator-level partitioning, Su et al. 2021).

Each rank's process calls the sharded function with its own blocks of the arguments (a split argument's block
along its split axis, a replicated argument whole) and gets its blocks of the results; all ranks call it
together, as with any collective. ``in_shardings`` / ``out_shardings`` are pytree prefixes of the arguments /
results whose leaves are layouts: ``R`` (replicated) or ``S(axis)`` (split along ``axis``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..core.ir import ShapedArray, check_dtype
from ..core.pytree import tree_flatten, tree_unflatten
from ..core.tracing import trace_flat
from ..primitives.sharding import Layout, R
from .cost import CostModel
from .propagate import ShardedProgram, ShardingError, shard_graph


class Mesh:
    """A 1-D mesh: the ranks of a communicator (``collectives.Communicator``; one per process)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    @property
    def size(self) -> int:
        return self.comm.world_size

    @property
    def rank(self) -> int:
        return self.comm.rank

    def __repr__(self) -> str:
        return f"Mesh(size={self.size}, rank={self.rank})"


def layouts_for(spec: Any, value: Any, what: str) -> list[Layout]:
    """One layout per leaf of ``value``: ``spec`` is a layout (for every leaf below), ``None`` (replicated) or a
    dict / list / tuple with the structure of ``value`` down to where layouts are given."""
    if spec is None:
        return [R] * len(tree_flatten(value)[0])
    if isinstance(spec, Layout):
        return [spec] * len(tree_flatten(value)[0])
    if isinstance(spec, dict) and isinstance(value, dict):
        if set(spec) != set(value):
            raise ShardingError(f"{what}: keys {sorted(map(str, spec))} do not match the value's {sorted(map(str, value))}")
        out: list[Layout] = []
        for k in sorted(value):  # the pytree's leaf order
            out += layouts_for(spec[k], value[k], f"{what}[{k!r}]")
        return out
    if isinstance(spec, (list, tuple)) and isinstance(value, (list, tuple)):
        if len(spec) != len(value):
            raise ShardingError(f"{what}: {len(spec)} layouts for {len(value)} values")
        out = []
        for i, (s, v) in enumerate(zip(spec, value)):
            out += layouts_for(s, v, f"{what}[{i}]")
        return out
    raise ShardingError(f"{what}: expected a layout (R or S(axis)) or a container like the value, got {type(spec).__name__}")


def global_shape(local: Sequence[int], layout: Layout, n: int) -> tuple:
    shape = tuple(int(s) for s in local)
    if layout.axis is None:
        return shape
    if layout.axis >= len(shape):
        raise ShardingError(f"layout S({layout.axis}) is out of range for a block of shape {shape}")
    return shape[: layout.axis] + (shape[layout.axis] * n,) + shape[layout.axis + 1:]


class ShardedFunction:
    """The callable ``shard_jit`` returns; ``lower(*args)`` gives the :class:`ShardedProgram` (print it)."""

    def __init__(self, fn: Callable, mesh: Mesh, in_shardings: Any, out_shardings: Any, cost: CostModel | None) -> None:
        self.fn, self.mesh = fn, mesh
        self.in_shardings, self.out_shardings = in_shardings, out_shardings
        self.cost = cost or CostModel(alpha=mesh.comm.transport.alpha, beta=mesh.comm.transport.beta,
                                      chunk_bytes=mesh.comm.chunk_bytes)
        self._cache: dict = {}

    def lower(self, *args: Any) -> tuple[ShardedProgram, Any]:
        leaves, treedef = tree_flatten(args)
        lays = layouts_for(tuple(self.in_shardings) if isinstance(self.in_shardings, list) else self.in_shardings,
                           args, "in_shardings")
        arrays = [np.asarray(x) for x in leaves]
        key = (treedef, tuple((a.shape, a.dtype.str) for a in arrays))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        n = self.mesh.size
        avals = [ShapedArray(global_shape(a.shape, lay, n), check_dtype(a.dtype, "shard_jit argument"))
                 for a, lay in zip(arrays, lays)]
        out_tree: list = []

        def flat_fn(tracers: list) -> list:
            out = self.fn(*tree_unflatten(treedef, tracers))
            out_leaves, td = tree_flatten(out)
            out_tree.append((td, out))
            return out_leaves

        graph, captured = trace_flat(flat_fn, avals)
        if captured:
            raise ShardingError("shard_jit: the function closes over values traced by an enclosing transformation")
        td, out_value = out_tree[0]
        out_lays = layouts_for(self.out_shardings, out_value, "out_shardings")
        program = shard_graph(graph, n, lays, out_lays, self.cost)
        self._cache[key] = (program, td)
        return program, td

    def __call__(self, *args: Any) -> Any:
        program, td = self.lower(*args)
        leaves = [np.asarray(x) for x in tree_flatten(args)[0]]
        return tree_unflatten(td, program.run(self.mesh.comm, leaves))

    def profile(self, *args: Any, hosts: list | None = None) -> tuple[Any, list[float]]:
        """Run like a call and also time each compiled segment's call in it: ``(results, seconds per
        segment)``, what :meth:`ShardedProgram.predicted_time` takes as measured compute; a list ``hosts``
        receives the seconds of each host step's own call, in the order the rank runs them."""
        program, td = self.lower(*args)
        leaves = [np.asarray(x) for x in tree_flatten(args)[0]]
        times: list[float] = []
        return tree_unflatten(td, program.run(self.mesh.comm, leaves, profile=times, hosts=hosts)), times


def shard_jit(fn: Callable, mesh: Mesh, in_shardings: Any = None, out_shardings: Any = None,
              cost: CostModel | None = None) -> ShardedFunction:
    """Shard ``fn`` over ``mesh``: ``in_shardings``/``out_shardings`` lay out its arguments/results (default:
    replicated); ``cost`` is the model that picks each equation's strategy (default: the transport's
    alpha-beta constants and this module's compute constants)."""
    return ShardedFunction(fn, mesh, in_shardings, out_shardings, cost)


def block(x: np.ndarray, layout: Layout, rank: int, n: int) -> np.ndarray:
    """Rank ``rank``'s block of the global array ``x`` laid out as ``layout``."""
    if layout.axis is None:
        return np.asarray(x)
    return np.ascontiguousarray(np.split(np.asarray(x), n, axis=layout.axis)[rank])


__all__ = ["Mesh", "ShardedFunction", "block", "global_shape", "layouts_for", "shard_jit"]
