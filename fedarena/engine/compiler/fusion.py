"""Elementwise fusion: maximal trees of elementwise equations become one ``fused_elementwise`` node.

A group grows backwards from an elementwise equation through operands that are produced by
elementwise equations of the same output type and used nowhere else, so every group is a tree
whose inner values never leave it (the classic producer-consumer "loop fusion" of array compilers;
Chen et al., "TVM", OSDI 2018, sec. 3 "operator fusion": injective/elementwise chains).  The fused
node carries its sub-graph; on the numpy backend it runs as one generated function that writes
each step into a temporary reused in place as soon as its value dies (so a chain of any length
touches at most a couple of buffers), and it is the same node a GPU backend turns into one kernel.

``multi_output_fusion`` then merges a fused producer whose values are also read elsewhere into its
fused consumer: one ``fused_elementwise_multi`` node with several outputs of one shape, computed in
one pass of the native VM (the moments and new weights of an Adam update).  The cupy pipeline keeps
single-output trees.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import native
from .. import primitives as P
from ..transforms import autodiff as AD
from ..primitives.base import host_only
from ..primitives.elementwise import expit
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
    """The generated numpy function of one fused body: ``kernel(*inputs, *outs)`` writes each of
    the body's outputs into its buffer and returns the buffer (one output) or the tuple of them."""

    def __init__(self, body: Graph):
        ns: dict[str, Any] = {"np": np, "_expit": expit, "_empty": np.empty, "_clip": _CLIP}
        ctx = _EmitContext(ns)
        names: dict = {v: f"i{k}" for k, v in enumerate(body.invars)}
        for c, v in zip(body.consts, body.constvars):
            names[v] = ctx.const(c)
        last_use: dict = {}
        for i, e in enumerate(body.eqns):
            for a in e.inputs:
                if isinstance(a, Var):
                    last_use[a] = i
        single = len(body.outvars) == 1
        out_names = ["out"] if single else [f"out{k}" for k in range(len(body.outvars))]
        # several outputs: each value is computed straight into its output buffer, which no other
        # value shares (the outputs are read by later steps, and must hold their values at the end)
        direct: dict = {} if single else {v: o for v, o in reversed(list(zip(body.outvars, out_names))) if isinstance(v, Var)}
        out_var = body.outvars[0] if single else None
        # one output: ``out`` doubles as the first temporary: every inner value is dead or an operand
        # of the root by the time the root writes ``out``, so a chain runs entirely in the output buffer
        temps_free: dict = {(out_var.aval.shape, out_var.aval.dtype): ["out"]} if single and isinstance(out_var, Var) else {}
        temp_owner: dict = {}  # temp name -> var currently held
        lines = []
        n = len(body.eqns)
        final_copy = None
        for i, e in enumerate(body.eqns):
            o = e.outputs[0]
            ins = [_literal_code(ctx, a) if isinstance(a, Literal) else names[a] for a in e.inputs]
            if o in direct:
                target = direct[o]
            elif o is out_var and i == n - 1:
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
        if single:
            if final_copy is not None:
                lines.append(f"np.copyto(out, {final_copy})")
            elif not body.eqns or body.eqns[-1].outputs[0] is not out_var:
                lines.append(f"np.copyto(out, {self._source_of(ctx, names, out_var)})")
        else:
            # outputs that no step wrote: an input, a literal, or a value listed twice
            for v, name in zip(body.outvars, out_names):
                if names.get(v) != name:
                    lines.append(f"np.copyto({name}, {self._source_of(ctx, names, v)})")
        args = ", ".join([f"i{k}" for k in range(len(body.invars))] + out_names)
        ret = "out" if single else "(" + ", ".join(out_names) + ",)"
        self.source = f"def fused({args}):\n" + "".join(f"    {l}\n" for l in lines) + f"    return {ret}\n"
        exec(compile(self.source, "<fedarena.engine fused kernel>", "exec"), ns)  # noqa: S102 - generated by us
        self.fn = ns["fused"]
        self.n_in = len(body.invars)
        self.multi = not single

    @staticmethod
    def _source_of(ctx: _EmitContext, names: dict, v: Any) -> str:
        return _literal_code(ctx, v) if isinstance(v, Literal) else names[v]

    def __call__(self, *args: Any) -> Any:
        if self.multi:
            ins, outs = args[: self.n_in], args[self.n_in :]
            if any(o is i for o in outs for i in ins):
                # an output over an input (a donated argument): each output is written while later
                # steps still read the inputs, so compute into temporaries and copy at the end
                tmp = [np.empty_like(o) for o in outs]
                self.fn(*ins, *tmp)
                for o, t in zip(outs, tmp):
                    np.copyto(o, t)
                return tuple(outs)
        return self.fn(*args)


