"""``engine.inspect(fn)(*args)``: the IR before and after each pass, the schedule and the memory
plan of a function, as text (the "dump after each pass" view of compilers such as LLVM's
``-print-after-all`` or XLA's ``--xla_dump_hlo_pass_re``).  The schedule and plan shown are the
ones the numpy executor compiles: its buffer of every value, in-place equations, per-call bytes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .compiler import passes as _passes
from .core.ir import Graph
from .backends.numpy.executor import Executable
from .jit import make_graph
from .compiler.memory_plan import MemoryPlan, nbytes


@dataclass
class Inspection:
    """What :func:`inspect` found; ``str()`` gives the full text report."""

    stages: list = field(default_factory=list)  # (name, Graph) — "traced" first
    graph: Graph | None = None  # the final (optimised) graph, as compiled
    plan: MemoryPlan | None = None  # the executor's memory plan
    source: str = ""  # the generated code

    def schedule(self) -> str:
        lines = ["schedule:"]
        g = self.graph
        for i, e in enumerate(g.eqns):
            src = f"  # {e.source}" if e.source else ""
            inplace = " (in place)" if self.plan and i in self.plan.in_place else ""
            for k, o in enumerate(e.outputs):  # one line per output; an equation's later outputs unnumbered
                buf = self.plan.buffer_of.get(o) if self.plan else None
                where = f"buf{buf}" if buf is not None else "-"
                head = f"  [{i:3d}] {e.prim.name:<18}" if k == 0 else f"  {'':5} {'':<18}"
                lines.append(f"{head} -> {o.aval.str_short():<14} {nbytes(o):>10,} B  {where}{inplace if k == 0 else ''}{src if k == 0 else ''}")
        return "\n".join(lines)

    def __str__(self) -> str:
        parts = []
        for name, g in self.stages:
            parts.append(f"=== IR after {name} ({len(g.eqns)} equations)\n{g}")
        parts.append(self.schedule())
        if self.plan is not None:
            parts.append(self.plan.report())
        return "\n\n".join(parts)


def inspect(fn: Callable, passes: Any = None, static_argnums: Any = (), printer: Callable[[str], Any] | None = print) -> Callable[..., Inspection]:
    """``inspect(fn)(*args)`` prints (with ``printer``; ``None`` to stay quiet) and returns an
    :class:`Inspection`: the traced IR, the IR after every pass of the pipeline ``passes``
    (as for ``jit``), the schedule with the executor's buffer of each value ("-": a view, a value
    allocated per call or a graph output), and the executor's memory plan."""

    def run(*args: Any, **kwargs: Any) -> Inspection:
        g = make_graph(fn, static_argnums)(*args, **kwargs)
        stages: list = [("tracing", g)]
        pipeline = _passes.resolve(passes)
        if pipeline is not None:
            g = pipeline(g, history=stages)
        exe = Executable(g)
        res = Inspection(stages=stages, graph=exe.graph, plan=exe.memory, source=exe.source)
        if printer is not None:
            printer(str(res))
        return res

    return run
