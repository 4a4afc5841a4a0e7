"""jit's call path in C (``_native.FastCall`` and ``JitBase``, used for whole-graph native programs whose
leaves are all arrays): the leaves, the structure decision and the output tree against ``tree_flatten`` /
``tree_unflatten`` (the oracles), the pool, the slow path and misses, calls with a changed structure
answered by the lookup with the right result, and the same behaviour without the C extension."""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine.core import cext
from fedarena.engine.core.pytree import tree_flatten, tree_unflatten

jit_module = sys.modules["fedarena.engine.jit"]
native = cext._native
pytestmark = pytest.mark.skipif(native is None or not hasattr(native, "FastCall"), reason="C extension not built")

Pair = collections.namedtuple("Pair", "a b")
Other = collections.namedtuple("Other", "a b")


def _spec_of(tree):
    leaves, td = tree_flatten(((tree,), {}))
    return jit_module._leaves_spec(td, leaves, (), (), True), leaves


def _echo(*xs):
    return list(xs)


def _fast(spec, run=_echo, out_spec=None, slow=None, pool=None):
    """A FastCall over ``run`` whose outputs are put in ``out_spec`` (default: a flat list of the leaves)."""
    return native.FastCall([run] if pool is None else pool, lambda: run, slow or (lambda *xs: 1 / 0), spec, out_spec)


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
        out = _fast(spec, out_spec=(1, (None,) * len(want)))(((tree,)), {})
        assert type(out) is list and len(out) == len(want) and all(a is b for a, b in zip(out, want))


def _same_tree(a, b):
    """Equal structure with identical leaves (types exact: a namedtuple stays that class)."""
    if isinstance(b, np.ndarray):
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(b, dict):
        return list(a) == list(b) and all(_same_tree(a[k], b[k]) for k in b)
    if isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_tree(x, y) for x, y in zip(a, b))
    return a is b  # None


def test_outputs_are_put_in_the_tree_of_tree_unflatten():
    rng = np.random.default_rng(1)
    for _ in range(300):
        tree = _random_tree(rng)
        leaves, td = tree_flatten(tree)
        out_spec = jit_module._tree_spec(td)
        x = np.zeros(1, np.float32)
        got = _fast((2, (None,)), run=lambda _x: list(leaves), out_spec=out_spec)((x,), {})
        assert _same_tree(got, tree_unflatten(td, leaves))


def test_a_program_with_the_wrong_number_of_outputs_is_an_error():
    x = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="fewer outputs"):
        _fast((2, (None,)), run=lambda _x: [x], out_spec=(2, (None, None)))((x,), {})
    with pytest.raises(ValueError, match="more outputs"):
        _fast((2, (None,)), run=lambda _x: [x, x], out_spec=None)((x,), {})


def test_dict_keys_that_are_not_the_same_objects_are_looked_up():
    """The walk matches a dict's keys by identity first (insertion order, not sorted); equal keys that are
    other string objects, and dicts built in another order, give tree_flatten's leaves all the same."""
    a, b, c = (np.full(1, i, np.float32) for i in range(3))
    key = "gamma"
    spec, want = _spec_of({"alpha": a, "beta": b, key: c})
    built = "".join(["gam", "ma"])  # equal to "gamma", another object
    assert built == key and built is not key
    for other in ({"gamma": c, "alpha": a, "beta": b}, {"beta": b, built: c, "alpha": a}):
        got = native.leaves((other,), spec)
        assert got is not None and [x is y for x, y in zip(got, want)] == [True] * 3
    assert native.leaves(({"alpha": a, "beta": b, "delta": c},), spec) is None  # same size, another key