def _fused_impl(*ins, body):
    outs = [np.empty(v.aval.shape, v.aval.dtype) for v in body.outvars]
    res = FusedKernel(body)(*ins, *outs)
    return list(res) if _multi(body) else res


def _fused_emit(ctx, ins, attrs, in_avals, out_aval):
    """One call into the native VM (several outputs: a tuple of buffers ``{o0}, {o1}, ...``),
    falling back to the generated numpy function when an operand is not a readable buffer."""
    body = attrs["body"]
    outs = [f"{{o{k}}}" for k in range(len(body.outvars))] if _multi(body) else ["{o}"]
    k = ctx.const(FusedKernel(body))
    call = f"{k}({', '.join(list(ins) + outs)})"
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
    prog = native.elementwise_program(body, frozenset(scalars)) if readable else None
    if prog is not None:
        # one call into the native VM; the generated numpy function if an operand is unreadable
        vm = ctx.const(native._native.elementwise)
        p, c, m = ctx.const(prog.program), ctx.const(prog.consts), ctx.const(prog.modes)
        bp = ctx.const(prog.bparams)
        target = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ",)"
        args = f"{p}, {c}, {m}, {bp}, {prog.n}, {prog.double}, {target}" + "".join(f", {a}" for a in vm_ins)
        return P.stmt(f"if not {vm}({args}): {call}")
    return P.stmt(call)


def _multi(body: Graph) -> bool:
    """Whether ``body`` is the body of a ``fused_multi_p`` node (its rules take and give lists)."""
    return len(body.outvars) > 1


def _fused_vjp(need, ct, out, *ins, body):
    # several outputs: ``ct`` is a list, None for an output without a cotangent
    env, live = AD.forward(body, list(ins), list(need))
    return tuple(AD.backward(body, env, live, list(ct) if _multi(body) else [ct]))


def _body_fn(body: Graph) -> Callable:
    return (lambda *a: eval_graph(body, a)) if _multi(body) else (lambda *a: eval_graph(body, a)[0])


def _fused_jvp(ts, out, *ins, body):
    tangents = [np.zeros(a.aval.shape, a.aval.dtype) if t is None else t for a, t in zip(body.invars, ts)]
    return AD.jvp(_body_fn(body), list(ins), tangents)[1]


def _fused_batch(prim, vals, batched, size, *, body):
    axes = tuple(0 if b else None for b in batched)
    return vmap(_body_fn(body), in_axes=axes)(*vals)


def _multi_rule(avals, attrs, weak):
    body: Graph = attrs["body"]
    if [v.aval for v in body.invars] != list(avals):
        raise ShapeError("fused_elementwise_multi: operands do not match the fused body's inputs")
    return [v.aval for v in body.outvars]


fused_p.abstract_eval = _fused_rule
# several outputs of one shape computed in one pass (multi-output fusion, below): the same rules,
# with a list of outputs; the emit rule's statement writes into ``{o0}, {o1}, ...``
fused_multi_p = register("fused_elementwise_multi")
fused_multi_p.multiple_results = True
fused_multi_p.abstract_eval = _multi_rule
for _p in (fused_p, fused_multi_p):
    _p.impl = _fused_impl
    _p.emit = _fused_emit
    _p.vjp = _fused_vjp
    _p.jvp = _fused_jvp
    _p.batch = _fused_batch
