"""Builders for hand-written graphs in the pass and kernel-selection tests."""

from __future__ import annotations

import numpy as np

from fedarena.engine.core.ir import Eqn, ShapedArray, Var
from fedarena.engine.core.tracing import PRIMITIVES


def V(*shape, dtype=np.float64) -> Var:
    """A fresh variable of this shape and dtype."""
    return Var(ShapedArray(shape, dtype))


def eq(name: str, ins: list, out: Var, **attrs) -> Eqn:
    """``out = name[attrs](*ins)``."""
    return Eqn(PRIMITIVES[name], ins, [out], attrs, None)


def prims(g) -> list:
    """The primitive names of a graph's equations, in order."""
    return [e.prim.name for e in g.eqns]
