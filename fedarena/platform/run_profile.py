"""Where the time of a command went: ``fedarena run --profile-run FILE`` runs under Python's deterministic
profiler (:mod:`cProfile`) and writes its statistics to FILE (open them with ``python -m pstats FILE`` or
snakeviz) and a summary beside it (FILE + ``.txt``): wall time, the share spent importing modules, the slowest
module imports, and the functions with the largest cumulative time outside the import machinery.
"""

from __future__ import annotations

import cProfile
import pstats
import time
from pathlib import Path
from typing import Any, Callable

def _is_import(func: tuple[str, int, str]) -> bool:
    return func[0].startswith("<frozen importlib") or func[2] in ("<module>", "<built-in method builtins.__import__>")


def _module_name(path: str) -> str:
    """``.../site-packages/scipy/stats/__init__.py`` -> ``scipy.stats``; a fedarena file -> its dotted name."""
    p = Path(path)
    parts = list(p.with_suffix("").parts)
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            parts = parts[parts.index(anchor) + 1:]
            break
    else:
        if "fedarena" in parts:
            parts = parts[len(parts) - 1 - parts[::-1].index("fedarena"):]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def summarize(stats: pstats.Stats, wall: float, top: int = 25, cpu_before: float | None = None) -> str:
    """The text summary of ``stats`` (a profile of ``wall`` seconds; ``cpu_before``: CPU seconds the process had
    spent before the profile started, i.e. interpreter start and the CLI's own imports)."""
    raw: dict[Any, tuple] = stats.stats  # type: ignore[attr-defined]
    importing = sum(ct for (f, line, name), (_, _, _, ct, _) in raw.items()
                    if name == "_find_and_load" and f.startswith("<frozen importlib"))
    # _find_and_load is recursive; pstats' cumulative time counts the outermost calls only
    modules = sorted(((ct, _module_name(f)) for (f, line, name), (_, _, _, ct, _) in raw.items()
                      if name == "<module>" and f.endswith(".py")), reverse=True)
    funcs = sorted(((ct, tt, nc, f, line, name) for (f, line, name), (_, nc, tt, ct, _) in raw.items()
                    if not _is_import((f, line, name)) and not f.startswith("<")), reverse=True)
    lines = [f"wall time: {wall:.3f} s (under the profiler, which slows Python code down)"]
    if cpu_before is not None:
        lines.append(f"before it (interpreter start, the CLI's imports): {cpu_before:.3f} s of CPU")
    lines += [f"importing modules: {importing:.3f} s ({100 * importing / max(wall, 1e-9):.0f} %)", "",
              f"slowest module imports (cumulative s, nested imports included; top {top}):"]
    lines += [f"  {ct:8.3f}  {name}" for ct, name in modules[:top]]
    lines += ["", f"functions by cumulative time, imports left out (cumulative s, own s, calls; top {top}):"]
    for ct, tt, nc, f, line, name in funcs[:top]:
        lines.append(f"  {ct:8.3f}  {tt:8.3f}  {nc:8d}  {_module_name(f)}:{line} {name}")
    return "\n".join(lines) + "\n"


def profile_call(fn: Callable[[], Any], path: str | Path) -> Any:
    """Call ``fn()`` under cProfile; write the statistics to ``path`` and the summary to ``path.txt``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof = cProfile.Profile()
    cpu_before = time.process_time()
    t0 = time.perf_counter()
    try:
        return prof.runcall(fn)
    finally:
        wall = time.perf_counter() - t0
        prof.dump_stats(str(path))
        text = summarize(pstats.Stats(prof), wall, cpu_before=cpu_before)
        path.with_name(path.name + ".txt").write_text(text)
