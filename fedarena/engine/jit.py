"""The tracing frontend: ``jit`` and ``make_graph``.

``jit(fn)`` flattens the arguments to leaves, traces ``fn`` over tracers into a graph the first
time a signature (tree structure, shapes, dtypes, static values) is seen, compiles it with the
numpy executor and caches it; later calls with the same signature only run the compiled code
(JAX's ``jit`` design; Frostig et al., SysML 2018).  Python scalars in the arguments are static
(part of the signature, with a warning when they keep changing); pass numpy scalars/arrays for
values that change between calls.  The cache of a jitted function is bounded
(:data:`CACHE_SIZE` programs, least recently used dropped first).

Cache misses are not silent: the first time a jitted function compiles again because an array
argument's shape or dtype, a static argument or the structure of the arguments changed, it warns
(:class:`RecompileWarning`) naming the argument by its path in the pytree (``x``, ``batch['obs']``)
and the change (old -> new), measured against the closest program already compiled;
:func:`explain_cache_misses` makes every miss explain itself (after JAX's
``jax.config.explain_cache_misses``), and a function that compiles more than ``max_compiles``
programs (default :data:`MAX_COMPILES`) warns once that it exceeded its budget.
"""

from __future__ import annotations

import functools
import inspect
import warnings
import weakref
from collections import OrderedDict
from typing import Any, Callable, Sequence

import numpy as np

from .compiler import passes as _passes
from .backends.numpy.executor import Executable
from .backends.numpy import native_executor as _native_graph
from .backends.cupy import jit as _cupy_jit
from . import ops
from .core import buckets as _buckets
from .core import cext as _cext
from .core.ir import EngineError, Graph, ShapedArray, check_dtype
from .core.nonfinite import SWITCH as _NAN_SWITCH
from .core.pytree import tree_flatten, tree_str, tree_unflatten
from .core.tracing import _TRACE_STACK, Tracer, trace_flat

_PY_SCALARS = (bool, int, float)

RECOMPILE_WARNING_AFTER = 8
"""A jitted function warns (once) when this many compiles differ only in Python scalar values."""

CACHE_SIZE = 64
"""Compiled programs a jitted function keeps; past this the least recently used one is dropped
(a call that needs it again traces and compiles again), so the cache stays bounded however many
distinct static values a caller passes."""


MAX_COMPILES = 16
"""Default compile budget of a jitted function (``jit(..., max_compiles=...)``): one more compile
warns once that the function recompiles more than its callers probably expect."""

_EXPLAIN = [False]


def explain_cache_misses(on: bool = True) -> None:
    """Make every cache miss of every jitted function warn with what changed (a
    :class:`RecompileWarning` per compile after a function's first), instead of the default of one
    warning per function; ``explain_cache_misses(False)`` restores the default."""
    _EXPLAIN[0] = bool(on)


class RecompileWarning(UserWarning):
    """A jitted function compiled again: an argument's shape, dtype, static value or structure
    changed (the message names the argument and the change), or it exceeded its compile budget."""


def static_key(v: Any) -> Any:
    """Hashable cache key of a static value (floats by ``repr``: ``nan`` equals itself, ``-0.0``
    differs from ``0.0``, as the traced programs do)."""
    t = type(v)
    if t is float:
        return (float, repr(v))
    if t is tuple:
        return (t, tuple(static_key(e) for e in v))
    return (t, v)


def same_static(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and static_key(a) == static_key(b))


class _Entry:
    __slots__ = ("executable", "out_tree", "graph", "record")

    def __init__(self, executable, out_tree, graph, record=None):
        self.executable = executable
        self.out_tree = out_tree
        self.graph = graph
        self.record = record  # the _CallRecord it was compiled for (what a later miss is compared with)


def _leaf_paths(td: tuple, prefix: str, out: list) -> None:
    """Append the path of every leaf of the tree ``td`` under ``prefix`` (``x``, ``batch['obs']``,
    ``params[0]``, ``state.h`` for a namedtuple field)."""
    tag = td[0]
    if tag == "*":
        out.append(prefix)
    elif tag == "d":
        for k, c in zip(td[1], td[2]):
            _leaf_paths(c, f"{prefix}[{k!r}]", out)
    elif tag in ("l", "t"):
        for i, c in enumerate(td[1]):
            _leaf_paths(c, f"{prefix}[{i}]", out)
    elif tag == "n":
        fields = getattr(td[1], "_fields", None)
        for i, c in enumerate(td[2]):
            _leaf_paths(c, f"{prefix}.{fields[i]}" if fields else f"{prefix}[{i}]", out)


