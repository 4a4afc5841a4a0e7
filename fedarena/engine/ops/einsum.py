"""``einsum`` written as transposes, reshapes, sums and batched matmuls (numpy's subscripts)."""

from __future__ import annotations

import builtins as _builtins

import numpy as np

from ..core import buckets as _buckets
from ..core.ir import ShapeError
from .basic import *  # noqa: F403  (the numpy-named operations these are written with)
from .basic import Array, _arr

def einsum(subscripts: str, *operands: Array) -> Array:
    """numpy.einsum for explicit (``"ij,jk->ik"``) and implicit (``"ij,jk"``) subscripts, any
    number of operands (contracted left to right), written as transposes, reshapes, products,
    sums and batched matmuls, so every transformation applies.  Repeated indices within one
    operand (traces, diagonals) and ``...`` are not supported."""
    if "." in subscripts:
        raise ShapeError("einsum: '...' (ellipsis) subscripts are not supported; name the axes")
    spec = subscripts.replace(" ", "")
    if "->" in spec:
        lhs, out = spec.split("->")
    else:
        lhs = spec
        letters = lhs.replace(",", "")
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ShapeError(f"einsum: {len(terms)} subscript groups for {len(operands)} operands")
    ops_ = [_arr(o) for o in operands]
    sizes: dict = {}
    for t, o in zip(terms, ops_):
        if len(t) != ndim(o):
            raise ShapeError(f"einsum: subscripts {t!r} do not match an operand of shape {shape(o)}")
        if len(set(t)) != len(t):
            raise ShapeError(f"einsum: repeated index in {t!r} (traces/diagonals) is not supported")
        for c, n in zip(t, shape(o)):
            if sizes.setdefault(c, n) != n:
                raise ShapeError(f"einsum: index {c!r} has sizes {sizes[c]} and {n}")
    if len(set(out)) != len(out) or _missing_index(out, sizes):
        raise ShapeError(f"einsum: bad output subscripts {out!r}")
    for t, o in zip(terms, ops_):
        if _buckets.leading(shape(o)) is not None and not out.startswith(t[0]):
            _buckets.refuse(f"einsum {subscripts!r} (the padded batch axis {t[0]!r} is not the output's first)")
    with _buckets.quiet():
        return _contract(ops_, terms, out, sizes)


def _contract(ops_: list, terms: list, out: str, sizes: dict) -> Array:
    cur, cur_t = ops_[0], terms[0]
    for k in range(1, len(ops_)):
        later = "".join(terms[k + 1 :]) + out
        cur, cur_t = _einsum_pair(cur, cur_t, ops_[k], terms[k], later, sizes)
    # whatever the output does not keep is summed; then order the axes as asked
    drop = tuple(i for i, c in enumerate(cur_t) if c not in out)
    if drop:
        cur = sum(cur, drop)
        cur_t = "".join(c for c in cur_t if c in out)
    return transpose(cur, [cur_t.index(c) for c in out]) if cur_t != out else cur


def _missing_index(out: str, sizes: dict) -> bool:
    return _builtins.any(c not in sizes for c in out)


def _einsum_pair(a: Array, ta: str, b: Array, tb: str, later: str, sizes: dict) -> tuple:
    """Contract two operands; indices still needed ``later`` are kept."""
    # indices seen only in one operand and not needed later are summed out first
    for arr_name in ("a", "b"):
        x, t, other = (a, ta, tb) if arr_name == "a" else (b, tb, ta)
        lone = tuple(i for i, c in enumerate(t) if c not in other and c not in later)
        if lone:
            x = sum(x, lone)
            t = "".join(c for i, c in enumerate(t) if i not in lone)
        if arr_name == "a":
            a, ta = x, t
        else:
            b, tb = x, t
    batch = [c for c in ta if c in tb and c in later]
    contract = [c for c in ta if c in tb and c not in later]
    free_a = [c for c in ta if c not in tb]
    free_b = [c for c in tb if c not in ta]
    a = transpose(a, [ta.index(c) for c in batch + free_a + contract])
    b = transpose(b, [tb.index(c) for c in batch + contract + free_b])
    nb = [sizes[c] for c in batch]
    m = int(np.prod([sizes[c] for c in free_a], dtype=np.int64))
    kk = int(np.prod([sizes[c] for c in contract], dtype=np.int64))
    n = int(np.prod([sizes[c] for c in free_b], dtype=np.int64))
    a3 = reshape(a, tuple(nb) + (m, kk))
    b3 = reshape(b, tuple(nb) + (kk, n))
    res = reshape(matmul(a3, b3), tuple(nb) + tuple(sizes[c] for c in free_a) + tuple(sizes[c] for c in free_b))
    return res, "".join(batch + free_a + free_b)
