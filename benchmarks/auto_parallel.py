"""MindSpore's data-parallel vs auto-parallel result in miniature: an MLP body with a classification head of 1K
to 1M classes, trained on 2 and 4 rank processes at a per-rank memory budget, by data parallelism and by the
strategy ``engine.sharding.search`` picks.

The seed paper (Su et al., "MindSpore: an all-scenario deep learning computing framework", 2021, the auto-parallel
evaluation) trains ResNet-50 with 1K to 1,024K classes on 8 devices: its search keeps data parallelism for small
heads and shards the head's MatMul (the body staying data parallel) for large ones, which avoids all-reducing the
head's gradients and keeps training where data parallelism runs out of memory. Here:

- data parallelism is the usual one: each rank computes the gradients of its half (quarter) of the batch with
  ``engine.jit`` and all-reduces them (mean) leaf by leaf, then applies Adam to replicated parameters;
- the searched strategy is the fastest plan of ``search`` under the calibrated cost model whose predicted peak
  memory (plus the process's baseline) fits the budget, run by ``shard_jit``.

Per size and rank count: median step time, bytes each rank sent per step (counted at the transport), peak RSS
per rank (``ru_maxrss`` of rank processes started for that size and strategy alone, so that memory the
allocator kept from a smaller size is not counted), the search's pick, and predicted against measured step time for both. The search's cost
model: the transport's alpha/beta fitted to ring all-reduces timed back to back on the ranks, compute constants
measured on each rank (``sharding.calibrate``), and the compute of every candidate plan that fits the budget
measured by profiling its compiled segments on the ranks (``sharding.cost.profile_segments``; Alpa's stage
profiling). The reported prediction of a searched plan's step: each compiled segment's call timed in profiled
steps interleaved with the timed ones (the executable the step runs, on the step's own values; median over the
steps), and its local host steps (rank-dependent kernels, slices) timed the same way, plus the model's
collectives (alpha-beta) and the executor's Python per schedule item (calibrated on a tiny data-parallel program
on the same ranks); of data parallelism's: its gradient and update programs' calls timed the same way plus its
all-reduces and a host item per call. Each row prints predicted against measured and the error. The analytic
roofline's prediction (no measured compute) is printed beside it. Sizes where data parallelism's measured peak
RSS exceeds the budget are marked as not fitting. At the largest size the searched strategy trains
``--train-steps`` steps and the loss must fall. ``--figure`` draws step time (predictions marked) and peak
memory against the number of classes, data parallelism beside the searched strategy, sizes that do not fit
marked.

Run:  python benchmarks/auto_parallel.py [--ranks 2,4] [--transport tcp] [--classes 1024,...,1048576]
          [--budget-mib 1024] [--figure docs/images/auto_parallel.png] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

from fedarena.engine.collectives import cost_model, run_threads
from fedarena.engine.collectives.launch import spawn
from fedarena.engine.core.ir import ShapedArray
from fedarena.engine.core.pytree import tree_flatten
from fedarena.engine.jit import jit
from fedarena.engine.sharding import CostModel, Mesh, R, calibrate, shard_jit
from fedarena.engine.sharding.cost import profile_segments
from fedarena.engine.sharding.conformance import init_mlp, layouts, local_tree, loss_fn, make_step, state_layouts
from fedarena.engine.sharding.search import layer_candidates, search
from fedarena.engine.transforms.autodiff import value_and_grad

MIB = 1 << 20


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _count_bytes(comm: Any) -> list:
    """Count the bytes this rank's transport sends (every collective goes through ``isend``)."""
    sent = [0]
    t = comm.transport
    orig = t.isend

    def isend(dst: int, array: np.ndarray) -> Any:
        sent[0] += int(np.asarray(array).nbytes)
        return orig(dst, array)

    t.isend = isend
    return sent


