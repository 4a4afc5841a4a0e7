"""jit's fast-path argument check in C (``_native.leaves`` / ``call_leaves``, used for whole-graph native
programs whose leaves are all arrays): the leaves and the structure decision against ``tree_flatten``
(the oracle), and calls with a changed structure answered by the slow path with the right result."""

from __future__ import annotations

import collections
import os
import sys

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine.core import cext
from fedarena.engine.core.pytree import tree_flatten

jit_module = sys.modules["fedarena.engine.jit"]
native = cext._native
pytestmark = pytest.mark.skipif(native is None or not hasattr(native, "call_leaves"), reason="C extension not built")

Pair = collections.namedtuple("Pair", "a b")
Other = collections.namedtuple("Other", "a b")


def _spec_of(tree):
    leaves, td = tree_flatten(((tree,), {}))
    return jit_module._leaves_spec(td, leaves, (), (), True), leaves


def _random_tree(rng, depth=0):
    kind = rng.integers(0, 6) if depth < 3 else 0
    if kind == 0:
        return np.zeros(int(rng.integers(1, 4)), np.float32)
    n = int(rng.integers(0, 4))
    kids = [_random_tree(rng, depth + 1) for _ in range(n)]
    if kind == 1:
        return {f"k{int(rng.integers(0, 100))}_{i}": c for i, c in enumerate(kids)}
    if kind == 2:
        return kids
    if kind == 3:
        return tuple(kids)
    if kind == 4:
        return Pair(kids[0] if kids else None, np.ones(2, np.float32))
    return None


def test_leaves_equal_tree_flatten_on_random_trees():
    rng = np.random.default_rng(0)
    for _ in range(300):
        tree = _random_tree(rng)
        spec, want = _spec_of(tree)
        if spec is None:  # no array leaf of rank >= 1 at all is fine too; only array leaves are generated
            continue
        got = native.leaves((tree,), spec)
        assert got is not None and len(got) == len(want) and all(a is b for a, b in zip(got, want))
        assert native.call_leaves(lambda *xs: list(xs), (tree,), spec) == got


@pytest.mark.parametrize(
    "other",
    [
        {"w": np.zeros(2), "b": [np.zeros(1)], "extra": np.zeros(1)},  # one key more
        {"w": np.zeros(2), "c": [np.zeros(1)]},  # another key
        {"w": np.zeros(2), "b": (np.zeros(1),)},  # tuple for list
        {"w": np.zeros(2), "b": [np.zeros(1), np.zeros(1)]},  # longer list
        {"w": np.zeros(2), "b": None},  # None for a subtree
        collections.OrderedDict(w=np.zeros(2), b=[np.zeros(1)]),  # a dict subclass
    ],
)
def test_a_different_structure_is_refused(other):
    spec, _ = _spec_of({"w": np.zeros(2), "b": [np.zeros(1)]})
    assert native.leaves((other,), spec) is None
    assert native.call_leaves(lambda *xs: 1 / 0, (other,), spec) is None  # not called


def test_namedtuple_class_is_checked():
    spec, _ = _spec_of(Pair(np.zeros(1), np.zeros(1)))
    assert native.leaves((Pair(np.zeros(1), np.zeros(1)),), spec) is not None
    assert native.leaves((Other(np.zeros(1), np.zeros(1)),), spec) is None
    assert native.leaves(((np.zeros(1), np.zeros(1)),), spec) is None


def test_scalars_statics_and_large_trees_keep_the_python_guard():
    leaves, td = tree_flatten(((np.zeros(2), 1.5), {}))
    assert jit_module._leaves_spec(td, leaves, (), (), True) is None  # a Python scalar leaf
    leaves, td = tree_flatten(((np.zeros(()),), {}))
    assert jit_module._leaves_spec(td, leaves, (), (), True) is None  # a 0-d array
    leaves, td = tree_flatten((([np.zeros(1)] * 300,), {}))
    assert jit_module._leaves_spec(td, leaves, (), (), True) is None  # more leaves than the C stack holds
    leaves, td = tree_flatten(((np.zeros(2),), {}))
    assert jit_module._leaves_spec(td, leaves, (), (), False) is None  # the callee does not check types


@pytest.mark.skipif(os.environ.get("FEDARENA_NATIVE_GRAPH") == "0", reason="whole-graph native code is off")
def test_jit_answers_a_changed_structure_through_the_slow_path(monkeypatch):
    monkeypatch.setenv("FEDARENA_NATIVE_GRAPH", "1")

    def f(params, x):
        total = x * 0.0
        for v in params.values():
            total = total + engine.ops.sum(v)
        return total

    jf = engine.jit(f)
    x = np.ones(3, np.float32)
    p = {"a": np.full(2, 1.0, np.float32), "b": np.full(2, 2.0, np.float32)}
    np.testing.assert_array_equal(jf(p, x), np.full(3, 6.0, np.float32))
    assert "_call" in jf._fast0.__code__.co_names  # the C check is in use for this signature
    p2 = dict(p, c=np.full(2, 3.0, np.float32))  # one key more: a new signature, not the old program
    with pytest.warns(engine.RecompileWarning, match="params"):
        np.testing.assert_array_equal(jf(p2, x), np.full(3, 12.0, np.float32))
    np.testing.assert_array_equal(jf(p, x), np.full(3, 6.0, np.float32))
    assert jf.cache_size == 2
