"""Pytrees: nested dict / list / tuple / namedtuple / None containers of array leaves.

Parameters, optimizer states and batches are pytrees; the frontend flattens them to a list of
leaves plus a hashable tree definition (the same idea as JAX's pytrees).  Dict keys are visited
in sorted order so the leaf order does not depend on insertion order.
"""

from __future__ import annotations

from typing import Any, Callable

# A treedef is a hashable nested tuple: ("*",) for a leaf, ("N",) for None,
# ("d", keys, children), ("l", children), ("t", children), ("n", type, children).
LEAF = ("*",)
_NONE = ("N",)


def _flatten(x: Any, leaves: list) -> tuple:
    t = type(x)
    if t is dict:
        keys = tuple(sorted(x))
        return ("d", keys, tuple(_flatten(x[k], leaves) for k in keys))
    if t is list:
        return ("l", tuple(_flatten(c, leaves) for c in x))
    if t is tuple:
        return ("t", tuple(_flatten(c, leaves) for c in x))
    if x is None:
        return _NONE
    if isinstance(x, tuple) and hasattr(t, "_fields"):
        return ("n", t, tuple(_flatten(c, leaves) for c in x))
    if isinstance(x, dict):
        keys = tuple(sorted(x))
        return ("d", keys, tuple(_flatten(x[k], leaves) for k in keys))
    leaves.append(x)
    return LEAF


def tree_flatten(tree: Any) -> tuple[list, tuple]:
    """Return ``(leaves, treedef)``."""
    leaves: list = []
    return leaves, _flatten(tree, leaves)


def _unflatten(td: tuple, it) -> Any:
    tag = td[0]
    if tag == "*":
        return next(it)
    if tag == "d":
        return {k: _unflatten(c, it) for k, c in zip(td[1], td[2])}
    if tag == "l":
        return [_unflatten(c, it) for c in td[1]]
    if tag == "t":
        return tuple(_unflatten(c, it) for c in td[1])
    if tag == "N":
        return None
    if tag == "n":
        return td[1](*[_unflatten(c, it) for c in td[2]])
    raise ValueError(f"bad treedef tag {tag!r}")


def tree_unflatten(treedef: tuple, leaves: Any) -> Any:
    it = iter(leaves)
    out = _unflatten(treedef, it)
    return out


def tree_leaves(tree: Any) -> list:
    return tree_flatten(tree)[0]


def tree_map(fn: Callable, tree: Any, *rest: Any) -> Any:
    """Apply ``fn`` leafwise; ``rest`` trees must have the same structure as ``tree``."""
    leaves, td = tree_flatten(tree)
    others = []
    for r in rest:
        rl, rtd = tree_flatten(r)
        if rtd != td:
            raise ValueError(f"tree_map: tree structures differ: {tree_str(td)} vs {tree_str(rtd)}")
        others.append(rl)
    return tree_unflatten(td, [fn(*xs) for xs in zip(leaves, *others)])


def tree_paths(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``[(path, leaf), ...]`` in flatten order, paths like ``layers/0/w``."""
    out: list[tuple[str, Any]] = []

    def rec(x: Any, p: str) -> None:
        if isinstance(x, dict):
            for k in sorted(x):
                rec(x[k], f"{p}/{k}" if p else str(k))
        elif isinstance(x, (list, tuple)):
            for i, c in enumerate(x):
                rec(c, f"{p}/{i}" if p else str(i))
        elif x is None:
            return
        else:
            out.append((p, x))

    rec(tree, prefix)
    return out


def tree_str(td: tuple) -> str:
    tag = td[0]
    if tag == "*":
        return "*"
    if tag == "N":
        return "None"
    if tag == "d":
        return "{" + ", ".join(f"{k!r}: {tree_str(c)}" for k, c in zip(td[1], td[2])) + "}"
    if tag == "l":
        return "[" + ", ".join(tree_str(c) for c in td[1]) + "]"
    if tag == "t":
        return "(" + ", ".join(tree_str(c) for c in td[1]) + ("," if len(td[1]) == 1 else "") + ")"
    return td[1].__name__ + "(" + ", ".join(tree_str(c) for c in td[2]) + ")"
