"""Parameter-server step rate with and without a straggler: synchronous vs threshold-synchronous vs async.

One server process and ``--workers`` worker processes over the TCP transport
(``fedarena.engine.distributed.run_parameter_server``). Every worker computes a least-squares gradient and
then sleeps ``--compute-ms`` (standing in for a model's compute); with a straggler, the last worker sleeps
``--straggler-ms`` instead. The server's step rate is its steps divided by the time from its first to its
last step. The ratios printed are each mode's rate with the straggler over its rate without, measured in the
same run (each configuration ``--repeats`` times; median and min-max are shown). Expected: threshold mode
(quorum ``ceil(threshold * workers)``, late gradients dropped) keeps its rate; synchronous mode drops to about
``compute / straggler``.

Run:  python benchmarks/parameter_server.py [--workers 4] [--steps 60] [--compute-ms 20] [--straggler-ms 100]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fedarena.engine import optim
from fedarena.engine.collectives.launch import spawn
from fedarena.engine.distributed import ParameterServerConfig, run_parameter_server

DIM = 64


def _task(worker: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(worker)
    a = rng.standard_normal((256, DIM))
    return a, a @ np.random.default_rng(99).standard_normal(DIM)


def _rank(comm, cfg: ParameterServerConfig, delays: list[float]):
    data = {}

    def gradient(params, worker, k):
        if worker not in data:
            data[worker] = _task(worker)
        a, b = data[worker]
        g = a.T @ (a @ params["w"] - b) / len(b)
        time.sleep(delays[worker])
        return {"w": g.astype(np.float32)}

    out = run_parameter_server(comm, cfg, {"w": np.zeros(DIM, np.float32)}, gradient, optim.sgd(0.05))
    if comm.rank == 0:
        t = out.step_times
        return {"rate": (len(t) - 1) / (t[-1] - t[0]), "dropped": sum(out.dropped.values()),
                "straggler_steps": out.applied.get(comm.world_size - 1, 0)}
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--straggler-ms", type=float, default=100.0)
    ap.add_argument("--threshold", type=float, default=0.75)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    w = args.workers
    modes = {"sync": ParameterServerConfig(mode="sync", steps=args.steps),
             "threshold": ParameterServerConfig(mode="threshold", threshold=args.threshold, staleness=0,
                                                steps=args.steps),
             "async": ParameterServerConfig(mode="async", staleness=w, steps=args.steps * w)}
    rates: dict[tuple[str, bool], list[float]] = {}
    extra: dict[tuple[str, bool], dict] = {}
    for _ in range(args.repeats):
        for name, cfg in modes.items():
            for straggler in (False, True):
                delays = [args.compute_ms / 1e3] * w
                if straggler:
                    delays[-1] = args.straggler_ms / 1e3
                res = spawn(w + 1, "tcp", _rank, (cfg, delays), timeout=120)[0]
                rates.setdefault((name, straggler), []).append(res["rate"])
                extra[(name, straggler)] = res
    print(f"{w} workers, compute {args.compute_ms:g} ms, straggler {args.straggler_ms:g} ms, "
          f"threshold {args.threshold:g} (quorum {modes['threshold'].quorum(w)}), {args.repeats} repeats")
    print(f"{'mode':<10} {'straggler':<9} {'steps/s median':>14} {'[min-max]':>15} {'dropped':>8} "
          f"{'straggler steps':>15}")
    for (name, straggler), r in rates.items():
        e = extra[(name, straggler)]
        print(f"{name:<10} {str(straggler):<9} {statistics.median(r):>14.2f} "
              f"{'[' + f'{min(r):.1f}-{max(r):.1f}' + ']':>15} {e['dropped']:>8} {e['straggler_steps']:>15}")
    for name in modes:
        ratio = statistics.median(rates[(name, True)]) / statistics.median(rates[(name, False)])
        print(f"{name}: rate with straggler / without = {ratio:.2f}")
    print(f"(sync is expected near compute/straggler = {args.compute_ms / args.straggler_ms:.2f}; "
          "threshold within 20% means >= 0.80)")


if __name__ == "__main__":
    main()
