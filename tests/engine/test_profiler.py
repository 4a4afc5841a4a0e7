"""Memory planning (liveness, reuse, in place) checked against brute-force lifetime overlap,
``engine.inspect`` output and ``engine.profile`` timings / Chrome trace."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.engine.compiler.memory_plan import check_plan, liveness, nbytes, plan_memory


def _train_step():
    mlp = nn.MLP([8, 32, 32, 4], activation="tanh")
    opt = optim.adam(1e-3)

    def step(p, s, x, y):
        loss, g = engine.value_and_grad(lambda p: ops.cross_entropy(mlp.apply(p, x), y))(p)
        p, s = opt.update(g, s, p)
        return p, s, loss

    p = mlp.init(0)
    rng = np.random.default_rng(0)
    return step, (p, opt.init(p), rng.standard_normal((16, 8)).astype(np.float32), rng.integers(0, 4, 16))


def test_memory_plan_reuses_buffers_without_overlap():
    step, args = _train_step()
    g = engine.passes.DEFAULT_PIPELINE(engine.make_graph(step)(*args))
    plan = plan_memory(g)
    check_plan(g, plan)  # no two overlapping lifetimes share a buffer
    # brute force: at every equation, the bytes of live values fit in the planned buffers
    root, iv = liveness(g)
    assert plan.lower_bound_bytes <= plan.planned_bytes <= plan.unplanned_bytes
    assert plan.planned_bytes < 0.8 * plan.unplanned_bytes
    assert plan.in_place, "an elementwise chain should run in place"
    for i in range(len(g.eqns)):
        live = sum(nbytes(v) for v, (s, t) in iv.items() if s <= i <= t)
        assert live <= plan.planned_bytes + max(nbytes(v) for v in iv)


def test_memory_plan_of_a_chain_is_one_buffer():
    def f(x):
        return ops.sum(ops.exp(ops.tanh(ops.sin(x) * 2.0) + 1.0))

    g = engine.make_graph(f)(np.ones((100, 10)))
    plan = plan_memory(g)
    check_plan(g, plan)
    big = [b for b in plan.buffer_bytes if b == 8000]
    assert len(big) == 1 and plan.unplanned_bytes >= 5 * 8000


def test_inspect_shows_passes_schedule_and_plan():
    def f(x):
        y = ops.transpose(ops.transpose(x * 1.0, (1, 0)), (1, 0))
        return ops.tanh(y) + ops.tanh(y)

    lines = []
    res = engine.inspect(f, printer=lines.append)(np.ones((3, 2)))
    text = lines[0]
    assert "IR after tracing" in text and "IR after algebraic_simplification" in text
    assert "IR after common_subexpression_elimination" in text
    assert "schedule:" in text and "memory plan:" in text
    assert [e.prim.name for e in res.graph.eqns] == ["tanh", "add"]
    assert len(res.stages[0][1].eqns) > len(res.graph.eqns)


def test_profile_reports_equations_and_chrome_trace(tmp_path):
    step, args = _train_step()
    j = engine.jit(step)
    out = []
    path = str(tmp_path / "trace.json")
    prof = engine.profile(j, repeat=2, trace_path=path, printer=out.append)(*args)
    g = j.graph(*args)
    assert len(prof.equations) == len(g.eqns)
    assert prof.compiled_seconds > 0 and all(e.seconds >= 0 for e in prof.equations)
    assert "matmul" in prof.by_primitive()
    assert prof.equations[0].bytes == nbytes(g.eqns[0].outputs[0])
    trace = json.load(open(path))
    ev = [e for e in trace["traceEvents"] if e["cat"] == "equation"]
    assert len(ev) == len(g.eqns) and all(e["ph"] == "X" for e in ev)
    assert "compiled call" in out[0]
    # line-by-line timings of the real compiled schedule: every body line of the source appears
    body = [l.strip() for l in j.source(*args).split("\n") if l.startswith("    ") and not l.strip().startswith("return")]
    assert [t for t, _ in prof.lines] == body and all(s >= 0 for _, s in prof.lines)
    assert any(e["cat"] == "compiled line" for e in trace["traceEvents"])


def test_lower_bound_is_a_bound_for_in_place_chains():
    def f(x):
        return ops.sum(ops.tanh(x) * 2.0) + ops.sum(x)

    g = engine.make_graph(f)(np.ones((50, 20)))
    plan = plan_memory(g)
    check_plan(g, plan)
    assert plan.lower_bound_bytes <= plan.planned_bytes <= plan.unplanned_bytes


def test_cpu_clock_and_a_bad_clock_name():
    f = engine.jit(lambda x: ops.tanh(x @ x))
    x = np.eye(16, dtype=np.float32)
    prof = engine.profile(f, repeat=2, printer=None, clock="cpu")(x)
    assert prof.compiled_seconds > 0 and {e.primitive for e in prof.equations} >= {"matmul", "tanh"}
    assert all(t >= 0 for _, t in prof.lines)
    with pytest.raises(ValueError, match="clock"):
        engine.profile(f, printer=None, clock="gpu")