class _CallRecord:
    """What one compiled signature was made of, by argument name: each argument's tree structure,
    and per leaf path its kind and value (``("array", shape, dtype)``, ``("scalar", key, repr)`` or
    ``("static", key, repr)``), so that a cache miss can say what changed."""

    __slots__ = ("structure", "leaves")

    def __init__(self, structure: dict, leaves: dict) -> None:
        self.structure, self.leaves = structure, leaves

    def diff(self, new: "_CallRecord", buckets: dict | None = None) -> list[tuple[str, str]]:
        """``(kind, text)`` per difference from ``self`` to ``new``; kind is ``structure``, ``shape``,
        ``dtype``, ``static``, ``scalar`` or ``bucket`` (a bucketed leading dimension)."""
        out: list[tuple[str, str]] = []
        for name in list(self.structure) + [n for n in new.structure if n not in self.structure]:
            a, b = self.structure.get(name), new.structure.get(name)
            if a != b:
                show = lambda t: "absent" if t is None else tree_str(t)  # noqa: E731
                out.append(("structure", f"{name}: pytree structure {show(a)} -> {show(b)}"))
        for path, b in new.leaves.items():
            a = self.leaves.get(path)
            if a is None or a == b:
                continue
            if a[0] == "array" and b[0] == "array":
                if a[1] != b[1]:
                    bucketed = (buckets is not None and buckets(path) and len(a[1]) == len(b[1]) and a[1][1:] == b[1][1:])
                    out.append(("bucket" if bucketed else "shape", f"{path}: shape {a[1]} -> {b[1]}"))
                if a[2] != b[2]:
                    out.append(("dtype", f"{path}: dtype {a[2]} -> {b[2]}"))
            elif a[0] == b[0]:
                what = "static value" if a[0] == "static" else "Python scalar"
                out.append((a[0], f"{path}: {what} {a[2]} -> {b[2]}"))
            else:
                describe = lambda d: f"array {d[2]}{list(d[1])}" if d[0] == "array" else f"{'static value' if d[0] == 'static' else 'Python scalar'} {d[2]}"  # noqa: E731
                out.append(("structure", f"{path}: {describe(a)} -> {describe(b)}"))
        return out


def _arg_names(fn: Callable, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [names[i] if i < len(names) else f"args[{i}]" for i in range(n)]


def _record(names: list[str], treedef: tuple, leaves: list, static: tuple, static_argnums: tuple, n_args: int,
            static_kw: tuple) -> _CallRecord:
    dyn_pos = [i for i in range(n_args) if i not in static_argnums]
    dyn_td, kw_td = treedef[1][0], treedef[1][1]
    structure: dict = {}
    paths: list[str] = []
    for pos, td in zip(dyn_pos, dyn_td[1]):
        structure[names[pos]] = td
        _leaf_paths(td, names[pos], paths)
    for k, td in zip(kw_td[1], kw_td[2]) if kw_td[0] == "d" else ():
        structure[k] = td
        _leaf_paths(td, k, paths)
    desc: dict = {}
    for path, x in zip(paths, leaves):
        if type(x) in _PY_SCALARS:
            desc[path] = ("scalar", static_key(x), repr(x))
        else:
            a = x if isinstance(x, np.ndarray) else np.asarray(x)
            desc[path] = ("array", tuple(a.shape), a.dtype)
    for pos, v in zip(static_argnums, static):
        desc[names[pos] if pos < n_args else f"args[{pos}]"] = ("static", static_key(v), repr(v))
    for k, v in static_kw:
        desc[k] = ("static", static_key(v), repr(v))
    return _CallRecord(structure, desc)


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
            key.append((t, repr(x)) if t is float else (t, x))  # repr: nan equals itself, -0.0 != 0.0
        elif isinstance(x, Tracer):  # pragma: no cover - handled by inlining
            raise EngineError("internal: tracer in a top-level jit call")
        else:
            a = np.asarray(x)
            key.append(a.shape)
            key.append(a.dtype)
            arrays.append(a)
    return tuple(key), arrays


def _trace(fn: Callable, treedef: tuple, leaves: list, static: tuple, static_argnums: tuple, n_args: int, static_kw: tuple = ()):
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
        out = fn(*args, **kwargs, **dict(static_kw))
        out_leaves, td = tree_flatten(out)
        out_tree.append(td)
        return out_leaves

    graph, captured = trace_flat(flat_fn, avals)
    if captured:  # pragma: no cover - only possible with leaked tracers
        raise EngineError("jit: the function closes over values traced by an enclosing transformation")
    return graph, out_tree[0]


def _guard_source(
    treedef: tuple, leaves: list, static: tuple, static_argnums: tuple, n_args: int, callee_checks: bool = False, callee_types: bool = False
) -> tuple[str, dict]:
    """Python source of ``guard(args, kwargs) -> list of arrays | None`` that re-checks the tree
    structure, shapes, dtypes and static values of a cached signature without building keys.
    ``callee_checks``: the executable checks the shape and dtype of each ndarray leaf itself (a
    native graph's C function), so the guard checks only that it is exactly an ndarray;
    ``callee_types``: it checks that too for leaves of rank 1 and more (its answer for anything else
    is NotImplemented), so the guard passes those on unchecked."""
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
            if type(x) is float and x != x:
                lines.append(f"    if type({var}) is not float or {var} == {var}: return None")
            elif type(x) is float and x == 0.0:
                lines.append(f"    if type({var}) is not float or {var} != 0.0 or str({var}) != {str(x)!r}: return None")
            elif type(x) in _PY_SCALARS:
                lines.append(f"    if type({var}) is not {type(x).__name__} or {var} != {const(x)}: return None")
            else:
                arr = x if isinstance(x, np.ndarray) else np.asarray(x)
                if not isinstance(x, np.ndarray):
                    lines.append(f"    if type({var}) is ndarray: return None")
                    lines.append(f"    {var} = np.asarray({var})")
                    ns["np"] = np
                # exact type only: an ndarray subclass misses here and takes the slow path (np.asarray)
                if callee_checks and isinstance(x, np.ndarray):
                    if not (callee_types and x.ndim > 0):  # a 0-d leaf: the C function takes scalars too
                        lines.append(f"    if type({var}) is not ndarray: return None")
                    out.append(var)
                    return
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
    ns["_same"] = same_static
    for pos, val in zip(static_argnums, static):
        lines.append(f"    if not _same(args[{pos}], {const(val)}): return None")
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
        # the pool of a native graph holds its C function itself: a layout it refuses (TypeError)
        # runs the per-equation executor (NotImplemented if an argument has another shape after all)
        *(["  except TypeError:", f"    o = _exe._slow({arrays})"] if getattr(exe, "checks_types", False) else []),
        "  finally:",
        "    _pool.append(run)",
    ]
    if getattr(exe, "checks_signature", False):  # another dtype or shape: the C function's answer
        body.append("  if o is NotImplemented: return _MISS")
    body.append(f"  return {build_expr}")
    ns.update({"_MISS": _MISS, "_pool": exe._pool, "_exe": exe})
    return "\n".join(["def fast(args, kwargs):"] + body), ns


