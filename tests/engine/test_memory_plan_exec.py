"""The executor's memory plan (``Executable.memory``, from ``memory_plan.BufferPlanner``): in-place
hazards, equality with an executor that shares nothing (``reuse=False``) and with the graph
interpreter on random programs, planned bytes equal to what the compiled code really holds, and
concurrent calls from several threads.  Arrays are above the executor's tiny-operand size (2048
elements), below which a broadcasting `a + b` allocates instead of writing into a buffer."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.engine.backends.numpy.executor import Executable
from fedarena.engine.compiler.passes import FUSION_PIPELINE
from fedarena.engine.compiler.memory_plan import check_plan, plan_memory
from fedarena.engine.core.tracing import eval_graph
from fedarena.engine.primitives.elementwise import tanh

from .test_passes import _random_program


@pytest.fixture(autouse=True)
def _per_equation_executor(monkeypatch):
    # these tests read the per-equation executor's memory plan: jit must not take whole-graph native code
    monkeypatch.setenv("FEDARENA_NATIVE_GRAPH", "0")


def _compile(fn, *args, reuse=True, passes=None):
    g = engine.make_graph(fn)(*args)
    pipeline = engine.passes.resolve(passes)
    if pipeline is not None:
        g = pipeline(g)
    return Executable(g, reuse=reuse)


def _eqn_index(exe, prim_name, k=0):
    return [i for i, e in enumerate(exe.graph.eqns) if e.prim.name == prim_name][k]


def _bases(exe, run=None):
    """The byte arrays a buffer set allocated: the arena and the blocks outside it."""
    ns = (run or exe._pool[-1]).__globals__
    arrays = {k: v for k, v in ns.items() if k == "_arena" or k.startswith("_b") and isinstance(v, np.ndarray)}
    return {k: v for k, v in arrays.items() if v.base is None}  # owners, not the arena's ranges


# ----------------------------------------------------------------------------- in place, and its hazards


def test_elementwise_chain_runs_in_one_buffer_in_place():
    def f(x):
        return ops.sum(ops.exp(ops.tanh(x * 2.0) + 1.0))

    x = np.random.default_rng(0).standard_normal((60, 50))
    exe = _compile(f, x)
    plan = exe.memory
    check_plan(exe.graph, plan)
    names = [e.prim.name for e in exe.graph.eqns]
    assert [names[i] for i in plan.in_place] == ["tanh", "add", "exp"]
    big = {plan.buffer_of[e.outputs[0]] for e in exe.graph.eqns[:4]}
    assert len(big) == 1  # x*2, tanh, +1, exp share one buffer
    (line,) = [l.strip() for l in exe.source.split("\n") if l.strip().startswith("np.tanh(")]
    src, dst = line[len("np.tanh(") : -1].split(", ")
    assert src == dst  # the generated code writes tanh over its operand
    np.testing.assert_allclose(exe(x)[0], np.sum(np.exp(np.tanh(x * 2.0) + 1.0)), rtol=1e-12)


def test_operand_used_twice_in_the_dying_equation():
    def f(x):
        h = x * 3.0
        return ops.sum(h * h)  # np.multiply(h, h, out=h)

    x = np.random.default_rng(1).standard_normal((60, 50))
    exe = _compile(f, x)
    assert _eqn_index(exe, "mul", 1) in exe.memory.in_place
    np.testing.assert_allclose(exe(x)[0], np.sum((3 * x) ** 2), rtol=1e-12)


def test_operand_aliased_by_another_operand_is_not_overwritten():
    def f(x):
        h = x * 2.0
        return ops.sum((h + ops.transpose(h, (1, 0))) * x)  # h dies here, but h.T reads it too

    x = np.random.default_rng(2).standard_normal((60, 60))
    exe = _compile(f, x, passes=())
    assert _eqn_index(exe, "add") not in exe.memory.in_place
    np.testing.assert_allclose(exe(x)[0], np.sum((2 * x + 2 * x.T) * x), rtol=1e-12)


def test_operand_aliased_by_a_view_used_later_is_not_overwritten():
    def f(x):
        h = x * 2.0
        v = ops.reshape(h, (x.shape[0] * x.shape[1],))  # a view of h's buffer, read after tanh(h)
        t = ops.tanh(h)  # h's last direct use
        return ops.sum(t) + ops.sum(v * 3.0)

    x = np.random.default_rng(3).standard_normal((60, 50))
    exe = _compile(f, x, passes=())
    assert _eqn_index(exe, "tanh") not in exe.memory.in_place
    np.testing.assert_allclose(exe(x)[0], np.sum(np.tanh(2 * x)) + np.sum(6 * x), rtol=1e-12)


def test_operand_that_is_a_graph_output_is_not_overwritten():
    def f(x):
        h = x * 2.0
        return ops.tanh(h) * 1.5, h  # h escapes to the caller

    x = np.random.default_rng(4).standard_normal((60, 50))
    exe = _compile(f, x)
    y, h = exe(x)
    np.testing.assert_allclose(h, 2 * x, rtol=1e-14)
    np.testing.assert_allclose(y, np.tanh(2 * x) * 1.5, rtol=1e-14)
    y2, h2 = exe(x + 1.0)  # outputs are fresh: the first call's arrays stay intact
    np.testing.assert_allclose(h, 2 * x, rtol=1e-14)
    np.testing.assert_allclose(h2, 2 * (x + 1.0), rtol=1e-14)


def test_select_only_overwrites_its_false_operand():
    def f(x, y):
        a, b = ops.exp(x * 0.5), ops.tanh(y)  # both die at the select
        return ops.sum(ops.where(x > y, a, b) * 2.0)

    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((90, 40)), rng.standard_normal((90, 40))
    exe = _compile(f, x, y, passes=())
    sel = _eqn_index(exe, "select")
    assert sel in exe.memory.in_place
    b_var = exe.graph.eqns[sel].inputs[2]
    assert exe.memory.buffer_of[exe.graph.eqns[sel].outputs[0]] == exe.memory.buffer_of[b_var]
    np.testing.assert_allclose(exe(x, y)[0], np.sum(np.where(x > y, np.exp(x * 0.5), np.tanh(y)) * 2.0), rtol=1e-12)


def test_graph_inputs_and_constants_are_never_written():
    c = np.linspace(-1, 1, 3000).reshape(60, 50)
    c_before = c.copy()

    def f(x, w):
        h = ops.tanh(x)  # x dies here: an input, never overwritten
        k = ops.exp(c * 0.5)  # folded at build time into a dedicated buffer
        return ops.sum(ops.sqrt(ops.abs(w) + 1.0) * h + k + c)

    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((60, 50)), rng.standard_normal((60, 50))
    xb, wb = x.copy(), w.copy()
    exe = _compile(f, x, w)
    want = np.sum(np.sqrt(np.abs(w) + 1.0) * np.tanh(x) + np.exp(c * 0.5) + c)
    for _ in range(3):  # a build-time buffer reused per call would change the second result
        np.testing.assert_allclose(exe(x, w)[0], want, rtol=1e-12)
    np.testing.assert_array_equal(x, xb)
    np.testing.assert_array_equal(w, wb)
    np.testing.assert_array_equal(c, c_before)


# ----------------------------------------------------------------------------- random programs


def _loss_of(fn):
    def loss(x, y):
        outs = fn(x, y)
        return outs[0] + ops.sum(outs[1] * outs[1]) + ops.sum(outs[2])

    return loss


@pytest.mark.parametrize("seed", range(16))
def test_property_planned_executor_equals_unplanned_and_interpreter(seed):
    rng = np.random.default_rng(200 + seed)
    fn = _random_program(rng, n_ops=10)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    xb, yb = x.copy(), y.copy()
    for f in (fn, engine.value_and_grad(_loss_of(fn), argnums=(0, 1))):
        g0 = engine.make_graph(f)(x, y)
        for g in (g0, engine.passes.DEFAULT_PIPELINE(g0), FUSION_PIPELINE(g0)):
            want = [np.asarray(v) for v in eval_graph(g, [x, y])]
            planned, unplanned = Executable(g), Executable(g, reuse=False)
            assert unplanned.memory.planned_bytes == unplanned.memory.unplanned_bytes
            assert not unplanned.memory.in_place
            check_plan(planned.graph, planned.memory)
            analysis = plan_memory(g)  # the same planner on the graph alone
            check_plan(g, analysis)
            assert analysis.lower_bound_bytes <= analysis.planned_bytes <= analysis.unplanned_bytes
            assert planned.memory.lower_bound_bytes <= planned.memory.planned_bytes <= planned.memory.unplanned_bytes
            assert planned.memory.unplanned_bytes == unplanned.memory.unplanned_bytes
            for _ in range(2):  # twice: nothing a call leaves in a buffer may leak into the next
                for a, b, w in zip(planned(x, y), unplanned(x, y), want):
                    np.testing.assert_allclose(a, w, rtol=1e-9, atol=1e-12)
                    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)  # BLAS rounding may follow alignment
    np.testing.assert_array_equal(x, xb)
    np.testing.assert_array_equal(y, yb)


def test_property_programs_exercise_in_place_and_sharing():
    """Over the random programs the planner both runs equations in place and shares buffers."""
    in_place = shared = 0
    for seed in range(16):
        rng = np.random.default_rng(200 + seed)
        fn = _random_program(rng, n_ops=10)
        x = rng.standard_normal((3, 4))
        exe = Executable(engine.make_graph(engine.value_and_grad(_loss_of(fn), argnums=(0, 1)))(x, x))
        in_place += bool(exe.memory.in_place)
        shared += exe.memory.planned_bytes < exe.memory.unplanned_bytes
    assert in_place >= 12 and shared >= 12, (in_place, shared)


# ----------------------------------------------------------------------------- bytes really held


def _train_step():
    mlp = nn.MLP([8, 64, 64, 4], activation="tanh")
    opt = optim.adam(1e-3)

    def step(p, s, x, y):
        loss, g = engine.value_and_grad(lambda p: ops.mse(mlp.apply(p, x), y))(p)
        p, s = opt.update(g, s, p)
        return p, s, loss

    p = mlp.init(0)
    rng = np.random.default_rng(0)
    return step, (p, opt.init(p), rng.standard_normal((64, 8)).astype(np.float32), rng.standard_normal((64, 4)).astype(np.float32))


@pytest.mark.parametrize("native_kernels", ["1", "0"])
def test_planned_bytes_are_the_bytes_the_compiled_code_holds(native_kernels, monkeypatch):
    monkeypatch.setenv("FEDARENA_NATIVE", native_kernels)  # with native kernels fewer, larger steps
    step, args = _train_step()
    j = engine.jit(step)
    j(*args)
    exe = j._lookup(args, {})[0].executable
    plan = exe.memory
    check_plan(exe.graph, plan)
    bases = _bases(exe)
    outside = [b for b in range(len(plan.buffer_bytes)) if b not in plan.offset]
    assert plan.arena_bytes > 0 and len(bases) == 1 + len(outside)
    assert sum(b.nbytes for b in bases.values()) == plan.planned_bytes
    ns = exe._pool[-1].__globals__
    arena = ns["_arena"]
    for b, off in plan.offset.items():  # each block is its planned byte range of the arena
        block = ns[f"_b{b}"]
        assert block.base is arena and block.nbytes == plan.buffer_bytes[b]
        assert block.__array_interface__["data"][0] - arena.__array_interface__["data"][0] == off
    assert plan.lower_bound_bytes <= plan.planned_bytes < 0.7 * plan.unplanned_bytes
    assert len(plan.in_place) >= (5 if native_kernels == "0" else 3)
    # every persistent array a kernel call of the code writes into (its last argument) is a view
    # of one of those buffers
    targets = set()
    for line in exe.source.split("\n"):
        if line.startswith("    ") and line.rstrip().endswith(")") and "=" not in line.split("(")[0]:
            last = line.rstrip()[:-1].rsplit(",", 1)[-1].strip().removeprefix("out=")
            if isinstance(ns.get(last), np.ndarray):
                targets.add(last)
    assert len(targets) >= 15
    for k in targets:
        assert any(np.shares_memory(ns[k], b) for b in bases.values()), k
    # the unplanned executor holds one buffer per planned value
    ref = Executable(exe.graph, reuse=False)
    assert sum(b.nbytes for b in _bases(ref).values()) == plan.unplanned_bytes == ref.memory.planned_bytes
    for a, b in zip(exe(*engine.tree_leaves(args)), ref(*engine.tree_leaves(args))):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)  # float32; BLAS rounding may follow alignment


def test_inspect_prints_the_executors_plan():
    step, args = _train_step()
    lines = []
    res = engine.inspect(step, printer=lines.append)(*args)
    j = engine.jit(step)
    exe = j._lookup(args, {})[0].executable
    assert res.plan.report() == exe.memory.report()
    assert res.source == exe.source
    assert exe.memory.report() in lines[0] and "(in place)" in lines[0]
    assert "allocated per call" in lines[0]


# ----------------------------------------------------------------------------- threads


def test_concurrent_calls_use_separate_buffer_sets():
    def f(x, w):
        h = ops.tanh(x @ w)
        for _ in range(4):
            h = ops.tanh(h @ w) * 0.5 + h
        return ops.sum(h, axis=1)

    rng = np.random.default_rng(8)
    w = rng.standard_normal((96, 96)) * 0.1
    xs = [rng.standard_normal((96, 96)) for _ in range(2)]

    def ref(x):
        h = np.tanh(x @ w)
        for _ in range(4):
            h = np.tanh(h @ w) * 0.5 + h
        return h.sum(1)

    want = [ref(x) for x in xs]
    j = engine.jit(f)
    j(xs[0], w)
    errors = []
    start = threading.Barrier(2)

    def worker(k):
        start.wait()
        for _ in range(150):
            got = j(xs[k], w)
            if not np.allclose(got, want[k], rtol=1e-12, atol=1e-12):
                errors.append(k)
                return

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    exe = j._lookup((xs[0], w), {})[0].executable
    sets = list(exe._pool)
    for run in sets:  # every buffer set follows the same plan, each with buffers of its own
        assert sum(b.nbytes for b in _bases(exe, run).values()) == exe.memory.planned_bytes
    for r1 in sets:
        for r2 in sets:
            if r1 is not r2:
                assert not any(np.shares_memory(a, b) for a in _bases(exe, r1).values() for b in _bases(exe, r2).values())


def test_two_buffer_sets_built_explicitly_give_equal_results():
    step, args = _train_step()
    flat = engine.tree_leaves(args)
    exe = Executable(engine.passes.DEFAULT_PIPELINE(engine.make_graph(step)(*args)))
    other = exe._build()  # a second buffer set, as a second thread gets
    a, b = exe(*flat), other(*flat)
    for u, v in zip(a, b):
        np.testing.assert_allclose(u, v, rtol=2e-6, atol=1e-7)
    assert not any(np.shares_memory(p, q) for p in _bases(exe).values() for q in _bases(exe, other).values())


# ----------------------------------------------------------------------------- 0-d steps on numpy scalars


def test_scalar_steps_compute_what_the_interpreter_computes():
    def f(x, s, k):
        t = ops.sum(x)  # a 0-d buffer
        a = t * 0.5 + 1.0
        b = ops.exp(a * 1e-3) / (ops.abs(a) + 2.0)
        c = ops.sqrt(ops.maximum(b, 0.25)) ** 2.0 - ops.minimum(b, s)
        flag = ops.astype(a > 2.0, np.float32) + ops.astype(k + 1, np.float32)  # k: an input, never a scalar
        d = ops.astype(c * 3.0, np.float64) / 7.0
        e = ops.astype(d * 2.0, np.float32)  # a 0-d cast read by an array step: item assignment
        n = ops.astype(k * 3, np.float32)  # from an integer input
        return b, c, flag, d, x * c, x * e + n  # c also feeds an array step

    rng = np.random.default_rng(9)
    x = rng.standard_normal((60, 50)).astype(np.float32)
    s = np.array(0.3, np.float32)
    k = np.array(4, np.int64)
    g = engine.passes.DEFAULT_PIPELINE(engine.make_graph(f)(x, s, k))
    exe = Executable(g)
    assert exe.source.count("[()]") >= 2  # the scalar path is exercised
    assert exe.source.count("[()] = ") == 2  # and the 0-d casts into buffers
    want = eval_graph(g, [x, s, k])
    for _ in range(2):
        got = exe(x, s, k)
        for u, w in zip(got, want):
            assert isinstance(u, np.ndarray) and u.dtype == np.asarray(w).dtype and u.shape == np.shape(w)
            np.testing.assert_allclose(u, w, rtol=1e-6, atol=1e-7)
    # a Python scalar where a 0-d input is expected still works (inputs never take the scalar path)
    for u, w in zip(exe(x, 0.3, 4), exe(x, s, k)):
        np.testing.assert_allclose(u, w, rtol=1e-6)


def test_short_axis_max_and_min_of_a_buffer_are_unrolled_exactly(monkeypatch):
    monkeypatch.setenv("FEDARENA_NATIVE", "0")  # natively a row max/min is one kernel call

    def f(x):
        h = x * 2.0  # a buffer: its column views are made at build time
        return ops.max(h, axis=1, keepdims=True) - 1.0, ops.min(ops.transpose(h, (1, 0)), axis=0) * 3.0

    x = np.random.default_rng(10).standard_normal((64, 4)).astype(np.float32)
    x[3, 2] = np.nan  # propagated like numpy's reduce does
    x[5, :] = 0.5  # ties
    exe = _compile(f, x)
    assert exe.source.count("np.maximum(") == 3 and exe.source.count("np.minimum(") == 3
    a, b = exe(x)
    np.testing.assert_array_equal(a, np.max(2 * x, axis=1, keepdims=True) - 1.0)
    np.testing.assert_array_equal(b, np.min((2 * x).T, axis=0) * 3.0)


def test_outer_product_as_matmul_is_exact(monkeypatch):
    monkeypatch.setenv("FEDARENA_NATIVE", "0")  # natively the product is one VM call, as fast

    def f(u, v):
        return ops.exp(ops.tanh(u) * ops.transpose(v, (1, 0)))  # (64,1) * (1,48) into a buffer

    rng = np.random.default_rng(11)
    u, v = rng.standard_normal((64, 1)).astype(np.float32), rng.standard_normal((48, 1)).astype(np.float32)
    exe = _compile(f, u, v)
    assert any(l.strip().startswith("np.dot(") for l in exe.source.split("\n"))
    # float32 tanh is the engine's own (primitives.elementwise.tanh; numpy's loop rounds differently)
    np.testing.assert_array_equal(exe(u, v)[0], np.exp(tanh(u) * v.T))


def test_jitted_memory_is_the_executables_plan():
    step, args = _train_step()
    j = engine.jit(step)
    plan = j.memory(*args)
    assert plan is j._lookup(args, {})[0].executable.memory
    assert 0 < plan.planned_bytes <= plan.unplanned_bytes and "planned" in plan.report()
