"""The numpy backend: compile a graph into one generated Python function.

The schedule is flat straight-line code, one numpy kernel call per equation, writing with
``out=`` into buffers allocated once per compiled signature; views (reshape, transpose, slices)
of those buffers and anything computed only from constants are evaluated once when the
executable is built (constant folding).  Graph outputs get fresh arrays every call, so callers
may keep them.  This is the "low per-operation overhead" design of the issue: for the small
networks of RL the cost of a step is dominated by interpreter dispatch, not arithmetic.

Buffers come from the memory planner (:mod:`.memory_plan`): ranges of one byte arena shared by
values whose lifetimes do not overlap, elementwise equations running in place over an operand
that dies there.  Building takes two passes over the schedule (the first tells the planner which
values need memory, the second emits code on the packed arena).  A few kernels are chosen here
for dispatch cost: 0-d steps read only by 0-d steps run on numpy scalars with Python operators,
scalar literals of ufuncs are typed 0-d constants, max/min over a short axis of a buffer become
binary ufuncs over build-time views, outer products become a one-term matmul.
"""

from __future__ import annotations

import functools
import math
from sys import getrefcount as _refcount
from typing import Any

import numpy as np
import scipy.special

from ...core.ir import Graph, Literal, ShapedArray, UnknownPrimitiveError, Var, is_float
from ...core.nonfinite import raise_non_finite
from ...core.tracing import names_with
from ...primitives.emit import CLIP as _CLIP
from ...primitives.emit import Code
from ...primitives.emit import EmitContext as _EmitContext
from ...compiler.memory_plan import VIEW_PRIMITIVES, BufferPlanner, in_place_operands, nbytes, size_of
from ...compiler import native
from ...compiler.passes import dead_code_elimination

_VIEW_PRIMS = VIEW_PRIMITIVES
_ELEMENTWISE = names_with("elementwise")  # derived from the primitives' traits
# primitives emitted as one ufunc call on their operands, whose scalar literals become 0-d constants
_SCALAR_CONST_PRIMS = frozenset(
    {"add", "sub", "mul", "div", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "select"}
)
_OPERATORS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_UNROLL_REDUCE = {"reduce_max": "np.maximum", "reduce_min": "np.minimum"}
# 0-d equations computed on numpy scalars (Python operators follow numpy's rules for them)
_SCALAR_EXPR = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})", "pow": "({0} ** {1})",
    "neg": "(-{0})", "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})", "maximum": "np.maximum({0}, {1})", "minimum": "np.minimum({0}, {1})",
    "exp": "np.exp({0})", "log": "np.log({0})", "log1p": "np.log1p({0})", "tanh": "np.tanh({0})", "sqrt": "np.sqrt({0})",
    "sin": "np.sin({0})", "cos": "np.cos({0})", "abs": "np.absolute({0})", "sign": "np.sign({0})",
    "logistic": "_expit({0})", "cast": None,
}
_SMALL = 2048  # elements; below this, a broadcasting operator (which allocates) beats a ufunc with out=


RECYCLE_MIN_BYTES = 64 * 1024
RECYCLE_MAX_BYTES = 32 * 1024 * 1024
"""Outputs of this size come from an :class:`OutputRecycler` (below: small ones are cheap to allocate;
above: keeping spares would hold too much memory)."""


