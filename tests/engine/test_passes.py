"""Optimisation passes: unit tests on hand-written graphs (what each pass must and must not
rewrite) and a property test on random programs built from the primitive registry — the
optimised graph computes the unoptimised graph's outputs (float64, 1e-6 relative), with and
without gradients."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops, passes
from fedarena.engine.compiler import native
from fedarena.engine.backends.numpy.executor import Executable
from fedarena.engine.core.ir import Graph, Literal

from .graphs import V, eq, prims


def run(g, *args):
    return Executable(g)(*args)


def W(x):
    return Literal(x, weak=True)


# ----------------------------------------------------------------------------- unit tests


def test_dce_drops_unused_equations_and_constants():
    x, a, b, c = V(3), V(3), V(3), V(3)
    k = V(3)
    g = Graph([x], [k], [np.ones(3)], [eq("exp", [x], a), eq("add", [x, k], b), eq("tanh", [x], c)], [c])
    g2 = passes.dead_code_elimination(g)
    assert prims(g2) == ["tanh"] and g2.constvars == []
    g2.validate()


def test_cse_merges_equal_equations_and_constants_but_not_different_attrs():
    x = V(2, 3)
    a, b, c, d, s1, s2 = V(2, 3), V(2, 3), V(2, 3), V(2, 3), V(2), V(3)
    k1, k2 = V(3), V(3)
    g = Graph(
        [x],
        [k1, k2],
        [np.arange(3.0), np.arange(3.0)],
        [
            eq("add", [x, k1], a),
            eq("add", [x, k2], b),  # same as a once the equal constants merge
            eq("mul", [a, b], c),
            eq("mul", [a, a], d),  # same as c after a == b
            eq("reduce_sum", [d], s1, axes=(1,), keepdims=False),
            eq("reduce_sum", [d], s2, axes=(0,), keepdims=False),  # different attrs: kept
        ],
        [c, d, s1, s2],
    )
    g2 = passes.common_subexpression_elimination(g)
    assert prims(g2) == ["add", "mul", "reduce_sum", "reduce_sum"]
    xv = np.random.default_rng(0).standard_normal((2, 3))
    for u, v in zip(run(g, xv), run(g2, xv)):
        np.testing.assert_allclose(u, v)


def test_constant_folding_evaluates_constant_subgraphs():
    x, a, b, c = V(3), V(3), V(3), V(3)
    k = V(3)
    g = Graph([x], [k], [np.array([0.1, 0.2, 0.3])], [eq("exp", [k], a), eq("mul", [a, W(2.0)], b), eq("add", [x, b], c)], [c])
    g2 = passes.constant_folding(g)
    assert prims(g2) == ["add"]
    np.testing.assert_allclose(g2.consts[-1], 2 * np.exp([0.1, 0.2, 0.3]))
    np.testing.assert_allclose(run(g2, np.ones(3))[0], 1 + 2 * np.exp([0.1, 0.2, 0.3]))


@pytest.mark.parametrize(
    "build, expect",
    [
        (lambda x, o: [eq("mul", [x, W(1.0)], o)], []),
        (lambda x, o: [eq("mul", [W(1), x], o)], []),
        (lambda x, o: [eq("add", [x, W(0.0)], o)], []),
        (lambda x, o: [eq("sub", [x, W(0)], o)], []),
        (lambda x, o: [eq("div", [x, W(1.0)], o)], []),
        (lambda x, o: [eq("pow", [x, W(1.0)], o)], []),
        (lambda x, o: [eq("cast", [x], o, dtype=np.dtype(np.float64))], []),
    ],
)
def test_identities_removed(build, expect):
    x, m, o = V(2, 3), V(2, 3), V(2, 3)
    g = Graph([x], [], [], [eq("tanh", [x], m)] + build(m, o), [o])
    g2 = passes.algebraic_simplification(g)
    assert prims(g2) == ["tanh"] + expect
    xv = np.random.default_rng(1).standard_normal((2, 3))
    np.testing.assert_allclose(run(g2, xv)[0], np.tanh(xv))


def test_simplification_keeps_outputs_fresh_and_types_exact():
    # x*1 with x an input and the product an output: kept (outputs are never the caller's array)
    x, o = V(3), V(3)
    g = Graph([x], [], [], [eq("mul", [x, W(1.0)], o)], [o])
    assert prims(passes.algebraic_simplification(g)) == ["mul"]
    # x*1 that broadcasts to a bigger shape, or int*1.0 that changes dtype: kept
    x, o = V(3), V(2, 3)
    k = V(2, 3)
    g = Graph([x], [k], [np.ones((2, 3))], [eq("mul", [x, k], o)], [o])
    assert prims(passes.algebraic_simplification(g)) == ["mul"]
    xi, m, o = V(3, dtype=np.int64), V(3, dtype=np.int64), V(3)
    g = Graph([xi], [], [], [eq("neg", [xi], m), eq("mul", [m, W(1.0)], o)], [o])
    assert prims(passes.algebraic_simplification(g)) == ["neg", "mul"]


def test_times_zero_only_when_declared_finite():
    x, m, o = V(3), V(3), V(3)
    g = Graph([x], [], [], [eq("log", [x], m), eq("mul", [m, W(0.0)], o)], [o])
    assert prims(passes.algebraic_simplification(g)) == ["log", "mul"]  # log(0) * 0 is nan, not 0
    g2 = passes.Simplify(assume_finite=True)(g)
    assert prims(g2) == ["full"]
    np.testing.assert_array_equal(run(g2, np.array([1.0, 2.0, 3.0]))[0], np.zeros(3))


def test_transpose_reshape_broadcast_rules():
    x = V(2, 3, 4)
    t1, t2, t3 = V(3, 4, 2), V(2, 3, 4), V(4, 2, 3)
    r1, r2, r3 = V(6, 4), V(24), V(1, 24)
    b1 = V(1, 24)
    g = Graph(
        [x],
        [],
        [],
        [
            eq("transpose", [x], t1, perm=(1, 2, 0)),
            eq("transpose", [t1], t2, perm=(2, 0, 1)),  # back to x: removed
            eq("transpose", [t1], t3, perm=(1, 2, 0)),  # composed into one transpose of x
            eq("reshape", [t2], r1, shape=(6, 4)),
            eq("reshape", [r1], r2, shape=(24,)),
            eq("expand_dims", [r2], r3, axes=(0,)),  # chain -> one reshape of x
            eq("broadcast_to", [r3], b1, shape=(1, 24)),  # no-op
        ],
        [t3, b1],
    )
    g2 = passes.Pipeline(passes.DEFAULT_PASSES)(g)
    assert sorted(prims(g2)) == ["reshape", "transpose"]
    tr = next(e for e in g2.eqns if e.prim.name == "transpose")
    assert tr.inputs[0] is x and tr.attrs["perm"] == (2, 0, 1)
    xv = np.random.default_rng(2).standard_normal((2, 3, 4))
    o = run(g2, xv)
    np.testing.assert_allclose(o[0], xv.transpose(1, 2, 0).transpose(1, 2, 0))
    np.testing.assert_allclose(o[1], xv.reshape(1, 24))


def test_sum_of_broadcast_becomes_scaled_operand():
    x, t, b, s, s2 = V(3, 1), V(3, 1), V(5, 3, 4), V(3), V(3, 4)
    g = Graph(
        [x],
        [],
        [],
        [
            eq("tanh", [x], t),
            eq("broadcast_to", [t], b, shape=(5, 3, 4)),
            eq("reduce_sum", [b], s, axes=(0, 2), keepdims=False),  # broadcast along both: t * 20
            eq("reduce_sum", [b], s2, axes=(0,), keepdims=False),  # only along 0: t * 5, broadcast on 2
        ],
        [s, s2],
    )
    g.validate()
    g2 = passes.algebraic_simplification(g)
    assert "reduce_sum" not in prims(g2)
    xv = np.random.default_rng(3).standard_normal((3, 1))
    for u, v in zip(run(g, xv), run(g2, xv)):
        np.testing.assert_allclose(v, u, rtol=1e-12)


def test_jit_passes_option():
    def f(x):
        y = ops.transpose(ops.transpose(x * 1.0 + 0.0, (1, 0)), (1, 0))
        return ops.tanh(y) + ops.tanh(y)

    x = np.random.default_rng(4).standard_normal((3, 2))
    j_on, j_off = engine.jit(f), engine.jit(f, passes=())
    np.testing.assert_allclose(j_on(x), j_off(x))
    assert len(j_on.graph(x).eqns) < len(j_off.graph(x).eqns)
    assert prims(j_on.graph(x)) == ["tanh", "add"]
    only_dce = engine.jit(f, passes=[passes.dead_code_elimination])
    assert len(only_dce.graph(x).eqns) == len(j_off.graph(x).eqns)


# ----------------------------------------------------------------------------- property test


def _random_program(rng: np.random.Generator, n_ops: int):
    """A random function of two (3, 4) inputs built from registry primitives, including patterns
    the passes rewrite (identities, double transposes, reshape chains, repeated subexpressions,
    constant subexpressions, sums of broadcasts).  Returns (fn, names of primitives used)."""
    plan = []
    for _ in range(n_ops):
        plan.append((rng.integers(0, 1 << 30), rng.choice(len(_OPS))))
    const = rng.standard_normal((3, 4))

    def fn(x, y):
        pool = [x, y, ops.tanh(x), const * 0.5]
        for seed, k in plan:
            r = np.random.default_rng(seed)
            a = pool[r.integers(len(pool))]
            b = pool[r.integers(len(pool))]
            out = _OPS[k][1](a, b, r)
            pool.append(out)
        return [ops.sum(pool[-1] * pool[-2]), pool[-3], ops.sum(pool[-4], axis=0)]

    return fn


def _safe(x):
    return ops.tanh(x)  # keeps values in a range where exp/log/div stay finite


_OPS = [
    ("add", lambda a, b, r: a + b),
    ("sub", lambda a, b, r: a - b * 0.5),
    ("mul", lambda a, b, r: a * b),
    ("div", lambda a, b, r: a / (ops.abs(b) + 1.0)),
    ("exp", lambda a, b, r: ops.exp(_safe(a))),
    ("log", lambda a, b, r: ops.log(ops.abs(a) + 0.5)),
    ("maximum", lambda a, b, r: ops.maximum(a, b)),
    ("select", lambda a, b, r: ops.where(a > b, a, b * 2.0)),
    ("logistic", lambda a, b, r: ops.sigmoid(a)),
    ("x*1+0", lambda a, b, r: (a * 1.0 + 0.0) / 1.0 - 0),
    ("double_transpose", lambda a, b, r: ops.transpose(ops.transpose(a, (1, 0)), (1, 0)) + b),
    ("reshape_chain", lambda a, b, r: ops.reshape(ops.reshape(ops.expand_dims(a, 0), (12,)), (3, 4))),
    ("matmul", lambda a, b, r: _safe(a @ ops.transpose(b, (1, 0))) @ b * 0.1),
    ("reduce_bcast", lambda a, b, r: ops.broadcast_to(ops.sum(ops.broadcast_to(a[:, :1], (3, 4)), axis=1, keepdims=True), (3, 4)) * 0.1),
    ("max_keep", lambda a, b, r: a - ops.max(a, axis=1, keepdims=True)),
    ("mean", lambda a, b, r: a - ops.mean(b, axis=0)),
    ("cse_twice", lambda a, b, r: ops.tanh(a * b) + ops.tanh(a * b)),
    ("const_expr", lambda a, b, r: a + ops.exp(np.linspace(0, 1, 4) * 0.3) * 2.0),
    ("slice_concat", lambda a, b, r: ops.concatenate([a[:, 2:], b[:, :2]], axis=1)),
    ("stack_sum", lambda a, b, r: ops.sum(ops.stack([a, b], axis=0), axis=0)),
    ("gather", lambda a, b, r: ops.broadcast_to(ops.take_along_axis(a, np.array([[1], [0], [3]]), axis=1), (3, 4)) + b),
    ("clip", lambda a, b, r: ops.clip(a, -0.7, 0.9)),
    ("softmax", lambda a, b, r: ops.softmax(a, axis=-1) + b),
    ("dense", lambda a, b, r: ops.relu(a @ r.standard_normal((4, 4)) + r.standard_normal(4)) * 0.3 + b),
    ("adam_like", lambda a, b, r: a - 0.1 * (a * 0.9 + b * 0.1) / (ops.sqrt(b * b * 0.5 + 0.1) + 1e-3)),
]


@pytest.mark.parametrize("seed", range(12))
def test_property_optimised_graph_computes_the_same(seed):
    rng = np.random.default_rng(seed)
    fn = _random_program(rng, n_ops=8)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    g = engine.make_graph(fn)(x, y)
    pipelines = [
        passes.DEFAULT_PIPELINE,
        passes.Pipeline((passes.common_subexpression_elimination,)),
        passes.Pipeline((passes.constant_folding,)),
        passes.Pipeline((passes.algebraic_simplification,)),
        passes.Pipeline((passes.dead_code_elimination,)),
        passes.Pipeline((native.select_native_kernels,)),
        passes.Pipeline((passes.fuse_elementwise,)),
        passes.Pipeline((passes.UnrollSmallReductions(min_elements=1),)),
    ]
    ref = Executable(g)(x, y)
    for p in pipelines:
        g2 = p(g)
        g2.validate()
        if p is not pipelines[-1]:  # unrolling reductions adds equations, the others never do
            assert len(g2.eqns) <= len(g.eqns)
        for u, v in zip(ref, Executable(g2)(x, y)):
            np.testing.assert_allclose(v, u, rtol=1e-6, atol=1e-12)

    # with gradients: the whole value-and-grad graph, optimised vs not
    def loss(x, y):
        outs = fn(x, y)
        return outs[0] + ops.sum(outs[1] * outs[1]) + ops.sum(outs[2])

    vg = engine.value_and_grad(loss, argnums=(0, 1))
    gg = engine.make_graph(vg)(x, y)
    ref = Executable(gg)(x, y)
    for p in pipelines:
        for u, v in zip(ref, Executable(p(gg))(x, y)):
            np.testing.assert_allclose(v, u, rtol=1e-6, atol=1e-12)
    a = engine.jit(vg)(x, y)
    b = engine.jit(vg, passes=())(x, y)
    for u, v in zip(engine.tree_leaves(a), engine.tree_leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-12)


def test_property_programs_exercise_the_passes():
    """The random programs are not trivially unoptimisable: over the seeds each pass fires."""
    fired = {"cse": 0, "fold": 0, "simplify": 0, "unroll": 0}
    if native.available():
        fired.update(native=0, fuse=0)
    for seed in range(12):
        rng = np.random.default_rng(seed)
        fn = _random_program(rng, n_ops=8)
        x = rng.standard_normal((3, 4))
        g = engine.make_graph(fn)(x, x * 2)
        n = len(g.eqns)
        fired["cse"] += len(passes.common_subexpression_elimination(g).eqns) < n
        fired["fold"] += len(passes.constant_folding(g).eqns) < n
        fired["simplify"] += len(passes.algebraic_simplification(g).eqns) < n
        fired["unroll"] += len(passes.UnrollSmallReductions(min_elements=1)(g).eqns) > n
        if native.available():
            fired["native"] += len(native.select_native_kernels(g).eqns) < n
            fired["fuse"] += len(passes.fuse_elementwise(g).eqns) < n
    assert all(v >= 3 for v in fired.values()), fired


def test_broadcast_feeding_an_output_keeps_its_shape():
    """Regression (executor): a broadcast consumed by an elementwise op whose result is a graph
    output used to be elided, and the ufunc then allocated the un-broadcast shape."""
    for p in (None, ()):
        f = engine.jit(lambda x: ops.broadcast_to(ops.tanh(x), (3, 4)) * 5.0, passes=p)
        x = np.linspace(-1, 1, 3).reshape(3, 1)
        np.testing.assert_allclose(f(x), np.broadcast_to(np.tanh(x), (3, 4)) * 5.0)


def test_outer_product_matmul_becomes_broadcast_multiply():
    x, y, o = V(5, 3, 1), V(5, 1, 4), V(5, 3, 4)
    g = Graph([x, y], [], [], [eq("matmul", [x, y], o)], [o])
    g2 = passes.algebraic_simplification(g)
    assert prims(g2) == ["mul"]
    rng = np.random.default_rng(6)
    xv, yv = rng.standard_normal((5, 3, 1)), rng.standard_normal((5, 1, 4))
    np.testing.assert_allclose(run(g2, xv, yv)[0], xv @ yv, rtol=1e-14)


@pytest.mark.parametrize("prim, ref", [("reduce_max", np.max), ("reduce_min", np.min), ("reduce_sum", np.sum)])
@pytest.mark.parametrize("keepdims", [True, False])
def test_small_axis_reductions_unrolled(prim, ref, keepdims):
    x = V(64, 3, 40)
    o = V(64, 1, 40) if keepdims else V(64, 40)
    g = Graph([x], [], [], [eq(prim, [x], o, axes=(1,), keepdims=keepdims)], [o])
    g2 = passes.unroll_small_reductions(g)
    g2.validate()
    assert prim not in prims(g2) and prims(g2).count("slice") == 3
    xv = np.random.default_rng(7).standard_normal((64, 3, 40))
    np.testing.assert_allclose(run(g2, xv)[0], ref(xv, axis=1, keepdims=keepdims), rtol=1e-14)
    # small results and long axes are left to numpy's reduction
    x2, o2 = V(4, 3), V(4)
    assert prims(passes.unroll_small_reductions(Graph([x2], [], [], [eq(prim, [x2], o2, axes=(1,), keepdims=False)], [o2]))) == [prim]
    x3, o3 = V(2000, 30), V(2000)
    assert prims(passes.unroll_small_reductions(Graph([x3], [], [], [eq(prim, [x3], o3, axes=(1,), keepdims=False)], [o3]))) == [prim]


def test_scalar_multiply_chains_fold_into_one_multiply():
    x, a, b, c, d = V(4), V(4), V(4), V(4), V(4)
    g = Graph(
        [x],
        [],
        [],
        [eq("tanh", [x], a), eq("mul", [a, W(0.5)], b), eq("neg", [b], c), eq("mul", [W(3), c], d)],
        [d],
    )
    g2 = passes.Pipeline((passes.algebraic_simplification,))(g)
    assert prims(g2) == ["tanh", "mul"]
    assert g2.eqns[1].inputs[1].value == -1.5
    xv = np.linspace(-2, 2, 4)
    np.testing.assert_allclose(run(g2, xv)[0], -1.5 * np.tanh(xv), rtol=1e-15)
    # an inner product with another use is not folded (it must be computed anyway)
    g3 = Graph([x], [], [], [eq("tanh", [x], a), eq("mul", [a, W(0.5)], b), eq("neg", [b], c)], [b, c])
    assert prims(passes.algebraic_simplification(g3)) == ["tanh", "mul", "neg"]


@pytest.mark.parametrize("axis, keepdims", [(2, False), (1, False), (2, True), (-2, True)])
def test_sums_over_inner_axes_become_matmuls(axis, keepdims):
    shape = (6, 20, 30)
    x = V(*shape)
    ax = axis % 3
    oshape = tuple(1 if i == ax else d for i, d in enumerate(shape)) if keepdims else tuple(d for i, d in enumerate(shape) if i != ax)
    o = V(*oshape)
    g = Graph([x], [], [], [eq("reduce_sum", [x], o, axes=(axis,), keepdims=keepdims)], [o])
    g2 = passes.SumsAsMatmul(min_elements=1)(g)
    g2.validate()
    # the last axis: one matrix-vector product over the flattened leading axes
    assert prims(g2) == (["reshape", "matmul", "reshape"] if ax == 2 else ["matmul", "reshape"])
    xv = np.random.default_rng(8).standard_normal(shape)
    np.testing.assert_allclose(run(g2, xv)[0], xv.sum(axis=axis, keepdims=keepdims), rtol=1e-12, atol=1e-12)
    # leading axes, rank 2 and small arrays stay reductions
    o0 = V(20, 30)
    g0 = Graph([x], [], [], [eq("reduce_sum", [x], o0, axes=(0,), keepdims=False)], [o0])
    assert prims(passes.SumsAsMatmul(min_elements=1)(g0)) == ["reduce_sum"]
    assert prims(passes.sums_as_matmul(g)) == ["reduce_sum"]  # 3600 elements < default 4096
