"""Operator selection into native kernels (engine/native.py, engine/_native.c): the C kernels
against numpy, the pass's pattern matching (what it must and must not rewrite), the numpy
fallback when an operand is not a contiguous float buffer, and the new nodes' VJPs against
finite differences."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import nn, ops
from fedarena.engine.compiler import fusion, native
from fedarena.engine.core import tracing
from fedarena.engine.backends.numpy.executor import Executable
from fedarena.engine.core.ir import Graph, Literal

from .graphs import V, eq, prims

needs_native = pytest.mark.skipif(not native.available(), reason="native kernels not built")


def test_native_kernels_built_where_required():
    """CI sets FEDARENA_REQUIRE_NATIVE=1 (it has a C compiler): a silently failed build of the
    optional extension would otherwise skip every native test below."""
    if os.environ.get("FEDARENA_REQUIRE_NATIVE") == "1":
        assert native._native is not None, "fedarena.engine._native was not built"


TOL = {np.float32: 2e-6, np.float64: 1e-13}


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", [(1, 8, 64), (1, 64, 64), (3, 17, 5), (4, 64, 33), (2, 1, 1), (1, 64, 16)])
@pytest.mark.parametrize("bias,relu", [(True, False), (False, False), (True, True)])
def test_dense_kernel_matches_numpy(dtype, m, k, n, bias, relu):
    rng = np.random.default_rng(m * 100 + k + n)
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.standard_normal((k, n)).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    out = np.full((m, n), np.nan, dtype)
    assert native._native.dense(x, w, b if bias else None, out, m, k, n, int(relu), dtype == np.float64)
    ref = x.astype(np.float64) @ w.astype(np.float64) + (b if bias else 0)
    ref = np.maximum(ref, 0) if relu else ref
    np.testing.assert_allclose(out, ref, rtol=TOL[dtype] * k, atol=TOL[dtype] * k * 4)


@needs_native
def test_dense_kernel_declines_what_it_cannot_read_and_touches_nothing():
    x = np.ones((2, 3), np.float32)
    w = np.ones((3, 4), np.float32)
    out = np.zeros((2, 4), np.float32)
    d = native._native.dense
    assert not d(np.asfortranarray(np.ones((2, 3), np.float32)), w, None, out, 2, 3, 4, 0, False)
    assert not d(x.astype(np.float64), w, None, out, 2, 3, 4, 0, False)  # wrong element type
    assert not d(x, w, None, out, 2, 3, 5, 0, False)  # sizes disagree with the buffers
    assert not d(x, w, None, out[:, :2], 2, 3, 2, 0, False)  # non-contiguous output
    ro = np.zeros((2, 4), np.float32)
    ro.flags.writeable = False
    assert not d(x, w, None, ro, 2, 3, 4, 0, False)
    big = np.zeros(8, np.float32)
    assert not d(big[:6].reshape(2, 3), w, None, big[:8].reshape(2, 4), 2, 3, 4, 0, False)  # aliasing
    assert (out == 0).all() and (ro == 0).all()
    with pytest.raises(ValueError):
        d(x, w, None, out, -2, 3, 4, 0, False)


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_kernel_matches_numpy_including_extremes(dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 7)).astype(dtype) * 30
    x[1, 3] = 1e4  # one dominating logit
    x[2] = -np.inf
    x[2, 0] = 0.0
    x[3, 4] = np.nan
    out = np.empty_like(x)
    assert native._native.softmax(x, out, 5, 7, dtype == np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        ref = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out, ref, rtol=10 * TOL[dtype], atol=10 * TOL[dtype])
    assert np.isnan(out[3]).all() and np.isnan(ref[3]).all()


# ----------------------------------------------------------------------------- the pass


def _mlp_policy(params, obs):
    h = nn.MLP([8, 64, 64], activation="tanh", output_activation="tanh").apply(params["body"], obs)
    return ops.softmax(nn.Linear(64, 4).apply(params["pi"], h)), nn.Linear(64, 1).apply(params["v"], h)


def _policy_params(dtype):
    rng = np.random.default_rng(0)
    p = {
        "body": nn.MLP([8, 64, 64], activation="tanh", output_activation="tanh").init(rng),
        "pi": nn.Linear(64, 4).init(rng),
        "v": nn.Linear(64, 1).init(rng),
    }
    return engine.tree_map(lambda a: a.astype(dtype), p)


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_policy_forward_uses_native_nodes_and_matches_unoptimised(dtype):
    params = _policy_params(dtype)
    obs = np.random.default_rng(1).standard_normal((1, 8)).astype(dtype)
    fast = engine.jit(_mlp_policy)
    plain = engine.jit(_mlp_policy, passes=())
    g = fast.graph(params, obs)
    assert prims(g).count("dense") == 4 and prims(g).count("softmax") == 1 and "matmul" not in prims(g)
    for a, b in zip(fast(params, obs), plain(params, obs)):
        np.testing.assert_allclose(a, b, rtol=1e-5 if dtype == np.float32 else 1e-12)
    # a Fortran-ordered weight cannot be read by the kernel: the numpy fallback gives the same answer
    p2 = engine.tree_map(lambda a: a, params)
    p2["body"][1]["w"] = np.asfortranarray(params["body"][1]["w"])
    for a, b in zip(fast(p2, obs), plain(params, obs)):
        np.testing.assert_allclose(a, b, rtol=1e-5 if dtype == np.float32 else 1e-12)


@needs_native
def test_large_operands_stay_on_blas():
    params = _policy_params(np.float32)
    obs = np.zeros((64, 8), np.float32)
    g = engine.jit(_mlp_policy).graph(params, obs)
    assert "dense" not in prims(g)
    assert prims(g).count("softmax") == 1  # 64x4: one native call still beats five numpy calls


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("FEDARENA_NATIVE", "0")
    assert not native.available()
    params = _policy_params(np.float32)
    g = engine.jit(_mlp_policy).graph(params, np.zeros((1, 8), np.float32))
    assert "dense" not in prims(g)


@needs_native
def test_pass_leaves_chains_whose_inner_values_escape():
    x, w, b = V(1, 4), V(4, 3), V(3)
    y, z = V(1, 3), V(1, 3)
    # the matmul result is also a graph output: fusing would lose it
    g = Graph([x, w, b], [], [], [eq("matmul", [x, w], y), eq("add", [y, b], z)], [z, y])
    assert prims(native.select_native_kernels(g)) == ["matmul", "add"]
    # a bias that is not a (N,) / (1, N) row vector is not a dense-layer bias
    c = V(1, 1)
    g = Graph([x, w, c], [], [], [eq("matmul", [x, w], y), eq("add", [y, c], z)], [z])
    assert prims(native.select_native_kernels(g)) == ["matmul", "add"]
    # matmul + relu without a bias is a dense node
    r = V(1, 3)
    g = Graph([x, w], [], [], [eq("matmul", [x, w], y), eq("relu", [y], r)], [r])
    g2 = native.select_native_kernels(g)
    assert prims(g2) == ["dense"] and g2.eqns[0].attrs == {"bias": False, "relu": True}
    xv = np.array([[1.0, -2.0, 3.0, 0.5]])
    wv = np.random.default_rng(0).standard_normal((4, 3))
    np.testing.assert_allclose(Executable(g2)(xv, wv)[0], np.maximum(xv @ wv, 0), rtol=1e-13)


@needs_native
def test_softmax_whose_max_is_used_elsewhere_is_left_alone():
    def f(x):
        m = ops.max(x, axis=-1, keepdims=True)
        e = ops.exp(x - m)
        return e / ops.sum(e, axis=-1, keepdims=True), m

    g = engine.jit(f).graph(np.zeros((2, 3)))
    assert "softmax" not in prims(g)
    g = engine.jit(lambda x: ops.softmax(x)).graph(np.zeros((2, 3)))
    assert prims(g) == ["softmax"]


# ----------------------------------------------------------------------------- gradients


def _fd_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        g[i] = (f(x + d) - f(x - d)) / (2 * eps)
    return g


@pytest.mark.parametrize("relu", [False, True])
def test_dense_vjp_matches_finite_differences(relu):
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((2, 3)), rng.standard_normal((3, 4)), rng.standard_normal(4)
    ct = rng.standard_normal((2, 4))

    def f(x, w, b):
        return ops.sum(tracing.bind(native.dense_p, x, w, b, bias=True, relu=relu) * ct)

    gx, gw, gb = engine.grad(f, argnums=(0, 1, 2))(x, w, b)
    np.testing.assert_allclose(gx, _fd_grad(lambda v: f(v, w, b), x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gw, _fd_grad(lambda v: f(x, v, b), w), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gb, _fd_grad(lambda v: f(x, w, v), b), rtol=1e-6, atol=1e-8)


def test_softmax_vjp_matches_finite_differences():
    rng = np.random.default_rng(4)
    x, ct = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))

    def f(x):
        return ops.sum(tracing.bind(native.softmax_p, x) * ct)

    np.testing.assert_allclose(engine.grad(f)(x), _fd_grad(f, x), rtol=1e-6, atol=1e-8)


# ----------------------------------------------------------------------------- elementwise VM

_UNARY = ["neg", "exp", "log", "log1p", "tanh", "logistic", "sqrt", "rsqrt", "abs", "sign", "relu", "sin", "cos"]
_BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "pow"]
_COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]


def _vm_run(body, *inputs):
    prog = native.elementwise_program(body)
    assert prog is not None, "the VM should take this body"
    out = np.full(body.outvars[0].aval.shape, 123.0, body.outvars[0].aval.dtype)
    assert native._native.elementwise(prog.program, prog.consts, prog.modes, prog.bparams, prog.n, prog.double, out, *inputs)
    return out


def _ref(body, *inputs):
    return fusion.FusedKernel(body)(*inputs, np.empty(body.outvars[0].aval.shape, body.outvars[0].aval.dtype))


def _special_values(rng, shape, dtype):
    x = rng.standard_normal(shape) * 3
    flat = x.reshape(-1)
    flat[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30][: flat.size]
    return x.astype(dtype)


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", _UNARY)
def test_vm_unary_ops_match_numpy(name, dtype):
    x, m, y = V(300, dtype=dtype), V(300, dtype=dtype), V(300, dtype=dtype)
    body = Graph([x], [], [], [eq(name, [x], m), eq("mul", [m, Literal(2.0, weak=True)], y)], [y])
    xv = _special_values(np.random.default_rng(0), (300,), dtype)
    with np.errstate(all="ignore"):
        ref = _ref(body, xv)
        got = _vm_run(body, xv)
    rtol = 4e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * 1e-3)
    assert np.array_equal(np.isnan(got), np.isnan(ref))


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", _BINARY + _COMPARE)
def test_vm_binary_ops_match_numpy_with_every_broadcast_mode(name, dtype):
    rng = np.random.default_rng(1)
    # blocks of 256 elements do not divide the rows: row/column/middle indices wrap inside a block
    cases = [((37, 11), s) for s in [(37, 11), (), (11,), (1, 11), (37, 1)]]
    cases += [((5, 9, 7), s) for s in [(5, 1, 7), (1, 9, 7), (5, 1, 1), (5, 9, 1), (7,)]]
    for shape, other_shape in cases:
        x, b = V(*shape, dtype=dtype), V(*other_shape, dtype=dtype)
        m, y = V(*shape, dtype=np.bool_ if name in _COMPARE else dtype), V(*shape, dtype=dtype)
        tail = eq("select", [m, x, Literal(-1.0, weak=True)], y) if name in _COMPARE else eq("add", [m, x], y)
        body = Graph([x, b], [], [], [eq(name, [x, b], m), tail], [y])
        xv = _special_values(rng, shape, dtype)
        bv = np.abs(_special_values(rng, other_shape, dtype)) if name == "pow" else _special_values(rng, other_shape, dtype)
        if name != "pow" and bv.size > 1:
            bv.reshape(-1)[-1] = xv.reshape(-1)[-1]  # ties for the comparisons
        with np.errstate(all="ignore"):
            ref = _ref(body, xv, bv)
            got = _vm_run(body, xv, bv)
        rtol = 4e-6 if dtype == np.float32 else 1e-14
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * 1e-3, err_msg=f"{name} with {other_shape} into {shape}")


@needs_native
def test_vm_select_clip_logic_and_casts():
    x, p, q, c, s, n, y = V(50), V(50, dtype=np.bool_), V(50, dtype=np.bool_), V(50), V(50), V(50, dtype=np.bool_), V(50)
    body = Graph(
        [x],
        [],
        [],
        [
            eq("gt", [x, Literal(0.0, weak=True)], p),
            eq("lt", [x, Literal(2.0, weak=True)], q),
            eq("and", [p, q], n),
            eq("clip", [x], c, lo=-0.5, hi=1.5),
            eq("select", [n, c, x], s),
            eq("mul", [s, s], y),
        ],
        [y],
    )
    xv = _special_values(np.random.default_rng(2), (50,), np.float64)
    np.testing.assert_array_equal(_vm_run(body, xv), _ref(body, xv))


@needs_native
def test_vm_declines_what_it_cannot_run():
    # a boolean result, an integer operand, an unsupported broadcast, a long transcendental
    x, y = V(8), V(8, dtype=np.bool_)
    assert native.elementwise_program(Graph([x], [], [], [eq("gt", [x, Literal(0.0, weak=True)], y)], [y])) is None
    i, z = V(8, dtype=np.int64), V(8)
    assert native.elementwise_program(Graph([i, x], [], [], [eq("add", [x, i], z)], [z])) is None
    a, b, o = V(4, 3, 2), V(1, 3, 1), V(4, 3, 2)  # a column repeated over both outer and inner axes
    assert native.elementwise_program(Graph([a, b], [], [], [eq("add", [a, b], o)], [o])) is None
    big, t = V(100_000), V(100_000)
    assert native.elementwise_program(Graph([big], [], [], [eq("tanh", [big], t)], [t])) is None
    assert native.elementwise_program(Graph([big], [], [], [eq("sqrt", [big], t)], [t])) is not None


@needs_native
def test_vm_rejects_hostile_programs_without_touching_memory():
    ew = native._native.elementwise
    out = np.zeros(4)
    x = np.ones(4)
    good = np.array([2, 2, native.OPCODE["add"], 2, 0, 1, 0], np.int32).tobytes()
    consts = np.array([1.0]).tobytes()
    full = (bytes([0]), np.zeros(2, np.int64).tobytes())
    assert ew(good, consts, *full, 4, True, out, x) and (out == 2).all()
    out[:] = 0
    bad = [
        np.array([2, 2, 99, 2, 0, 1, 0], np.int32).tobytes(),  # unknown opcode
        np.array([2, 2, native.OPCODE["add"], 1000, 0, 1, 0], np.int32).tobytes(),  # register out of range
        np.array([2, 2, native.OPCODE["add"], 2, -5, 1, 0], np.int32).tobytes(),
        np.array([5, 5, native.OPCODE["add"], 5, 0, 1, 0], np.int32).tobytes(),  # inconsistent layout
        good[:-2],  # truncated
    ]
    for prog in bad:
        with pytest.raises(ValueError):
            ew(prog, consts, *full, 4, True, out, x)
    for mode, params in [(7, (0, 0)), (2, (0, 1)), (2, (3, 2)), (2, (3, 1))]:  # unknown mode, bad (S, Cin)
        with pytest.raises(ValueError):
            ew(good, consts, bytes([mode]), np.array(params, np.int64).tobytes(), 4, True, out, x)
    with pytest.raises(ValueError):
        ew(good, consts, bytes([0]), b"", 4, True, out, x)  # missing broadcast parameters
    assert not ew(good, consts, *full, 5, True, out, x)  # sizes disagree with the buffers
    assert not ew(good, consts, bytes([2]), np.array([4, 4], np.int64).tobytes(), 4, True, out, x[:3])
    assert (out == 0).all()


@needs_native
def test_vm_runs_in_place_when_the_output_is_an_input():
    x, a, y = V(1000), V(1000), V(1000)
    body = Graph([x], [], [], [eq("mul", [x, x], a), eq("sub", [a, x], y)], [y])
    prog = native.elementwise_program(body)
    xv = np.random.default_rng(3).standard_normal(1000)
    expect = xv * xv - xv
    assert native._native.elementwise(prog.program, prog.consts, prog.modes, prog.bparams, prog.n, prog.double, xv, xv)
    np.testing.assert_allclose(xv, expect, rtol=1e-15)


@needs_native
def test_default_pipeline_fuses_only_what_the_vm_runs_and_matches_unfused():
    def step(w, g, m):
        m2 = m * 0.9 + g * 0.1
        return w - 0.01 * m2 / (ops.sqrt(m2 * m2) + 1e-8), m2, ops.tanh(w @ w.T + g)

    rng = np.random.default_rng(4)
    args = [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(3)]
    jf, jp = engine.jit(step), engine.jit(step, passes=())
    names = prims(jf.graph(*args))
    # m2 and the new w: one multi-output fused node; tanh over 4096 elements stays in numpy
    assert "fused_elementwise_multi" in names and "tanh" in names
    for a, b in zip(jf(*args), jp(*args)):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_row_max_and_min_match_numpy(dtype):
    x = _special_values(np.random.default_rng(5), (40, 6), dtype)
    x[7, 3] = np.nan
    for fn, ref in ((ops.max, np.max), (ops.min, np.min)):
        got = engine.jit(lambda v: fn(v, axis=1))(x)
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(got, ref(x, axis=1))


@pytest.mark.parametrize("relu", [False, True])
def test_dense_jvp_matches_finite_differences(relu):
    rng = np.random.default_rng(6)
    x, w, b = rng.standard_normal((2, 3)), rng.standard_normal((3, 4)), rng.standard_normal(4)
    tx, tw, tb = rng.standard_normal((2, 3)), rng.standard_normal((3, 4)), rng.standard_normal(4)

    def f(x, w, b):
        return tracing.bind(native.dense_p, x, w, b, bias=True, relu=relu)

    _, t = engine.jvp(f, (x, w, b), (tx, tw, tb))
    eps = 1e-6
    fd = (_dense_impl_np(x + eps * tx, w + eps * tw, b + eps * tb, relu) - _dense_impl_np(x - eps * tx, w - eps * tw, b - eps * tb, relu)) / (2 * eps)
    np.testing.assert_allclose(t, fd, rtol=1e-6, atol=1e-8)


def _dense_impl_np(x, w, b, relu):
    y = x @ w + b
    return np.maximum(y, 0) if relu else y


def test_softmax_jvp_matches_finite_differences():
    rng = np.random.default_rng(7)
    x, tx = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    _, t = engine.jvp(lambda v: tracing.bind(native.softmax_p, v), (x,), (tx,))
    eps = 1e-6
    sm = native._softmax_impl
    np.testing.assert_allclose(t, (sm(x + eps * tx) - sm(x - eps * tx)) / (2 * eps), rtol=1e-6, atol=1e-9)


def test_dense_and_softmax_vjps_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    x, w, b = rng.standard_normal((3, 5)), rng.standard_normal((5, 4)), rng.standard_normal(4)
    ct = rng.standard_normal((3, 4))

    def ours(x, w, b):
        y = tracing.bind(native.dense_p, x, w, b, bias=True, relu=True)
        return ops.sum(tracing.bind(native.softmax_p, y) * ct)

    grads = engine.grad(ours, argnums=(0, 1, 2))(x, w, b)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    (torch.softmax(torch.relu(tx @ tw + tb), -1) * torch.tensor(ct)).sum().backward()
    for g, t in zip(grads, (tx, tw, tb)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)