def _data(cfg: dict, classes: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((cfg.get("batch", 8), cfg.get("features", 8))).astype(np.float32)
    y = rng.integers(0, classes, cfg["batch"])
    return x, y


def _params(cfg: dict, classes: int) -> dict:
    return init_mlp(cfg["features"], cfg["hidden"], classes, seed=0)


def _avals(cfg: dict, classes: int) -> tuple:
    sizes = [cfg["features"]] + list(cfg["hidden"]) + [classes]
    p = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        p[f"w{i}"], p[f"b{i}"] = ShapedArray((a, b), np.float32), ShapedArray((b,), np.float32)
    state = {"count": ShapedArray((), np.int64), "mu": p, "nu": p}
    batch = cfg["batch"]
    return (p, state, ShapedArray((batch, cfg["features"]), np.float32), ShapedArray((batch,), np.int64))


def plan_for(cfg: dict, classes: int, n: int, cost: CostModel, measured: dict | None = None) -> Any:
    _, step = make_step()
    best, plans = search(step, _avals(cfg, classes), n, layer_candidates(cfg["layers"], state_layouts), cost,
                         memory_budget=cfg["budget"], baseline_bytes=cfg["baseline"], measured=measured)
    return best, plans


def profile_rank(comm: Any, cfg: dict, cost: CostModel) -> dict:
    """On every rank at once (the load the plans will run under): per size, the measured seconds of each
    compiled segment of every candidate plan whose predicted memory fits the budget
    (``sharding.cost.profile_segments``)."""
    out: dict = {}
    for classes in cfg["classes"]:
        _, plans = plan_for(cfg, classes, comm.world_size, cost)
        out[classes] = {}
        for p in plans:
            if p.fits:
                out[classes][p.name] = profile_segments(p.program, repeats=cfg["profile_repeats"])
                p.program._local = None  # its compiled segments' buffers, released before the next plan
        del plans
        comm.barrier()
    return out


def measured_segments(n: int, transport: str, cfg: dict, cost: CostModel) -> dict:
    """``classes -> plan -> segment seconds``: each segment the slowest rank's time."""
    per_rank = spawn(n, transport, profile_rank, (cfg, cost), timeout=600, join_timeout=7200)
    return {c: {name: [max(r[c][name][i] for r in per_rank) for i in range(len(segs))]
                for name, segs in per_rank[0][c].items()} for c in cfg["classes"]}


def _steps_for(comm: Any, run, cfg: dict) -> int:
    """How many steps to time: at least ``cfg['steps']``, as many as fill ``cfg['seconds']`` at the time of one
    step (at most 50); the ranks agree on the largest (every step runs collectives)."""
    t0 = time.perf_counter()
    run()
    k = int(min(50, max(cfg["steps"], cfg["seconds"] / max(time.perf_counter() - t0, 1e-6))))
    return int(comm.all_reduce(np.asarray(k, np.int64), op="max"))


def _time_steps(run, steps: int) -> list[float]:
    times: list[float] = []
    for _ in range(steps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


def _time_interleaved(run, profiled, steps: int, sent: list) -> tuple[list[float], float, list]:
    """``steps`` timed steps, each followed by a profiled one (so that the host's load, which drifts over
    seconds here, falls on both alike): ``(step seconds, bytes sent per timed step, per profiled step its
    measured parts)``."""
    times: list[float] = []
    nbytes = 0
    parts = []
    for _ in range(steps):
        before = sent[0]
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
        nbytes += sent[0] - before
        parts.append(profiled())
    return times, nbytes / steps, parts


def dp_rank(comm: Any, cfg: dict, cost: CostModel) -> list[dict]:
    """Data parallelism: local gradients, all-reduced (mean) leaf by leaf, replicated Adam. Its predicted step:
    the gradient and update programs timed alone here just before (as the searched plans' segments are), the
    alpha-beta time of each leaf's all-reduce and the loss's, and a host step's time per call."""
    sent = _count_bytes(comm)
    n, rank = comm.world_size, comm.rank
    out = []
    for classes in cfg["classes"]:
        if classes > cfg["dp_max_classes"].get(str(n), 1 << 62):
            out.append({"classes": classes, "skipped": True})
            continue
        opt, _ = make_step()
        grad_fn = jit(value_and_grad(loss_fn))
        update = jit(opt.update)
        params = _params(cfg, classes)
        state = opt.init(params)
        x, y = _data(cfg, classes)
        xb, yb = np.split(x, n)[rank], np.split(y, n)[rank]
        box = [params, state, 0.0]

        def run() -> float:  # returns the seconds of its two compiled programs' calls
            t0 = time.perf_counter()
            loss, grads = grad_fn(box[0], xb, yb)
            t1 = time.perf_counter()
            grads = {k: comm.all_reduce(v, op="mean") for k, v in grads.items()}
            t2 = time.perf_counter()
            box[0], box[1] = update(grads, box[1], box[0])
            programs = t1 - t0 + time.perf_counter() - t2
            box[2] = float(comm.all_reduce(np.asarray(loss), op="mean"))
            return programs

        run()  # compile
        k = _steps_for(comm, run, cfg)
        comm.barrier()
        times, sent_per_step, programs = _time_interleaved(run, run, k, sent)
        t_compute = statistics.median(programs)
        comm_t = sum(cost.collective_time("all_reduce", v.nbytes, n) for v in box[0].values()) \
            + cost.collective_time("all_reduce", 4, n)
        # the two programs' calls include their dispatch; the host's Python per all-reduce and per program
        predicted = t_compute + comm_t + (len(box[0]) + 3) * cost.host_time
        out.append({"classes": classes, "step_s": statistics.median(times), "bytes_per_step": sent_per_step,
                    "peak_rss": rss_bytes(), "loss": box[2], "predicted_s": predicted, "predicted_comm_s": comm_t})
        del params, state, box  # released before the next size
    return out


def searched_rank(comm: Any, cfg: dict, cost: CostModel) -> list[dict]:
    """The searched strategy, run by ``shard_jit``; at the largest size also ``train_steps`` steps of training."""
    sent = _count_bytes(comm)
    n, rank = comm.world_size, comm.rank
    out = []
    for classes in cfg["classes"]:
        best, plans = plan_for(cfg, classes, n, cost, cfg["measured"][classes])
        ins, outs = best.in_shardings, best.out_shardings
        opt, step = make_step()
        fn = shard_jit(step, Mesh(comm), in_shardings=ins, out_shardings=outs, cost=cost)
        params = _params(cfg, classes)
        x, y = _data(cfg, classes)
        box = [local_tree(params, ins[0], rank, n), local_tree(opt.init(params), ins[1], rank, n), 0.0]
        del params
        xb, yb = local_tree(x, ins[2], rank, n), local_tree(y, ins[3], rank, n)
        losses: list[float] = []

        def run() -> None:
            box[0], box[1], loss = fn(box[0], box[1], xb, yb)
            box[2] = float(loss)
            losses.append(box[2])

        def profiled() -> tuple[list[float], list[float]]:  # a step that also gives its segments' and host steps' seconds
            hosts: list[float] = []
            (box[0], box[1], loss), seconds = fn.profile(box[0], box[1], xb, yb, hosts=hosts)
            box[2] = float(loss)
            losses.append(box[2])
            return seconds, hosts

        run()
        k = _steps_for(comm, run, cfg)
        comm.barrier()
        times, sent_per_step, profiles = _time_interleaved(run, profiled, k, sent)
        # each segment's and each host step's call, median over the steps
        segs = [statistics.median(ts) for ts in zip(*(p[0] for p in profiles))]
        hosts = [statistics.median(ts) for ts in zip(*(p[1] for p in profiles))]
        if classes == cfg["largest"] and cfg["train_steps"]:
            while len(losses) < cfg["train_steps"]:
                run()
        peak = rss_bytes()
        program = fn.lower(box[0], box[1], xb, yb)[0]
        row = {"classes": classes, "plan": best.name, "step_s": statistics.median(times),
               "bytes_per_step": sent_per_step, "peak_rss": peak,
               "predicted_s": program.predicted_time(segs, hosts), "predicted_compute_s": program.predicted_compute(segs, hosts),
               "predicted_comm_s": best.comm_time, "search_predicted_s": best.time, "segments_s": sum(segs),
               "model_s": best.model_time, "segments": len(program.local_program.segments),
               "predicted_bytes": best.comm_bytes, "predicted_memory": best.memory + cfg["baseline"],
               "dp_predicted_memory": next((p.memory + cfg["baseline"] for p in plans if p.name == cfg["dp_name"]), None),
               "loss": box[2]}
        if classes == cfg["largest"] and cfg["train_steps"]:
            row["train_losses"] = losses[: cfg["train_steps"]]
        out.append(row)
        del box, fn
    return out


def measure_machine(comm: Any, sizes: list[int], repeats: int, cfg: dict) -> tuple[list[float], list, Any, float]:
    """On every rank at once (the load the benchmark's ranks run under): the collectives of a tiny step and the
    executor's per-item Python (:func:`_in_step`), the mean seconds of a ring all-reduce
    of each size (float32) run back to back (a training step's collectives meet ranks that were descheduled
    or still computing; the mean of a run of them carries those waits, where the best time after a barrier
    would describe an idle host), and the compute constants, measured by
    ``sharding.calibrate`` and then scaled so that the model's compute time of the benchmark's own step, run
    replicated on one rank by the sharded executor at the smallest two head sizes, matches its measured median
    (the executor allocates its results and runs transposed products, which the bare kernels do not time)."""
    times = []
    for size in sizes:
        buf = np.ones(size // 4, np.float32)
        comm.all_reduce(buf, algorithm="ring")
        count = repeats * max(1, (1 << 20) // size)  # more of the small ones: their mean is steadier
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(count):
            comm.all_reduce(buf, algorithm="ring")
        times.append((time.perf_counter() - t0) / count)
    comm.barrier()
    host, calls = _in_step(comm)
    base = replace(calibrate(), op_time=_executor_op_time(), host_time=host)
    ratios = run_threads(1, _executor_ratio, cfg, base)[0]
    k = float(np.mean(ratios))
    comm.barrier()
    return times, calls, replace(base, flop_time=base.flop_time * k, byte_time=base.byte_time * k,
                          byte_curve=tuple((b, r * k) for b, r in base.byte_curve)), k


def _executor_ratio(comm: Any, cfg: dict, base: CostModel) -> list[float]:
    ratios = []
    for classes in sorted(cfg["classes"])[:2]:
        opt, step = make_step()
        params = _params(cfg, classes)
        st = opt.init(params)
        x, y = _data(cfg, classes)
        fn = shard_jit(step, Mesh(comm), cost=base)
        fn(params, st, x, y)
        program = fn.lower(params, st, x, y)[0]
        measured = statistics.median(_time_steps(lambda: fn(params, st, x, y), 5))
        ops = program.predicted_compute() - 0  # op_time is measured on the executor already
        ratios.append(max(measured - base.op_time * len(program.steps), 1e-9) / max(ops - base.op_time * len(program.steps), 1e-9))
    return ratios


def _executor_op_time() -> float:
    """Seconds per equation of a sharded program on tiny arrays (one rank), run compiled: the roofline's
    per-equation cost on the executor."""

    def body(comm: Any) -> float:
        small = {"batch": 8, "features": 8}
        opt, step = make_step()
        params = init_mlp(8, 8, 8)
        fn = shard_jit(step, Mesh(comm))
        x, y = _data(small, 8)
        st = opt.init(params)
        fn(params, st, x, y)
        program = fn.lower(params, st, x, y)[0]
        times = _time_steps(lambda: fn(params, st, x, y), 50)
        return statistics.median(times) / len(program.steps)

    return run_threads(1, body)[0]


def _in_step(comm: Any, steps: int = 50) -> tuple[float, list]:
    """On all ranks of ``comm`` at once (its transport's threads and the load the benchmark runs under), a
    data-parallel step of a tiny MLP (8-8-8, not the benchmark's model) run ``steps`` times: ``(the executor's
    Python per item of a rank's schedule (segment or host step) and per call: each call's seconds less its
    segments' and host steps' own calls, over its items plus one, median; [(collective, global bytes, median
    seconds of its call)])``: collectives as a step meets them (the ranks arriving from compute, not back to
    back)."""
    n, rank = comm.world_size, comm.rank
    opt, step = make_step()
    params = init_mlp(8, 8, 8)
    pspec, xspec = layouts("data_parallel")
    sspec = state_layouts(pspec)
    fn = shard_jit(step, Mesh(comm), in_shardings=(pspec, sspec, xspec, xspec), out_shardings=(pspec, sspec, R))
    x, y = _data({"batch": 8 * n, "features": 8}, 8)
    args = (params, opt.init(params), local_tree(x, xspec, rank, n), local_tree(y, xspec, rank, n))
    fn(*args)
    program = fn.lower(*args)[0]
    items = len(program.local_program.items) + 1
    rest = []
    per_host = []
    for _ in range(steps):
        segs: list[float] = []
        hosts: list[float] = []
        t0 = time.perf_counter()
        prog, _ = fn.lower(*args)  # what a call does: look up the program, flatten, run
        prog.run(comm, [np.asarray(a) for a in tree_flatten(args)[0]], profile=segs, hosts=hosts)
        rest.append((time.perf_counter() - t0 - sum(segs) - sum(hosts)) / items)
        per_host.append(hosts)
    calls = [(it.collective.name, it.inputs[0].aval.size * it.inputs[0].aval.dtype.itemsize, statistics.median(ts))
             for (kind, it), ts in zip([x for x in program.local_program.items if x[0] == "host"], zip(*per_host))
             if it.collective is not None and it.collective.name in ("all_gather", "all_reduce", "reduce_scatter")]
    return statistics.median(rest), calls


def step_alpha(calls: list, n: int, beta: float, chunk_bytes: int) -> float:
    """The per-message latency collectives see inside a step: each timed call less its bytes at ``beta``, over
    its algorithm's messages on the critical path (``cost_model.coefficients``), the median."""
    out = []
    for name, nbytes, seconds in calls:
        alg = cost_model.choose(name, nbytes, n, 1e-4, beta, chunk_bytes)
        rounds, sent = cost_model.coefficients(name, alg, nbytes, n, chunk_bytes)
        out.append(max(seconds - sent * beta, 0.0) / max(rounds, 1))
    return float(np.median(out))


def calibrated_cost(n: int, transport: str, cfg: dict, chunk_bytes: int = 1 << 20) -> tuple[CostModel, float]:
    """The benchmark's cost model: ``beta`` fitted (with an alpha) to ring all-reduces timed back to back; the
    per-message ``alpha`` the collectives of a tiny data-parallel step show (:func:`step_alpha`: in a step
    the ranks arrive at a collective from compute, one waiting for the other, which back-to-back calls hide);
    compute and per-item constants measured on the ranks, averaged over them."""
    sizes = [1 << 10, 1 << 14, 1 << 18, 1 << 21, 1 << 23]
    per_rank = spawn(n, transport, measure_machine, (sizes, 7, cfg), timeout=300, join_timeout=1800)
    times = [max(r[0][i] for r in per_rank) for i in range(len(sizes))]
    fitted, beta = cost_model.fit("all_reduce", "ring", n, sizes, times, chunk_bytes)
    mean = lambda xs: float(np.mean(xs))  # noqa: E731
    alpha = mean([step_alpha(r[1], n, beta, chunk_bytes) for r in per_rank])
    print(f"alpha: {fitted * 1e6:.0f} us fitted to back-to-back all-reduces, {alpha * 1e6:.0f} us in a step (used)")
    return CostModel(alpha=alpha, beta=beta, chunk_bytes=chunk_bytes, op_time=mean([r[2].op_time for r in per_rank]),
                     flop_time=mean([r[2].flop_time for r in per_rank]),
                     byte_time=mean([r[2].byte_time for r in per_rank]),
                     byte_curve=tuple((b, mean([r[2].byte_curve[i][1] for r in per_rank]))
                                      for i, (b, _) in enumerate(per_rank[0][2].byte_curve)),
                     segment_time=mean([r[2].segment_time for r in per_rank]),
                     host_time=mean([r[2].host_time for r in per_rank])), mean([r[3] for r in per_rank])


def _idle_rss(comm: Any) -> int:
    return rss_bytes()


def baseline_rss(transport: str) -> int:
    """Peak RSS of a rank process that has imported everything and joined its group."""
    return max(spawn(2, transport, _idle_rss, (), timeout=60))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--transport", default="tcp", choices=("tcp", "shm"))
    ap.add_argument("--classes", default="1024,4096,16384,65536,262144,1048576")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--features", type=int, default=512)
    ap.add_argument("--hidden", default="1024,32", help="hidden layer sizes: the body, then the width the head reads")
    ap.add_argument("--budget-mib", type=float, default=1024.0, help="per-rank peak RSS budget")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per size (at least)")
    ap.add_argument("--seconds", type=float, default=1.0, help="time steps until this many seconds have passed (at most 50 steps)")
    ap.add_argument("--profile-repeats", type=int, default=3, help="timed runs of each compiled segment of every "
                    "candidate plan, run alone, for the search")
    ap.add_argument("--train-steps", type=int, default=50, help="steps trained by the searched strategy at the largest size")
    ap.add_argument("--dp-max-classes", default="4:262144", help="n:classes pairs above which data parallelism is not run "
                    "(its predicted peak already exceeds the budget; keeps the host's memory safe)")
    ap.add_argument("--scaling", default="", help="print only the predicted scaling at these rank counts (e.g. 8,16,32,64)")
    ap.add_argument("--scaling-classes", default="1024,262144")
    ap.add_argument("--figure", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--redraw", default="", help="draw --figure from a --json file of an earlier run and exit")
    ap.add_argument("--note", default="", help="a line drawn above the figure (e.g. the host's load during the run)")
    args = ap.parse_args(argv)
    if args.redraw:
        with open(args.redraw) as f:
            report = json.load(f)
        draw(report, args.figure, report["config"]["budget"], args.note)
        return report
    classes = sorted(int(c) for c in args.classes.split(","))
    hidden = [int(h) for h in args.hidden.split(",")]
    body = {str(i): ["R"] for i in range(1, len(hidden) + 1)}
    head = str(len(hidden) + 1)
    cfg = {"classes": classes, "batch": args.batch, "features": args.features, "hidden": hidden,
           "budget": args.budget_mib * MIB, "steps": args.steps, "train_steps": args.train_steps,
           "layers": {**body, head: ["R", "col", "row"]},
           "dp_name": "batch:S0 " + " ".join(f"l{i}:R" for i in list(body) + [head]),
           "dp_max_classes": dict(p.split(":") for p in args.dp_max_classes.split(",") if p),
           "profile_repeats": args.profile_repeats, "seconds": args.seconds, "largest": max(classes)}
    cfg["dp_max_classes"] = {k: int(v) for k, v in cfg["dp_max_classes"].items()}
    if args.scaling:
        compute = calibrate()
        ranks = [int(r) for r in args.scaling.split(",")]
        cls = [int(c) for c in args.scaling_classes.split(",")]
        pred = scaling(cfg, compute, cls, ranks, args.batch)
        print(f"predicted weak scaling, {args.batch} examples per rank, MLP {args.features}-{args.hidden}-C; this host's compute "
              f"constants ({1 / compute.flop_time / 1e9:.1f} GFLOP/s, {1 / compute.byte_time / 1e9:.1f} GB/s), networks: "
              + ", ".join(f"{k} alpha {a * 1e6:.0f} us, {1 / b / 1e9:.2f} GB/s" for k, (a, b) in cost_model.NETWORKS.items()))
        print(f"{'classes':>8} {'network':>7} " + " ".join(f"{'n=' + str(n):>20}" for n in ranks) + "   (speed-up: data parallel (its efficiency) / hybrid)")
        for c in cls:
            for net in cost_model.NETWORKS:
                cells = [pred[(c, net, n)] for n in ranks]
                print(f"{c:>8} {net:>7} " + " ".join(f"{p['dp_speedup']:5.1f} ({100 * p['dp_speedup'] / n:3.0f}%) /{p['hybrid_speedup']:6.1f}"
                                                    for p, n in zip(cells, ranks)))
        return {"scaling": {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in pred.items()}}
    cfg["baseline"] = baseline_rss(args.transport)
    print(f"baseline RSS of a rank process: {cfg['baseline'] / MIB:.0f} MiB; budget {args.budget_mib:.0f} MiB per rank; "
          f"MLP {args.features}-{'-'.join(map(str, hidden))}-C, batch {args.batch}, transport {args.transport}; load average {os.getloadavg()[0]:.1f}")
    report: dict = {"config": {k: v for k, v in cfg.items() if k != "layers"}, "runs": {}}
    for n in (int(r) for r in args.ranks.split(",")):
        cost, scale = calibrated_cost(n, args.transport, cfg)
        print(f"\n{n} ranks: cost model alpha {cost.alpha * 1e6:.1f} us, 1/beta {1 / max(cost.beta, 1e-30) / 1e9:.2f} GB/s, "
              f"op {cost.op_time * 1e6:.1f} us, host {cost.host_time * 1e6:.0f} us an item, {1 / cost.flop_time / 1e9:.2f} GFLOP/s, {1 / cost.byte_time / 1e9:.2f} GB/s memory, "
              f"streaming by bytes touched " + ", ".join(f"{b / MIB:.2g} MiB {1 / r / 1e9:.1f} GB/s" for b, r in cost.byte_curve) + " "
              f"(kernel constants scaled by {scale:.2f} to the executor)")
        cfg["measured"] = measured_segments(n, args.transport, cfg, cost)
        # fresh rank processes for each size and strategy: a process's peak RSS is then that run's alone
        searched = [[] for _ in range(n)]
        dp = [[] for _ in range(n)]
        for c in classes:
            one = dict(cfg, classes=[c])
            for rank, rows in enumerate(spawn(n, args.transport, searched_rank, (one, cost), timeout=600, join_timeout=7200)):
                searched[rank] += rows
            for rank, rows in enumerate(spawn(n, args.transport, dp_rank, (one, cost), timeout=600, join_timeout=7200)):
                dp[rank] += rows
        rows = []
        print(f"{'classes':>8} | {'DP step':>9} {'pred':>8} {'err':>5} {'MiB/step':>9} {'peak':>6} {'fits':>4} | "
              f"{'searched plan':<22} {'step':>8} {'pred':>8} {'err':>5} {'roofline':>9} {'err':>5} {'MiB/step':>9} {'peak':>6} | speed-up")
        for i, c in enumerate(classes):
            d = [r[i] for r in dp]
            s = [r[i] for r in searched]
            srow = {"classes": c, "plan": s[0]["plan"], "step_s": max(r["step_s"] for r in s),
                    "bytes_per_step": max(r["bytes_per_step"] for r in s), "peak_rss": max(r["peak_rss"] for r in s),
                    "predicted_s": max(r["predicted_s"] for r in s), "search_predicted_s": s[0]["search_predicted_s"],
                    "model_s": s[0]["model_s"], "segments": s[0]["segments"],
                    "segments_s": max(r["segments_s"] for r in s),
                    "predicted_comm_s": s[0]["predicted_comm_s"], "predicted_memory": s[0]["predicted_memory"],
                    "dp_predicted_memory": s[0]["dp_predicted_memory"], "train_losses": s[0].get("train_losses")}
            if d[0].get("skipped"):
                drow = {"classes": c, "skipped": True, "fits": False}
            else:
                drow = {"classes": c, "step_s": max(r["step_s"] for r in d), "bytes_per_step": max(r["bytes_per_step"] for r in d),
                        "peak_rss": max(r["peak_rss"] for r in d), "predicted_s": max(r["predicted_s"] for r in d)}
                drow["fits"] = drow["peak_rss"] <= cfg["budget"]
                drow["error"] = (drow["predicted_s"] - drow["step_s"]) / drow["step_s"]
            srow["fits"] = srow["peak_rss"] <= cfg["budget"]
            srow["error"] = (srow["predicted_s"] - srow["step_s"]) / srow["step_s"]
            srow["model_error"] = (srow["model_s"] - srow["step_s"]) / srow["step_s"]
            dp_txt = ("not run (predicted " + f"{(srow['dp_predicted_memory'] or 0) / MIB:.0f} MiB)").rjust(54) if drow.get("skipped") else \
                (f"{drow['step_s'] * 1e3:7.1f}ms {drow['predicted_s'] * 1e3:6.1f}ms {drow['error'] * 100:+4.0f}% "
                 f"{drow['bytes_per_step'] / MIB:9.3f} {drow['peak_rss'] / MIB:5.0f}M {'yes' if drow['fits'] else 'NO':>4}")
            ratio = "" if drow.get("skipped") else f"{drow['step_s'] / srow['step_s']:.2f}x"
            print(f"{c:>8} | {dp_txt} | {srow['plan']:<22} {srow['step_s'] * 1e3:6.1f}ms {srow['predicted_s'] * 1e3:6.1f}ms "
                  f"{srow['error'] * 100:+4.0f}% {srow['model_s'] * 1e3:7.1f}ms {srow['model_error'] * 100:+4.0f}% "
                  f"{srow['bytes_per_step'] / MIB:9.3f} {srow['peak_rss'] / MIB:5.0f}M | {ratio}")
            rows.append({"dp": drow, "searched": srow})
        print("searched plan's prediction in parts (slowest rank): measured segments + modelled collectives + "
              "measured local kernels and slices, modelled per-item Python")
        for r in rows:
            s = r["searched"]
            rest = s["predicted_s"] - s["segments_s"] - s["predicted_comm_s"]
            print(f"{s['classes']:>8}: {s['segments_s'] * 1e3:7.1f} + {s['predicted_comm_s'] * 1e3:6.1f} + {rest * 1e3:6.1f} "
                  f"= {s['predicted_s'] * 1e3:7.1f} ms predicted, {s['step_s'] * 1e3:7.1f} ms measured ({s['error'] * 100:+.0f}%)")
        big = rows[-1]["searched"]
        if big["train_losses"]:
            l0, l1 = big["train_losses"][0], big["train_losses"][-1]
            print(f"largest head ({classes[-1]} classes), searched strategy: loss {l0:.4f} -> {l1:.4f} over "
                  f"{len(big['train_losses'])} steps, peak RSS {big['peak_rss'] / MIB:.0f} MiB (budget {args.budget_mib:.0f})")
        report["runs"][str(n)] = {"cost": cost.__dict__, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=float)
    if args.figure:
        draw(report, args.figure, cfg["budget"], args.note)
    return report


def scaling(cfg: dict, compute: CostModel, classes: list[int], ranks: list[int], per_rank_batch: int) -> dict:
    """Predicted weak scaling on paper: ``per_rank_batch`` examples per rank, throughput of ``n`` ranks over one
    rank's, for data parallelism (local step, then a ring all-reduce of every gradient) and for the hybrid
    strategy (body data parallel, head split by classes, sharded by ``shard_graph``), with ``compute``'s
    constants and each network of ``cost_model.NETWORKS``."""
    from fedarena.engine.sharding import R, S, shard_graph
    from fedarena.engine.sharding.api import layouts_for
    from fedarena.engine.sharding.search import LAYER_LAYOUTS, trace_global

    _, step = make_step()
    out: dict = {}
    for c in classes:
        one_cfg = dict(cfg, batch=per_rank_batch)
        graph, outv, _ = trace_global(step, _avals(one_cfg, c))
        args = _avals(one_cfg, c)
        single = shard_graph(graph, 1, layouts_for(R, args, "in"), layouts_for(R, outv, "out"), compute)
        t1 = single.predicted_compute()
        grad_bytes = sum(a.size * 4 for a in args[0].values())
        for net, (alpha, beta) in cost_model.NETWORKS.items():
            cm = compute.with_transport(alpha, beta)
            for n in ranks:
                dp = t1 + cm.collective_time("all_reduce", grad_bytes, n)
                big = dict(cfg, batch=per_rank_batch * n)
                args_n = _avals(big, c)
                head = str(len(cfg["hidden"]) + 1)
                pspec = {k: R for k in args_n[0]}
                pspec[f"w{head}"], pspec[f"b{head}"] = LAYER_LAYOUTS["col"]
                ins = (pspec, state_layouts(pspec), S(0), S(0))
                g, ov, _ = trace_global(step, args_n)
                prog = shard_graph(g, n, layouts_for(ins, args_n, "in"), layouts_for((pspec, state_layouts(pspec), R), ov, "out"), cm)
                hy = prog.predicted_time()
                out[(c, net, n)] = {"dp_speedup": n * t1 / dp, "hybrid_speedup": n * t1 / hy}
    return out


def draw(report: dict, path: str, budget: float, note: str = "") -> None:
    """Step time (top, the cost model's prediction as a black bar over each) and peak RSS per rank (bottom)
    against the number of classes, one column per rank count: data parallelism beside the searched strategy,
    sizes where data parallelism does not fit marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    fig, axes = plt.subplots(2, len(runs), figsize=(5.5 * len(runs), 7), squeeze=False)
    for j, (n, run) in enumerate(runs.items()):
        cls = [r["searched"]["classes"] for r in run["rows"]]
        pos = np.arange(len(cls))
        w = 0.38
        for k, (key, label) in enumerate((("dp", "data parallel"), ("searched", "searched strategy"))):
            t = [r[key].get("step_s", np.nan) * 1e3 if not r[key].get("skipped") else np.nan for r in run["rows"]]
            m = [r[key].get("peak_rss", np.nan) / MIB if not r[key].get("skipped") else np.nan for r in run["rows"]]
            axes[0, j].bar(pos + (k - 0.5) * w, t, w, label=label)
            axes[1, j].bar(pos + (k - 0.5) * w, m, w, label=label)
            pred = [r[key].get("predicted_s", np.nan) * 1e3 if not r[key].get("skipped") else np.nan for r in run["rows"]]
            axes[0, j].plot(pos + (k - 0.5) * w, pred, "_", ms=18, mew=2.5, color="k",
                            label="predicted (cost model)" if k == 1 else None)
        for i, r in enumerate(run["rows"]):
            if not r["dp"]["fits"]:
                top = r["dp"].get("peak_rss", 0) / MIB if not r["dp"].get("skipped") else 0
                axes[1, j].annotate("DP over\nbudget" if not r["dp"].get("skipped") else "DP not\nrun",
                                    (pos[i] - w / 2, top if np.isfinite(top) else 0), xytext=(0, 2),
                                    textcoords="offset points", ha="center", va="bottom", fontsize=8,
                                    color="firebrick")
        axes[1, j].axhline(budget / MIB, color="k", ls="--", lw=1, label="per-rank budget")
        for ax in axes[:, j]:
            ax.set_xticks(pos, [f"{c // 1024}K" for c in cls])
        axes[0, j].set_title(f"{n} ranks")
        axes[0, j].set_ylabel("step time (ms)")
        axes[0, j].set_yscale("log")
        axes[1, j].set_ylabel("peak RSS per rank (MiB)")
        axes[1, j].set_xlabel("classes")
        axes[0, j].legend(fontsize=8)
        axes[1, j].legend(fontsize=8)
    if note:
        fig.suptitle(note, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1:])
