"""The tracing frontend: ``jit`` and ``make_graph``.

``jit(fn)`` flattens the arguments to leaves, traces ``fn`` over tracers into a graph the first
time a signature (tree structure, shapes, dtypes, static values) is seen, compiles it with the
numpy executor and caches it; later calls with the same signature only run the compiled code
(JAX's ``jit`` design; Frostig et al., SysML 2018).  Python scalars in the arguments are static
(part of the signature); pass numpy scalars/arrays for values that change between calls.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

from . import passes as _passes
from .executor import Executable
from .ir import EngineError, Graph, ShapedArray, check_dtype
from .pytree import tree_flatten, tree_unflatten
from .tracing import _TRACE_STACK, Tracer, trace_flat

_PY_SCALARS = (bool, int, float)


class _Entry:
    __slots__ = ("executable", "out_tree", "graph")

    def __init__(self, executable, out_tree, graph):
        self.executable = executable
        self.out_tree = out_tree
        self.graph = graph


def _split(args: tuple, static_argnums: tuple) -> tuple[tuple, tuple]:
    dyn = tuple(a for i, a in enumerate(args) if i not in static_argnums)
    static = tuple(args[i] for i in static_argnums if i < len(args))
    return dyn, static


def _merge(dyn: Sequence, static: Sequence, static_argnums: tuple, n: int) -> list:
    out = []
    di, si = iter(dyn), iter(static)
    for i in range(n):
        out.append(next(si) if i in static_argnums else next(di))
    return out


def _signature(leaves: list) -> tuple[tuple, list]:
    """Hashable key of the leaves, and the list of array leaves that become graph inputs."""
    key = []
    arrays = []
    for x in leaves:
        t = type(x)
        if t is np.ndarray:
            key.append(x.shape)
            key.append(x.dtype)
            arrays.append(x)
        elif t in _PY_SCALARS:
            key.append((t, x))
        elif isinstance(x, Tracer):  # pragma: no cover - handled by inlining
            raise EngineError("internal: tracer in a top-level jit call")
        else:
            a = np.asarray(x)
            key.append(a.shape)
            key.append(a.dtype)
            arrays.append(a)
    return tuple(key), arrays


def _trace(fn: Callable, treedef: tuple, leaves: list, static: tuple, static_argnums: tuple, n_args: int):
    is_arr = [not (type(x) in _PY_SCALARS) for x in leaves]
    avals = []
    for x, a in zip(leaves, is_arr):
        if a:
            arr = x if isinstance(x, np.ndarray) else np.asarray(x)
            check_dtype(arr.dtype, "jit argument")
            avals.append(ShapedArray(arr.shape, arr.dtype))
    out_tree: list = []

    def flat_fn(tracers: list) -> list:
        it = iter(tracers)
        vals = [next(it) if a else x for x, a in zip(leaves, is_arr)]
        dyn, kwargs = tree_unflatten(treedef, vals)
        args = _merge(dyn, static, static_argnums, n_args)
        out = fn(*args, **kwargs)
        out_leaves, td = tree_flatten(out)
        out_tree.append(td)
        return out_leaves

    graph, captured = trace_flat(flat_fn, avals)
    if captured:  # pragma: no cover - only possible with leaked tracers
        raise EngineError("jit: the function closes over values traced by an enclosing transformation")
    return graph, out_tree[0]


def _guard_source(treedef: tuple, leaves: list, static: tuple, static_argnums: tuple, n_args: int) -> tuple[str, dict]:
    """Python source of ``guard(args, kwargs) -> list of arrays | None`` that re-checks the tree
    structure, shapes, dtypes and static values of a cached signature without building keys."""
    ns: dict[str, Any] = {"ndarray": np.ndarray}
    lines = ["def guard(args, kwargs):", "  try:"]
    out: list[str] = []
    counter = [0]
    leaf_iter = iter(leaves)

    def fresh() -> str:
        counter[0] += 1
        return f"n{counter[0]}"

    def const(v: Any) -> str:
        counter[0] += 1
        name = f"c{counter[0]}"
        ns[name] = v
        return name

    def walk(td: tuple, expr: str) -> None:
        tag = td[0]
        if tag == "*":
            x = next(leaf_iter)
            var = fresh()
            lines.append(f"    {var} = {expr}")
            if type(x) in _PY_SCALARS:
                lines.append(f"    if type({var}) is not {type(x).__name__} or {var} != {x!r}: return None")
            else:
                arr = x if isinstance(x, np.ndarray) else np.asarray(x)
                if not isinstance(x, np.ndarray):
                    lines.append(f"    if type({var}) is ndarray: return None")
                    lines.append(f"    {var} = np.asarray({var})")
                    ns["np"] = np
                # exact type only: an ndarray subclass misses here and takes the slow path (np.asarray)
                lines.append(
                    f"    if type({var}) is not ndarray or {var}.shape != {arr.shape!r} or {var}.dtype is not {const(arr.dtype)}: return None"
                )
                out.append(var)
            return
        var = fresh()
        lines.append(f"    {var} = {expr}")
        if tag == "N":
            lines.append(f"    if {var} is not None: return None")
        elif tag == "d":
            keys = td[1]
            lines.append(f"    if type({var}) is not dict or len({var}) != {len(keys)}: return None")
            for k, c in zip(keys, td[2]):
                walk(c, f"{var}[{k!r}]")
        elif tag in ("l", "t"):
            tname = "list" if tag == "l" else "tuple"
            lines.append(f"    if type({var}) is not {tname} or len({var}) != {len(td[1])}: return None")
            for i, c in enumerate(td[1]):
                walk(c, f"{var}[{i}]")
        elif tag == "n":
            lines.append(f"    if type({var}) is not {const(td[1])} : return None")
            for i, c in enumerate(td[2]):
                walk(c, f"{var}[{i}]")

    lines.append(f"    if len(args) != {n_args}: return None")
    # ((dyn, kwargs)) as flattened by _lookup
    dyn_td, kw_td = treedef[1][0], treedef[1][1]
    dyn_pos = [i for i in range(n_args) if i not in static_argnums]
    for pos, c in zip(dyn_pos, dyn_td[1]):
        walk(c, f"args[{pos}]")
    if kw_td[0] == "d" and not kw_td[1]:
        lines.append("    if kwargs: return None")
    else:
        lines.append("    kw = kwargs")
        walk(kw_td, "kw")
    for pos, val in zip(static_argnums, static):
        lines.append(f"    if args[{pos}] != {const(val)}: return None")
    lines.append(f"    return [{', '.join(out)}]")
    lines.append("  except (KeyError, IndexError, TypeError):")
    lines.append("    return None")
    return "\n".join(lines), ns


def _fast_call_source(guard_src: str, exe: Executable, out_tree: tuple) -> tuple[str, dict]:
    """``fast(args, kwargs)``: the guard, the compiled schedule and the output pytree in one
    generated function (returns the ``_MISS`` sentinel when the guard fails)."""
    bsrc, ns = _builder_source(out_tree)
    build_expr = bsrc.split("return ", 1)[1]
    lines = guard_src.replace("return None", "return _MISS").split("\n")
    ret = lines[-3]  # "    return [n1, n2, ...]"
    arrays = ret.strip()[len("return [") : -1]
    body = lines[1:-3] + [
        "  except (KeyError, IndexError, TypeError):",
        "    return _MISS",
        "  try:",
        "    run = _pool.pop()",
        "  except IndexError:",
        "    run = _exe._build()",
        "  try:",
        f"    o = run({arrays})",
        "  finally:",
        "    _pool.append(run)",
        f"  return {build_expr}",
    ]
    ns.update({"_MISS": _MISS, "_pool": exe._pool, "_exe": exe})
    return "\n".join(["def fast(args, kwargs):"] + body), ns


_MISS = object()


def _always_miss(args: tuple, kwargs: dict) -> object:
    return _MISS


def _builder_source(treedef: tuple) -> tuple[str, dict]:
    """Python source of ``build(outs) -> pytree`` for an output tree definition."""
    ns: dict[str, Any] = {}
    idx = [0]

    def expr(td: tuple) -> str:
        tag = td[0]
        if tag == "*":
            idx[0] += 1
            return f"o[{idx[0] - 1}]"
        if tag == "N":
            return "None"
        if tag == "d":
            return "{" + ", ".join(f"{k!r}: {expr(c)}" for k, c in zip(td[1], td[2])) + "}"
        if tag == "l":
            return "[" + ", ".join(expr(c) for c in td[1]) + "]"
        if tag == "t":
            items = [expr(c) for c in td[1]]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        name = f"T{len(ns)}"
        ns[name] = td[1]
        return f"{name}(" + ", ".join(expr(c) for c in td[2]) + ")"

    return f"def build(o):\n    return {expr(treedef)}", ns


def _compile_fn(src: str, ns: dict, name: str):
    exec(compile(src, f"<fedarena.engine {name}>", "exec"), ns)  # noqa: S102 - generated by us
    return ns[name]


class Jitted:
    """A jit-compiled function; call it like the original."""

    def __init__(self, fn: Callable, static_argnums: Sequence[int] = (), passes: Any = None):
        self.fn = fn
        self.static_argnums = tuple(sorted(int(i) for i in static_argnums))
        self.passes = passes  # see passes.resolve: None -> the default pipeline, () -> none
        self._cache: dict = {}
        self._fast: list = []  # (fast call, executable) for recently used signatures, newest first
        self._fast0: Callable = _always_miss  # self._fast[0]'s fast call
        functools.update_wrapper(self, fn)

    def _lookup(self, args: tuple, kwargs: dict):
        dyn, static = _split(args, self.static_argnums)
        leaves, treedef = tree_flatten((dyn, kwargs))
        sig, arrays = _signature(leaves)
        key = (treedef, sig, static, len(args))
        entry = self._cache.get(key)
        if entry is None:
            try:
                hash(static)
            except TypeError:
                raise EngineError(f"jit: static arguments must be hashable, got {static!r}") from None
            graph, out_tree = _trace(self.fn, treedef, leaves, static, self.static_argnums, len(args))
            pipeline = _passes.resolve(self.passes)
            if pipeline is not None:
                graph = pipeline(graph)
            entry = _Entry(Executable(graph), out_tree, graph)
            self._cache[key] = entry
            gsrc, gns = _guard_source(treedef, leaves, static, self.static_argnums, len(args))
            fsrc, fns = _fast_call_source(gsrc, entry.executable, out_tree)
            fns.update(gns)
            fast = (_compile_fn(fsrc, fns, "fast"), entry.executable)
            self._fast.insert(0, fast)
            del self._fast[4:]
            self._fast0 = fast[0]
        return entry, arrays

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._fast0(args, kwargs)  # the most recent signature: guard + compiled code
        if out is not _MISS:
            return out
        if _TRACE_STACK:
            return self.fn(*args, **kwargs)  # inside another transformation: inline
        for fast, _ in self._fast[1:]:
            out = fast(args, kwargs)
            if out is not _MISS:
                return out
        entry, arrays = self._lookup(args, kwargs)
        return tree_unflatten(entry.out_tree, entry.executable(*arrays))

    def graph(self, *args: Any, **kwargs: Any) -> Graph:
        """The graph compiled for these arguments (after dead-code elimination)."""
        return self._lookup(args, kwargs)[0].executable.graph

    def source(self, *args: Any, **kwargs: Any) -> str:
        """The generated Python source of the compiled schedule for these arguments."""
        return self._lookup(args, kwargs)[0].executable.source

    def memory(self, *args: Any, **kwargs: Any):
        """The memory plan the compiled code for these arguments follows (``MemoryPlan``: planned
        vs unplanned bytes, equations run in place; ``.report()`` for one line)."""
        return self._lookup(args, kwargs)[0].executable.memory

    @property
    def cache_size(self) -> int:
        return len(self._cache)


def jit(fn: Callable | None = None, static_argnums: int | Sequence[int] = (), passes: Any = None) -> Any:
    """Trace ``fn`` into a graph, compile it for numpy and cache per input signature.

    Usable as ``jit(fn)``, ``jit(fn, static_argnums=(1,))`` or as a decorator ``@jit``.
    ``passes``: graph passes run before compilation (``None``: ``passes.DEFAULT_PIPELINE``;
    ``()``: none; a list of ``Graph -> Graph`` functions or a ``passes.Pipeline``).
    """
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if fn is None:
        return lambda f: Jitted(f, static_argnums, passes)
    return Jitted(fn, static_argnums, passes)


def make_graph(fn: Callable, static_argnums: int | Sequence[int] = ()) -> Callable[..., Graph]:
    """``make_graph(fn)(*args)`` returns the IR graph of ``fn`` for these arguments (not compiled)."""
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    sa = tuple(sorted(static_argnums))

    def build(*args: Any, **kwargs: Any) -> Graph:
        dyn, static = _split(args, sa)
        leaves, treedef = tree_flatten((dyn, kwargs))
        graph, out_tree = _trace(fn, treedef, leaves, static, sa, len(args))
        graph.out_tree = out_tree  # type: ignore[attr-defined]
        return graph

    return build
