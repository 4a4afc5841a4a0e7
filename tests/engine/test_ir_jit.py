"""IR text (golden), validation, jit caching and static arguments, error messages, HVPs."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops
from fedarena.engine.core.ir import Eqn, Graph, GraphValidationError, ShapedArray, Var
from fedarena.engine.core.tracing import PRIMITIVES, Primitive, bind

GOLDEN = """\
{ lambda a:f32[3], b:f32[4,3], c:f32[2,4]. let
    d:f32[2,3] = matmul c b
    e:f32[2,3] = add d a
    f:f32[2,3] = tanh e
    g:f32[2,3] = mul f 2.0
    h:f32[2] = reduce_sum[axes=(1,), keepdims=False] g
    i:bool[2] = gt h 0
    j:f32[2] = select i h 0.0
  in (j, f) }"""


def _small(params, x):
    h = ops.tanh(x @ params["w"] + params["b"])
    s = ops.sum(h * 2.0, axis=1)
    return ops.where(s > 0, s, 0.0), h


def _small_args():
    return {"w": np.ones((4, 3), np.float32), "b": np.zeros(3, np.float32)}, np.ones((2, 4), np.float32)


def test_ir_text_golden():
    g = engine.make_graph(_small)(*_small_args())
    assert str(g) == GOLDEN
    g.validate()


def test_constants_and_literals_print():
    c = np.arange(3.0)
    g = engine.make_graph(lambda x: x * c + np.float32(1.5))(np.ones(3))
    text = str(g)
    assert text.startswith("{ lambda a:f64[3]; b:f64[3]. let")
    assert "add c 1.5:f32" in text


def test_validate_catches_bad_types_and_ssa():
    x = Var(ShapedArray((2, 3), np.float32))
    y = Var(ShapedArray((2, 2), np.float32))  # wrong declared output type
    bad = Graph([x], [], [], [Eqn(PRIMITIVES["tanh"], [x], [y], {}, None)], [y])
    with pytest.raises(GraphValidationError, match=r"tanh.*declared f32\[2,2\].*rule gives f32\[2,3\]"):
        bad.validate()
    z = Var(ShapedArray((2, 3), np.float32))
    undefined = Graph([x], [], [], [Eqn(PRIMITIVES["add"], [x, z], [Var(ShapedArray((2, 3), np.float32))], {}, None)], [x])
    with pytest.raises(GraphValidationError, match="before it is defined"):
        undefined.validate()
    w = Var(ShapedArray((4,), np.float32))
    mism = Graph([x, w], [], [], [Eqn(PRIMITIVES["add"], [x, w], [z], {}, None)], [z])
    with pytest.raises(GraphValidationError, match="does not type-check"):
        mism.validate()


@pytest.mark.quick
def test_jit_caches_per_signature_and_matches_eager():
    calls = []

    def f(x, y):
        calls.append(1)
        return ops.tanh(x) * y

    jf = engine.jit(f)
    a = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    np.testing.assert_allclose(jf(a, a), np.tanh(a) * a, rtol=1e-6)
    jf(a + 1, a)
    assert jf.cache_size == 1 and len(calls) == 1
    jf(a.astype(np.float64), a)  # new dtype -> retrace
    jf(np.ones((4, 2), np.float32), np.ones((4, 2), np.float32))  # new shape -> retrace
    assert jf.cache_size == 3 and len(calls) == 3
    # outputs are fresh arrays: holding one across calls is safe
    r1 = jf(a, a)
    r1_copy = r1.copy()
    jf(a * 3, a)
    np.testing.assert_array_equal(r1, r1_copy)


def test_python_scalars_and_static_argnums_are_static():
    def f(x, scale, mode):
        return x * scale if mode == "mul" else x + scale

    jf = engine.jit(f, static_argnums=(2,))
    x = np.ones(3)
    np.testing.assert_allclose(jf(x, 2.0, "mul"), 2 * x)
    np.testing.assert_allclose(jf(x, 2.0, "add"), x + 2)
    np.testing.assert_allclose(jf(x, 3.0, "add"), x + 3)
    assert jf.cache_size == 3
    np.testing.assert_allclose(jf(x, np.float64(5.0), "mul"), 5 * x)
    np.testing.assert_allclose(jf(x, np.float64(7.0), "mul"), 7 * x)
    assert jf.cache_size == 4  # numpy scalars are traced, not static


def test_pytrees_in_and_out():
    def f(tree):
        return {"s": tree["a"] + tree["b"][0], "t": (tree["b"][1] * 2, None)}

    tree = {"a": np.ones(2), "b": [np.ones(2) * 3, np.ones(1)]}
    out = engine.jit(f)(tree)
    assert set(out) == {"s", "t"} and out["t"][1] is None
    np.testing.assert_allclose(out["s"], [4, 4])
    np.testing.assert_allclose(out["t"][0], [2])


def test_control_flow_on_tracer_gives_clear_error():
    def f(x):
        if ops.sum(x) > 0:
            return x
        return -x

    with pytest.raises(engine.TracerControlFlowError, match="ops.where"):
        engine.jit(f)(np.ones(3))
    with pytest.raises(engine.TracerControlFlowError, match="float"):
        engine.jit(lambda x: float(ops.sum(x)))(np.ones(3))
    with pytest.raises(engine.TracerControlFlowError):
        engine.grad(lambda x: ops.sum(x) if x[0] > 0 else 0.0)(np.ones(3))


def test_shape_error_names_primitive_shapes_and_source_line():
    def f(x, y):
        return x @ y  # the offending line

    with pytest.raises(engine.ShapeError) as ei:
        engine.jit(f)(np.ones((2, 3)), np.ones((4, 5)))
    msg = str(ei.value)
    assert "matmul" in msg and "f64[2,3]" in msg and "f64[4,5]" in msg
    assert "test_ir_jit.py:" in msg
    with pytest.raises(engine.ShapeError, match=r"add: shapes \(3,\) and \(4,\) do not broadcast.*test_ir_jit.py"):
        ops.add(np.ones(3), np.ones(4))  # eager mode too


def test_shape_error_inside_grad_reports_user_line():
    def loss(w, x):
        return ops.sum(ops.matmul(x, w))

    with pytest.raises(engine.ShapeError, match="matmul.*test_ir_jit.py"):
        engine.grad(loss)(np.ones((3, 2)), np.ones((2, 4)))


def test_unsupported_dtype_and_unknown_primitive():
    with pytest.raises(engine.UnsupportedDtypeError, match="complex128 is not supported"):
        ops.tanh(np.ones(3, np.complex128))
    with pytest.raises(engine.UnsupportedDtypeError, match="uint16"):  # float16 is supported since issue 18
        engine.jit(lambda x: x * 2)(np.ones(3, np.uint16))
    with pytest.raises(engine.UnsupportedDtypeError):
        ops.astype(np.ones(2), np.complex64)
    rogue = Primitive("rogue_op")
    with pytest.raises(engine.UnknownPrimitiveError, match="rogue_op"):
        bind(rogue, np.ones(2))
    from fedarena.engine.core.tracing import get_primitive

    with pytest.raises(engine.UnknownPrimitiveError, match="unknown primitive 'nope'"):
        get_primitive("nope")


def test_leaked_tracer_is_reported():
    leaked = []

    def f(x):
        leaked.append(x)
        return x * 2

    engine.jit(f)(np.ones(2))
    with pytest.raises(engine.LeakedTracerError):
        ops.tanh(leaked[0])


def test_grad_errors():
    with pytest.raises(engine.EngineError, match="float scalar"):
        engine.grad(lambda x: x * 2)(np.ones(3))
    with pytest.raises(engine.EngineError, match="float arrays"):
        engine.grad(lambda x: ops.sum(x))(np.ones(3, np.int64))


def test_gradient_accumulates_over_multiple_uses():
    x = np.array([0.3, -1.2, 2.0])
    g = engine.grad(lambda x: ops.sum(x * x * x + ops.tanh(x) * x))(x)
    np.testing.assert_allclose(g, 3 * x**2 + np.tanh(x) + x * (1 - np.tanh(x) ** 2), rtol=1e-12)


def test_grad_closing_over_traced_values_inside_jit():
    w = np.array([[0.5, -1.0], [2.0, 0.1]])
    x = np.array([[1.0, 2.0]])

    @engine.jit
    def step(w, x):
        return engine.grad(lambda w_: ops.sum(ops.tanh(x @ w_)))(w)  # closes over traced x

    want = x.T @ (1 - np.tanh(x @ w) ** 2)
    np.testing.assert_allclose(step(w, x), want, rtol=1e-12)


def test_has_aux_and_argnums_tuple():
    def f(a, b):
        return ops.sum(a * b), {"prod": a * b}

    (v, aux), (ga, gb) = engine.value_and_grad(f, argnums=(0, 1), has_aux=True)(np.arange(3.0), np.ones(3) * 2)
    assert v == 6.0
    np.testing.assert_allclose(aux["prod"], [0, 2, 4])
    np.testing.assert_allclose(ga, [2, 2, 2])
    np.testing.assert_allclose(gb, [0, 1, 2])


def _hess_fd(fn, x, v, eps=1e-5):
    g = engine.grad(fn)
    return (g(x + eps * v) - g(x - eps * v)) / (2 * eps)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: ops.sum(ops.tanh(x) ** 3 + ops.exp(x * 0.3) * ops.log1p(x * x)),
        lambda x: ops.sum(ops.softmax(ops.reshape(x, (2, 3)), axis=1) * np.arange(6.0).reshape(2, 3)),
        lambda x: ops.logsumexp(ops.matmul(ops.reshape(x, (2, 3)), np.linspace(-1, 1, 12).reshape(3, 4)), axis=1).sum(),
        lambda x: ops.mean(ops.sigmoid(x) * ops.sqrt(x * x + 1.0)) + ops.max(x * x),
        lambda x: ops.sum(ops.maximum(x, 0.1) * x / (1.0 + x * x)),
    ],
    ids=["elementwise", "softmax", "matmul_logsumexp", "reductions", "max_div"],
)
def test_hessian_vector_product_matches_finite_differences(fn):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(6)
    v = rng.standard_normal(6)
    want = _hess_fd(fn, x, v)
    np.testing.assert_allclose(engine.hvp(fn, (x,), (v,)), want, rtol=1e-5, atol=1e-7)
    got_jit = engine.jit(lambda x, v: engine.hvp(fn, (x,), (v,)))(x, v)
    np.testing.assert_allclose(got_jit, want, rtol=1e-5, atol=1e-7)


def test_grad_of_grad_closed_form():
    f = lambda x: ops.sum(x**4)  # noqa: E731
    d2 = engine.grad(lambda x: ops.sum(engine.grad(f)(x)))
    x = np.array([0.5, -2.0])
    np.testing.assert_allclose(d2(x), 12 * x**2)


@pytest.mark.quick
def test_mlp_hessian_vector_product_vs_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    w1, w2, x = rng.standard_normal((3, 5)), rng.standard_normal((5, 2)), rng.standard_normal((4, 3))
    v1, v2 = rng.standard_normal((3, 5)), rng.standard_normal((5, 2))

    def loss(w1, w2):
        return ops.mean(ops.tanh(x @ w1) @ w2 ** 2)

    h1, h2 = engine.hvp(loss, (w1, w2), (v1, v2))
    tw1, tw2 = torch.tensor(w1, requires_grad=True), torch.tensor(w2, requires_grad=True)
    tl = (torch.tanh(torch.tensor(x) @ tw1) @ tw2**2).mean()
    g1, g2 = torch.autograd.grad(tl, (tw1, tw2), create_graph=True)
    th = torch.autograd.grad((g1 * torch.tensor(v1)).sum() + (g2 * torch.tensor(v2)).sum(), (tw1, tw2))
    np.testing.assert_allclose(h1, th[0].numpy(), rtol=1e-10)
    np.testing.assert_allclose(h2, th[1].numpy(), rtol=1e-10)


def test_int_and_bool_ops_in_jit():
    def f(a, b):
        return ops.argmax(a, axis=1), ops.one_hot(b, 4, np.float32), ops.logical_and(a[:, 0] > 0, b > 1), ops.sum(b)

    a = np.array([[0.1, 3.0, -1.0], [2.0, 0.0, 1.0]])
    b = np.array([3, 1], np.int32)
    am, oh, land, s = engine.jit(f)(a, b)
    np.testing.assert_array_equal(am, [1, 0])
    np.testing.assert_array_equal(oh, np.eye(4, dtype=np.float32)[[3, 1]])
    assert oh.dtype == np.float32
    np.testing.assert_array_equal(land, [True, False])
    assert s == 4 and s.dtype == np.int64


def test_keyword_arguments_and_concurrent_calls():
    import threading

    f = engine.jit(lambda x, *, scale: ops.tanh(x) * scale)
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    np.testing.assert_allclose(f(x, scale=np.float64(2.0)), 2 * np.tanh(x))
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(200):
            a = rng.standard_normal((2, 3))
            if not np.allclose(f(a, scale=np.float64(seed)), np.tanh(a) * seed):
                errors.append(seed)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors  # each concurrently running thread gets its own buffer set


def test_blas_thread_control():
    before = engine.get_num_threads()
    engine.set_num_threads(1)
    try:
        if before is not None:
            assert engine.get_num_threads() == 1
    finally:
        engine.set_num_threads(None)
    assert engine.get_num_threads() == before
    with pytest.raises(ValueError):
        engine.set_num_threads(0)


def test_make_graph_of_train_step_validates_and_dce_keeps_outputs():
    from fedarena.engine import nn, optim

    mlp = nn.MLP([3, 4, 2])
    opt = optim.adam(1e-2)
    p = mlp.init(0)

    def step(p, s, x, y):
        loss, g = engine.value_and_grad(lambda p: ops.cross_entropy(mlp.apply(p, x), y))(p)
        p, s = opt.update(g, s, p)
        return p, s, loss

    args = (p, opt.init(p), np.ones((5, 3), np.float32), np.zeros(5, np.int64))
    g = engine.make_graph(step)(*args)
    g.validate()
    prims = {e.prim.name for e in g.eqns}
    assert {"matmul", "tanh", "reduce_max", "gather", "scatter_add", "concatenate", "sqrt"} <= prims
    assert len(g.outvars) == len(engine.tree_leaves(step(*args)))


def test_executor_reuses_buffers_and_stays_correct(monkeypatch):
    monkeypatch.setenv("FEDARENA_NATIVE_GRAPH", "0")  # the per-equation executor's buffers, not native code
    def chain(x, w):
        h = x
        for i in range(12):
            h = ops.tanh(h @ w + float(i)) * 0.5 + h  # many same-shaped temporaries
        return ops.sum(h), h

    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((4, 4)), rng.standard_normal((4, 4)) * 0.3
    f = engine.jit(chain)
    s, h = f(x, w)
    want_h = x
    for i in range(12):
        want_h = np.tanh(want_h @ w + i) * 0.5 + want_h
    np.testing.assert_allclose(h, want_h, rtol=1e-12)
    np.testing.assert_allclose(s, want_h.sum(), rtol=1e-12)
    exe = f._fast[0][1]
    ns = exe._pool[0].__globals__
    plan = exe.memory  # lifetimes let temporaries share memory
    assert plan.planned_bytes < plan.unplanned_bytes / 3 and len(plan.buffer_of) > 20
    assert sum(v.nbytes for k, v in ns.items() if k == "_arena" or k.startswith("_b") and v.base is None) == plan.planned_bytes
    g = engine.jit(engine.grad(lambda x: chain(x, w)[0]))(x)  # backward through the same planner
    eps = 1e-6
    fd = np.array([(chain(x + eps * e, w)[0] - chain(x - eps * e, w)[0]) / (2 * eps) for e in np.eye(16).reshape(16, 4, 4)]).reshape(4, 4)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def _scaled_tanh(x, k):
    return ops.tanh(x) * k


def test_a_jitted_function_pickles_and_copies_without_its_programs():
    """pickle, copy.deepcopy and Ray's cloudpickle (how a policy holding a jitted function reaches an actor) give
    the same jitted function, options included, with no compiled program carried over."""
    import copy
    import pickle

    j = engine.jit(_scaled_tanh, static_argnums=(1,), max_compiles=5)
    x = np.linspace(-2, 2, 7)
    want = j(x, 3.0)
    dumps = [pickle.dumps]
    try:
        from ray import cloudpickle
        dumps.append(cloudpickle.dumps)
    except ImportError:  # pragma: no cover - ray is a test dependency
        pass
    copies = [copy.deepcopy(j), copy.copy(j)] + [pickle.loads(d(j)) for d in dumps]
    for c in copies:
        assert type(c) is type(j) and c.cache_size == 0 and c.compiles == 0
        assert c.static_argnums == (1,) and c.max_compiles == 5 and c.__wrapped__ is _scaled_tanh
        np.testing.assert_array_equal(c(x, 3.0), want)
        assert c.cache_size == 1
    assert j.cache_size == 1  # the original keeps its program


def test_interpret_can_free_each_value_after_its_last_reader():
    """``interpret(..., free=True)`` (the sharded executor's eager segments) gives the same outputs and holds
    no intermediate at the end; without it every value stays in the environment."""
    from fedarena.engine.core.interpreter import interpret
    from fedarena.engine.core.tracing import bind_rule

    def f(x):
        h = ops.tanh(x) * 2.0 + x
        return ops.sum(h * h), h

    x = np.linspace(-1, 1, 6)
    g = engine.make_graph(f)(x)
    kept_out, kept_env = interpret(g, [x], bind_rule)
    freed_out, freed_env = interpret(g, [x], bind_rule, free=True)
    for a, b in zip(kept_out, freed_out):
        np.testing.assert_array_equal(a, b)
    outs = {v for v in g.outvars if isinstance(v, Var)}
    assert len(g.eqns) >= 4 and len(kept_env) == len(g.eqns) + len(g.invars) + len(g.constvars)
    assert set(freed_env) <= set(g.invars) | set(g.constvars) | outs
