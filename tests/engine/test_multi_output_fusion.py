"""Multi-output elementwise fusion: a fused producer whose values are also read elsewhere merges
into its fused consumer, and the merged node computes every output in one pass of the native VM.

The oracle for values is the same program with single-output fusion only (bit for bit: the VM runs
the same float operations in the same order) and the un-jitted program (to rounding).  Fused nodes
exist only in compiled graphs (``jit`` inlines under ``grad``/``vmap``), so the transformation
rules are checked by evaluating a fused graph under them."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.engine.compiler import native
from fedarena.engine.compiler.fusion import (
    FusedKernel,
    _vm_worth,
    elementwise_fusion,
    fused_multi_p,
    fused_p,
    multi_output_fusion,
)
from fedarena.engine.compiler.memory_plan import check_plan
from fedarena.engine.compiler.passes import DEFAULT_PASSES, Pipeline, fuse_elementwise
from fedarena.engine.backends.numpy.executor import Executable
from fedarena.engine.core.tracing import eval_graph

from .test_passes import _random_program

needs_native = pytest.mark.skipif(not native.available(), reason="native kernels not built")


def _single_output_fusion(graph):
    return elementwise_fusion(graph, min_size=1, accept=_vm_worth)


# the default passes with the fusion as it was before multi-output fusion (the bit-for-bit oracle)
SINGLE_OUTPUT_PIPELINE = Pipeline(tuple(_single_output_fusion if p is fuse_elementwise else p for p in DEFAULT_PASSES))


def _fused(graph):
    return [e for e in graph.eqns if e.prim is fused_p or e.prim is fused_multi_p]


def _adam_update_graph(shape, seed):
    """The compiled graph of an Adam update of one (per-parameter) weight of ``shape``, and the rng."""
    opt = optim.adam(1e-3, fused=False)
    rng = np.random.default_rng(seed)
    p = {"w": rng.standard_normal(shape).astype(np.float32)}
    g = {"w": rng.standard_normal(shape).astype(np.float32)}
    return engine.jit(lambda g, s, p: opt.update(g, s, p)).graph(g, opt.init(p), p), rng


@needs_native
def test_adam_update_of_one_matrix_is_one_node_computing_m_v_and_p():
    graph, _ = _adam_update_graph((64, 32), 0)
    big = [e for e in _fused(graph) if e.outputs[0].aval.shape == (64, 32)]
    assert len(big) == 1 and big[0].prim is fused_multi_p
    (node,) = big
    outs = [v for v in graph.outvars if getattr(v, "aval", None) is not None and v.aval.shape == (64, 32)]
    assert len(outs) == 3 and set(outs) == set(node.outputs)  # p', m', v'
    prog = native.elementwise_program(node.attrs["body"])
    assert prog is not None  # the native VM runs it: one pass
    # each outer input once: g, m, v, p and the two step-dependent scalars
    assert len(node.inputs) == len(set(node.inputs)) == 6


@needs_native
@pytest.mark.parametrize("fused_layout", [False, True])
def test_tiny_mlp_adam_step_equals_single_output_fusion_bit_for_bit_and_eager(fused_layout):
    mlp = nn.MLP([12, 32, 32, 3], activation="relu")
    opt = optim.adam(1e-2, fused=fused_layout)

    def step(p, s, x, y):
        l, g = engine.value_and_grad(lambda p: ops.cross_entropy(mlp.apply(p, x), y))(p)
        p, s = opt.update(g, s, p)
        return p, s, l

    p = mlp.init(0)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((16, 12)).astype(np.float32), rng.integers(0, 3, 16)
    multi, single = engine.jit(step), engine.jit(step, passes=SINGLE_OUTPUT_PIPELINE)
    s0 = opt.init(p)
    assert any(e.prim is fused_multi_p for e in multi.graph(p, s0, x, y).eqns)
    assert not any(e.prim is fused_multi_p for e in single.graph(p, s0, x, y).eqns)
    a, b, c = (p, s0), (p, s0), (p, s0)
    for _ in range(3):
        *a, la = multi(*a, x, y)
        *b, lb = single(*b, x, y)
        *c, lc = step(*c, x, y)
        assert la == lb
        np.testing.assert_allclose(la, lc, rtol=1e-5)
    for u, v, w in zip(engine.tree_leaves(a), engine.tree_leaves(b), engine.tree_leaves(c)):
        np.testing.assert_array_equal(u, v)
        # eager runs numpy's ufuncs, whose float32 results differ from the VM's in the last bits
        np.testing.assert_allclose(u, w, rtol=2e-5, atol=2e-6)


def _producer_matmul_consumer(x, w):
    a = x * 2.0 + 1.0  # the producer: read by the matmul and by the consumer
    b = a @ w  # depends on the producer, feeds the consumer
    return a * 3.0 + b * 0.5


def test_merge_that_would_create_a_cycle_is_not_made():
    x, w = np.random.default_rng(2).standard_normal((8, 8)), np.eye(8) * 0.5
    g = multi_output_fusion(elementwise_fusion(engine.make_graph(_producer_matmul_consumer)(x, w)))
    names = [e.prim.name for e in g.eqns]
    assert names == ["fused_elementwise", "matmul", "fused_elementwise"]
    g.validate()
    np.testing.assert_allclose(Executable(g)(x, w)[0], _producer_matmul_consumer(x, w), rtol=1e-14)


def _shared_producer(x, y, w):
    a = x * 2.0 + 1.0  # read by the matmul and by the consumer, which does not need the matmul
    h = a @ w
    c = a * y + y
    return h, c


def test_reader_between_producer_and_consumer_moves_after_the_merged_node():
    rng = np.random.default_rng(3)
    x, y, w = rng.standard_normal((6, 6)), rng.standard_normal((6, 6)), rng.standard_normal((6, 6))
    g0 = engine.make_graph(_shared_producer)(x, y, w)
    g = multi_output_fusion(elementwise_fusion(g0))
    assert [e.prim.name for e in g.eqns] == ["fused_elementwise_multi", "matmul"]
    assert len(g.eqns[0].outputs) == 2  # a (read by the matmul) and c
    g.validate()
    for u, v in zip(Executable(g)(x, y, w), Executable(g0)(x, y, w)):
        np.testing.assert_allclose(u, v, rtol=1e-14)


@needs_native
def test_multi_output_node_with_an_intermediate_output_uses_a_planned_buffer():
    rng = np.random.default_rng(4)
    x, y, w = (rng.standard_normal((32, 32)).astype(np.float32) for _ in range(3))
    j = engine.jit(_shared_producer)
    g = j.graph(x, y, w)
    (node,) = [e for e in g.eqns if e.prim is fused_multi_p]
    exe = Executable(g)
    check_plan(exe.graph, exe.memory)
    a, c = node.outputs  # a: read only by the matmul (a planned buffer); c: a graph output (fresh)
    assert a in exe.memory.buffer_of and c not in exe.memory.buffer_of
    for u, v in zip(j(x, y, w), _shared_producer(x, y, w)):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-5)


def test_grad_jvp_vmap_through_a_multi_output_fused_node():
    def f(x):
        a = ops.tanh(x * x + 1.0)
        return a, a * ops.sin(x) + 2.0

    x = np.linspace(-1, 1, 5)
    g = multi_output_fusion(elementwise_fusion(engine.make_graph(f)(x)))
    assert [e.prim for e in g.eqns] == [fused_multi_p]

    def run(x):
        a, b = eval_graph(g, [x])
        return ops.sum(a * 0.5) + ops.sum(b)

    def ref(x):
        a, b = f(x)
        return ops.sum(a * 0.5) + ops.sum(b)

    np.testing.assert_allclose(engine.grad(run)(x), engine.grad(ref)(x), rtol=1e-12)
    # only the second output has a cotangent: the first gets None
    np.testing.assert_allclose(engine.grad(lambda x: ops.sum(eval_graph(g, [x])[1]))(x), engine.grad(lambda x: ops.sum(f(x)[1]))(x), rtol=1e-12)
    _, t = engine.jvp(run, (x,), (np.ones(5),))
    _, t_ref = engine.jvp(ref, (x,), (np.ones(5),))
    np.testing.assert_allclose(t, t_ref, rtol=1e-12)
    X = np.stack([x, x * 0.5])
    for u, v in zip(engine.vmap(lambda x: eval_graph(g, [x]))(X), f(X)):
        np.testing.assert_allclose(u, v, rtol=1e-12)


@needs_native
def test_numpy_fallback_kernel_equals_the_vm_on_a_multi_output_body():
    graph, rng = _adam_update_graph((300, 7), 5)
    (node,) = [e for e in graph.eqns if e.prim is fused_multi_p and e.outputs[0].aval.shape == (300, 7)]
    body = node.attrs["body"]
    ins = [rng.random(v.aval.shape).astype(np.float32) + 0.5 for v in body.invars]
    want = [np.empty((300, 7), np.float32) for _ in body.outvars]
    got = [np.full((300, 7), 7.0, np.float32) for _ in body.outvars]
    FusedKernel(body)(*ins, *want)
    prog = native.elementwise_program(body)
    assert native._native.elementwise(prog.program, prog.consts, prog.modes, prog.bparams, prog.n, prog.double, tuple(got), *ins)
    for u, v in zip(got, want):
        np.testing.assert_array_equal(u, v)


@needs_native
def test_vm_runs_a_two_result_program_and_rejects_malformed_ones():
    ew, add, mul = native._native.elementwise, native.OPCODE["add"], native.OPCODE["mul"]
    x = np.arange(600, dtype=np.float64)
    consts = np.array([1.0]).tobytes()
    full = (bytes([0]), np.zeros(2, np.int64).tobytes())
    # registers: 0 = x, 1 = the constant, 2 = x + 1 (result 0), 3 = (x + 1)^2 (result 1)
    good = np.array([2, 2, 3, add, 2, 0, 1, 0, mul, 3, 2, 2, 0], np.int32).tobytes()
    o0, o1 = np.zeros(600), np.zeros(600)
    assert ew(good, consts, *full, 600, True, (o0, o1), x)
    np.testing.assert_array_equal(o0, x + 1)
    np.testing.assert_array_equal(o1, (x + 1) ** 2)
    o0[:] = o1[:] = 0
    bad = [
        (good, (o0,)),  # one output for a two-result program: the instructions do not line up
        (good, (o0, o1, np.zeros(600))),
        (good, ()),  # no output
        (good, tuple(np.zeros(600) for _ in range(native.VM_MAX_OUTPUTS + 1))),
        (np.array([2, 2, 2, add, 2, 0, 1, 0, mul, 3, 2, 2, 0], np.int32).tobytes(), (o0, o1)),  # one register twice
        (np.array([2, 1, 3, add, 2, 0, 1, 0, mul, 3, 2, 2, 0], np.int32).tobytes(), (o0, o1)),  # a result in an input's register
        (np.array([2, 2, 64, add, 2, 0, 1, 0, mul, 3, 2, 2, 0], np.int32).tobytes(), (o0, o1)),  # beyond the registers
        (np.array([2, 2, 3, add, 2, 0, 1, 0, 99, 3, 2, 2, 0], np.int32).tobytes(), (o0, o1)),  # unknown opcode
        (np.array([2, 2, 3, add, 2, 0, 1, 0, mul, 4, 2, 2, 0], np.int32).tobytes(), (o0, o1)),  # result 1 never written
    ]
    for prog, outs in bad:
        with pytest.raises(ValueError):
            ew(prog, consts, *full, 600, True, outs, x)
    # an output of the wrong size or dtype: declined (the caller runs numpy), nothing written
    assert not ew(good, consts, *full, 600, True, (o0, np.zeros(599)), x)
    assert not ew(good, consts, *full, 600, True, (o0, np.zeros(600, np.float32)), x)
    assert not (o0 != 0).any() and not (o1 != 0).any()


@pytest.mark.parametrize("seed", range(12))
def test_property_random_programs_compute_the_same_after_multi_output_fusion(seed):
    rng = np.random.default_rng(300 + seed)
    fn = _random_program(rng, n_ops=10)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))

    def loss(x, y):
        outs = fn(x, y)
        return outs[0] + ops.sum(outs[1] * outs[1]) + ops.sum(outs[2])

    passes = [lambda g: multi_output_fusion(elementwise_fusion(g))]
    if native.available():
        passes.append(fuse_elementwise)  # the default pipeline's: VM-run trees, merged
    for f in (fn, engine.value_and_grad(loss, argnums=(0, 1))):
        g = engine.make_graph(f)(x, y)
        for fuse in passes:
            g2 = fuse(g)
            g2.validate()
            exe = Executable(g2)
            check_plan(exe.graph, exe.memory)
            for u, v in zip(Executable(g)(x, y), exe(x, y)):
                np.testing.assert_allclose(v, u, rtol=1e-6, atol=1e-12)
