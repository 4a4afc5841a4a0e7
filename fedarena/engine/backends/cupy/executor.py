"""The cupy backend's executor: a compiled graph as a flat list of device steps over one arena.

Each equation of the schedule becomes one step: a fused elementwise group (or a lone elementwise
equation) launches its generated kernel (:mod:`.kernels`), a reduction its row or column kernel,
the softmax and logsumexp chains their row kernels; every other equation's step comes from its
primitive's cupy rule, defined beside the primitive in its family file (``prim.cuda``, see
:mod:`.lowering`): ``matmul`` goes to the device's ``matmul`` (cuBLAS;
tensor cores for float16/bfloat16), convolutions to generated
im2col/col2im kernels around GEMMs, gathers and scatters to generated kernels, views (reshape,
transpose, slices, broadcasts) are views of device arrays; an elementwise primitive gives its C
expression (``prim.cuda_expr``) to the generated kernel.  The memory plan of the engine (:func:`memory_plan.plan_memory`)
places every intermediate value at an offset of one device arena, allocated once per executable.
Primitives declared ``host_only`` (and equations a rule leaves to the host: dtypes without a C
type, literal operands) run their numpy kernel on host copies; those steps are listed in
``Executable.host_steps`` (empty for the PPO and CNN steps measured in benchmarks/gpu_check.sh; the
CNN step's label check reads back one flag).

With ``cuda_graph=True`` the second call captures the whole schedule as one CUDA graph over input
and output buffers of its own, and later calls replay it (one launch); :meth:`Executable.capture_refusal`
names what keeps a schedule from being captured (host steps, ``cond``/``while``, ``check_range``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ...compiler.memory_plan import nbytes, plan_memory
from ...compiler.passes import dead_code_elimination
from ...core.ir import EngineError, Eqn, Graph, Literal, Var
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


class Executable:
    """``exe(*flat_inputs) -> list of device arrays`` on ``device`` (see :mod:`.device`).

    ``kernels``: every generated kernel, ``source``: the CUDA module they form, ``memory``: the
    plan the arena follows, ``host_steps``: primitives run on host copies (declared ``host_only``, or left to
    the host by their rule for this equation)."""

    def __init__(self, graph: Graph, device: Any, validate: bool = True, cuda_graph: bool = False):
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
        self.cuda_graph = bool(cuda_graph)
        self.graph_status = "off" if not cuda_graph else "warm-up"
        self._calls = 0
        self._graph: Any = None

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
        low = lowering.low_precision_spec(e)
        if low is not None:
            return low
        if prim.cuda is not None:
            spec = prim.cuda(e, lowering)
            if spec is None:
                return ("host", None, list(e.inputs))
            if spec[0] == "step":  # the step's builder is made for this executable
                return ("step", spec[1](self, e), spec[2])
            return spec
        if prim.cuda_expr is not None:
            if all(K.has_storage(a.aval.dtype) for a in e.inputs) and K.has_storage(e.outputs[0].aval.dtype):
                body, outer = _single_body(e)
                return ("kernel", K.elementwise_kernel(body), outer)
            return ("host", None, list(e.inputs))
        raise EngineError(
            f"cupy backend: primitive {prim.name!r} has no cupy rule (define its cuda rule beside the primitive, "
            "or declare primitives.base.host_only to run it on the host)"
        )

    def capture_refusal(self) -> str | None:
        """Why this schedule cannot be one CUDA graph (``None`` when it can): host steps copy values
        to the host and back, ``cond``/``while`` read a predicate on the host to choose what runs,
        ``check_range`` reads a flag back; a graph holds only device work with fixed shapes."""
        if self.host_steps:
            return f"host steps {sorted(set(self.host_steps))} copy values to the host"
        for e, spec in zip(self.graph.eqns, self._specs):
            if e.prim.name in ("cond", "while"):
                return f"{e.prim.name!r} reads its predicate on the host"
            if e.prim.name == "check_range":
                return "'check_range' reads a flag back to the host"
            body = getattr(spec[1], "body", None) if spec[0] == "step" else None
            if isinstance(body, Executable):
                why = body.capture_refusal()
                if why is not None:
                    return f"{e.prim.name!r} body: {why}"
        if any(isinstance(a, Literal) for a in self.graph.outvars):
            return "a literal output would be copied from the host"
        return None

    def _build(self, static: bool = False) -> Callable:
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
            if static:  # a captured graph writes its outputs into buffers of its own
                values[v] = xp.empty(v.aval.shape, v.aval.dtype)
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
                elif a in invars or a in owned or static:
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
            shape, dtype, matmul = out.aval.shape, out.aval.dtype, self.device.matmul

            def matmul_step(env: dict) -> None:
                o = buf if buf is not None else xp.empty(shape, dtype)
                matmul(env[a], env[b], o)
                env[out] = o

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
        if self._graph is not None:
            return self._replay(args)
        run = getattr(self, "_run", None)
        if run is None:
            run = self._run = self._build()
        if self.cuda_graph and self.graph_status == "warm-up":
            self._calls += 1
            if self._calls > 1:  # the first call compiled the module and filled caches: capture now
                why = self.capture_refusal()
                if why is not None:
                    self.graph_status = f"not captured: {why}"
                else:
                    self._capture(args)
                    return self._replay(args)
        return run(*args)

    # ------------------------------------------------------------------ CUDA graph

    def _capture(self, args: tuple) -> None:
        """Capture one call's work as a CUDA graph over static input and output buffers (holding
        this call's arguments: the emulated capture runs the work once)."""
        xp, g, dev = self.xp, self.graph, self.device
        run = self._build(static=True)
        ins = [xp.empty(v.aval.shape, v.aval.dtype) for v in g.invars]
        for buf, a in zip(ins, args):
            xp.copyto(buf, a if dev.is_device_array(a) else dev.to_device(a))
        self._graph = self.device.capture(lambda: run(*ins))
        self._graph_inputs, self._graph_outputs = ins, self._graph.result
        self._run = None  # the uncaptured arena is not needed any more
        self.graph_status = "captured"

    def _replay(self, args: tuple) -> list:
        """Copy the arguments into the graph's input buffers, launch it once, copy the outputs out."""
        xp, to_device = self.xp, self.device.to_device
        for buf, a in zip(self._graph_inputs, args):
            if a is not buf:
                xp.copyto(buf, a if self.device.is_device_array(a) else to_device(a))
        self._graph.launch()
        return [xp.array(o, copy=True) for o in self._graph_outputs]
