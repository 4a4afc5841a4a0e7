"""Recording an engine profile into a run folder, for the board's profile page: the per-equation times, the
compiled schedule's line times and the memory plan of a jitted step.

``record_profile(run_dir, step, *args, name="train_step")`` runs ``engine.profile`` on ``engine.jit(step)``
with those arguments and writes two files under ``RUN_DIR/profile/``:

``<name>.json``
    ``{"format": 1, "name", "created", "compiled_seconds", "equations": [{index, primitive, shape, dtype, bytes,
    seconds, source}], "by_primitive": {primitive: seconds}, "lines": [[line of the compiled schedule, seconds
    per call]], "memory": {unplanned_bytes, planned_bytes, lower_bound_bytes, arena_bytes, fresh_bytes,
    in_place (equation indices), report (one line), blocks: [{value, buffer, offset, bytes, first, last}]}}``
    where a block is one planned value: its buffer, its byte offset in the arena (null for a dedicated
    buffer), its size and the equations between which it is live.
``<name>.trace.json``
    the Chrome trace ``engine.profile`` writes (chrome://tracing, https://ui.perfetto.dev).

Recording writes into the run folder and is done by the run's own code (or a script); the board only reads
these files (:mod:`fedarena.board.profiles`).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from fedarena import engine
from fedarena.board.profiles import FORMAT, PROFILE_DIR, check_name
from fedarena.platform.checkpoint import write_atomic


def memory_blocks(plan: Any) -> list[dict[str, Any]]:
    """The planned values of an engine ``MemoryPlan`` as ``{value, buffer, offset, bytes, first, last}``."""
    blocks = []
    for var, (first, last) in plan.live.items():
        buf = plan.buffer_of.get(var)
        if buf is None:
            continue
        blocks.append({"value": str(var), "buffer": int(buf), "offset": plan.offset.get(buf),
                       "bytes": int(plan.buffer_bytes[buf]), "first": int(first), "last": int(last)})
    return sorted(blocks, key=lambda b: (b["first"], b["buffer"]))


def record_profile(run_dir: str | Path, step: Callable, *args: Any, name: str = "step", repeat: int = 5) -> Path:
    """Profile ``step`` (a function or an ``engine.jit`` result) on ``args`` and write it into ``run_dir``.

    Returns the path of ``profile/<name>.json``; the Chrome trace goes beside it as ``<name>.trace.json``.
    """
    check_name(name)
    jitted = step if callable(getattr(step, "memory", None)) else engine.jit(step)  # already jitted, or jit it
    out = Path(run_dir) / PROFILE_DIR
    out.mkdir(parents=True, exist_ok=True)
    trace = out / f"{name}.trace.json"
    prof = engine.profile(jitted, repeat=repeat, printer=None)(*args)
    write_atomic(trace, json.dumps(prof.chrome_trace()).encode())
    plan = jitted.memory(*args)
    doc = {
        "format": FORMAT, "name": name, "created": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "compiled_seconds": prof.compiled_seconds,
        "equations": [{"index": e.index, "primitive": e.primitive, "shape": list(e.shape), "dtype": e.dtype,
                       "bytes": int(e.bytes), "seconds": e.seconds, "source": e.source} for e in prof.equations],
        "by_primitive": prof.by_primitive(),
        "lines": [[text, seconds] for text, seconds in prof.lines],
        "memory": {"unplanned_bytes": plan.unplanned_bytes, "planned_bytes": plan.planned_bytes,
                   "lower_bound_bytes": plan.lower_bound_bytes, "arena_bytes": plan.arena_bytes,
                   "fresh_bytes": plan.fresh_bytes, "in_place": sorted(int(i) for i in plan.in_place),
                   "report": plan.report(), "blocks": memory_blocks(plan)},
        "trace": trace.name,
    }
    path = out / f"{name}.json"
    write_atomic(path, json.dumps(doc, allow_nan=False, default=_finite).encode())
    return path


def _finite(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    raise TypeError(f"profile: cannot store {type(v).__name__}")
