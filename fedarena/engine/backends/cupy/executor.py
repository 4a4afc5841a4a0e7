"""The cupy backend's executor: a compiled graph as a flat list of device steps over one arena.

Each equation of the schedule becomes one step: a fused elementwise group (or a lone elementwise
equation) launches its generated kernel (:mod:`.kernels`), a reduction its row or column kernel,
the softmax and logsumexp chains their row kernels, ``matmul`` goes to ``xp.matmul`` (cuBLAS under
cupy), convolutions to generated im2col/col2im kernels around ``xp.matmul`` GEMMs, gathers and
scatters to generated kernels, views (reshape, transpose, slices, broadcasts) are views of device
arrays.  The memory plan of the engine (:func:`memory_plan.plan_memory`)
places every intermediate value at an offset of one device arena, allocated once per executable.
Primitives with no device rule run their numpy kernel on host copies; those steps are listed in
``Executable.host_steps`` (empty for the PPO and CNN steps measured in benchmarks/gpu_check.sh; the
CNN step's label check reads back one flag).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ...compiler.memory_plan import VIEW_PRIMITIVES, nbytes, plan_memory
from ...compiler.passes import dead_code_elimination
from ...core.ir import Eqn, Graph, Literal, Var
from ...core.tracing import PRIMITIVES
from . import kernels as K
from . import random_kernels as RK
from .patterns import RowKernelOp

REDUCTIONS = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min"}


def _pad(xp: Any, ins: list, attrs: dict, out: Any) -> None:
    out.fill(0)
    out[tuple(slice(lo, lo + max(0, s - 1) * (it + 1) + 1, it + 1) for s, lo, it in zip(ins[0].shape, attrs["low"], attrs["interior"]))] = ins[0]


def _check_range(xp: Any, ins: list, attrs: dict, out: Any) -> None:
    """Pass the indices through; one flag read back from the device says whether one is out of
    range, and only then the host kernel runs to raise its error."""
    x = ins[0]
    out[...] = x
    if x.size and bool(xp.any((x < attrs["lo"]) | (x >= attrs["hi"]))):
        PRIMITIVES["check_range"].impl(np.asarray(x.get() if hasattr(x, "get") else x), **attrs)


def _cumsum(xp: Any, ins: list, attrs: dict, out: Any) -> None:
    x, axis = ins[0], attrs["axis"]
    if attrs["reverse"]:
        out[...] = xp.flip(xp.cumsum(xp.flip(x, axis), axis, dtype=out.dtype), axis)
    else:
        xp.cumsum(x, axis, dtype=out.dtype, out=out)


DEVICE_RULES: dict = {
    "argmax": lambda xp, ins, attrs, out: out.__setitem__(Ellipsis, xp.argmax(ins[0], axis=attrs["axis"]).reshape(out.shape)),
    "cumsum": _cumsum,
    "reduce_prod": lambda xp, ins, attrs, out: out.__setitem__(Ellipsis, xp.prod(ins[0], axis=tuple(attrs["axes"]), dtype=out.dtype).reshape(out.shape)),
    "one_hot": lambda xp, ins, attrs, out: out.__setitem__(Ellipsis, ins[0][..., None] == xp.arange(attrs["num_classes"])),
    "conv_gemm": lambda xp, ins, attrs, out: xp.matmul(ins[0], ins[1], out=out),
    "check_range": _check_range,
    "concatenate": lambda xp, ins, attrs, out: xp.concatenate(ins, axis=attrs["axis"], out=out),
    "stack": lambda xp, ins, attrs, out: xp.stack(ins, axis=attrs["axis"], out=out),
    "full": lambda xp, ins, attrs, out: out.fill(attrs["value"]),
    "pad": _pad,
}
"""Primitives run by the array module's own device functions (cupy's kernels on a GPU), writing
into their arena buffer: ``rule(xp, operands, attrs, out)``."""

SPEC_RULES: dict = {}
"""Device rules registered by other modules (:mod:`.indexing`, :mod:`.control`):
``rule(executable, eqn) -> spec or None`` (``None``: no device rule for this equation).  A spec is
``("kernel" | "scatter", Kernel, operands)`` (a generated kernel; ``scatter`` zeroes the output
first) or ``("step", builder, operands)`` where ``builder(executable, eqn, buffers)`` returns the
step ``step(env)`` (``buffers``: the arena buffer of each output, ``None`` for a fresh array) and
``builder.host_steps`` lists host steps nested inside it."""


def _single_body(e: Eqn) -> tuple[Graph, list]:
    """One elementwise equation as a body of its own (its variable operands become inputs)."""
    outer: list = []
    for a in e.inputs:
        if isinstance(a, Var) and a not in outer:
            outer.append(a)
    inner = [Var(a.aval) for a in outer]
    ren = dict(zip(outer, inner))
    eq = Eqn(e.prim, [ren.get(a, a) if isinstance(a, Var) else a for a in e.inputs], e.outputs, e.attrs, e.source)
    return Graph(inner, [], [], [eq], [e.outputs[0]]), outer


class Executable:
    """``exe(*flat_inputs) -> list of device arrays`` on ``device`` (see :mod:`.device`).

    ``kernels``: every generated kernel, ``source``: the CUDA module they form, ``memory``: the
    plan the arena follows, ``host_steps``: primitives run on host copies (no device rule)."""

    def __init__(self, graph: Graph, device: Any, validate: bool = True):
        if validate:
            graph.validate()
        self.device = device
        self.xp = device.xp
        graph = dead_code_elimination(graph)
        self.graph = graph
        self.kernels: list = []
        self.host_steps: list = []
        self._plan_steps()
        self.source = K.module_source(self.kernels)
        self.memory = plan_memory(graph)
        self._module = None

    # ------------------------------------------------------------------ building

    def _plan_steps(self) -> None:
        """Decide each equation's step and generate its kernel (no device work yet)."""
        self._specs: list = []
        for e in self.graph.eqns:
            try:
                spec = self._spec(e)
            except K.KernelGenerationError:  # e.g. float16 operands: no generated kernel
                spec = ("host", None, list(e.inputs))
            if spec[0] == "host":
                self.host_steps.append(e.prim.name)
            elif spec[0] == "step":
                self.host_steps.extend(spec[1].host_steps)
            if spec[0] in ("kernel", "scatter", "col2im"):
                self.kernels.append(spec[1])
            self._specs.append(spec)

    def _spec(self, e: Eqn) -> tuple:
        """``(kind, kernel or None, operands)`` of one equation's step."""
        name = e.prim.name
        rule = SPEC_RULES.get(name)
        spec = rule(self, e) if rule is not None else None
        if spec is not None:
            return spec
        if name == "fused_elementwise":
            spec = ("kernel", K.elementwise_kernel(e.attrs["body"]), list(e.inputs))
        elif isinstance(e.prim, RowKernelOp):
            x = e.inputs[0]
            rows = math.prod(x.aval.shape[:-1])
            spec = ("kernel", K.row_softmax_kernel(rows, x.aval.shape[-1], x.aval.dtype, log=e.prim.name == "row_logsumexp"), [x])
        elif name in K.ELEMENTWISE_OPS and name != "broadcast_to" and all(a.aval.dtype in K.CTYPE for a in e.inputs) and e.outputs[0].aval.dtype in K.CTYPE:
            body, outer = _single_body(e)
            spec = ("kernel", K.elementwise_kernel(body), outer)
        elif name in REDUCTIONS and e.inputs[0].aval.dtype in K.CTYPE and e.outputs[0].aval.dtype in K.CTYPE:
            x = e.inputs[0]
            spec = ("kernel", K.reduction_kernel(REDUCTIONS[name], x.aval, e.attrs["axes"], e.outputs[0].aval.dtype), [x])
        elif name == "gather" and e.inputs[0].aval.dtype in K.CTYPE:
            spec = ("kernel", K.gather_kernel(e.inputs[0].aval, e.inputs[1].aval, e.attrs["axis"]), list(e.inputs))
        elif name == "scatter_add" and e.inputs[0].aval.dtype in (np.float32, np.float64, np.int32):
            spec = ("scatter", K.scatter_add_kernel(e.inputs[0].aval, e.inputs[1].aval, e.attrs["axis"], tuple(e.attrs["shape"])), list(e.inputs))
        elif name == "im2col" and e.inputs[0].aval.dtype in (np.float32, np.float64):
            spec = ("kernel", K.im2col_kernel(e.inputs[0].aval, e.attrs), [e.inputs[0]])
        elif name in ("max_pool2d", "avg_pool2d"):
            spec = ("kernel", K.pool_kernel(name[:3], e.inputs[0].aval, e.attrs), [e.inputs[0]])
        elif name == "max_pool2d_grad" and e.inputs[0].aval.dtype in (np.float32, np.float64):
            spec = ("kernel", K.max_pool_grad_kernel(e.inputs[0].aval, e.attrs), list(e.inputs))
        elif name == "col2im" and e.inputs[0].aval.dtype in (np.float32, np.float64):
            make = K.phase_col2im_kernel if e.attrs.get("phased") else K.plain_col2im_kernel
            spec = ("kernel", make(e.inputs[0].aval.shape[1], tuple(e.attrs["x_shape"]), e.inputs[0].aval.dtype, e.attrs), [e.inputs[0]])
        elif name == "conv_input_grad" and e.outputs[0].aval.dtype in (np.float32, np.float64) and all(a.aval.dtype == e.outputs[0].aval.dtype for a in e.inputs):
            ct, w2 = e.inputs
            spec = ("col2im", K.phase_col2im_kernel(w2.aval.shape[1], tuple(e.attrs["x_shape"]), e.outputs[0].aval.dtype, e.attrs), [ct, w2])
        elif name in RK.RANDOM_PRIMITIVES:
            spec = ("kernel", RK.random_kernel(e), [e.inputs[0]])
        elif name in DEVICE_RULES:
            spec = ("xp", None, list(e.inputs))
        elif name in VIEW_PRIMITIVES:
            spec = ("view", None, list(e.inputs))
        elif name == "matmul":
            spec = ("matmul", None, list(e.inputs))
        else:
            spec = ("host", None, list(e.inputs))
        return spec

    def _build(self) -> Callable:
        xp, dev = self.xp, self.device
        g, plan = self.graph, self.memory
        if self._module is None and self.kernels:
            self._module = dev.load(self.source, [k.name for k in self.kernels])
        mod = self._module
        bases: dict = {}
        if plan.arena_bytes:
            arena = xp.empty(plan.arena_bytes, np.uint8)
        values: dict = {}
        for v, b in plan.buffer_of.items():
            if b not in bases:
                off = plan.offset.get(b)
                bases[b] = arena[off : off + plan.buffer_bytes[b]] if off is not None else xp.empty(plan.buffer_bytes[b], np.uint8)
            values[v] = bases[b][: nbytes(v)].view(v.aval.dtype).reshape(v.aval.shape)
        # graph outputs computed by a step get a fresh array each call (callers keep them), the
        # rest of the arena is reused by the next call
        fresh = {a for a in g.outvars if isinstance(a, Var) and a not in g.invars}
        for v in fresh:
            values.pop(v, None)
        consts = {v: dev.to_device(np.asarray(c)) for v, c in zip(g.constvars, g.consts)}
        steps = []
        for e, (kind, kern, operands) in zip(g.eqns, self._specs):
            steps.append(self._step(e, kind, kern, operands, values, mod))
        invars, outvars = list(g.invars), list(g.outvars)
        owned = {o for e, spec in zip(g.eqns, self._specs) if spec[0] != "view" for o in e.outputs if o in fresh}
        to_device, is_dev = dev.to_device, dev.is_device_array

        def run(*args: Any) -> list:
            env = dict(consts)
            for v, a in zip(invars, args):
                env[v] = a if is_dev(a) else to_device(a)
            for step in steps:
                step(env)
            outs = []
            for a in outvars:
                if isinstance(a, Literal):
                    outs.append(xp.asarray(np.asarray(a.value, a.aval.dtype)))
                elif a in invars or a in owned:
                    outs.append(env[a])
                else:
                    outs.append(xp.array(env[a], copy=True))  # a view of the arena: copied out
            return outs

        return run

    def _step(self, e: Eqn, kind: str, kern: Any, operands: list, values: dict, mod: Any) -> Callable:
        xp = self.xp
        if kind == "step":
            return kern(self, e, [values.get(o) for o in e.outputs])
        out = e.outputs[0]
        buf = values.get(out)

        def read(env: dict, a: Any) -> Any:
            if isinstance(a, Literal):
                return a.value
            return env[a]

        if kind in ("kernel", "scatter"):
            n = math.prod(out.aval.shape)
            grid, block, name = kern.blocks, kern.threads, kern.name
            launch = mod.launch
            contiguous = xp.ascontiguousarray
            tail = (n,) if name.startswith("fe_ew_") else ()

            zero = kind == "scatter"

            shape, dtype, empty = out.aval.shape, out.aval.dtype, xp.empty

            def kernel_step(env: dict) -> None:
                ins = [contiguous(env[a]) for a in operands]
                o = buf if buf is not None else empty(shape, dtype)
                if zero:
                    o.fill(0)
                if n and all(x.size for x in ins):
                    launch(name, grid, block, *ins, o, *tail)
                env[out] = o

            return kernel_step
        if kind == "col2im":
            ct, w2 = operands
            name, grid, block, launch = kern.name, kern.blocks, kern.threads, mod.launch

            def conv_input_grad_step(env: dict) -> None:
                cols = xp.matmul(xp.transpose(env[w2]), env[ct])  # (N, KH*KW*C [+1], HQ*WQ)
                o = buf if buf is not None else xp.empty(out.aval.shape, out.aval.dtype)
                launch(name, grid, block, xp.ascontiguousarray(cols), o)
                env[out] = o

            return conv_input_grad_step
        if kind == "xp":
            rule, attrs = DEVICE_RULES[e.prim.name], e.attrs

            def xp_step(env: dict) -> None:
                o = buf if buf is not None else xp.empty(out.aval.shape, out.aval.dtype)
                rule(xp, [read(env, a) for a in e.inputs], attrs, o)
                env[out] = o

            return xp_step
        if kind == "view":
            pname, attrs, shape = e.prim.name, e.attrs, out.aval.shape
            if pname == "transpose":
                perm = tuple(attrs["perm"])
                return lambda env: env.__setitem__(out, xp.transpose(env[e.inputs[0]], perm))
            if pname == "broadcast_to":
                return lambda env: env.__setitem__(out, xp.broadcast_to(read(env, e.inputs[0]), shape))
            if pname == "slice":
                sl = tuple(slice(s, l, st) for s, l, st in zip(attrs["starts"], attrs["limits"], attrs["strides"]))
                return lambda env: env.__setitem__(out, env[e.inputs[0]][sl])
            if pname == "stop_gradient":
                return lambda env: env.__setitem__(out, env[e.inputs[0]])
            return lambda env: env.__setitem__(out, xp.reshape(env[e.inputs[0]], shape))
        if kind == "matmul":
            a, b = e.inputs

            def matmul_step(env: dict) -> None:
                x, y = env[a], env[b]
                if buf is None:
                    env[out] = xp.matmul(x, y)
                else:
                    xp.matmul(x, y, out=buf)
                    env[out] = buf

            return matmul_step
        # host fallback: the primitive's numpy kernel on host copies
        dev, impl, attrs = self.device, e.prim.impl, e.attrs
        if e.prim.multiple_results:  # one result per output (control flow)
            bufs = [values.get(o) for o in e.outputs]

            def host_multi_step(env: dict) -> None:
                host = [dev.to_host(env[a]) if isinstance(a, Var) else a.value for a in e.inputs]
                for o, b, r in zip(e.outputs, bufs, impl(*host, **attrs)):
                    r = dev.to_device(np.asarray(r, o.aval.dtype))
                    if b is None:
                        env[o] = r
                    else:
                        b[...] = r
                        env[o] = b

            return host_multi_step

        def host_step(env: dict) -> None:
            host = [dev.to_host(env[a]) if isinstance(a, Var) else a.value for a in e.inputs]
            r = np.asarray(impl(*host, **attrs), out.aval.dtype)
            if buf is None:
                env[out] = dev.to_device(r)
            else:
                buf[...] = dev.to_device(r)
                env[out] = buf

        return host_step

    def __call__(self, *args: Any) -> list:
        run = getattr(self, "_run", None)
        if run is None:
            run = self._run = self._build()
        return run(*args)
