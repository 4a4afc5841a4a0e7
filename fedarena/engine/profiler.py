"""``engine.profile(compiled)(*args)``: per-equation timings and buffer sizes of a compiled
function, the top equations, and a Chrome trace (the Trace Event Format read by
chrome://tracing and Perfetto, https://ui.perfetto.dev).

Two views: (1) per equation, by replaying the same (optimised) graph equation by equation through
each primitive's numpy kernel (median of ``repeat`` runs; these kernels allocate their results, so
they cost more than the compiled code), with each equation's output bytes and source line; and
(2) per line of the compiled schedule, by running an instrumented copy of the generated function on
its own buffers (the real code; views and constants hoisted to build time do not appear).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable


from .core.interpreter import interpret
from .core.ir import Graph
from .jit import Jitted
from .compiler.memory_plan import nbytes

CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
"""``wall``: elapsed time; ``cpu``: the calling thread's CPU time (robust on a loaded, shared machine;
it leaves out the time other BLAS threads spend, so use it with one thread)."""


def _clock(name: str):
    try:
        return CLOCKS[name]
    except KeyError:
        raise ValueError(f"clock: expected one of {', '.join(CLOCKS)}, got {name!r}") from None


@dataclass
class EquationTiming:
    index: int
    primitive: str
    shape: tuple
    dtype: str
    bytes: int
    seconds: float
    source: str | None


@dataclass
class Profile:
    equations: list = field(default_factory=list)
    compiled_seconds: float = 0.0
    lines: list = field(default_factory=list)  # (line of the compiled schedule, seconds per call)

    @property
    def total_seconds(self) -> float:
        return sum(e.seconds for e in self.equations)

    def top(self, n: int = 10) -> list:
        return sorted(self.equations, key=lambda e: -e.seconds)[:n]

    def by_primitive(self) -> dict:
        out: dict = {}
        for e in self.equations:
            out[e.primitive] = out.get(e.primitive, 0.0) + e.seconds
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def table(self, n: int = 10) -> str:
        tot = self.total_seconds or 1e-30
        lines = [
            f"compiled call: {self.compiled_seconds * 1e6:.1f} us; sum over {len(self.equations)} equations "
            f"(kernel by kernel): {self.total_seconds * 1e6:.1f} us",
            f"{'#':>4} {'primitive':<18} {'output':<22} {'bytes':>10} {'us':>9} {'share':>6}  source",
        ]
        for e in self.top(n):
            shp = f"{e.dtype}{list(e.shape)}"
            lines.append(f"{e.index:>4} {e.primitive:<18} {shp:<22} {e.bytes:>10,} {e.seconds * 1e6:>9.2f} {e.seconds / tot:>6.1%}  {e.source or ''}")
        if self.lines:
            lt = sum(t for _, t in self.lines) or 1e-30
            lines.append(f"compiled schedule, line by line (sum {lt * 1e6:.1f} us incl. ~0.1 us timer cost per line):")
            for text, t in sorted(self.lines, key=lambda kv: -kv[1])[:n]:
                lines.append(f"     {t * 1e6:>9.2f} us {t / lt:>6.1%}  {text}")
        return "\n".join(lines)

    def chrome_trace(self) -> dict:
        events, ts = [], 0.0
        for e in self.equations:
            dur = e.seconds * 1e6
            events.append(
                {
                    "name": e.primitive, "cat": "equation", "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": 0,
                    "args": {"index": e.index, "shape": list(e.shape), "dtype": e.dtype, "bytes": e.bytes, "source": e.source},
                }
            )
            ts += dur
        events.append({"name": "compiled call", "cat": "call", "ph": "X", "ts": 0.0, "dur": self.compiled_seconds * 1e6, "pid": 0, "tid": 1})
        ts = 0.0
        for text, t in self.lines:
            events.append({"name": text[:60], "cat": "compiled line", "ph": "X", "ts": ts, "dur": t * 1e6, "pid": 0, "tid": 2, "args": {"line": text}})
            ts += t * 1e6
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def save_chrome_trace(self, path: str) -> str:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.chrome_trace(), f)
        return path


def profile_graph(graph: Graph, flat_args: list, repeat: int = 5, clock: str = "wall") -> Profile:
    """Time each equation of ``graph`` on ``flat_args`` with the primitives' numpy kernels: the engine's
    one interpreter (:func:`~fedarena.engine.core.interpreter.interpret`) runs the graph ``repeat``
    times with a rule that times each kernel call."""
    tick = _clock(clock)
    index = {id(e): i for i, e in enumerate(graph.eqns)}
    samples: list = [[] for _ in graph.eqns]

    def timed(e, ins: list) -> Any:
        t0 = tick()
        out = e.prim.impl(*ins, **e.attrs)
        samples[index[id(e)]].append(tick() - t0)
        return out

    for _ in range(repeat):
        interpret(graph, flat_args, timed)
    prof = Profile()
    for i, e in enumerate(graph.eqns):
        o = e.outputs[0]  # an equation with several outputs is reported with its first one's type and all their bytes
        prof.equations.append(
            EquationTiming(
                i, e.prim.name, o.aval.shape, o.aval.dtype.name, sum(nbytes(v) for v in e.outputs), statistics.median(samples[i]), e.source
            )
        )
    return prof


def profile_compiled_lines(executable: Any, flat_args: list, repeat: int = 5, clock: str = "wall") -> list:
    """Time every line of the executable's generated schedule (the real compiled code, on its own
    buffers) by running an instrumented copy of it ``repeat`` times; returns (line, median seconds/call)."""
    run = executable._pool[-1] if executable._pool else executable._build()
    ns = run.__globals__
    src_lines = executable.source.split("\n")
    start = next(i for i, l in enumerate(src_lines) if l.startswith("def _run("))
    body = [l[4:] for l in src_lines[start + 1 :] if l.startswith("    ")]
    ret, body = body[-1], body[:-1]
    acc = [0.0] * len(body)
    out = [src_lines[start].replace("def _run(", "def _run_profiled(", 1), "    _t0 = _pc()"]
    for k, line in enumerate(body):
        out.append("    " + line)
        out.append(f"    _t1 = _pc(); _acc[{k}] += _t1 - _t0; _t0 = _t1")
    out.append("    " + ret)
    ns["_pc"], ns["_acc"] = _clock(clock), acc
    exec(compile("\n".join(out), "<fedarena.engine profiled schedule>", "exec"), ns)  # noqa: S102 - generated by us
    prof_run = ns["_run_profiled"]
    prof_run(*flat_args)  # warm
    samples = []
    for _ in range(repeat):
        acc[:] = [0.0] * len(body)
        prof_run(*flat_args)
        samples.append(list(acc))
    return [(line, statistics.median(s[k] for s in samples)) for k, line in enumerate(body)]


def profile(compiled: Callable, repeat: int = 5, top: int = 10, trace_path: str | None = None, printer: Callable | None = print,
            clock: str = "wall") -> Callable[..., Profile]:
    """``profile(jit(fn))(*args)``: a :class:`Profile` of the graph the jitted function compiled for
    these arguments (a plain function is jitted first).  Prints the top equations (``printer=None``
    to stay quiet) and writes a Chrome trace JSON to ``trace_path`` if given.  ``clock="cpu"`` times
    with the calling thread's CPU time (see ``CLOCKS``)."""
    j = compiled if isinstance(compiled, Jitted) else Jitted(compiled)
    tick = _clock(clock)

    def run(*args: Any, **kwargs: Any) -> Profile:
        entry, arrays = j._lookup(args, kwargs)
        graph = entry.executable.graph
        j(*args, **kwargs)  # warm
        times = []
        for _ in range(repeat):
            t0 = tick()
            j(*args, **kwargs)
            times.append(tick() - t0)
        prof = profile_graph(graph, list(arrays), repeat, clock)
        prof.compiled_seconds = statistics.median(times)
        prof.lines = profile_compiled_lines(entry.executable, list(arrays), repeat, clock)
        if trace_path:
            prof.save_chrome_trace(trace_path)
        if printer is not None:
            printer(prof.table(top))
        return prof

    return run