# cupy: the fused group is one generated kernel; a multi-output group (the numpy backend's) runs on the host
fused_p.cuda = lambda e, lib: lib.kernel(lib.elementwise_kernel(e.attrs["body"]), e.inputs)
fused_multi_p.cuda = host_only


def elementwise_fusion(graph: Graph, min_size: int = 2, accept: Callable[[Graph], bool] | None = None, masks: bool = False) -> Graph:
    """Replace every maximal tree of at least ``min_size`` fusible equations (same output shape
    and dtype, inner values used only inside the tree) by one ``fused_elementwise`` equation.
    ``accept(body)``, if given, decides per tree whether to fuse it (the default pipeline fuses
    only what the native VM runs).  A ``broadcast_to`` whose only consumer is in the tree joins
    it, so the tree reads the small operand instead of a strided view.  ``masks``: a boolean value
    of the tree's shape (a comparison's result: the gradient mask of relu, clip, min/max) may be
    an inner value of a float tree; the native VM holds it as 0/1 in the tree's float type."""
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
            if j not in group_of or (a.aval != o.aval and not (masks and a.aval.dtype == np.bool_ and a.aval.shape == o.aval.shape)):
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
    the numpy kernels alone a fused tree is no faster than its equations), then multi-output
    fusion of those trees; nothing when the native kernels are unavailable."""
    if not native.available():
        return graph
    return multi_output_fusion(elementwise_fusion(graph, min_size=1, accept=_vm_worth, masks=True), accept=_vm_worth)


# ----------------------------------------------------------------------------- multi-output fusion


def multi_output_fusion(graph: Graph, accept: Callable[[Graph], bool] | None = None) -> Graph:
    """Merge a fused producer into a fused consumer of the same output shape and dtype when the
    producer's values have other uses too (which tree fusion cannot do): the merged node computes
    both bodies in one pass and outputs, beside the consumer's values, the producer's values that
    are still read elsewhere (producer-consumer multi-output fusion, as XLA's
    ``multi_output_fusion`` pass does it).  The Adam update of one weight matrix -- m', v', and p'
    reading both -- becomes one node reading g, m, v, p once and writing m', v', p' once, instead
    of three passes.

    A pair is merged only when no other equation lies on a path from the producer to the consumer
    (the merged node would depend on itself), every output has the consumer's shape and dtype,
    they fit the VM (``native.VM_MAX_OUTPUTS``) and ``accept`` takes the merged body.  The merged
    node sits where the consumer was; the equations between the two that read the producer's
    values (and those that depend on them) move after it, so the order stays topological."""
    eqns = list(graph.eqns)
    outvars = {a for a in graph.outvars if isinstance(a, Var)}
    tried: set = set()  # (producer, consumer) pairs already tried
    i = 0
    producer, readers = _index(eqns)
    while i < len(eqns):
        merged = None
        if eqns[i].prim is fused_p or eqns[i].prim is fused_multi_p:
            merged = _merge_one_producer(eqns, i, producer, readers, outvars, accept, tried)
        if merged is None:
            i += 1
            continue
        eqns, i = merged  # the merged node may absorb another producer: try it again
        producer, readers = _index(eqns)
    return Graph(graph.invars, graph.constvars, graph.consts, eqns, graph.outvars)


def _index(eqns: list) -> tuple[dict, dict]:
    """``(producer, readers)``: the position of the equation defining each value, and how many
    equations read it."""
    producer = {o: j for j, e in enumerate(eqns) for o in e.outputs}
    readers: dict = {}
    for e in eqns:
        for x in {x for x in e.inputs if isinstance(x, Var)}:
            readers[x] = readers.get(x, 0) + 1
    return producer, readers


def _merge_one_producer(eqns: list, ic: int, producer: dict, readers: dict, outvars: set, accept, tried: set) -> tuple[list, int] | None:
    """Merge one fused producer of ``eqns[ic]`` into it: ``(new equation list, position of the
    merged node)``, or None when none can be merged."""
    c = eqns[ic]
    aval = c.outputs[0].aval
    for ip in sorted({producer[a] for a in c.inputs if isinstance(a, Var) and a in producer}, reverse=True):
        p = eqns[ip]
        if (p.prim is not fused_p and p.prim is not fused_multi_p) or (p, c) in tried:
            continue
        tried.add((p, c))
        if any(o.aval != aval for o in list(p.outputs) + list(c.outputs)):
            continue
        # equations between the two that read the producer's values, and those that depend on them
        after = set(p.outputs)
        moved = []
        for j in range(ip + 1, ic):
            if any(isinstance(x, Var) and x in after for x in eqns[j].inputs):
                moved.append(j)
                after.update(eqns[j].outputs)
        if any(isinstance(x, Var) and x in after and x not in p.outputs for x in c.inputs):
            continue  # the consumer depends on the producer through another equation
        keep = [o for o in p.outputs if o in outvars or readers.get(o, 0) > (o in c.inputs)]
        m = _merged(p, c, keep)
        if m is None or (accept is not None and not accept(m.attrs["body"])):
            continue
        moved_set = set(moved)
        stay = [eqns[j] for j in range(ip + 1, ic) if j not in moved_set]
        return eqns[:ip] + stay + [m] + [eqns[j] for j in moved] + eqns[ic + 1 :], ip + len(stay)
    return None


def _merged(p: Eqn, c: Eqn, keep: list) -> Eqn | None:
    """The fused node computing ``p``'s body, then ``c``'s reading ``p``'s values directly; its
    outputs are ``keep`` (the producer's values read elsewhere) and the consumer's outputs."""
    pb, cb = p.attrs["body"], c.attrs["body"]
    if pb.constvars or cb.constvars or len(keep) + len(c.outputs) > native.VM_MAX_OUTPUTS:
        return None
    ext: list = []
    for a in list(p.inputs) + [x for x in c.inputs if x not in p.outputs]:
        if a not in ext:
            ext.append(a)
    sub_in = [Var(a.aval) for a in ext]
    outer = dict(zip(ext, sub_in))
    ren = {v: outer[a] for v, a in zip(pb.invars, p.inputs)}
    eqns = [Eqn(e.prim, [ren.get(x, x) if isinstance(x, Var) else x for x in e.inputs], e.outputs, e.attrs, e.source) for e in pb.eqns]
    inner = {o: ren.get(v, v) for o, v in zip(p.outputs, pb.outvars)}  # the producer's values inside the body
    ren_c = {v: inner[a] if a in inner else outer[a] for v, a in zip(cb.invars, c.inputs)}
    eqns += [Eqn(e.prim, [ren_c.get(x, x) if isinstance(x, Var) else x for x in e.inputs], e.outputs, e.attrs, e.source) for e in cb.eqns]
    outs = [inner[o] for o in keep] + [ren_c.get(v, v) for v in cb.outvars]
    body = Graph(sub_in, [], [], eqns, outs)
    prim = fused_multi_p if len(outs) > 1 else fused_p
    return Eqn(prim, ext, list(keep) + list(c.outputs), {"body": body}, c.source)


def fused_sources(graph: Graph) -> list[str]:
    """Generated source of every fused node of ``graph`` (for inspection and tests)."""
    return [FusedKernel(e.attrs["body"]).source for e in graph.eqns if e.prim is fused_p or e.prim is fused_multi_p]


__all__ = ["FUSIBLE", "FusedKernel", "default_elementwise_fusion", "elementwise_fusion", "fused_multi_p", "fused_p", "fused_sources", "multi_output_fusion"]
