"""The sharding vocabulary of the primitive families: the layout of a tensor over a 1-D mesh of ``n`` ranks and
the strategies a primitive's ``shard`` rule offers (MindSpore's operator-level partitioning: each operator
lists the ways it can run split over devices, and tensor redistribution joins operators whose layouts differ;
Su et al., "MindSpore: an all-scenario deep learning computing framework", 2021, and the auto-parallel design
of Wang et al., "Supporting very large models using automatic dataflow graph partitioning", EuroSys 2019).

A layout is replicated (every rank holds the whole tensor), split along one axis (rank ``r`` holds the ``r``-th
of ``n`` equal blocks of that axis) or partial (every rank holds a tensor of the full shape and the value is
their sum, max or min over the ranks; a row-sharded matmul leaves a partial sum). A primitive's rule
``shard(in_avals, attrs, out_aval, n) -> list[Strategy]`` is given global types; a :class:`Strategy` says
which layout each input must have and which layout the output then has, with the equation's attributes on
the local shards (``attrs``) and a local kernel ``kernel(rank, n, *arrays, **attrs)`` where the shard's
computation is not the primitive's own (a gather from a class-sharded table masks the indices another rank
holds). The transform that uses the rules lives in ``engine.sharding``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

PARTIAL_OPS = ("sum", "max", "min")


@dataclass(frozen=True)
class Layout:
    """How a tensor lies over the mesh: ``axis`` split over the ranks (``None``: not split); ``partial``:
    ``"sum"``/``"max"``/``"min"`` when every rank holds a full-shape term of that reduction."""

    axis: int | None = None
    partial: str | None = None

    def __post_init__(self) -> None:
        if self.axis is not None and self.partial is not None:
            raise ValueError("layout: a tensor is either split along an axis or partial, not both")
        if self.partial is not None and self.partial not in PARTIAL_OPS:
            raise ValueError(f"layout: partial must be one of {', '.join(PARTIAL_OPS)}, got {self.partial!r}")
        if self.axis is not None and (not isinstance(self.axis, int) or self.axis < 0):
            raise ValueError(f"layout: axis must be a non-negative int, got {self.axis!r}")

    @property
    def replicated(self) -> bool:
        return self.axis is None and self.partial is None

    def __repr__(self) -> str:
        if self.axis is not None:
            return f"S{self.axis}"
        return f"P{self.partial}" if self.partial else "R"


R = Layout()
PSUM = Layout(partial="sum")


def S(axis: int) -> Layout:
    """Split along ``axis``."""
    return Layout(axis=int(axis))


class Strategy(NamedTuple):
    """One way to run a primitive over the mesh: input layouts, output layout, local attributes and kernel."""

    ins: tuple
    out: Layout
    attrs: dict | None = None
    kernel: Callable | None = None


def splittable(size: int, n: int) -> bool:
    """An axis of ``size`` splits into ``n`` equal blocks."""
    return n > 1 and size >= n and size % n == 0


def local_shape(shape: Sequence[int], layout: Layout, n: int) -> tuple:
    """The shape of one rank's block of a tensor of global ``shape``."""
    shape = tuple(shape)
    if layout.axis is None:
        return shape
    return shape[: layout.axis] + (shape[layout.axis] // n,) + shape[layout.axis + 1:]


def with_axis(shape: Sequence[int], axis: int, n: int) -> tuple:
    """``shape`` with ``axis`` divided by ``n`` (a shape attribute on local shards)."""
    return local_shape(shape, S(axis), n)


def elementwise(in_avals: Sequence[Any], out_aval: Any, n: int, partial: str = "") -> list[Strategy]:
    """Strategies of a broadcasting elementwise primitive: everything replicated, or the output split along an
    axis with each operand split along its own aligned axis (replicated where it broadcasts there).
    ``partial`` names how the primitive is linear, giving partial-sum strategies: ``"all"`` (every operand a
    partial sum: add, sub), ``"one"`` (one partial operand times replicated ones: mul), ``"first"`` (the first
    operand partial: div by a replicated divisor), ``"unary"`` (neg, cast, stop_gradient)."""
    k = len(in_avals)
    out = [Strategy((R,) * k, R)]
    nd = len(out_aval.shape)
    for ax in range(nd):
        if not splittable(out_aval.shape[ax], n):
            continue
        ins = []
        for av in in_avals:
            j = ax - (nd - len(av.shape))
            ins.append(S(j) if j >= 0 and av.shape[j] == out_aval.shape[ax] else R)
        out.append(Strategy(tuple(ins), S(ax)))
    if partial in ("all", "unary"):
        out.append(Strategy((PSUM,) * k, PSUM))
    elif partial == "one":
        out.extend(Strategy(tuple(PSUM if i == j else R for i in range(k)), PSUM) for j in range(k))
    elif partial == "first":
        out.append(Strategy((PSUM,) + (R,) * (k - 1), PSUM))
    return out


def axis_map(in_aval: Any, out_aval: Any, n: int, pairs: Sequence[tuple[int, int]],
             local_attrs: Callable[[int], dict] | None = None, linear: bool = True) -> list[Strategy]:
    """Strategies of a one-operand primitive that carries input axis ``i`` to output axis ``j`` for each
    ``(i, j)`` in ``pairs``: replicated, split ``i`` -> split ``j`` (attributes ``local_attrs(j)``), and, when
    ``linear``, partial sum -> partial sum."""
    out = [Strategy((R,), R)]
    for i, j in pairs:
        if splittable(in_aval.shape[i], n) and splittable(out_aval.shape[j], n):
            out.append(Strategy((S(i),), S(j), local_attrs(j) if local_attrs else None))
    if linear:
        out.append(Strategy((PSUM,), PSUM))
    return out


__all__ = ["Layout", "PARTIAL_OPS", "PSUM", "R", "S", "Strategy", "axis_map", "elementwise", "local_shape",
           "splittable", "with_axis"]
