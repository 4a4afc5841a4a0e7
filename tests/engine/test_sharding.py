"""engine.sharding: a sharded training step equals the single-process step (10 Adam steps, rtol 1e-5) for the
replicated, data-parallel, column-, row-, class-sharded and hybrid layouts, over threads, TCP and shared memory; every
redistribution against numpy; a primitive without a rule runs replicated and the program says so."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fedarena.engine import ops
from fedarena.engine.collectives import run_threads
from fedarena.engine.collectives.launch import spawn
from fedarena.engine.primitives.sharding import Layout
from fedarena.engine.sharding import NO_RULE, CostModel, Mesh, R, S, ShardingError, block, shard_jit
from fedarena.engine.sharding.conformance import STRATEGIES, check_strategies
from fedarena.engine.sharding.propagate import shard_graph
from fedarena.engine.sharding.redistribute import plan


def _assert_matches(per_rank: list) -> None:
    for name in STRATEGIES:
        for rank, res in enumerate(per_rank):
            got, want = res[name]["params"], res[name]["reference"]
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"{name} rank {rank} {k}")
        losses = per_rank[0][name]["losses"]
        assert losses[-1] < losses[0], (name, losses)


def test_sharded_step_equals_single_process_on_threads():
    # a model of bandwidth alone (no latency, free compute): the strategies that move the fewest bytes, whose
    # structure is asserted below
    bandwidth = CostModel(alpha=0.0, op_time=0.0, flop_time=0.0, byte_time=0.0)
    per_rank = run_threads(2, lambda comm: check_strategies(comm, cost=bandwidth), timeout=120)
    _assert_matches(per_rank)
    text = {name: per_rank[0][name]["program"] for name in STRATEGIES}
    # the class-sharded head keeps its logits split: the label logit is a masked local gather, the softmax's
    # max and normaliser all-reduces of one number per example; nothing of the logits' size is gathered
    assert "gather[axis=1]" in text["class"] and "# local kernel" in text["class"]
    assert "all_reduce[op='max']" in text["class"]
    assert not any("all_gather" in ln and "f32[8,12]" in ln for ln in text["class"].splitlines())
    # the row-sharded layer leaves a partial sum that is all-reduced
    assert "{Psum} = matmul" in text["row"] and "all_reduce[op='sum']" in text["row"]
    # data parallelism all-reduces weight gradients; the replicated step communicates nothing
    assert "all_reduce[op='sum']" in text["data_parallel"]
    assert "all_gather" not in text["replicated"] and "all_reduce" not in text["replicated"]
    # with the transport's own latency (tiny tensors: fewer messages win) the step is just as exact on 4 ranks
    _assert_matches(run_threads(4, check_strategies, timeout=120))


def test_data_parallelism_all_reduces_each_gradient_and_gathers_no_activation():
    # a batch larger than the layers (64 examples, 8-16-12 network): under the bandwidth model each weight
    # gradient's all-reduce moves fewer bytes than gathering an activation, so propagation keeps the batch split
    # through forward and backward, and each parameter's gradient is a partial sum all-reduced once
    bandwidth = CostModel(alpha=0.0, op_time=0.0, flop_time=0.0, byte_time=0.0)
    per_rank = run_threads(2, lambda comm: check_strategies(comm, ("data_parallel",), batch=64, cost=bandwidth),
                           timeout=120)
    for rank, res in enumerate(per_rank):
        for k, want in res["data_parallel"]["reference"].items():
            np.testing.assert_allclose(res["data_parallel"]["params"][k], want, rtol=1e-5, atol=1e-6, err_msg=f"rank {rank} {k}")
    lines = [ln for ln in per_rank[0]["data_parallel"]["program"].splitlines() if "= all_" in ln or "= reduce_scatter" in ln]
    assert not any("all_gather" in ln or "reduce_scatter" in ln for ln in lines), lines
    reduced = sorted(ln.split(":")[1].split("{")[0] for ln in lines)
    assert reduced == sorted(["f32[]", "f32[8,16]", "f32[16]", "f32[16,12]", "f32[12]"]), lines  # loss and 4 gradients


@pytest.mark.parametrize("kind,n", [("tcp", 2), ("shm", 4)])
def test_sharded_step_equals_single_process_on_processes(kind, n):
    _assert_matches(spawn(n, kind, check_strategies, (), timeout=120))


@pytest.mark.slow
@pytest.mark.parametrize("kind,n", [("tcp", 4), ("shm", 2)])
def test_sharded_step_equals_single_process_on_processes_more(kind, n):
    _assert_matches(spawn(n, kind, check_strategies, (), timeout=120))


LAYOUTS = [R, S(0), S(1), Layout(partial="sum"), Layout(partial="max")]


def _redistribute_all(comm):
    n, rank = comm.world_size, comm.rank
    rng = np.random.default_rng(7)
    terms = rng.standard_normal((n, 6, 6))  # rank r's term of a partial value
    full_sum, full_max = terms.sum(0), terms.max(0)
    checked = 0
    for src in LAYOUTS:
        for dst in LAYOUTS:
            if src.partial == "sum":
                x, value = terms[rank], full_sum
            elif src.partial == "max":
                x, value = terms[rank], full_max
            else:
                x, value = block(full_sum, src, rank, n), full_sum
            for c in plan(src, dst):
                x = c.run(comm, x)
            if dst.partial == "sum":
                got = comm.all_reduce(x)
            elif dst.partial == "max":
                got = comm.all_reduce(x, op="max")
            else:
                got = np.concatenate(list(comm.all_gather(x)), axis=dst.axis) if dst.axis is not None else x
            np.testing.assert_allclose(got, value, rtol=1e-12, err_msg=f"{src} -> {dst}")
            checked += 1
    return checked


@pytest.mark.parametrize("n", [2, 3])
def test_every_redistribution_gives_the_same_tensor(n):
    assert run_threads(n, _redistribute_all) == [len(LAYOUTS) ** 2] * n


def _no_rule(comm):
    n, rank = comm.world_size, comm.rank
    x = np.arange(24.0).reshape(4, 6)

    def fn(a):
        return ops.cumsum(ops.tanh(a), axis=1) * 2.0

    f = shard_jit(fn, Mesh(comm), in_shardings=S(0), out_shardings=S(0))
    out = f(block(x, S(0), rank, n))
    return out, str(f.lower(block(x, S(0), rank, n))[0])


def test_a_primitive_without_a_rule_runs_replicated_and_says_so():
    per_rank = run_threads(2, _no_rule)
    want = np.cumsum(np.tanh(np.arange(24.0).reshape(4, 6)), axis=1) * 2.0
    np.testing.assert_allclose(np.concatenate([o for o, _ in per_rank]), want, rtol=1e-12)
    text = per_rank[0][1]
    line = next(ln for ln in text.splitlines() if "cumsum" in ln)
    assert NO_RULE in line and "{R}" in line
    assert "all_gather[axis=0]" in text  # its sharded input was gathered


def test_a_layout_that_does_not_fit_is_refused_in_one_line():
    def body(comm):
        f = shard_jit(lambda a: a * 2.0, Mesh(comm), in_shardings=S(2))
        with pytest.raises(ShardingError, match=r"layout S\(2\) is out of range for a block of shape \(4, 3\)"):
            f(np.zeros((4, 3)))
        g = shard_jit(lambda a: a * 2.0, Mesh(comm), out_shardings=S(1))
        with pytest.raises(ShardingError, match=r"out_shardings\[0\]: axis 1 of shape \(4, 3\) does not split into 2"):
            g(np.zeros((4, 3)))
        return True

    assert run_threads(2, body) == [True, True]


def _mlp_avals(classes: int, batch: int = 32, sizes=(512, 1024, 32)) -> tuple:
    from fedarena.engine.core.ir import ShapedArray

    dims = list(sizes) + [classes]
    p = {}
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:]), start=1):
        p[f"w{i}"], p[f"b{i}"] = ShapedArray((a, b), np.float32), ShapedArray((b,), np.float32)
    state = {"count": ShapedArray((), np.int64), "mu": p, "nu": p}
    return p, state, ShapedArray((batch, sizes[0]), np.float32), ShapedArray((batch,), np.int64)


def _matmul_time(program) -> float:
    t = 0.0
    for st in program.steps:
        if st.prim is not None and st.prim.name == "matmul":
            ins = [program.local_aval(a).shape for a in st.inputs]
            out = program.local_aval(st.outputs[0])
            t += program.cost.compute_time("matmul", ins, out.shape, out.dtype.itemsize) - program.cost.op_time
    return t


def test_search_keeps_a_small_head_whole_splits_a_large_one_and_respects_the_budget():
    from fedarena.engine.sharding.conformance import make_step, state_layouts
    from fedarena.engine.sharding.search import layer_candidates, search

    # the constants the benchmark measured on 2 ranks of this host (docs/reproductions.md)
    cost = CostModel(alpha=296e-6, beta=1 / 1.85e9, op_time=6.2e-6, flop_time=1 / 16.68e9, byte_time=1 / 4.06e9)
    _, step = make_step()
    space = layer_candidates({"1": ["R"], "2": ["R"], "3": ["R", "col", "row"]}, state_layouts)
    small, _ = search(step, _mlp_avals(1024, batch=256), 2, space, cost)
    # a small head: data parallelism, the batch split through the body and the head, each weight's gradient a
    # partial sum all-reduced once, no wide activation gathered, each rank's matmuls half the single-process ones.
    # (The 32-wide layer's bias gradient comes from gathering its [256, 32] activation gradient, 16 KiB sent: one
    # message, where the all-reduce of 32 numbers is two at this latency; the per-example losses likewise.)
    assert small.name == "batch:S0 l1:R l2:R l3:R"
    text = str(small.program)
    for shape in ("512,1024", "1024,32", "32,1024", "1024"):
        assert f"f32[{shape}]{{R}} = all_reduce[op='sum']" in text, shape
    assert not any("all_gather" in ln and ("f32[256,1024]" in ln or "f32[256,512]" in ln) for ln in text.splitlines())
    whole = shard_graph(small.program.graph, 1, [R] * len(small.program.graph.invars),
                        [R] * len(small.program.graph.outvars), cost)
    assert _matmul_time(small.program) == pytest.approx(_matmul_time(whole) / 2, rel=0.01)
    large, plans = search(step, _mlp_avals(262144, batch=256), 2, space, cost)
    assert large.name.endswith("l3:col")  # the head split by classes
    assert large.time == min(p.time for p in plans)
    # a budget the whole head does not fit: only split heads remain, and the pick is the fastest of those
    whole = min(p.memory for p in plans if p.name.endswith("l3:R"))
    budget = (whole + max(p.memory for p in plans if not p.name.endswith("l3:R"))) / 2
    fit, plans = search(step, _mlp_avals(262144, batch=256), 2, space, cost, memory_budget=budget)
    assert all(not p.fits for p in plans if p.name.endswith("l3:R")) and fit.memory <= budget
    assert fit.time == min(p.time for p in plans if p.fits)
    with pytest.raises(ShardingError, match="memory_budget: no strategy fits"):
        search(step, _mlp_avals(262144), 2, space, cost, memory_budget=1.0)


def test_the_streaming_rate_follows_the_measured_curve_by_bytes_touched():
    curve = ((1200, 1e-11), (120000, 1e-10))
    cost = CostModel(op_time=1e-6, byte_time=5e-10, byte_curve=curve)
    # add of two float32 [n] vectors touches 12 n bytes: at a point, between points (log-linear), beyond the ends
    assert cost.compute_time("add", [(100,)] * 2, (100,), 4) == pytest.approx(1e-6 + 1200 * 1e-11)
    assert cost.byte_rate(12000) == pytest.approx(0.5 * (1e-11 + 1e-10))
    assert cost.byte_rate(10.0) == 1e-11 and cost.byte_rate(1e9) == 1e-10
    # without a curve, one rate for every size
    assert CostModel(op_time=0.0, byte_time=1e-10).compute_time("add", [(8,), (8,)], (8,), 4) == pytest.approx(96e-10)


def test_a_rank_runs_compiled_segments_between_its_collectives():
    # data parallelism: the forward pass (a segment), the loss's all-reduce and the local slice of its cotangent
    # (host steps), the backward pass (a segment), each gradient's all-reduce, the Adam update (a segment): cut
    # by level, three segments for six host steps; the compiled program gives what the single-process step
    # gives (tests above) and a profiled step the same values as a call
    from fedarena.engine.sharding.conformance import init_mlp, layouts, local_tree, make_step, state_layouts

    bandwidth = CostModel(alpha=0.0, op_time=0.0, flop_time=0.0, byte_time=0.0, segment_time=0.0, host_time=0.0)

    def body(comm):
        n, rank = comm.world_size, comm.rank
        rng = np.random.default_rng(1)
        x = rng.standard_normal((64, 8)).astype(np.float32)
        y = rng.integers(0, 12, 64)
        params = init_mlp(8, 16, 12)
        opt, step = make_step()
        pspec, xspec = layouts("data_parallel")
        sspec = state_layouts(pspec)
        fn = shard_jit(step, Mesh(comm), in_shardings=(pspec, sspec, xspec, xspec), out_shardings=(pspec, sspec, R),
                       cost=bandwidth)
        args = (params, opt.init(params), block(x, xspec, rank, n), block(y, xspec, rank, n))
        called = fn(*args)
        hosts: list = []
        profiled, seconds = fn.profile(*args, hosts=hosts)
        program = fn.lower(*args)[0]
        local = program.local_program
        kinds = [kind if kind == "segment" else it.collective.name for kind, it in local.items]
        eqns = sum(len(seg.graph.eqns) for seg in local.segments)
        # the Adam moments (inputs 5-12: after the 4 parameters and the step count) are read only by the last
        # segment: equations run as late as their readers allow, so the update's decay of the moments is not
        # computed in the first segment and held through the step
        moments = set(program.graph.invars[5:13])
        early = [v for seg in local.segments[:-1] for v in seg.invars if v in moments]
        late = [v for v in local.segments[-1].invars if v in moments]
        return called, profiled, seconds, hosts, kinds, eqns, len(program.steps), program, early, len(late)

    for called, profiled, seconds, hosts, kinds, eqns, steps, program, early, late in run_threads(2, body, timeout=120):
        assert early == [] and late == 8
        assert kinds == ["segment", "all_reduce", "shard_slice", "segment"] + ["all_reduce"] * 4 + ["segment"], kinds
        assert eqns + len(kinds) - 3 == steps  # every equation of the program runs once
        for a, b in zip(called[0].values(), profiled[0].values()):
            np.testing.assert_array_equal(a, b)
        assert len(seconds) == 3 and all(t > 0 for t in seconds)
        # measured compute: the segments' seconds plus the modelled copy of the sliced block (no overheads here)
        sliced = bandwidth.compute_time("copy", [(32, 1)], (32, 1), 4)
        assert program.predicted_compute(seconds) == pytest.approx(sum(seconds) + sliced)
        # with the executor's Python per item: once for each of the 3 segments, the 6 host steps and the call
        program.cost = replace(bandwidth, host_time=1e-3)
        assert program.predicted_compute(seconds) == pytest.approx(sum(seconds) + sliced + 10e-3)
        # the host steps' measured seconds in the order they ran: the local slice's replaces its model, the
        # all-reduces stay modelled (in predicted_comm, not compute)
        assert len(hosts) == 6 and all(t > 0 for t in hosts)
        assert program.predicted_compute(seconds, hosts) == pytest.approx(sum(seconds) + hosts[1] + 10e-3)


def test_segments_run_eagerly_above_the_held_bytes_give_the_same_step(monkeypatch):
    # every segment over the limit: each runs eagerly (numpy kernels, values freed after their last use) and the
    # class-sharded and hybrid steps still equal the single-process step
    from fedarena.engine.sharding import execute

    monkeypatch.setattr(execute, "MAX_HELD_BYTES", -1)

    def body(comm):
        fn = shard_jit(lambda a: ops.tanh(a) * 2.0, Mesh(comm), in_shardings=S(0), out_shardings=R)
        x = np.ones((4, 3), np.float32)
        fn(x)
        return [seg.compiled for seg in fn.lower(x)[0].local_program.segments]

    assert run_threads(2, body, timeout=60)[0] == [False]
    per_rank = run_threads(2, lambda comm: check_strategies(comm, ("class", "hybrid")), timeout=120)
    for rank, res in enumerate(per_rank):
        for name in ("class", "hybrid"):
            for k, want in res[name]["reference"].items():
                np.testing.assert_allclose(res[name]["params"][k], want, rtol=1e-5, atol=1e-6, err_msg=f"{name} rank {rank} {k}")
