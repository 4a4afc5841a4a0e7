"""Elementwise fusion: maximal trees of elementwise equations become one ``fused_elementwise`` node.

A group grows backwards from an elementwise equation through operands that are produced by
elementwise equations of the same output type and used nowhere else, so every group is a tree
whose inner values never leave it (the classic producer-consumer "loop fusion" of array compilers;
Chen et al., "TVM", OSDI 2018, sec. 3 "operator fusion": injective/elementwise chains).  The fused
node carries its sub-graph; on the numpy backend it runs as one generated function that writes
each step into a temporary reused in place as soon as its value dies (so a chain of any length
touches at most a couple of buffers), and it is the same node a GPU backend turns into one kernel.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided
import scipy.special

from . import native
from .. import primitives as P
from ..transforms import autodiff as AD
from ..primitives.emit import CLIP as _CLIP
from ..primitives.emit import EmitContext as _EmitContext
from ..core.ir import Eqn, Graph, Literal, ShapeError, Var
from ..core.tracing import eval_graph, names_with, register
from ..transforms.vmap import vmap

FUSIBLE = names_with("fusible")  # derived from the primitives' traits

fused_p = register("fused_elementwise")


def _fused_rule(avals, attrs, weak):
    body: Graph = attrs["body"]
    if [v.aval for v in body.invars] != list(avals):
        raise ShapeError("fused_elementwise: operands do not match the fused body's inputs")
    return body.outvars[0].aval


def _literal_code(ctx: _EmitContext, a: Literal) -> str:
    val = a.value
    if a.weak and isinstance(val, (bool, int)):
        return repr(val)
    if a.weak and isinstance(val, float) and np.isfinite(val):
        return repr(val)
    return ctx.const(a.aval.dtype.type(val))


def _is_temp(name: str) -> bool:
    return name == "out" or name.startswith("_t")


class FusedKernel:
    """The generated numpy function of one fused body: ``kernel(*inputs, out) -> out``."""

    def __init__(self, body: Graph):
        ns: dict[str, Any] = {"np": np, "_expit": scipy.special.expit, "_empty": np.empty, "_clip": _CLIP}
        ctx = _EmitContext(ns)
        names: dict = {v: f"i{k}" for k, v in enumerate(body.invars)}
        for c, v in zip(body.consts, body.constvars):
            names[v] = ctx.const(c)
        last_use: dict = {}
        for i, e in enumerate(body.eqns):
            for a in e.inputs:
                if isinstance(a, Var):
                    last_use[a] = i
        out_var = body.outvars[0]
        # ``out`` doubles as the first temporary: every inner value is dead or an operand of the
        # root by the time the root writes ``out``, so a chain runs entirely in the output buffer
        temps_free: dict = {(out_var.aval.shape, out_var.aval.dtype): ["out"]}
        temp_owner: dict = {}  # temp name -> var currently held
        lines = []
        n = len(body.eqns)
        final_copy = None
        for i, e in enumerate(body.eqns):
            o = e.outputs[0]
            ins = [_literal_code(ctx, a) if isinstance(a, Literal) else names[a] for a in e.inputs]
            if o is out_var and i == n - 1:
                target = "out"
                held = temp_owner.get("out")
                if e.prim.name == "select" and held is not None and held in e.inputs[:2]:
                    target = f"_t{len(temp_owner)}"
                    ns[target] = np.empty(o.aval.shape, o.aval.dtype)
                    temp_owner[target] = o
                    final_copy = target
            else:
                target = None
                # in place: reuse the temporary of an operand that dies here
                # (select copies its false operand first, so only that one may share the output)
                for a in (e.inputs[2:] if e.prim.name == "select" else e.inputs):
                    if isinstance(a, Var) and _is_temp(names.get(a, "")) and last_use.get(a) == i and a.aval == o.aval:
                        target = names[a]
                        break
                if target is None:
                    pool = temps_free.get((o.aval.shape, o.aval.dtype), [])
                    if pool:
                        target = pool.pop()
                    else:
                        target = f"_t{len(temp_owner)}"
                        ns[target] = np.empty(o.aval.shape, o.aval.dtype)
                temp_owner[target] = o
            code = e.prim.emit(ctx, ins, e.attrs, [a.aval for a in e.inputs], o.aval)
            if code.kind == "stmt":
                lines.append(code.text.replace("{o}", target))
            else:
                lines.append(f"np.copyto({target}, {code.text}, casting='unsafe')")
            names[o] = target
            for a in e.inputs:
                if isinstance(a, Var) and last_use.get(a) == i and _is_temp(names.get(a, "")) and names[a] != target:
                    temps_free.setdefault((a.aval.shape, a.aval.dtype), []).append(names[a])
        if final_copy is not None:
            lines.append(f"np.copyto(out, {final_copy})")
        elif not body.eqns or body.eqns[-1].outputs[0] is not out_var:
            lines.append(f"np.copyto(out, {names[out_var]})")
        args = ", ".join(f"i{k}" for k in range(len(body.invars)))
        self.source = f"def fused({args}{', ' if args else ''}out):\n" + "".join(f"    {l}\n" for l in lines) + "    return out\n"
        exec(compile(self.source, "<fedarena.engine fused kernel>", "exec"), ns)  # noqa: S102 - generated by us
        self.fn = ns["fused"]

    def __call__(self, *args: Any) -> np.ndarray:
        return self.fn(*args)


def _fused_impl(*ins, body):
    av = body.outvars[0].aval
    out = np.empty(av.shape, av.dtype)
    return FusedKernel(body)(*ins, out)


def _fused_emit(ctx, ins, attrs, in_avals, out_aval):
    k = ctx.const(FusedKernel(attrs["body"]))
    call = f"{k}({', '.join(ins)}{', ' if ins else ''}{{o}})"
    # operands known at build time (constants, buffer views): a broadcast of one value is passed
    # as a one-element view of it; another non-contiguous one keeps the numpy function
    vm_ins = list(ins)
    scalars = set()
    readable = True
    for k, name in enumerate(ins):
        v = ctx.ns.get(name)
        if not isinstance(v, np.ndarray) or v.flags.c_contiguous:
            continue
        if v.size and not any(v.strides):
            scalars.add(k)
            vm_ins[k] = ctx.const(as_strided(v, shape=(1,), strides=(0,)))
        else:
            readable = False
    prog = native.elementwise_program(attrs["body"], frozenset(scalars)) if readable else None
    if prog is not None:
        # one call into the native VM; the generated numpy function if an operand is unreadable
        vm = ctx.const(native._native.elementwise)
        p, c, m = ctx.const(prog.program), ctx.const(prog.consts), ctx.const(prog.modes)
        bp = ctx.const(prog.bparams)
        args = f"{p}, {c}, {m}, {bp}, {prog.n}, {prog.double}, {{o}}" + "".join(f", {a}" for a in vm_ins)
        return P.stmt(f"if not {vm}({args}): {call}")
    return P.stmt(call)


def _fused_vjp(need, ct, out, *ins, body):
    env, live = AD.forward(body, list(ins), list(need))
    return tuple(AD.backward(body, env, live, [ct]))


def _fused_jvp(ts, out, *ins, body):
    tangents = [np.zeros(a.aval.shape, a.aval.dtype) if t is None else t for a, t in zip(body.invars, ts)]
    return AD.jvp(lambda *a: eval_graph(body, a)[0], list(ins), tangents)[1]


def _fused_batch(prim, vals, batched, size, *, body):
    axes = tuple(0 if b else None for b in batched)
    return vmap(lambda *a: eval_graph(body, a)[0], in_axes=axes)(*vals)


fused_p.abstract_eval = _fused_rule
fused_p.impl = _fused_impl
fused_p.emit = _fused_emit
fused_p.vjp = _fused_vjp
fused_p.jvp = _fused_jvp
fused_p.batch = _fused_batch


def elementwise_fusion(graph: Graph, min_size: int = 2, accept: Callable[[Graph], bool] | None = None) -> Graph:
    """Replace every maximal tree of at least ``min_size`` fusible equations (same output shape
    and dtype, inner values used only inside the tree) by one ``fused_elementwise`` equation.
    ``accept(body)``, if given, decides per tree whether to fuse it (the default pipeline fuses
    only what the native VM runs).  A ``broadcast_to`` whose only consumer is in the tree joins
    it, so the tree reads the small operand instead of a strided view."""
    uses: dict = {}
    for e in graph.eqns:
        for a in e.inputs:
            if isinstance(a, Var):
                uses[a] = uses.get(a, 0) + 1
    for a in graph.outvars:
        if isinstance(a, Var):
            uses[a] = uses.get(a, 0) + 2  # an output is never an inner value
    group_of: dict = {}  # equation index -> group id
    members: dict = {}  # group id -> list of equation indices
    producer: dict = {}
    for i, e in enumerate(graph.eqns):
        producer.update((o, i) for o in e.outputs)
    for i, e in enumerate(graph.eqns):
        o = e.outputs[0]
        if e.prim.name not in FUSIBLE or len(e.outputs) != 1 or _int_cast(e):
            continue
        gid = i
        group_of[i] = gid
        members[gid] = [i]
        for a in e.inputs:
            if not isinstance(a, Var) or uses.get(a) != 1 or a not in producer:
                continue
            j = producer[a]
            if j not in group_of or a.aval != o.aval:
                continue
            other = group_of[j]
            if other == gid:
                continue
            for k in members.pop(other):
                group_of[k] = gid
                members[gid].append(k)
    eqns: list = []
    for i, e in enumerate(graph.eqns):
        gid = group_of.get(i)
        if gid is None or len(members[gid]) < min_size or (len(members[gid]) == 2 and _only_broadcast(graph, members[gid])):
            eqns.append(e)
            continue
        if gid != i:
            continue  # emitted with its root
        idx = sorted(members[gid])
        inner = {graph.eqns[k].outputs[0] for k in idx}
        ext: list = []
        for k in idx:
            for a in graph.eqns[k].inputs:
                if isinstance(a, Var) and a not in inner and a not in ext:
                    ext.append(a)
        sub_in = [Var(a.aval) for a in ext]
        ren = dict(zip(ext, sub_in))
        sub_eqns = [
            Eqn(graph.eqns[k].prim, [ren.get(a, a) if isinstance(a, Var) else a for a in graph.eqns[k].inputs], graph.eqns[k].outputs, graph.eqns[k].attrs, graph.eqns[k].source)
            for k in idx
        ]
        body = Graph(sub_in, [], [], sub_eqns, [e.outputs[0]])
        if accept is not None and not accept(body):
            # not the whole tree: each equation alone, if that is accepted (a broadcasting add
            # whose consumer, a tanh over a long array, the VM would run slower than numpy)
            for k in idx:
                ek = graph.eqns[k]
                single = _single_body(ek)
                if single is not None and accept(single[0]):
                    ek = Eqn(fused_p, single[1], [ek.outputs[0]], {"body": single[0]}, ek.source)
                eqns.append(ek)
            continue
        # the fused node defines the root's variable (consumers need no renaming); the body keeps
        # its own copy of the root equation, which is fine because a sub-graph is its own scope
        eqns.append(Eqn(fused_p, ext, [e.outputs[0]], {"body": body}, e.source))
    return Graph(graph.invars, graph.constvars, graph.consts, eqns, graph.outvars)


def _single_body(e: Eqn) -> tuple[Graph, list] | None:
    """One fusible equation as a fused body of its own: ``(body, the operands it reads)``."""
    if e.prim.name not in FUSIBLE or e.prim.name == "broadcast_to":
        return None
    outer = []
    for a in e.inputs:
        if isinstance(a, Var) and a not in outer:
            outer.append(a)
    inner = [Var(a.aval) for a in outer]
    ren = dict(zip(outer, inner))
    eq = Eqn(e.prim, [ren.get(a, a) if isinstance(a, Var) else a for a in e.inputs], e.outputs, e.attrs, e.source)
    return Graph(inner, [], [], [eq], [e.outputs[0]]), outer


def _int_cast(e: Eqn) -> bool:
    """A cast from integers stays outside fused trees (the step count of an optimizer): the tree
    then holds one float type, which the native VM runs."""
    return e.prim.name == "cast" and isinstance(e.inputs[0], Var) and e.inputs[0].aval.dtype.kind in "iu"


def _only_broadcast(graph: Graph, idx: list) -> bool:
    """A broadcast and its one consumer alone are not worth a fused node."""
    return any(graph.eqns[k].prim.name == "broadcast_to" for k in idx)


def _vm_worth(body: Graph) -> bool:
    """A tree the VM runs, of two or more equations, or a single broadcasting operation of
    moderate size (numpy's loop over a row- or column-broadcast operand of a short row is ~2x
    slower than the VM's blocked copy)."""
    prog = native.elementwise_program(body)
    if prog is None:
        return False
    if len(body.eqns) >= 2:
        return True
    if body.eqns[0].prim.name in _VM_SINGLE_ALWAYS:
        return prog.n >= _VM_SINGLE_MIN
    return _VM_SINGLE_MIN <= prog.n <= _VM_SINGLE_MAX and native._MODE["bcast"] in prog.modes


# single broadcasting ops: below 64 elements the call costs more than it saves; above 32k
# numpy's broadcast loop runs at memory speed too (a (256, 16, 32) + (256, 1, 32) add: 37 us
# either way, against 0.9 us vs 1.9 us for (64, 64) + (64,))
_VM_SINGLE_MIN, _VM_SINGLE_MAX = 64, 32768
# ...and single ops numpy runs slowly at any size: np.maximum(x, 0) goes through the scalar-
# broadcast loop (76 us for 200k float32 against 23 us in the VM)
_VM_SINGLE_ALWAYS = frozenset({"relu"})


def default_elementwise_fusion(graph: Graph) -> Graph:
    """The default pipeline's fusion: only trees the native elementwise VM runs in one call (on
    the numpy kernels alone a fused tree is no faster than its equations), and nothing when the
    native kernels are unavailable."""
    if not native.available():
        return graph
    return elementwise_fusion(graph, min_size=1, accept=_vm_worth)


def fused_sources(graph: Graph) -> list[str]:
    """Generated source of every fused node of ``graph`` (for inspection and tests)."""
    return [FusedKernel(e.attrs["body"]).source for e in graph.eqns if e.prim is fused_p]


__all__ = ["FUSIBLE", "FusedKernel", "default_elementwise_fusion", "elementwise_fusion", "fused_p", "fused_sources"]