_MAX_TREE_LEAVES = 256  # _native.c's MAX_TREE_LEAVES: larger trees keep the Python guard


def _leaves_spec(treedef: tuple, leaves: list, static: tuple, static_argnums: tuple, callee_types: bool):
    """The tree spec of the argument tuple for ``_native.FastCall`` (``_native.c``'s walk_tree), for a
    signature whose argument check can run in C: no static or keyword arguments, and every leaf an array of
    rank 1 or more that the called program checks itself (``callee_types``: exact ndarray type, dtype and
    shape). ``None`` where the Python guard must check."""
    if _cext._native is None or not callee_types or static_argnums or static:
        return None
    if len(leaves) > _MAX_TREE_LEAVES or not all(type(x) is np.ndarray and x.ndim > 0 for x in leaves):
        return None
    dyn_td, kw_td = treedef[1][0], treedef[1][1]
    if dyn_td[0] != "t" or kw_td[0] != "d" or kw_td[1]:
        return None
    return _tree_spec(dyn_td)


def _tree_spec(td: tuple):
    """A tree definition as ``_native.c``'s tree spec: None a leaf, (0, keys, children) a dict, (1, children) a
    list, (2, children) a tuple, (3,) None, (4, cls, children) a namedtuple."""
    tag = td[0]
    if tag == "*":
        return None
    if tag == "N":
        return (3,)
    if tag == "d":
        return (0, tuple(td[1]), tuple(_tree_spec(c) for c in td[2]))
    if tag in ("l", "t"):
        return (1 if tag == "l" else 2, tuple(_tree_spec(c) for c in td[1]))
    return (4, td[1], tuple(_tree_spec(c) for c in td[2]))


_MISS = _cext._native.MISS if _cext._native is not None else object()  # a fast call's "not this signature"


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


_LIVE: "weakref.WeakSet[Jitted]" = weakref.WeakSet()


def _forget_fast_paths() -> None:
    """The NaN debugger was switched: every jitted function looks its program up again (the
    checking and the ordinary program are cached under different keys)."""
    for j in list(_LIVE):
        j._fast.clear()
        j._fast0 = _always_miss


_NAN_SWITCH.listeners.append(_forget_fast_paths)


