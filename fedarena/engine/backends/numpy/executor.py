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
values need memory, the second emits code on the packed arena).

Each equation is lowered by emit rules, one module per primitive family (``emit_control``,
``emit_shapes``, ``emit_elementwise``, ``emit_reductions``, ``emit_linalg``; see
:mod:`.emit_state` for the rule interface), which choose kernels for dispatch cost: 0-d steps read
only by 0-d steps run on numpy scalars with Python operators, scalar literals of ufuncs are typed
0-d constants, max/min over a short axis of a buffer become binary ufuncs over build-time views,
outer products become a one-term matmul; otherwise the primitive's own emit rule (next to the
primitive, ``primitives/<family>.py``) gives the kernel.  :func:`place` then puts the result in memory.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ...core.ir import Graph, Literal, UnknownPrimitiveError, Var, is_float
from ...core.nonfinite import raise_non_finite
from ...compiler.memory_plan import VIEW_PRIMITIVES, BufferPlanner, in_place_operands, nbytes, size_of
from ...compiler.passes import dead_code_elimination
from . import emit_control, emit_elementwise, emit_linalg, emit_reductions, emit_shapes
from .emit_state import RECYCLE_MAX_BYTES, RECYCLE_MIN_BYTES, EmitState, OutputRecycler, Step, donation_conflicts

_VIEW_PRIMS = VIEW_PRIMITIVES
_OPERATORS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_SMALL = 2048  # elements; below this, a broadcasting operator (which allocates) beats a ufunc with out=

DEFINE_RULES = (emit_control.multiple_outputs, emit_shapes.elided_broadcast, emit_elementwise.scalar_expression)
"""Rules that lower an equation completely (define its outputs) or decline (return False), tried in order."""
OPERAND_RULES = (emit_elementwise.typed_literals, emit_elementwise.same_size_operands, emit_elementwise.ranked_operands)
"""Rules that rewrite the operands' source (``step.ins``), all applied in order."""
KERNEL_RULES = (emit_reductions.drop_unit_axes, emit_reductions.unrolled_max_min, emit_linalg.outer_product, emit_elementwise.scalar_cast)
"""Rules that choose the kernel (``step.code``) or reshape what it computes, all applied in order;
each declines once a kernel is chosen."""


class _Instance:
    """One set of buffers and the generated function that runs on them."""

    __slots__ = ("run",)


