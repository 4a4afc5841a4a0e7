"""The vocabulary of emit rules (how a primitive writes itself into the numpy executor's
generated code): :class:`Code` (a statement writing into the output buffer ``{o}``, or an
expression), and :class:`EmitContext`, which names the objects generated code refers to.
"""

from __future__ import annotations

from typing import Any

import numpy as np

CLIP = getattr(getattr(np, "_core", np).umath, "clip", None) or np.clip
"""numpy's clip ufunc itself (``np.clip`` wraps it in Python argument handling)."""


class Code:
    """What an emitter returns: ``stmt`` writes into the buffer named ``{o}``; ``expr`` is a value;
    ``alloc`` (optional) is an expression computing the same result into a new array."""

    __slots__ = ("text", "kind", "alloc")

    def __init__(self, text: str, kind: str, alloc: str | None = None):
        self.text = text
        self.kind = kind
        self.alloc = alloc


def stmt(text: str) -> Code:
    return Code(text, "stmt")


def expr(text: str) -> Code:
    return Code(text, "expr")


class EmitContext:
    """Names for objects the generated code refers to (constants, kernels, index arrays)."""

    def __init__(self, ns: dict):
        self.ns = ns
        self._n = 0

    def const(self, value: Any) -> str:
        self._n += 1
        name = f"_k{self._n}"
        self.ns[name] = value
        return name