def test_the_pool_the_slow_path_and_misses():
    x = np.zeros(2, np.float32)
    spec = (2, (None,))
    calls = []
    fc = None

    def run(v):  # reentrant: the inner call finds the pool empty and builds another program
        calls.append("run")
        if len(calls) == 1:
            assert fc.pool == [] and fc((v,), {}) == [v]
        return [v]

    fc = native.FastCall([run], lambda: (calls.append("build"), _echo)[1], lambda *xs: 1 / 0, spec, (1, (None,)))
    assert fc((x,), {}) == [x]
    assert calls == ["run", "build"] and len(fc.pool) == 2  # both programs are free again

    def refuses(v):
        raise TypeError("a layout the program does not take")

    slow = _fast(spec, run=refuses, slow=lambda v: [v + 1], out_spec=None)
    np.testing.assert_array_equal(slow((x,), {}), x + 1)  # the per-equation executor's answer
    assert _fast(spec, run=lambda v: NotImplemented)((x,), {}) is native.MISS  # another dtype or shape
    assert _fast(spec)((x,), {"k": 1}) is native.MISS  # keywords: the Python path

    def fails(v):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _fast(spec, run=fails)((x,), {})


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
    assert _fast(spec, run=lambda *xs: 1 / 0)(((other,)), {}) is native.MISS  # not called


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
    assert type(jf._fast0) is native.FastCall  # the C path is in use for this signature
    p2 = dict(p, c=np.full(2, 3.0, np.float32))  # one key more: a new signature, not the old program
    with pytest.warns(engine.RecompileWarning, match="params"):
        np.testing.assert_array_equal(jf(p2, x), np.full(3, 12.0, np.float32))
    np.testing.assert_array_equal(jf(p, x), np.full(3, 6.0, np.float32))
    assert jf.cache_size == 2


def test_jit_base_calls_the_slow_method_on_a_miss():
    class J(native.JitBase):
        def _call_slow(self, *args, **kwargs):
            return ("slow", args, kwargs)

    j = J()
    assert j(1, k=2) == ("slow", (1,), {"k": 2})  # no fast call yet
    j._fast0 = lambda args, kwargs: ("fast", args, kwargs)
    assert j(1, k=2) == ("fast", (1,), {"k": 2})
    j._fast0 = lambda args, kwargs: native.MISS
    assert j(3) == ("slow", (3,), {})


def test_jit_without_the_c_extension_gives_the_same_results():
    code = (
        "import sys; sys.modules['fedarena.engine._native'] = None\n"  # the import of the extension fails
        "import numpy as np\n"
        "from fedarena import engine\n"
        "from fedarena.engine.jit import Jitted, _JitCall\n"
        "assert issubclass(Jitted, _JitCall)\n"
        "f = engine.jit(lambda p, x: {'y': engine.ops.tanh(x @ p['w']), 'n': None})\n"
        "p = {'w': np.arange(6, dtype=np.float64).reshape(2, 3) / 7}\n"
        "for x in (np.ones((1, 2)), np.ones((1, 2)), np.ones((4, 2))):\n"
        "    out = f(p, x)\n"
        "    np.testing.assert_allclose(out['y'], np.tanh(x @ p['w']), rtol=1e-12)\n"
        "    assert out['n'] is None\n"
        "print('ok', f.cache_size)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", "2"]


def test_a_program_that_drops_the_running_fast_call_does_not_free_it_under_the_call():
    """JitBase holds the fast call it runs: a program (or another thread meanwhile) that replaces ``_fast0``
    drops the last other reference to the running FastCall, whose pool the call still puts the program back in."""
    import gc

    class J(native.JitBase):
        def _call_slow(self, *args, **kwargs):
            return "slow"

    j = J()
    x = np.zeros(2, np.float32)
    seen = []

    def run(v):
        del j._fast0  # the only other reference to the FastCall running this program
        gc.collect()
        seen.append(v)
        return [v, np.ones(3)]

    for _ in range(50):
        j._fast0 = native.FastCall([run], lambda: run, lambda *xs: 1 / 0, (2, (None,)), (1, (None, None)))
        out = j(x)
        assert out[0] is x and out[1].tolist() == [1.0, 1.0, 1.0]
    assert len(seen) == 50 and j(x) == "slow"


@pytest.mark.parametrize("bad", [(), (7,), (0, ("a",), ()), (1, None), (4, "not a class", (None,)), (4, int, (None,)), (2, (None,), "x"),
                                 ("0", (), ()), (2, ((9,),))])
def test_malformed_specs_are_refused_when_given(bad):
    with pytest.raises(ValueError, match="malformed tree spec"):
        native.FastCall([_echo], _echo, _echo, (2, (bad,)), None)
    with pytest.raises(ValueError, match="malformed tree spec"):
        native.FastCall([_echo], _echo, _echo, (2, (None,)), bad)
    with pytest.raises(ValueError, match="malformed tree spec"):
        native.leaves((np.zeros(1),), (2, (bad,)))