class OutputRecycler:
    """Fresh output arrays of one shape and dtype for successive calls, reusing one that nobody
    references any more.

    A graph output must be a new array the caller may keep.  Allocating a large one every call
    costs page faults: glibc's malloc returns big freed blocks to the system (``mmap`` or a heap
    trim) and the next call touches fresh pages (an MLP 784-512-512-10 Adam step: ~950 minor faults,
    a fifth of its time).  So the recycler keeps the arrays it handed out (at most ``KEEP``) and
    hands one out again only when its reference count says that only the recycler still holds it:
    no caller variable, no view (a view references its base), no buffer export.  In a training
    loop that passes the outputs back in, the outputs of the call before last are free again.
    """

    KEEP = 2
    __slots__ = ("shape", "dtype", "pool")

    def __init__(self, shape: tuple, dtype: np.dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.pool: list = []

    def take(self) -> np.ndarray:
        for a in self.pool:
            if _refcount(a) == 3:  # the pool's list, the loop variable and getrefcount's argument
                return a
        a = np.empty(self.shape, self.dtype)
        if len(self.pool) < self.KEEP:
            self.pool.append(a)
        return a

    def copy(self, x: np.ndarray) -> np.ndarray:
        a = self.take()
        np.copyto(a, x)
        return a


class _Instance:
    """One set of buffers and the generated function that runs on them."""

    __slots__ = ("run",)


class Executable:
    """A compiled graph: ``exe(*flat_inputs) -> list of outputs`` (numpy arrays).

    Each concurrently running thread gets its own buffer set, built on demand.  ``memory`` is the
    :class:`~fedarena.engine.memory_plan.MemoryPlan` the generated code follows (bytes per buffer
    set), ``source`` the generated code.
    """

    def __init__(self, graph: Graph, validate: bool = True, reuse: bool = True, check_finite: bool = False):
        if validate:
            graph.validate()
        # check_finite (the NaN debugger, core/nonfinite.py): after each equation with a float output the
        # code tests it and raises NonFiniteError at the first NaN/Inf; every value keeps a buffer of its own
        # so the operands are still intact for the error's statistics
        self.check_finite = check_finite
        self.reuse = reuse and not check_finite  # False: no buffer sharing, no in-place (one buffer per value)
        self.graph = dead_code_elimination(graph)
        self.source = ""
        self._packing = None  # the planner's offline buffer assignment, shared by every buffer set
        self._pool: list = []
        self._pool.append(self._build())

    def _build(self):
        """A new buffer set and the generated function that runs on it."""
        if self._packing is None and self.reuse:
            # first pass: which values the code keeps in buffers, which run in place
            probe = BufferPlanner(self.graph, True)
            self._emit(probe, probe=True)
            self._packing = probe.pack()
        return self._emit(BufferPlanner(self.graph, self.reuse, self._packing))

    def _emit(self, planner: BufferPlanner, probe: bool = False):
        """Generate the code of one buffer set, taking buffers from ``planner`` (``probe``: only
        to record the requests; no code is compiled)."""
        g = self.graph
        ns: dict[str, Any] = {"np": np, "_expit": scipy.special.expit, "_empty": np.empty, "_clip": _CLIP}
        ctx = _EmitContext(ns)
        names: dict[Var, str] = {}
        storage: dict[Var, str] = {}  # input | const | buffer | fresh (allocated per call)
        root: dict[Var, Var] = {}  # the variable whose memory a view aliases
        static: set[Var] = set()  # values known once the executable is built (constant folding)
        outs = {a for a in g.outvars if isinstance(a, Var)}
        consumers: dict[Var, list] = {}
        for e in g.eqns:
            for a in e.inputs:
                if isinstance(a, Var):
                    consumers.setdefault(a, []).append(e)
        # Memory planning (memory_plan.BufferPlanner, the engine's one planner): every value this
        # code keeps in a buffer asks the planner for one, in schedule order; a buffer is a byte
        # array and each value a typed, reshaped view of it made once here.
        views: dict[tuple, str] = {}  # (buffer id, shape, dtype) -> name of that view
        fresh_bytes = 0  # bytes the generated code allocates per call

        def buffer_for(n: int, out: Var, cands: tuple, dedicated: bool) -> tuple[str, Var | None]:
            bid, donor = planner.assign(n, out, cands, dedicated)
            base = ns.get(f"_b{bid}")
            if base is None:
                size, off = planner.plan.buffer_bytes[bid], planner.plan.offset.get(bid)
                if off is None:  # a block of its own (dedicated, or the first pass)
                    base = np.empty(size, np.uint8)
                else:  # a range of the arena
                    if "_arena" not in ns:
                        ns["_arena"] = np.empty(planner.plan.arena_bytes, np.uint8)
                    base = ns["_arena"][off : off + size]
                ns[f"_b{bid}"] = base
            key = (bid, out.aval.shape, out.aval.dtype)
            if key not in views:
                views[key] = ctx.const(base[: nbytes(out)].view(out.aval.dtype).reshape(out.aval.shape))
            return views[key], donor

        phys: dict[Var, tuple] = {}  # shape of the array a name holds when it differs (elided broadcasts)
        escapes = set(outs)  # variables whose memory reaches an output through views
        for e in reversed(g.eqns):
            if e.prim.name in _VIEW_PRIMS and e.outputs[0] in escapes and isinstance(e.inputs[0], Var):
                escapes.add(e.inputs[0])
        for i, v in enumerate(g.invars):
            names[v] = f"i{i}"
            storage[v] = "input"
        for c, v in zip(g.consts, g.constvars):
            names[v] = ctx.const(c)
            storage[v] = "const"
            static.add(v)
        body: list[str] = []
        setup: list[str] = []

        def run_now(line: str) -> None:
            setup.append(line)
            exec(line, ns)  # noqa: S102 - our own generated code

        def atom(a: Any) -> str:
            if isinstance(a, Literal):
                val = a.value
                if a.weak and isinstance(val, (bool, int)):
                    return repr(val)
                if a.weak and isinstance(val, float) and math.isfinite(val):
                    return repr(val)
                return ctx.const(a.aval.dtype.type(val))
            return names[a]

        scalar_consts: dict = {}

        def ufunc_literal(a: Literal, operands: list) -> str | None:
            """A literal operand of a ufunc as a 0-d array of the dtype numpy would convert it to
            (NEP 50: a Python scalar takes the array operands' type): ufuncs take that path about
            twice as fast as a Python scalar, which they must convert on every call."""
            val = a.value
            try:
                dt = np.result_type(*[b.aval.dtype for b in operands if isinstance(b, Var)], val if a.weak else a.aval.dtype)
                c = np.asarray(val, dt)
            except (OverflowError, TypeError, ValueError):
                return None
            if c.item() != val and not (isinstance(val, float) and (math.isnan(val) or dt.kind == "f")):
                return None  # a Python int that this dtype cannot hold exactly: keep numpy's own handling
            key = (c.dtype.str, c.tobytes())
            if key not in scalar_consts:
                scalar_consts[key] = ctx.const(c)
            return scalar_consts[key]

        scalars: set[Var] = set()  # 0-d values held as numpy scalars

        def scalar_expr(e: Any, out: Var) -> str | None:
            """Python source computing ``e`` on numpy scalars, if it yields ``out``'s dtype."""
            args, trial = [], []
            for a in e.inputs:
                if isinstance(a, Literal):
                    args.append(atom(a))
                    trial.append(args[-1])
                elif a in scalars:
                    args.append(names[a])
                elif a in static:
                    args.append(ctx.const(np.asarray(ns[names[a]])[()]))  # fixed at build time
                else:
                    args.append(f"{names[a]}[()]")  # a 0-d array the code made (buffer, output): its scalar
                if isinstance(a, Var):
                    trial.append(ctx.const(a.aval.dtype.type(1)))
            form = _SCALAR_EXPR[e.prim.name]
            if e.prim.name == "cast":
                form = ctx.const(e.attrs["dtype"].type) + "({0})" if isinstance(e.attrs["dtype"], np.dtype) else ctx.const(np.dtype(e.attrs["dtype"]).type) + "({0})"
            try:
                with np.errstate(all="ignore"):
                    got = eval(form.format(*trial), ns)  # noqa: S307 - our own generated code
            except Exception:  # noqa: BLE001 - any failure: use the ufunc path
                return None
            if not isinstance(got, np.generic) or got.dtype != out.aval.dtype:
                return None
            return form.format(*args)

        checked = self.check_finite and not probe
        if checked:
            ns["_finite"] = _finite
            ns["_non_finite"] = functools.partial(_report_non_finite, g.eqns)
        pending: int | None = None  # the equation whose output the next check tests
        for n, e in enumerate(g.eqns):
            if pending is not None:
                body.extend(_check_lines(g.eqns[pending], pending, names, atom))
                pending = None
            if checked and e.prim.name not in _VIEW_PRIMS and any(is_float(o.aval.dtype) for o in e.outputs):
                pending = n
            if e.prim.emit is None:
                raise UnknownPrimitiveError(f"primitive {e.prim.name!r} has no numpy kernel")
            if e.prim.multiple_results:
                # several outputs: the emit rule gives an expression whose value is a sequence of
                # new arrays, one per output, unpacked into names of their own (fresh storage)
                code = e.prim.emit(ctx, [atom(a) for a in e.inputs], e.attrs, [a.aval for a in e.inputs], [o.aval for o in e.outputs])
                if code.kind != "expr":  # pragma: no cover - a rule bug
                    raise UnknownPrimitiveError(f"primitive {e.prim.name!r}: a multi-output emit rule must give an expression")
                targets = [f"v{n}_{k}" for k in range(len(e.outputs))]
                lhs = (", ".join(targets) + ("," if len(targets) == 1 else "")) if targets else "_"
                if all(not isinstance(a, Var) or a in static for a in e.inputs):
                    targets = [ctx.const(None) for _ in e.outputs]
                    if targets:
                        run_now(f"{', '.join(targets)}{',' if len(targets) == 1 else ''} = {code.text}")
                    static.update(e.outputs)
                    kind = "const"
                else:
                    body.append(f"{lhs} = {code.text}")
                    fresh_bytes += sum(nbytes(o) for o in e.outputs)
                    kind = "fresh"
                for o, t in zip(e.outputs, targets):
                    names[o] = t
                    storage[o] = kind
                continue
            out = e.outputs[0]
            pname = e.prim.name
            x0 = e.inputs[0] if e.inputs else None
            if (
                pname == "broadcast_to"
                and out not in outs
                and all(c.prim.name in _ELEMENTWISE for c in consumers.get(out, ()))
                and not any(c.outputs[0] in escapes for c in consumers.get(out, ()))
            ):
                # ufuncs writing into a full-shape `out` broadcast by themselves: no op needed
                # (not when the consumer's result escapes: that one is allocated by the ufunc)
                names[out] = atom(x0)
                phys[out] = phys.get(x0, x0.aval.shape) if isinstance(x0, Var) else ()
                if isinstance(x0, Var):
                    storage[out] = storage[x0]
                    root[out] = root.get(x0, x0)
                    if x0 in static:
                        static.add(out)
                else:
                    storage[out] = "const"
                    static.add(out)
                continue
            if (
                pname in _SCALAR_EXPR
                and out.aval.ndim == 0
                and not all(not isinstance(a, Var) or a in static for a in e.inputs)
                and all(isinstance(a, Literal) or a.aval.ndim == 0 and storage.get(a) != "input" for a in e.inputs)
                and (out in outs or (out not in escapes and consumers.get(out)))
                and all(c.prim.name in _SCALAR_EXPR and c.outputs[0].aval.ndim == 0 for c in consumers.get(out, ()))
            ):
                # Scalar arithmetic (loss scaling, Adam's bias corrections): numpy scalars and
                # Python operators cost ~0.05 us a step against ~0.25 us for a ufunc writing a 0-d
                # array, so a 0-d value read only by such steps is kept as a numpy scalar; a graph
                # output gets a 0-d array of its own.  Same types as the ufuncs (NEP 50), checked
                # here.  Not on graph inputs: callers may pass Python scalars there.
                expr = scalar_expr(e, out)
                if expr is not None:
                    name = f"v{n}"
                    if out in outs:
                        body.append(f"{name} = np.asarray({expr})")
                    else:
                        body.append(f"{name} = {expr}")
                        scalars.add(out)
                    names[out] = name
                    storage[out] = "fresh"
                    fresh_bytes += nbytes(out)
                    continue
            ins = [atom(a) for a in e.inputs]
            if pname in _SCALAR_CONST_PRIMS and any(isinstance(a, Var) for a in e.inputs):
                for k, a in enumerate(e.inputs):
                    if isinstance(a, Literal) and a.aval.ndim == 0:
                        ins[k] = ufunc_literal(a, e.inputs) or ins[k]
            out_shape_used = None
            if (
                pname in _ELEMENTWISE
                and len(e.inputs) > 1
                and out not in escapes
                and not all(not isinstance(a, Var) or a in static for a in e.inputs)
            ):
                # An operand computed per call with as many elements as the output but another shape
                # (e.g. a (64,) bias added to a (1, 64) row): compute in *its* shape, through views of
                # the output buffer and of the other (persistent) operands made once at build time.
                size = size_of(out)
                percall = {a.aval.shape for a in e.inputs if isinstance(a, Var) and names[a] not in ns and size_of(a) == size}
                fits = all(not isinstance(a, Var) or size_of(a) in (size, 1) for a in e.inputs)
                if len(percall) == 1 and fits and size > 1:
                    tgt = next(iter(percall))
                    if tgt != out.aval.shape:
                        new_ins = list(ins)
                        ok = True
                        for k, a in enumerate(e.inputs):
                            if not isinstance(a, Var) or a.aval.shape == tgt:
                                continue
                            shp = () if size_of(a) == 1 else tgt
                            if names[a] in ns:
                                view = _safe_view(ns[names[a]], shp, storage.get(a))
                                if view is None:
                                    ok = False
                                    break
                                new_ins[k] = ctx.const(view)
                            else:
                                new_ins[k] = f"{names[a]}.reshape({shp!r})"
                        if ok:
                            ins = new_ins
                            out_shape_used = tgt
            if pname in _ELEMENTWISE and len(e.inputs) > 1 and out_shape_used is None:
                # a one-element operand as 0-d (numpy's scalar fast path: ~0.3 us less a call); a
                # persistent lower-rank operand viewed with the output's rank once here (per-call
                # operands keep their rank: a reshape per call costs more than it saves in numpy 2)
                for k, a in enumerate(e.inputs):
                    if isinstance(a, Var) and a.aval.ndim > 0 and (a.aval.ndim < out.aval.ndim or (size_of(a) == 1 < size_of(out))):
                        shp = () if size_of(a) == 1 else (1,) * (out.aval.ndim - a.aval.ndim) + a.aval.shape
                        if names[a] in ns:
                            arr = ns[names[a]]  # may be a dropped broadcast's smaller operand
                            if arr.size == 1:
                                ins[k] = ctx.const(arr.reshape(()))
                            elif arr.ndim <= out.aval.ndim:
                                ins[k] = ctx.const(arr.reshape((1,) * (out.aval.ndim - arr.ndim) + arr.shape))
                        elif size_of(a) == 1:
                            ins[k] = f"{names[a]}.reshape({shp!r})"
            emit_attrs, emit_in, emit_out = e.attrs, [a.aval for a in e.inputs], out.aval
            if (
                pname in ("reduce_max", "reduce_min", "reduce_sum")
                and out_shape_used is None
                and out not in escapes
                and isinstance(x0, Var)
                and 1 in x0.aval.shape
                and not (pname == "reduce_sum" and x0.aval.ndim == 2 and len(e.attrs["axes"]) == 1)
                and not all(not isinstance(a, Var) or a in static for a in e.inputs)
            ):
                # reduce the operand with its unit axes dropped (numpy's simpler, faster loops)
                axes = set(e.attrs["axes"])
                keep = [i for i, d in enumerate(x0.aval.shape) if d != 1]
                new_axes = tuple(k for k, i in enumerate(keep) if i in axes)
                in_shape = tuple(x0.aval.shape[i] for i in keep)
                out_sq = tuple(d for i, d in enumerate(x0.aval.shape) if i in keep and i not in axes)
                if new_axes:
                    view = _safe_view(ns[names[x0]], in_shape, storage.get(x0)) if names[x0] in ns else None
                    ins = [ctx.const(view) if view is not None else f"{names[x0]}.reshape({in_shape!r})"]
                    emit_attrs = dict(e.attrs, axes=new_axes, keepdims=False)
                    emit_in = [ShapedArray(in_shape, x0.aval.dtype)]
                    emit_out = ShapedArray(out_sq, out.aval.dtype)
                    out_shape_used = out_sq
            code = None
            if (
                pname in _UNROLL_REDUCE
                and out_shape_used is None
                and out not in escapes
                and isinstance(x0, Var)
                and storage.get(x0) in ("buffer", "const")
                and isinstance(ns.get(names[x0]), np.ndarray)
                and ns[names[x0]].shape == x0.aval.shape  # not an elided broadcast's smaller array
                and not all(not isinstance(a, Var) or a in static for a in e.inputs)
                and len(e.attrs["axes"]) == 1
                and x0.aval.dtype.kind == "f"
                and x0.aval.dtype == out.aval.dtype
                and not native.row_reduce_native(x0.aval, e.attrs["axes"][0])
            ):
                # (a float max/min over the last axis is one native call instead: the reduce emitter)
                # A max/min over a short axis of a persistent operand: one binary ufunc per element
                # of that axis over views made here (strength reduction, exact for max/min; numpy's
                # reduce loop over a short axis costs ~3.4 us for a (64, 4) max against ~1.0 us,
                # but wins for results of under 4 elements).  Sums keep their kernel (a matmul).
                ax = e.attrs["axes"][0] % x0.aval.ndim
                k = x0.aval.shape[ax]
                if 2 <= k <= 8 and size_of(out) >= 4:
                    base = ns[names[x0]]
                    red = tuple(d for i, d in enumerate(x0.aval.shape) if i != ax)
                    views_ = [base[(slice(None),) * ax + (slice(j, j + 1),)].reshape(red) for j in range(k)]
                    if all(np.shares_memory(v, base) for v in views_):  # views (see every later write), not copies
                        parts = [ctx.const(v) for v in views_]
                        uf = _UNROLL_REDUCE[pname]
                        steps = [f"{uf}({parts[0]}, {parts[1]}, out={{o}})"] + [f"{uf}({{o}}, {p}, out={{o}})" for p in parts[2:]]
                        code = Code("; ".join(steps), "stmt")
                        out_shape_used = red
            if (
                code is None
                and pname == "mul"
                and out_shape_used is None
                and out not in escapes
                and out.aval.ndim == 2
                and out.aval.dtype in (np.float32, np.float64)
                and all(isinstance(a, Var) and a.aval.dtype == out.aval.dtype and phys.get(a, a.aval.shape) == a.aval.shape for a in e.inputs)
                and sorted(a.aval.shape for a in e.inputs) == sorted([(out.aval.shape[0], 1), (1, out.aval.shape[1])])
                and min(out.aval.shape) > 1
            ):
                # an outer product (m,1)*(1,n): as a matmul with one inner term each element is the
                # same single product, and BLAS writes it ~2x faster than the broadcasting ufunc
                col, row = (ins[0], ins[1]) if e.inputs[0].aval.shape[1] == 1 else (ins[1], ins[0])
                code = Code(f"np.dot({col}, {row}, {{o}})", "stmt")
            if (
                code is None
                and pname == "cast"
                and out.aval.ndim == 0
                and out.aval.dtype.kind == "f"
                and isinstance(x0, Var)
                and x0.aval.dtype.kind in "biuf"
            ):
                # a 0-d cast to float (Adam's step sizes into the parameters' dtype): item
                # assignment converts like casting="unsafe" here, at ~0.08 us against ~0.7 us
                code = Code(f"{{o}}[()] = {ins[0]}", "stmt")
            if code is None:
                code = e.prim.emit(ctx, ins, emit_attrs, emit_in, emit_out)
            all_static = all(not isinstance(a, Var) or a in static for a in e.inputs)
            name = f"v{n}"
            if code.kind == "expr":
                if pname in _VIEW_PRIMS and isinstance(x0, Var):
                    base = root.get(x0, x0)
                    root[out] = base
                    storage[out] = storage[x0]
                    if storage[x0] in ("buffer", "const") and names[x0] in ns:
                        trial = eval(code.text, ns)  # noqa: S307 - our own generated code
                        if np.shares_memory(trial, ns[names[base]]):
                            hoisted = ctx.const(trial)
                            names[out] = hoisted
                            setup.append(f"{hoisted} = {code.text}")
                            if all_static:
                                static.add(out)
                            continue
                    body.append(f"{name} = {code.text}")
                    names[out] = name
                    continue
                storage[out] = "fresh"
                if all_static:
                    hoisted = ctx.const(None)
                    run_now(f"{hoisted} = {code.text}")
                    names[out] = hoisted
                    static.add(out)
                    storage[out] = "const"
                else:
                    body.append(f"{name} = {code.text}")
                    names[out] = name
                    fresh_bytes += nbytes(out)
                continue
            dedicated = all_static  # values fixed at build time keep a buffer of their own
            cands: tuple = ()
            if not dedicated:
                # in place: an operand held in a buffer of its own (not a graph input, constant or
                # output, none of which live in buffers) that the kernel may overwrite; the planner
                # takes it only if it and every view of it die here.  No other operand may alias it.
                cands = tuple(
                    a
                    for k in in_place_operands(pname, len(e.inputs))
                    for a in (e.inputs[k],)
                    if isinstance(a, Var)
                    and storage.get(a) == "buffer"
                    and a not in root
                    and a not in static
                    and size_of(a) == size_of(out)
                    and a.aval.dtype == out.aval.dtype
                    and not any(isinstance(b, Var) and b is not a and root.get(b, b) is a for b in e.inputs)
                )
            if (
                pname in _OPERATORS
                and not any(planner.dies_at(a, n) for a in cands)  # in place beats allocating
                and (out in escapes or any(isinstance(a, Var) and 1 < size_of(a) < size_of(out) for a in e.inputs))
                and code.alloc is not None
                and not all_static
                and out_shape_used is None
                and 0 < out.aval.ndim
                and size_of(out) <= _SMALL
                and all(isinstance(a, Literal) and a.weak or a.aval.dtype == out.aval.dtype for a in e.inputs)
                and _result_shape(e.inputs, phys) == out.aval.shape  # an elided broadcast must not shrink it
            ):
                # tiny operands broadcast against each other (e.g. an outer product (64,1)*(1,4)),
                # or a result the caller gets anyway: the ndarray operator, which allocates, beats a
                # ufunc writing into a buffer (~1.4 vs ~2.0 us in numpy 2.4) or a ufunc call that
                # allocates; otherwise out= is as fast or faster and keeps the value in a buffer
                # (views of which are then made at build time), in place where it can
                body.append(f"{name} = {ins[0]} {_OPERATORS[pname]} {ins[1]}")
                names[out] = name
                storage[out] = "fresh"
                fresh_bytes += nbytes(out)
                continue
            if (out in escapes) and not all_static:
                same_dtype = all(
                    isinstance(a, Literal) and a.weak or a.aval.dtype == out.aval.dtype for a in e.inputs
                )
                if RECYCLE_MIN_BYTES <= nbytes(out) <= RECYCLE_MAX_BYTES:
                    body.append(f"{name} = {ctx.const(OutputRecycler(out.aval.shape, out.aval.dtype))}.take()")
                    body.append(code.text.replace("{o}", name))
                elif code.alloc is not None and out.aval.ndim > 0 and same_dtype:
                    body.append(f"{name} = {code.alloc}")  # let the ufunc allocate its result
                else:
                    body.append(f"{name} = _empty({out.aval.shape!r}, np.{out.aval.dtype.name})")
                    body.append(code.text.replace("{o}", name))
                names[out] = name
                storage[out] = "fresh"
                fresh_bytes += nbytes(out)
                continue
            buf, donor = buffer_for(n, out, cands, dedicated)
            names[out] = buf
            storage[out] = "buffer"
            target = buf if out_shape_used is None else ctx.const(ns[buf].reshape(out_shape_used))
            if donor is not None:
                # in place: write through the very array object the operand is read from -- numpy
                # takes its fast path only when input and output are the same object (two views of
                # the same memory cost it an overlap analysis, ~0.2 us a call)
                shape = out.aval.shape if out_shape_used is None else out_shape_used
                for k, a in enumerate(e.inputs):
                    arr = ns.get(ins[k]) if a is donor else None
                    if isinstance(arr, np.ndarray) and arr.shape == shape and np.shares_memory(arr, ns[buf]):
                        target = ins[k]
                        break
            line = code.text.replace("{o}", target)
            if all_static:
                run_now(line)
                static.add(out)
            else:
                body.append(line)

        if pending is not None:
            body.extend(_check_lines(g.eqns[pending], pending, names, atom))
        rets = []
        for a in g.outvars:
            if isinstance(a, Literal):
                rets.append(f"np.asarray({atom(a)}, np.{a.aval.dtype.name})")
                continue
            st = storage[a]
            if a in g.invars:
                rets.append(names[a])
            elif st == "fresh" and a not in static:
                rets.append(names[a])
            elif RECYCLE_MIN_BYTES <= nbytes(a) <= RECYCLE_MAX_BYTES and names[a] in ns:
                rets.append(f"{ctx.const(OutputRecycler(a.aval.shape, a.aval.dtype))}.copy({names[a]})")
                fresh_bytes += nbytes(a)
            else:
                rets.append(f"np.array({names[a]})")
                fresh_bytes += nbytes(a)
        if probe:
            return None
        args = ", ".join(f"i{i}" for i in range(len(g.invars)))
        src = ["# setup (run once per buffer set):"] + [f"#   {l}" for l in setup]
        src += [f"def _run({args}):"] + [f"    {l}" for l in body] + [f"    return [{', '.join(rets)}]"]
        self.source = "\n".join(src)
        self.memory = planner.finish()
        self.memory.fresh_bytes = fresh_bytes
        code_obj = compile(self.source, "<fedarena.engine compiled graph>", "exec")
        exec(code_obj, ns)  # noqa: S102
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


def _result_shape(inputs, phys: dict) -> tuple:
    """numpy's broadcast result shape of the arrays the operands' names actually hold."""
    return tuple(np.broadcast_shapes(*[phys.get(a, a.aval.shape) if isinstance(a, Var) else () for a in inputs]))


def _safe_view(arr: np.ndarray, shape: tuple, storage: str | None) -> np.ndarray | None:
    """``arr.reshape(shape)`` if it can be made once at build time: always for constants, and for
    buffers only when it is a view (so it sees every later write)."""
    v = arr.reshape(shape)
    if storage == "const" or np.shares_memory(v, arr):
        return v
    return None


def _finite(x: Any) -> bool:
    return bool(np.isfinite(x).all())


def _check_lines(e: Any, n: int, names: dict, atom: Any) -> list:
    """Generated code testing equation ``n``'s float outputs (NaN debugger)."""
    ins = ", ".join(atom(a) if isinstance(a, Literal) else names[a] for a in e.inputs)
    lines = []
    for o in e.outputs:
        if is_float(o.aval.dtype):
            out = names[o]
            lines.append(f"if not _finite({out}): _non_finite({n}, {out}, ({ins}{',' if len(e.inputs) == 1 else ''}))")
    return lines


def _report_non_finite(eqns: list, n: int, out: Any, ins: tuple) -> None:
    e = eqns[n]
    raise_non_finite(e.prim.name, out, ins, e.source, n)


def compile_graph(graph: Graph, validate: bool = True, reuse: bool = True, check_finite: bool = False) -> Executable:
    return Executable(graph, validate, reuse, check_finite)
