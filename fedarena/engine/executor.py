"""The numpy backend: compile a graph into one generated Python function.

The schedule is flat straight-line code, one numpy kernel call per equation, writing with
``out=`` into buffers allocated once per compiled signature; views (reshape, transpose, slices)
of those buffers and anything computed only from constants are evaluated once when the
executable is built (constant folding).  Graph outputs get fresh arrays every call, so callers
may keep them.  This is the "low per-operation overhead" design of the issue: for the small
networks of RL the cost of a step is dominated by interpreter dispatch, not arithmetic.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import scipy.special

from .ir import Graph, Literal, UnknownPrimitiveError, Var

_VIEW_PRIMS = frozenset({"transpose", "reshape", "broadcast_to", "squeeze", "expand_dims", "slice", "stop_gradient"})


def dead_code_elimination(graph: Graph) -> Graph:
    """Drop equations whose outputs never reach a graph output."""
    needed = {a for a in graph.outvars if isinstance(a, Var)}
    kept = []
    for e in reversed(graph.eqns):
        if any(o in needed for o in e.outputs):
            kept.append(e)
            needed.update(a for a in e.inputs if isinstance(a, Var))
    kept.reverse()
    return Graph(graph.invars, graph.constvars, graph.consts, kept, graph.outvars)


class _EmitContext:
    """Names for objects the generated code refers to (constants, kernels, index arrays)."""

    def __init__(self, ns: dict):
        self.ns = ns
        self._n = 0

    def const(self, value: Any) -> str:
        self._n += 1
        name = f"_k{self._n}"
        self.ns[name] = value
        return name


class _Instance:
    """One set of buffers and the generated function that runs on them."""

    __slots__ = ("run",)


class Executable:
    """A compiled graph: ``exe(*flat_inputs) -> list of outputs`` (numpy arrays).

    Each concurrently running thread gets its own buffer set, built on demand.
    """

    def __init__(self, graph: Graph, validate: bool = True):
        if validate:
            graph.validate()
        self.graph = dead_code_elimination(graph)
        self.source = ""
        self._pool: list = []
        self._pool.append(self._build())

    def _build(self):
        g = self.graph
        ns: dict[str, Any] = {"np": np, "_expit": scipy.special.expit, "_empty": np.empty}
        ctx = _EmitContext(ns)
        names: dict[Var, str] = {}
        static: set[Var] = set()  # values known once the executable is built
        is_output = {a for a in g.outvars if isinstance(a, Var)}
        for i, v in enumerate(g.invars):
            names[v] = f"i{i}"
        for c, v in zip(g.consts, g.constvars):
            names[v] = ctx.const(c)
            static.add(v)
        setup: list[str] = []
        body: list[str] = []

        def atom(a: Any) -> str:
            if isinstance(a, Literal):
                val = a.value
                if a.weak and isinstance(val, (bool, int)):
                    return repr(val)
                if a.weak and isinstance(val, float) and math.isfinite(val):
                    return repr(val)
                return ctx.const(a.aval.dtype.type(val))
            return names[a]

        for n, e in enumerate(g.eqns):
            if e.prim.emit is None:
                raise UnknownPrimitiveError(f"primitive {e.prim.name!r} has no numpy kernel")
            ins = [atom(a) for a in e.inputs]
            out = e.outputs[0]
            code = e.prim.emit(ctx, ins, e.attrs, [a.aval for a in e.inputs], out.aval)
            all_static = all(not isinstance(a, Var) or a in static for a in e.inputs)
            name = f"v{n}"
            if code.kind == "expr":
                if all_static and e.prim.name in _VIEW_PRIMS | {"gather"}:
                    ns_name = ctx.const(None)
                    setup.append(f"{ns_name} = {code.text}")
                    names[out] = ns_name
                    static.add(out)
                else:
                    body.append(f"{name} = {code.text}")
                    names[out] = name
                continue
            if out in is_output and not all_static:
                body.append(f"{name} = _empty({out.aval.shape!r}, np.{out.aval.dtype.name})")
                body.append(code.text.replace("{o}", name))
                names[out] = name
                continue
            buf = ctx.const(np.empty(out.aval.shape, out.aval.dtype))
            names[out] = buf
            line = code.text.replace("{o}", buf)
            if all_static:
                setup.append(line)
                static.add(out)
            else:
                body.append(line)

        rets = []
        for a in g.outvars:
            if isinstance(a, Literal):
                rets.append(f"np.asarray({atom(a)}, np.{a.aval.dtype.name})")
            elif a in g.invars:
                rets.append(names[a])
            elif a in static or names[a].startswith("_k"):
                rets.append(f"{names[a]}.copy()")
            elif _produced_by_expr(g, a):
                rets.append(f"np.array({names[a]})")
            else:
                rets.append(names[a])
        args = ", ".join(f"i{i}" for i in range(len(g.invars)))
        src = ["def _setup():"] + [f"    global {_targets(l)}" for l in setup if _targets(l)] + [f"    {l}" for l in setup] + ["    pass"]
        src += [f"def _run({args}):"] + [f"    {l}" for l in body] + [f"    return [{', '.join(rets)}]"]
        self.source = "\n".join(src)
        code_obj = compile(self.source, "<fedarena.engine compiled graph>", "exec")
        exec(code_obj, ns)
        ns["_setup"]()
        return ns["_run"]

    def __call__(self, *args: Any) -> list:
        pool = self._pool
        try:
            run = pool.pop()
        except IndexError:
            run = self._build()
        try:
            return run(*args)
        finally:
            pool.append(run)


def _targets(line: str) -> str:
    head = line.split("=", 1)[0].strip() if "=" in line.split("(", 1)[0] else ""
    return head if head.startswith("_k") and head.isidentifier() else ""


def _produced_by_expr(g: Graph, v: Var) -> bool:
    for e in g.eqns:
        if v in e.outputs:
            return e.prim.emit is not None and e.prim.name in _VIEW_PRIMS | {"gather", "stop_gradient"}
    return False


def compile_graph(graph: Graph, validate: bool = True) -> Executable:
    return Executable(graph, validate)