class _JitCall:
    """Jitted's call where the C extension is not built (``_native.JitBase`` does the same in C): the newest
    signature's fast call, and the lookup when it misses."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._fast0(args, kwargs)
        if out is not _MISS:
            return out
        return self._call_slow(*args, **kwargs)


class Jitted(_cext._native.JitBase if _cext._native is not None else _JitCall):
    """A jit-compiled function; call it like the original."""

    def __init__(self, fn: Callable, static_argnums: Sequence[int] = (), passes: Any = None, static_argnames: Sequence[str] = (),
                 debug_nans: bool | None = None, donate_argnums: Sequence[int] = (), max_compiles: int | None = None,
                 shape_varies: bool = False):
        self.fn = fn
        if max_compiles is not None and (isinstance(max_compiles, bool) or not isinstance(max_compiles, int) or max_compiles < 1):
            raise EngineError(f"jit: max_compiles must be a positive int, got {max_compiles!r}")
        self.max_compiles = max_compiles  # None: the module's MAX_COMPILES at the time of the compile
        self.compiles = 0  # programs compiled so far (evicted ones included)
        # the once-per-function warning about a changed shape/dtype/static value (not for a function whose
        # caller expects several shapes)
        self._shape_varies = bool(shape_varies)
        self._miss_warned = self._shape_varies
        self._budget_warned = False
        self.donate_argnums = frozenset(int(i) for i in donate_argnums)
        if self.donate_argnums & set(int(i) for i in static_argnums):
            raise EngineError(f"jit: an argument cannot be both static and donated: {sorted(self.donate_argnums & set(static_argnums))}")
        self.debug_nans = debug_nans  # None: follow engine.debug_nans; True/False: always / never check
        self.static_argnums = tuple(sorted(int(i) for i in static_argnums))
        self.static_argnames = frozenset(static_argnames)
        self.passes = passes  # see passes.resolve: None -> the default pipeline, () -> none
        self._cache: OrderedDict = OrderedDict()  # key -> _Entry, least recently used first
        self._fast: list = []  # (fast call, executable) for recently used signatures, newest first
        self._fast0: Callable = _always_miss  # self._fast[0]'s fast call
        self._variants: dict = {}  # signature without Python scalar values -> number of compiles
        self._warned = False
        functools.update_wrapper(self, fn)
        _LIVE.add(self)

    def __reduce__(self):
        """A copy or a pickle (``copy.deepcopy``, ``pickle``, Ray's cloudpickle) is the same jitted function
        without its compiled programs, which belong to this process (a native one is rebuilt from the disk
        cache on the first call)."""
        return (Jitted, (self.fn, self.static_argnums, self.passes, tuple(sorted(self.static_argnames)),
                         self.debug_nans, tuple(sorted(self.donate_argnums)), self.max_compiles, self._shape_varies))

    def _lookup(self, args: tuple, kwargs: dict, static_kw: tuple = ()):
        dyn, static = _split(args, self.static_argnums)
        leaves, treedef = tree_flatten((dyn, kwargs))
        sig, arrays = _signature(leaves)
        check = _NAN_SWITCH.on if self.debug_nans is None else self.debug_nans
        try:
            key = (treedef, sig, static_key(static), static_key(static_kw), len(args), check)
            hash(key)
        except TypeError:
            raise EngineError(f"jit: static arguments must be hashable, got {static + static_kw!r}") from None
        entry = self._cache.get(key)
        if entry is not None:
            self._cache.move_to_end(key)
        else:
            graph, out_tree = _trace(self.fn, treedef, leaves, static, self.static_argnums, len(args), static_kw)
            # the NaN debugger checks the equations as traced (no fusion), unless passes are given
            pipeline = _passes.resolve(() if check and self.passes is None else self.passes)
            if pipeline is not None:
                graph = pipeline(graph)
            donated = self._donated(args, leaves)
            # whole-graph native code, else (no compiler, a large graph, equations without a C
            # lowering spread through it, the NaN debugger, donated arguments: only the executor
            # writes their buffers in place) the per-equation executor
            exe = None if check or donated or not _native_graph.enabled() else _native_graph.native_executable(graph)
            if exe is None:
                exe = Executable(graph, check_finite=check, donated=donated)
            graph = exe.graph
            record = _record(self._arg_names(len(args)), treedef, leaves, static, self.static_argnums, len(args), static_kw)
            self._explain_miss(record, check)
            entry = _Entry(exe, out_tree, graph, record)
            self._cache[key] = entry
            self._evict()
            self._count_variant(key, args, leaves)
            if not static_kw and not self.static_argnames:
                callee = getattr(entry.executable, "checks_signature", False)
                types = getattr(entry.executable, "checks_types", False)
                spec = _leaves_spec(treedef, leaves, static, self.static_argnums, callee and types)
                if spec is not None:  # the whole call path in C (_native.c's FastCall)
                    exe = entry.executable
                    call = _cext._native.FastCall(exe._pool, exe._build, exe._slow, spec, _tree_spec(out_tree))
                else:
                    gsrc, gns = _guard_source(treedef, leaves, static, self.static_argnums, len(args), callee, types)
                    fsrc, fns = _fast_call_source(gsrc, entry.executable, out_tree)
                    fns.update(gns)
                    call = _compile_fn(fsrc, fns, "fast")
                fast = (call, entry.executable)
                self._fast.insert(0, fast)
                del self._fast[4:]
                self._fast0 = fast[0]
        return entry, arrays

    def _explain_miss(self, record: _CallRecord, check: bool) -> None:
        """Warn about this compile: what changed against the closest cached program (every miss under
        :func:`explain_cache_misses`, else once per function when an array's shape or dtype, a static
        value or the arguments' structure changed; Python scalars alone have their own warning), and
        once when the compile budget is exceeded."""
        self.compiles += 1
        name = getattr(self.fn, "__name__", "fn")
        olds = [e.record for e in reversed(self._cache.values()) if e.record is not None]  # most recent first
        if olds:
            diffs = min((old.diff(record, self._bucket_paths()) for old in olds), key=lambda d: (sum(k == "structure" for k, _ in d), len(d)))
            if not diffs:  # same arguments: the program was evicted, or the NaN debugger was switched
                diffs = [("cache", "the same signature was evicted from the cache (CACHE_SIZE)" if not any(
                    e.record is not None and e.executable.check_finite != check for e in self._cache.values())
                    else "the NaN debugger was switched")]
            loud = [t for k, t in diffs if k in ("structure", "shape", "dtype", "static")]
            if _EXPLAIN[0] or (loud and not self._miss_warned):
                if not _EXPLAIN[0]:
                    self._miss_warned = True
                shown = [t for _, t in diffs] if _EXPLAIN[0] else loud
                warnings.warn(
                    f"jit({name}) compiles program {self.compiles} because {'; '.join(shown)}. Every new "
                    "input shape, dtype or static value traces and compiles a new program: keep shapes fixed, "
                    "pad them to a few sizes (jit(..., shape_buckets=...)), or pass values that change as "
                    "arrays; engine.explain_cache_misses(True) explains every miss"
                    + ("" if _EXPLAIN[0] else " (this function warns once)") + ".",
                    RecompileWarning, stacklevel=4)
        budget = MAX_COMPILES if self.max_compiles is None else self.max_compiles
        if self.compiles > budget and not self._budget_warned:
            self._budget_warned = True
            warnings.warn(
                f"jit({name}) compiled {self.compiles} programs, over its budget of {budget} "
                "(jit(..., max_compiles=...); default MAX_COMPILES of the module fedarena.engine.jit); each compile traces and builds "
                "a new program, so a function whose shapes or static values keep changing runs mostly in the "
                "compiler.", RecompileWarning, stacklevel=4)

    def _arg_names(self, n: int) -> list[str]:
        """Names of the first ``n`` positional parameters, as warnings show them."""
        return _arg_names(self.fn, n)

    _bucket_prefixes: tuple = ()  # set by BucketedJitted: the names of the arguments whose leading axis is padded

    def _bucket_paths(self) -> Callable[[str], bool] | None:
        prefixes = self._bucket_prefixes
        if not prefixes:
            return None
        if prefixes == ("*",):  # every non-static positional argument is bucketed
            return lambda path: not path.startswith("n_valid")
        return lambda path: any(path == p or path.startswith((p + "[", p + ".")) for p in prefixes)

    def _donated(self, args: tuple, leaves: list) -> frozenset:
        """Indices among the graph's inputs (the array leaves) of the leaves of donated arguments."""
        if not self.donate_argnums:
            return frozenset()
        out, pos, k = [], 0, 0
        for i in range(len(args)):
            if i in self.static_argnums:
                continue
            n = len(tree_flatten(args[i])[0])
            for leaf in leaves[pos : pos + n]:
                if type(leaf) not in _PY_SCALARS:
                    if i in self.donate_argnums:
                        out.append(k)
                    k += 1
            pos += n
        return frozenset(out)

    def _evict(self) -> None:
        """Drop the least recently used programs past :data:`CACHE_SIZE` (and their fast paths)."""
        while len(self._cache) > CACHE_SIZE:
            # the oldest entry without a fast path (fast-path hits do not refresh the order)
            hot = {id(f[1]) for f in self._fast}
            key = next((k for k, e in self._cache.items() if id(e.executable) not in hot), next(iter(self._cache)))
            old = self._cache.pop(key)
            self._fast = [f for f in self._fast if f[1] is not old.executable]
            self._fast0 = self._fast[0][0] if self._fast else _always_miss

    def _count_variant(self, key: tuple, args: tuple, leaves: list) -> None:
        """Warn once when compiles pile up that differ only in the values of Python scalars."""
        treedef, sig, *rest = key
        shape_sig = (treedef, tuple((e[0], "scalar") if type(e) is tuple and len(e) == 2 and e[0] in _PY_SCALARS else e for e in sig), *rest)
        n = self._variants.get(shape_sig, 0) + 1
        self._variants[shape_sig] = n
        if n <= RECOMPILE_WARNING_AFTER or self._warned:
            return
        self._warned = True
        try:
            names = list(inspect.signature(self.fn).parameters)
        except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
            names = []
        scalar_args = [names[i] if i < len(names) else f"#{i}" for i, a in enumerate(args) if type(a) in _PY_SCALARS and i not in self.static_argnums]
        which = f"argument(s) {', '.join(scalar_args)}" if scalar_args else "Python scalars inside the arguments"
        warnings.warn(
            f"jit({getattr(self.fn, '__name__', 'fn')}): {n} programs compiled for arguments that differ only in "
            f"the values of {which}; a Python scalar is static (each new value traces and compiles again). "
            "Pass a value that changes between calls as a numpy scalar (np.float32(lr), np.float64(lr), "
            "np.int64(i)) to trace it, or mark what must be static with static_argnums/static_argnames.",
            RecompileWarning,
            stacklevel=3,
        )

    def _call_slow(self, *args: Any, **kwargs: Any) -> Any:
        """A call the newest signature's fast call (``_fast0``, tried first by the base class) missed."""
        if _TRACE_STACK:
            return self.fn(*args, **kwargs)  # inside another transformation: inline
        if self.static_argnames:
            dyn_kw = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
            static_kw = tuple(sorted((k, v) for k, v in kwargs.items() if k in self.static_argnames))
            entry, arrays = self._lookup(args, dyn_kw, static_kw)
            return tree_unflatten(entry.out_tree, entry.executable(*arrays))
        for fast, _ in self._fast[1:]:
            out = fast(args, kwargs)
            if out is not _MISS:
                return out
        entry, arrays = self._lookup(args, kwargs)
        return tree_unflatten(entry.out_tree, entry.executable(*arrays))

    def _entry(self, args: tuple, kwargs: dict) -> _Entry:
        if self.static_argnames:
            dyn_kw = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
            static_kw = tuple(sorted((k, v) for k, v in kwargs.items() if k in self.static_argnames))
            return self._lookup(args, dyn_kw, static_kw)[0]
        return self._lookup(args, kwargs)[0]

    def graph(self, *args: Any, **kwargs: Any) -> Graph:
        """The graph compiled for these arguments (after dead-code elimination)."""
        return self._entry(args, kwargs).executable.graph

    def source(self, *args: Any, **kwargs: Any) -> str:
        """The generated Python source of the compiled schedule for these arguments."""
        return self._entry(args, kwargs).executable.source

    def memory(self, *args: Any, **kwargs: Any):
        """The memory plan of the per-equation program for these arguments (``MemoryPlan``: planned
        vs unplanned bytes, equations run in place; ``.report()`` for one line).  Whole-graph native
        code (the default where a C compiler exists) runs that program's schedule in C with an arena of
        its own that does not share buffers; ``FEDARENA_NATIVE_GRAPH=0`` runs the planned program."""
        return self._entry(args, kwargs).executable.memory

    @property
    def cache_size(self) -> int:
        return len(self._cache)


class BucketedJitted:
    """``jit(fn, shape_buckets=...)``: pads the leading (batch) axis of the bucketed arguments with zero rows
    up to the next bucket size, so calls with different batch sizes share one program per bucket.

    Every array leaf of the bucketed arguments must have the same leading length ``n`` (the batch); the call
    pads them to the smallest bucket ``B >= n`` and traces ``fn`` with the padded shapes and a validity
    mask (core/buckets.py) that the reductions of :mod:`fedarena.engine.ops` (and the losses and layers
    written with them) respect: ``sum``/``mean``/``var``/``std``/``max``/``min``/``prod``/``argmax``/
    ``argmin``/``any``/``all`` over the batch axis ignore the padded rows and means divide by ``n``, so
    ``cross_entropy``/``mse``/``huber`` with ``reduction="mean"``, ``softmax``/``logsumexp`` over the batch
    axis, and their gradients, equal the unpadded call. Outputs whose leading length is ``B`` are cut back to
    ``n`` rows. Operations in the traced function that would move the batch axis or mix padded rows into
    valid ones (a transpose or reshape moving axis 0, concatenating or stacking batches along it, a matmul or
    einsum contracting it, sorting along it, indexing or taking rows along it) raise a one-line error
    instead; docs/engine.md ("Shape buckets") gives the full contract and what is not checked.
    """

    def __init__(self, fn: Callable, buckets: Sequence[int], bucket_argnums: Sequence[int] | None,
                 static_argnums: tuple, passes: Any, static_argnames: Sequence[str], debug_nans: bool | None,
                 donate_argnums: Sequence[int], max_compiles: int | None) -> None:
        try:
            sizes = sorted({int(b) for b in buckets})
        except (TypeError, ValueError):
            raise EngineError(f"jit: shape_buckets must be a sequence of positive ints, got {buckets!r}") from None
        if not sizes or sizes[0] < 1 or any(isinstance(b, bool) or int(b) != b for b in buckets):
            raise EngineError(f"jit: shape_buckets must be a non-empty sequence of positive ints, got {buckets!r}")
        self.fn, self.buckets = fn, tuple(sizes)
        self.static_argnums = tuple(sorted(int(i) for i in static_argnums))
        self.bucket_argnums = None if bucket_argnums is None else tuple(sorted(int(i) for i in bucket_argnums))
        if self.bucket_argnums is not None and set(self.bucket_argnums) & set(self.static_argnums):
            raise EngineError("jit: an argument cannot be both static and bucketed")
        names = _arg_names(fn, 1 + max([*self.static_argnums, *(self.bucket_argnums or ()), 0]))

        def padded_call(n_valid: Any, *args: Any, **kwargs: Any) -> Any:
            size = self._size_inside(args, kwargs)
            mask = ops.less(np.arange(size), n_valid)
            with _buckets.scope(_buckets.BucketScope(size, n_valid, mask)):
                return fn(*args, **kwargs)

        padded_call.__name__ = getattr(fn, "__name__", "fn")
        try:
            sig = inspect.signature(fn)
            padded_call.__signature__ = sig.replace(parameters=[inspect.Parameter(
                "n_valid", inspect.Parameter.POSITIONAL_ONLY)] + list(sig.parameters.values()))  # type: ignore[attr-defined]
        except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
            pass
        self._inner = Jitted(padded_call, [i + 1 for i in self.static_argnums], passes, static_argnames, debug_nans,
                             [int(i) + 1 for i in donate_argnums], max_compiles)
        self._inner._bucket_prefixes = tuple(names[i] for i in self.bucket_argnums) if self.bucket_argnums is not None \
            else ("*",)
        self._inner._arg_names = lambda n: ["n_valid"] + _arg_names(fn, n - 1)  # type: ignore[method-assign]
        self._names = names
        functools.update_wrapper(self, fn)

    def _positions(self, n_args: int) -> list[int]:
        if self.bucket_argnums is None:
            return [i for i in range(n_args) if i not in self.static_argnums]
        return [i for i in self.bucket_argnums if i < n_args]

    def _size_inside(self, args: tuple, kwargs: dict) -> int:
        """The bucket, read from the traced arguments; refuses other arguments whose leading length is the
        bucket's (their axis 0 would be taken for the batch axis)."""
        positions = self._positions(len(args))
        size = next(x.shape[0] for i in positions for x in tree_flatten(args[i])[0] if hasattr(x, "shape"))
        others = [(self._name(i), a) for i, a in enumerate(args) if i not in positions and i not in self.static_argnums]
        others += list(kwargs.items())
        for name, a in others:
            leaves, td = tree_flatten(a)
            paths: list[str] = []
            _leaf_paths(td, name, paths)
            for path, x in zip(paths, leaves):
                if getattr(x, "ndim", 0) and x.shape[0] == size:
                    raise EngineError(f"jit(shape_buckets): argument {path} is not bucketed but its leading length is "
                                      f"the bucket size {size}, so it would be taken for a padded batch; choose "
                                      "buckets that differ from the other arguments' leading lengths")
        return size

    def _name(self, i: int) -> str:
        if i >= len(self._names):
            self._names = _arg_names(self.fn, i + 1)
        return self._names[i]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        positions = self._positions(len(args))
        n = None
        new = list(args)
        for i in positions:
            leaves, td = tree_flatten(args[i])
            paths: list[str] = []
            _leaf_paths(td, self._name(i), paths)
            arrays = []
            for path, x in zip(paths, leaves):
                if isinstance(x, Tracer):
                    return self.fn(*args, **kwargs)  # inside another transformation: inline, unpadded
                a = x if isinstance(x, np.ndarray) else np.asarray(x)
                if a.ndim == 0:
                    raise EngineError(f"jit(shape_buckets): {path} is bucketed but has no leading axis (shape ())")
                if n is None:
                    n, first = a.shape[0], path
                elif a.shape[0] != n:
                    raise EngineError(f"jit(shape_buckets): {path} has {a.shape[0]} rows but {first} has {n}; every "
                                      "bucketed array needs the same leading (batch) length")
                arrays.append(a)
            new[i] = (td, arrays)
        if n is None:
            raise EngineError("jit(shape_buckets): no bucketed array argument (bucket_argnums names the arguments "
                              "whose leading axis is the batch)")
        size = next((b for b in self.buckets if b >= n), None)
        if size is None:
            raise EngineError(f"jit(shape_buckets): a batch of {n} rows is larger than the largest bucket "
                              f"{self.buckets[-1]}")
        for i in positions:
            td, arrays = new[i]
            if size != n:
                arrays = [np.concatenate([a, np.zeros((size - n,) + a.shape[1:], a.dtype)]) for a in arrays]
            new[i] = tree_unflatten(td, arrays)
        out = self._inner(np.asarray(n, np.int64), *new, **kwargs)
        if size == n:
            return out
        leaves, td = tree_flatten(out)
        return tree_unflatten(td, [x[:n] if isinstance(x, np.ndarray) and x.ndim and x.shape[0] == size else x
                                   for x in leaves])

    @property
    def cache_size(self) -> int:
        return self._inner.cache_size

    @property
    def compiles(self) -> int:
        return self._inner.compiles


def jit(
    fn: Callable | None = None,
    static_argnums: int | Sequence[int] = (),
    passes: Any = None,
    static_argnames: str | Sequence[str] = (),
    backend: str = "numpy",
    debug_nans: bool | None = None,
    donate_argnums: int | Sequence[int] = (),
    max_compiles: int | None = None,
    shape_buckets: Sequence[int] | None = None,
    bucket_argnums: int | Sequence[int] | None = None,
    shape_varies: bool = False,
    cuda_graph: bool = False,
) -> Any:
    """Trace ``fn`` into a graph, compile it for numpy and cache per input signature.

    Usable as ``jit(fn)``, ``jit(fn, static_argnums=(1,))``, ``jit(fn, static_argnames="mode")``
    or as a decorator ``@jit``.  Arrays and numpy scalars are traced; Python scalars (bool, int,
    float) are static, part of the cache key (a :class:`RecompileWarning` says so once when more
    than ``RECOMPILE_WARNING_AFTER`` compiles differ only in their values).  Static arguments are
    compared by value (floats by ``repr``, so ``nan`` hits the cache).
    ``passes``: graph passes run before compilation (``None``: ``passes.DEFAULT_PIPELINE``;
    ``()``: none; a list of ``Graph -> Graph`` functions or a ``passes.Pipeline``).
    ``backend="cupy"``: compile for a CUDA GPU (``backends.cupy``; raises
    ``backends.cupy.GpuUnavailableError`` when cupy or a device is missing).
    ``cuda_graph`` (cupy only): each signature's second call captures its kernels as one CUDA graph that
    later calls replay (see ``backends.cupy.jit``).
    ``debug_nans``: ``True`` compiles a program that raises :class:`~fedarena.engine.NonFiniteError` at
    the first equation producing NaN/Inf (see ``engine.debug_nans``), ``False`` never checks, ``None``
    (default) follows ``engine.debug_nans``.
    ``donate_argnums``: positional arguments the caller gives up (JAX's option of that name): the
    compiled program may write outputs into their arrays, so their contents after the call are
    undefined and they must not be used again (pass the returned values instead).  A training step
    ``jit(step, donate_argnums=(0, 1))`` then updates parameters and optimizer state in place, the
    way PyTorch's optimizers do, reading and writing each array once.  An output takes a donated
    array only when the multi-output elementwise program computing it (an optimizer update) is the
    last to read that array, and only at run time if the array is a writeable, C-ordered numpy
    array owning its memory that is passed once and is not the base of another argument; otherwise
    the output is a new array as without donation.  The cupy backend does not reuse donated arrays.
    ``max_compiles``: the compile budget; one more program warns once (:class:`RecompileWarning`).
    ``None`` reads :data:`MAX_COMPILES` at each compile.  The first recompile caused by a new array
    shape or dtype, static value or argument structure also warns once, naming the argument and the
    change (:func:`explain_cache_misses` for every miss).
    ``shape_varies``: the caller expects a few different input shapes by design (a stack of however many
    clients a round trains, a last partial batch): no warning for a new shape, the compile budget still warns.
    ``shape_buckets``: batch sizes (e.g. ``(32, 128, 512)``); the leading axis of the arguments
    ``bucket_argnums`` (default: every non-static positional argument) is padded with zero rows to the next
    size and masked, so any batch up to the largest size runs one of ``len(shape_buckets)`` programs with
    the unpadded result (see :class:`BucketedJitted` for what respects the mask and what is refused).
    """
    if shape_buckets is None and bucket_argnums is not None:
        raise EngineError("jit: bucket_argnums needs shape_buckets")
    if backend == "cupy":
        if shape_buckets is not None or max_compiles is not None:
            raise EngineError("jit(backend='cupy'): shape_buckets and max_compiles run on the numpy backend only")
        if static_argnames:
            raise EngineError("jit(backend='cupy'): static_argnames is not supported, use static_argnums")
        if debug_nans:
            raise EngineError("jit(backend='cupy'): debug_nans runs on the numpy backend only")
        return _cupy_jit(fn, static_argnums, passes, cuda_graph=cuda_graph)
    if cuda_graph:
        raise EngineError("jit: cuda_graph needs backend='cupy' (CUDA graphs replay GPU kernels)")
    if backend != "numpy":
        raise EngineError(f"jit: backend must be 'numpy' or 'cupy', got {backend!r}")
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    if isinstance(donate_argnums, int):
        donate_argnums = (donate_argnums,)
    if shape_buckets is not None:
        if isinstance(bucket_argnums, int):
            bucket_argnums = (bucket_argnums,)
        make = lambda f: BucketedJitted(f, shape_buckets, bucket_argnums, tuple(static_argnums), passes,  # noqa: E731
                                        static_argnames, debug_nans, donate_argnums, max_compiles)
        return make if fn is None else make(fn)
    if fn is None:
        return lambda f: Jitted(f, static_argnums, passes, static_argnames, debug_nans, donate_argnums, max_compiles,
                                shape_varies)
    return Jitted(fn, static_argnums, passes, static_argnames, debug_nans, donate_argnums, max_compiles,
                  shape_varies)


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
