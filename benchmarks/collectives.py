"""fedarena collectives vs torch.distributed (gloo), measured in the same run, with the alpha-beta model.

For all-reduce, all-gather and reduce-scatter, 2 and 4 ranks (one process each), sizes from 1 KiB to
``--max-size`` (default 16 MiB; the issue's full range is ``--max-size 256MiB``), every transport (TCP, shared
memory; Ray actors with ``--transports tcp,shm,ray``) and algorithm (ring, binary tree, recursive
halving-doubling) against gloo. All groups stay up for the whole run and the measurements are interleaved:
each repetition round times every system once per size, so machine load drifts hit all of them alike.

Definitions (NCCL-tests, ``doc/PERFORMANCE.md``): ``size`` is the all-reduce buffer, the full all-gather
output and the full reduce-scatter input; ``algbw = size / time``; ``busbw = algbw * 2(n-1)/n`` for all-reduce
and ``algbw * (n-1)/n`` for all-gather and reduce-scatter. A time is the slowest rank's, for one call started
after a barrier; the table gives the median over ``--repeats`` calls and the min-max spread.

Alpha-beta model: for each (system, collective, algorithm, n) the predicted time is ``a*alpha + b*beta``
with ``(a, b)`` the message count and critical-path bytes of the schedule
(``fedarena.engine.collectives.cost_model.coefficients``; gloo is modelled with the ring schedule at its
whole-segment message size). ``alpha`` and ``beta`` are fitted to that row's median times over all sizes by
non-negative least squares on the relative error (each equation divided by its measured time), so small and
large sizes weigh alike; the fitted values and the prediction are printed next to each measurement.

Contended CPU: ``--busy-core`` starts one more process that pins itself to the last CPU and spins for the whole
run, so the ranks share the machine with a process that never yields (the case where a waiting rank that spins
or polls takes the core from the rank it waits for).

Run:  python benchmarks/collectives.py [--max-size 64MiB] [--ranks 2,4] [--repeats 5] [--transports tcp,shm]
      python benchmarks/collectives.py --ranks 2 --transports shm --collectives all_reduce --algorithms ring \
          --min-size 16MiB --max-size 64MiB [--busy-core]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
ALGORITHMS = ("ring", "halving_doubling", "tree")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}


def parse_size(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "b": 1}
    t = text.strip().lower()
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u):
            return int(float(t[: -len(u)]) * units[u])
    return int(t)


def human(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


# ------------------------------------------------------------------------------------------- rank processes


def _elements(collective: str, nbytes: int, n: int) -> int:
    # all-gather: size = the full output, each rank contributes size / n; reduce-scatter: size = the full input
    return max(1, nbytes // 4 // n) if collective == "all_gather" else max(n, nbytes // 4 // n * n)


def _ours(comm: Any, conn: Any) -> None:
    n = comm.world_size
    while True:
        cmd = conn.recv()
        if cmd is None:
            return
        collective, algorithm, nbytes, iters = cmd
        count = _elements(collective, nbytes, n)
        x = np.ones(count if collective != "reduce_scatter" else (n, count // n), dtype=np.float32)
        out = np.empty((n, count), dtype=np.float32) if collective == "all_gather" else None
        # in place / into a preallocated output, as the gloo calls below are
        op = {"all_reduce": lambda: comm.all_reduce(x, "sum", algorithm, out=x),
              "all_gather": lambda: comm.all_gather(x, algorithm, out=out),
              "reduce_scatter": lambda: comm.reduce_scatter(x, "sum", algorithm)}[collective]
        op()
        times = []
        for _ in range(iters):
            comm.barrier()
            t0 = time.perf_counter()
            op()
            times.append(time.perf_counter() - t0)
        conn.send(times)


def _ours_main(kind: str, rank: int, n: int, spec: dict, conn: Any, chunk: int) -> None:
    from fedarena.engine.collectives import Communicator

    if kind == "ray":
        raise ValueError("ray ranks are actors, not processes")
    from fedarena.engine.collectives.launch import make_transport

    comm = Communicator(make_transport(kind, rank, n, spec, timeout=120.0), chunk_bytes=chunk)
    conn.send("ready")
    try:
        _ours(comm, conn)
    finally:
        comm.close()


def _gloo_main(rank: int, n: int, port: int, conn: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    conn.send("ready")
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        collective, _, nbytes, iters = cmd
        count = _elements(collective, nbytes, n)
        if collective == "all_reduce":
            x = torch.ones(count)
            op = lambda: dist.all_reduce(x)  # noqa: E731
        elif collective == "all_gather":
            x = torch.ones(count)
            out = [torch.empty(count) for _ in range(n)]
            op = lambda: dist.all_gather(out, x)  # noqa: E731
        else:
            xs = [torch.ones(count // n) for _ in range(n)]
            y = torch.empty(count // n)
            op = lambda: dist.reduce_scatter(y, xs)  # noqa: E731
        try:
            op()
        except RuntimeError as exc:  # gloo lacks some collectives in some torch versions
            conn.send(f"unsupported: {str(exc).splitlines()[0]}")
            continue
        times = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            op()
            times.append(time.perf_counter() - t0)
        conn.send(times)
    dist.destroy_process_group()


class ProcessGroup:
    """The rank processes of one system, driven by commands over pipes."""

    def __init__(self, system: str, n: int, chunk: int) -> None:
        from fedarena.engine.collectives.launch import free_port, group_spec

        ctx = mp.get_context("spawn")
        self.system, self.n, self.conns, self.procs = system, n, [], []
        spec = None if system == "gloo" else group_spec(system)
        port = free_port()
        for rank in range(n):
            parent, child = ctx.Pipe()
            target, args = ((_gloo_main, (rank, n, port, child)) if system == "gloo"
                            else (_ours_main, (system, rank, n, spec, child, chunk)))
            p = ctx.Process(target=target, args=args, daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:
            if not c.poll(180):
                raise RuntimeError(f"{system} group of {n} did not start")
            c.recv()

    def measure(self, collective: str, algorithm: str, nbytes: int, iters: int) -> list[float] | str:
        for c in self.conns:
            c.send((collective, algorithm, nbytes, iters))
        replies = [c.recv() for c in self.conns]
        if isinstance(replies[0], str):
            return replies[0]
        return [max(ts) for ts in zip(*replies)]  # the slowest rank per call

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


class RayBench:
    """The Ray-actor transport: the same commands, run through ``RayGroup``."""

    def __init__(self, n: int, chunk: int) -> None:
        import ray

        from fedarena.engine.collectives.ray_actors import RayGroup

        if not ray.is_initialized():
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        self.group = RayGroup(n, timeout=120.0, comm_options={"chunk_bytes": chunk})
        self.system, self.n = "ray", n

    def measure(self, collective: str, algorithm: str, nbytes: int, iters: int) -> list[float]:
        replies = self.group.run(_ray_measure, collective, algorithm, nbytes, iters)
        return [max(ts) for ts in zip(*replies)]

    def close(self) -> None:
        self.group.shutdown()


def _ray_measure(comm: Any, collective: str, algorithm: str, nbytes: int, iters: int) -> list[float]:
    class _Pipe:
        def __init__(self) -> None:
            self.cmds, self.out = [(collective, algorithm, nbytes, iters), None], None

        def recv(self) -> Any:
            return self.cmds.pop(0)

        def send(self, value: Any) -> None:
            self.out = value

    pipe = _Pipe()
    _ours(comm, pipe)
    return pipe.out


# ------------------------------------------------------------------------------------------------- model


def fit_alpha_beta(collective: str, algorithm: str, n: int, sizes: list[int], times: list[float],
                   chunk_bytes: int) -> tuple[float, float]:
    from scipy.optimize import nnls

    from fedarena.engine.collectives.cost_model import coefficients

    rows = np.array([coefficients(collective, algorithm, s, n, chunk_bytes) for s in sizes], dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    solution, _ = nnls(rows / t[:, None], np.ones_like(t))
    return float(solution[0]), float(solution[1])


def predicted(collective: str, algorithm: str, n: int, size: int, alpha: float, beta: float,
              chunk_bytes: int) -> float:
    from fedarena.engine.collectives.cost_model import coefficients

    a, b = coefficients(collective, algorithm, size, n, chunk_bytes)
    return a * alpha + b * beta


# -------------------------------------------------------------------------------------------------- main


def iterations(size: int) -> int:
    return 20 if size <= (256 << 10) else 8 if size <= (4 << 20) else 3


def _busy_loop(stop: Any) -> None:
    """Spin on one CPU until ``stop`` is set (checked every few million iterations)."""
    try:
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    except (AttributeError, OSError):
        pass
    x = 0
    while not stop.is_set():
        for _ in range(2_000_000):
            x += 1


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-size", default="16MiB", help="largest message (e.g. 64MiB, 256MiB)")
    ap.add_argument("--min-size", default="1KiB")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; each round times every system once per size")
    ap.add_argument("--transports", default="tcp,shm", help="comma list of tcp, shm, ray")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--chunk", default="1MiB", help="the communicators' chunk_bytes (pipelining unit)")
    ap.add_argument("--json", default="", help="write all measurements to this file")
    ap.add_argument("--busy-core", action="store_true", help="keep one CPU busy with a spinning process")
    args = ap.parse_args()
    busy = None
    if args.busy_core:
        stop = mp.get_context("spawn").Event()
        busy = mp.get_context("spawn").Process(target=_busy_loop, args=(stop,), daemon=True)
        busy.start()
        busy.stop = stop  # type: ignore[attr-defined]
    sizes = []
    s = parse_size(args.min_size)
    while s <= parse_size(args.max_size):
        sizes.append(s)
        s *= 4
    ranks = [int(r) for r in args.ranks.split(",")]
    transports = [t for t in args.transports.split(",") if t]
    collectives = [c for c in args.collectives.split(",") if c]
    algorithms = [a for a in args.algorithms.split(",") if a]
    print(f"chunk {args.chunk}, sizes {human(sizes[0])} .. {human(sizes[-1])}, ranks {ranks}, {args.repeats} rounds, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
          + (", one CPU kept busy by a spinning process" if busy is not None else ""), flush=True)
    try:
        run(args, sizes, ranks, transports, collectives, algorithms)
    finally:
        if busy is not None:
            busy.stop.set()
            busy.join(timeout=10)
            if busy.is_alive():
                busy.terminate()


def run(args: Any, sizes: list, ranks: list, transports: list, collectives: list, algorithms: list) -> None:
    results: list[dict] = []
    for n in ranks:
        chunk = parse_size(args.chunk)
        groups: dict[str, Any] = {"gloo": ProcessGroup("gloo", n, chunk)}
        try:
            for t in transports:
                groups[t] = RayBench(n, chunk) if t == "ray" else ProcessGroup(t, n, chunk)
            rows = [("gloo", "gloo")] + [(t, a) for t in transports for a in algorithms]
            samples: dict[tuple, list[float]] = {}
            unsupported: dict[tuple, str] = {}
            for rnd in range(args.repeats):
                for c in collectives:
                    for size in sizes:
                        for system, alg in rows:
                            key = (system, alg, c, size)
                            if key in unsupported:
                                continue
                            got = groups[system].measure(c, alg if system != "gloo" else "ring", size,
                                                         iterations(size))
                            if isinstance(got, str):
                                unsupported[key] = got
                            else:
                                samples.setdefault(key, []).extend(got)
                print(f"  n={n}: round {rnd + 1}/{args.repeats} done", flush=True)
            report(n, rows, collectives, sizes, samples, unsupported, results, chunk)
        finally:
            for g in groups.values():
                g.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def report(n: int, rows: list, collectives: list, sizes: list, samples: dict, unsupported: dict,
           results: list, chunk: int) -> None:
    for c in collectives:
        print(f"\n== {c}, {n} ranks (busbw = algbw * {BUS_FACTOR[c](n):.3g}) ==")
        print(f"{'size':>9} {'system':<22} {'median ms':>10} {'[min-max]':>17} {'algbw GB/s':>10} "
              f"{'busbw GB/s':>10} {'x gloo':>7} {'model ms':>9}")
        fits = {}
        for system, alg in rows:
            ts = [statistics.median(samples[(system, alg, c, s)]) for s in sizes if (system, alg, c, s) in samples]
            if len(ts) == len(sizes):
                fits[(system, alg)] = fit_alpha_beta(c, "ring" if system == "gloo" else alg, n, sizes, ts,
                                                     chunk if system != "gloo" else 1 << 40)
        for size in sizes:
            gloo_t = samples.get(("gloo", "gloo", c, size))
            gloo_bus = size / statistics.median(gloo_t) * BUS_FACTOR[c](n) / 1e9 if gloo_t else float("nan")
            for system, alg in rows:
                key = (system, alg, c, size)
                name = "gloo" if system == "gloo" else f"{system}/{alg}"
                if key in unsupported:
                    print(f"{human(size):>9} {name:<22} {unsupported[key][:60]}")
                    continue
                t = samples[key]
                med = statistics.median(t)
                alg_bw = size / med / 1e9
                bus = alg_bw * BUS_FACTOR[c](n)
                model = float("nan")
                if (system, alg) in fits:
                    a, b = fits[(system, alg)]
                    model = predicted(c, "ring" if system == "gloo" else alg, n, size, a, b,
                                      chunk if system != "gloo" else 1 << 40)
                print(f"{human(size):>9} {name:<22} {med * 1e3:>10.3f} "
                      f"{'[' + f'{min(t) * 1e3:.2f}-{max(t) * 1e3:.2f}' + ']':>17} {alg_bw:>10.3f} {bus:>10.3f} "
                      f"{bus / gloo_bus:>7.2f} {model * 1e3:>9.3f}")
                results.append({"n": n, "collective": c, "system": system, "algorithm": alg, "size": size,
                                "times": t, "median": med, "busbw_GBps": bus, "vs_gloo": bus / gloo_bus,
                                "model": model})
        print("alpha-beta fits: " + "; ".join(
            f"{'gloo' if s == 'gloo' else s + '/' + a}: alpha {fa * 1e6:.1f} us, "
            f"1/beta {1 / fb / 1e9 if fb else float('inf'):.2f} GB/s" for (s, a), (fa, fb) in fits.items()))
    big = [r for r in results if r["n"] == n and (16 << 20) <= r["size"] <= (64 << 20) and r["system"] != "gloo"]
    if big:
        print(f"\n-- {n} ranks, 16-64 MiB: bus bandwidth relative to gloo (median over sizes) --")
        for c in collectives:
            for system, alg in rows[1:]:
                v = [r["vs_gloo"] for r in big if r["collective"] == c and r["system"] == system
                     and r["algorithm"] == alg]
                if v:
                    print(f"  {c:<15} {system + '/' + alg:<22} {statistics.median(v):.2f}x gloo")


if __name__ == "__main__":
    sys.exit(main())
