"""The cupy backend's executor: a compiled graph as a flat list of device steps over one arena.

Each equation of the schedule becomes one step: a fused elementwise group (or a lone elementwise
equation) launches its generated kernel (:mod:`.kernels`), a reduction its row or column kernel,
the softmax and logsumexp chains their row kernels; every other equation's step comes from its
primitive's cupy rule, defined beside the primitive in its family file (``prim.cuda``, see
:mod:`.lowering`): ``matmul`` goes to ``xp.matmul`` (cuBLAS under cupy), convolutions to generated
im2col/col2im kernels around GEMMs, gathers and scatters to generated kernels, views (reshape,
transpose, slices, broadcasts) are views of device arrays; an elementwise primitive gives its C
expression (``prim.cuda_expr``) to the generated kernel.  The memory plan of the engine (:func:`memory_plan.plan_memory`)
places every intermediate value at an offset of one device arena, allocated once per executable.
Primitives declared ``host_only`` (and equations a rule leaves to the host: dtypes without a C
type, literal operands) run their numpy kernel on host copies; those steps are listed in
``Executable.host_steps`` (empty for the PPO and CNN steps measured in benchmarks/gpu_check.sh; the
CNN step's label check reads back one flag).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ...compiler.fusion import fused_p
from ...compiler.memory_plan import nbytes, plan_memory
from ...compiler.passes import dead_code_elimination
from ...core.ir import EngineError, Eqn, Graph, Literal, Var
from ...core.tracing import PRIMITIVES
from ...primitives.base import host_only
from . import kernels as K
from . import lowering

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


# The primitives the compiler's passes create (their family files are in compiler/, above the
# primitives): the fused elementwise group is the backend's own kernel; the native-kernel selections
# and multi-output fusion groups of the numpy backend run on the host if a graph brings them.
fused_p.cuda = lambda e, lib: lib.kernel(K.elementwise_kernel(e.attrs["body"]), e.inputs)
for _name in ("fused_elementwise_multi", "dense", "softmax"):
    if _name in PRIMITIVES:
        PRIMITIVES[_name].cuda = host_only


class Executable:
    """``exe(*flat_inputs) -> list of device arrays`` on ``device`` (see :mod:`.device`).

    ``kernels``: every generated kernel, ``source``: the CUDA module they form, ``memory``: the
    plan the arena follows, ``host_steps``: primitives run on host copies (declared ``host_only``, or left to
    the host by their rule for this equation)."""

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
        """``(kind, kernel or builder or function, operands)`` of one equation's step: the primitive's
        own cupy rule (``prim.cuda``, beside it in its family file; ``None``: the host kernel), else
        one generated kernel from its element expression (``prim.cuda_expr``)."""
        prim = e.prim
        if prim.cuda is not None:
            spec = prim.cuda(e, lowering)
            if spec is None:
                return ("host", None, list(e.inputs))
            if spec[0] == "step":  # the step's builder is made for this executable
                return ("step", spec[1](self, e), spec[2])
            return spec
        if prim.cuda_expr is not None:
            if all(a.aval.dtype in K.CTYPE for a in e.inputs) and e.outputs[0].aval.dtype in K.CTYPE:
                body, outer = _single_body(e)
                return ("kernel", K.elementwise_kernel(body), outer)
            return ("host", None, list(e.inputs))
        raise EngineError(
            f"cupy backend: primitive {prim.name!r} has no cupy rule (define its cuda rule beside the primitive, "
            "or declare primitives.base.host_only to run it on the host)"
        )

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
            rule, attrs = kern, e.attrs

            def xp_step(env: dict) -> None:
                o = buf if buf is not None else xp.empty(out.aval.shape, out.aval.dtype)
                rule(xp, [read(env, a) for a in e.inputs], attrs, o)
                env[out] = o

            return xp_step
        if kind == "view":
            view, x = kern, e.inputs[0]
            return lambda env: env.__setitem__(out, view(xp, read(env, x)))
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
