"""The padded batch axis of a shape-bucketed ``jit`` call, as the operations see it while tracing.

``jit(fn, shape_buckets=...)`` pads the leading (batch) axis of its bucketed arguments with zero rows up to
the next bucket size ``B`` and traces ``fn`` inside a :class:`BucketScope` holding ``B``, the traced number
of valid rows ``n`` and the validity mask ``arange(B) < n``. The reductions in :mod:`fedarena.engine.ops`
ask :func:`padded` whether they reduce over that axis (axis 0 of an array whose leading length is ``B``) and
then mask the padded rows (``sum``: zeros, ``max``/``argmax``: the lowest value, ``min``: the highest,
``prod``: ones) and divide means and variances by the valid count; operations that would mix padded rows
into valid ones ask :func:`refuse`, which raises a one-line :class:`~fedarena.engine.EngineError` when the
call comes from user code. Inside ``vmap`` the scope is suspended (the mapped function sees one example, no
padded axis). docs/engine.md ("Shape buckets") lists which operations respect the mask and which are refused.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from .ir import EngineError

_ENGINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # fedarena/engine


class BucketScope:
    """``size``: the bucket ``B``; ``valid``: the traced int64 count of valid rows; ``mask``: the traced
    bool ``(B,)`` validity mask."""

    __slots__ = ("size", "valid", "mask")

    def __init__(self, size: int, valid: Any, mask: Any) -> None:
        self.size, self.valid, self.mask = int(size), valid, mask


class _Stack(threading.local):
    def __init__(self) -> None:
        self.items: list = []  # BucketScope, or None for a suspension (vmap)
        self.quiet = 0  # > 0: an operation that checked the padded axis itself runs its parts unchecked


_STACK = _Stack()


def current() -> BucketScope | None:
    """The innermost active scope (``None`` outside a bucketed trace or inside ``vmap``)."""
    items = _STACK.items
    return items[-1] if items else None


class scope:
    """``with scope(BucketScope(...)):`` traces with that padded axis; ``with scope(None):`` suspends it."""

    def __init__(self, value: BucketScope | None) -> None:
        self.value = value

    def __enter__(self) -> BucketScope | None:
        _STACK.items.append(self.value)
        return self.value

    def __exit__(self, *exc: Any) -> None:
        _STACK.items.pop()


def padded(shape: tuple, axes: tuple) -> BucketScope | None:
    """The active scope when reducing ``axes`` of an array of ``shape`` crosses the padded axis (axis 0 of
    an array whose leading length is the bucket), else ``None``."""
    s = current()
    if s is None or not shape or shape[0] != s.size or 0 not in axes:
        return None
    return s


def leading(shape: tuple) -> BucketScope | None:
    """The active scope when an array of ``shape`` has the padded axis in front."""
    s = current()
    return s if s is not None and shape and shape[0] == s.size else None


_OPS_DIR = os.path.join(_ENGINE_DIR, "ops") + os.sep


def _from_user() -> bool:
    """Whether the innermost frame outside ``fedarena/engine/ops`` (and this module) is outside the engine."""
    frame = sys._getframe(2)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(_OPS_DIR) and name != os.path.abspath(__file__):
            return not name.startswith(_ENGINE_DIR + os.sep)
        frame = frame.f_back
    return False  # pragma: no cover


class quiet:
    """Operations inside run unchecked (the caller checked the padded axis for the whole operation)."""

    def __enter__(self) -> None:
        _STACK.quiet += 1

    def __exit__(self, *exc: Any) -> None:
        _STACK.quiet -= 1


def refuse(what: str) -> None:
    """Raise the one-line error for an operation that would move the padded batch axis or mix padded rows
    into valid ones, when user code calls it (directly or through a composite of ``ops``). The engine's own
    rules are exempt: a gradient's transposes and reshapes see cotangents whose padded rows the masked
    reductions already zeroed, and ``vmap``'s batching rules see the mapped axis, not the padded one."""
    if not _STACK.quiet and _from_user():
        raise EngineError(f"shape_buckets: {what} would mix the zero rows padded onto the batch axis into valid "
                          "results; call this function without shape_buckets, or keep the batch axis in front "
                          "(see docs/engine.md, 'Shape buckets')")


__all__ = ["BucketScope", "current", "leading", "padded", "quiet", "refuse", "scope"]