class Executable:
    """A compiled graph: ``exe(*flat_inputs) -> list of outputs`` (numpy arrays).

    Each concurrently running thread gets its own buffer set, built on demand.  ``memory`` is the
    :class:`~fedarena.engine.compiler.memory_plan.MemoryPlan` the generated code follows (bytes per buffer
    set), ``source`` the generated code.
    """

    def __init__(self, graph: Graph, validate: bool = True, reuse: bool = True, check_finite: bool = False, donated: frozenset = frozenset()):
        if validate:
            graph.validate()
        # check_finite (the NaN debugger, core/nonfinite.py): after each equation with a float output the
        # code tests it and raises NonFiniteError at the first NaN/Inf; every value keeps a buffer of its own
        # so the operands are still intact for the error's statistics
        self.check_finite = check_finite
        self.reuse = reuse and not check_finite  # False: no buffer sharing, no in-place (one buffer per value)
        self.graph = dead_code_elimination(graph)
        # inputs the caller gave up (jit's donate_argnums) whose memory outputs may take; not with the
        # NaN debugger, which reports on intact operands
        self.donated = frozenset() if check_finite else frozenset(donated)
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
        to record the requests; no code is compiled).  Each equation goes through the emit rules
        (``DEFINE_RULES``, ``OPERAND_RULES``, ``KERNEL_RULES``, then the primitive's own emit rule)
        and :func:`place` puts its result in memory."""
        g = self.graph
        st = EmitState(g, planner, self.donated)
        checked = self.check_finite and not probe
        if checked:
            st.ns["_finite"] = _finite
            st.ns["_non_finite"] = functools.partial(_report_non_finite, g.eqns)
        pending: int | None = None  # the equation whose output the next check tests
        for n, e in enumerate(g.eqns):
            if pending is not None:
                st.body.extend(_check_lines(g.eqns[pending], pending, st.names, st.atom))
                pending = None
            if checked and e.prim.name not in _VIEW_PRIMS and any(is_float(o.aval.dtype) for o in e.outputs):
                pending = n
            if e.prim.emit is None:
                raise UnknownPrimitiveError(f"primitive {e.prim.name!r} has no numpy kernel")
            step = Step(n, e)
            if any(rule(st, step) for rule in DEFINE_RULES):
                continue
            step.ins = [st.atom(a) for a in e.inputs]
            for rule in OPERAND_RULES:
                rule(st, step)
            for rule in KERNEL_RULES:
                rule(st, step)
            if step.code is None:
                step.code = e.prim.emit(st.ctx, step.ins, step.attrs, step.in_avals, step.out_aval)
            place(st, step)
        if pending is not None:
            st.body.extend(_check_lines(g.eqns[pending], pending, st.names, st.atom))
        rets = _returns(st)
        if probe:
            return None
        args = ", ".join(f"i{i}" for i in range(len(g.invars)))
        if st.donations:  # which donated arguments may take an output this call
            st.body.insert(0, f"_dconf = {st.ctx.const(donation_conflicts)}(({args}{',' if len(g.invars) == 1 else ''}))")
        src = ["# setup (run once per buffer set):"] + [f"#   {l}" for l in st.setup]
        src += [f"def _run({args}):"] + [f"    {l}" for l in st.body] + [f"    return [{', '.join(rets)}]"]
        self.source = "\n".join(src)
        self.memory = planner.finish()
        self.memory.fresh_bytes = st.fresh_bytes
        code_obj = compile(self.source, "<fedarena.engine compiled graph>", "exec")
        exec(code_obj, st.ns)  # noqa: S102
        return st.ns["_run"]

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


def place(st: EmitState, step: Step) -> None:
    """Put the result of ``step``'s kernel in memory and emit its line: a view (hoisted to the build
    when it aliases a persistent buffer), a fresh array (graph outputs, small operator results), or
    a planned buffer (in place over a dying operand where the planner allows); run at build time
    when every operand is known then."""
    e, out, code, ins, n = step.e, step.out, step.code, step.ins, step.n
    ns, names, storage, root, static, body = st.ns, st.names, st.storage, st.root, st.static, st.body
    pname = e.prim.name
    x0 = e.inputs[0] if e.inputs else None
    all_static = st.all_static(e)
    name = step.name
    if code.kind == "expr":
        if pname in _VIEW_PRIMS and isinstance(x0, Var):
            base = root.get(x0, x0)
            root[out] = base
            storage[out] = storage[x0]
            if storage[x0] in ("buffer", "const") and names[x0] in ns:
                trial = eval(code.text, ns)  # noqa: S307 - our own generated code
                if np.shares_memory(trial, ns[names[base]]):
                    hoisted = st.ctx.const(trial)
                    names[out] = hoisted
                    st.setup.append(f"{hoisted} = {code.text}")
                    if all_static:
                        static.add(out)
                    return
            body.append(f"{name} = {code.text}")
            names[out] = name
            return
        if all_static:
            hoisted = st.ctx.const(None)
            st.run_now(f"{hoisted} = {code.text}")
            static.add(out)
            st.define(out, hoisted, "const")
        else:
            body.append(f"{name} = {code.text}")
            st.define(out, name, "fresh")
            st.fresh_bytes += nbytes(out)
        return
    dedicated = all_static  # values fixed at build time keep a buffer of their own
    cands: tuple = ()
    if not dedicated:
        # in place: an operand held in a buffer of its own (not a graph input, constant or output,
        # none of which live in buffers) that the kernel may overwrite; the planner takes it only if
        # it and every view of it die here.  No other operand may alias it.
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
        and not any(st.planner.dies_at(a, n) for a in cands)  # in place beats allocating
        and (out in st.escapes or any(isinstance(a, Var) and 1 < size_of(a) < size_of(out) for a in e.inputs))
        and code.alloc is not None
        and not all_static
        and step.out_shape is None
        and 0 < out.aval.ndim
        and size_of(out) <= _SMALL
        and all(isinstance(a, Literal) and a.weak or a.aval.dtype == out.aval.dtype for a in e.inputs)
        and _result_shape(e.inputs, st.phys) == out.aval.shape  # an elided broadcast must not shrink it
    ):
        # tiny operands broadcast against each other (e.g. an outer product (64,1)*(1,4)), or a
        # result the caller gets anyway: the ndarray operator, which allocates, beats a ufunc
        # writing into a buffer (~1.4 vs ~2.0 us in numpy 2.4) or a ufunc call that allocates;
        # otherwise out= is as fast or faster and keeps the value in a buffer (views of which are
        # then made at build time), in place where it can
        body.append(f"{name} = {ins[0]} {_OPERATORS[pname]} {ins[1]}")
        st.define(out, name, "fresh")
        st.fresh_bytes += nbytes(out)
        return
    if (out in st.escapes) and not all_static:
        same_dtype = all(isinstance(a, Literal) and a.weak or a.aval.dtype == out.aval.dtype for a in e.inputs)
        recycled = RECYCLE_MIN_BYTES <= nbytes(out) <= RECYCLE_MAX_BYTES
        if code.alloc is not None and out.aval.ndim > 0 and same_dtype and not recycled:
            body.append(f"{name} = {code.alloc}")  # let the ufunc allocate its result
        else:
            body.append(f"{name} = {st.fresh_array(out)}")
            body.append(code.text.replace("{o}", name))
        st.define(out, name, "fresh")
        st.fresh_bytes += nbytes(out)
        return
    buf, donor = st.buffer_for(n, out, cands, dedicated)
    st.define(out, buf, "buffer")
    target = buf if step.out_shape is None else st.ctx.const(ns[buf].reshape(step.out_shape))
    if donor is not None:
        # in place: write through the very array object the operand is read from -- numpy takes its
        # fast path only when input and output are the same object (two views of the same memory
        # cost it an overlap analysis, ~0.2 us a call)
        shape = out.aval.shape if step.out_shape is None else step.out_shape
        for k, a in enumerate(e.inputs):
            arr = ns.get(ins[k]) if a is donor else None
            if isinstance(arr, np.ndarray) and arr.shape == shape and np.shares_memory(arr, ns[buf]):
                target = ins[k]
                break
    line = code.text.replace("{o}", target)
    if all_static:
        st.run_now(line)
        static.add(out)
    else:
        body.append(line)


def _returns(st: EmitState) -> list:
    """Source of each graph output: a fresh array every call (large ones recycled)."""
    g, names, ns = st.graph, st.names, st.ns
    rets = []
    for a in g.outvars:
        if isinstance(a, Literal):
            rets.append(f"np.asarray({st.atom(a)}, np.{a.aval.dtype.name})")
            continue
        kind = st.storage[a]
        if a in g.invars:
            rets.append(names[a])
        elif kind == "fresh" and a not in st.static:
            rets.append(names[a])
        elif RECYCLE_MIN_BYTES <= nbytes(a) <= RECYCLE_MAX_BYTES and names[a] in ns:
            rets.append(f"{st.ctx.const(OutputRecycler(a.aval.shape, a.aval.dtype))}.copy({names[a]})")
            st.fresh_bytes += nbytes(a)
        else:
            rets.append(f"np.array({names[a]})")
            st.fresh_bytes += nbytes(a)
    return rets


def _result_shape(inputs, phys: dict) -> tuple:
    """numpy's broadcast result shape of the arrays the operands' names actually hold."""
    return tuple(np.broadcast_shapes(*[phys.get(a, a.aval.shape) if isinstance(a, Var) else () for a in inputs]))


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
