"""Horizontal FL over real gRPC on loopback: rounds per second and bytes per client per round.

One scheduler, two FL-Server processes and N FL-Client processes (default 20) train a ~100k-parameter
MLP (64 -> 512 -> 128 -> 10 = 100,234 parameters, float32) on synthetic data, one local epoch per
round. Measured in the same run:

* the gRPC deployment with dense float32 uploads, and again with 8-bit (``q8``) and top-10% uploads;
* the alternative without any networking: the same clients' local training and FedAvg done
  sequentially in this one process (what a single-process FL simulator would do).

Printed: rounds/s of each, the ratio deployment / in-process, and bytes per client per round (up and
down, measured on the wire by the servers), with the compression ratios.

    python benchmarks/federated_grpc.py --clients 20 --rounds 10
"""

from __future__ import annotations

import os

# every deployment node runs single-threaded BLAS (Deployment sets this for its processes); the
# in-process alternative gets the same, otherwise BLAS thread oversubscription decides the ratio
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from fedarena.federated.client import ClientOptions
from fedarena.federated.deployment import Deployment, DeploymentSpec
from fedarena.federated.protocol import RoundConfig
from fedarena.federated.scheduler import RoundPolicy
from fedarena.federated.strategy import PartialAggregate, ServerOptimizer
from fedarena.federated.task import TaskSpec, build_task


def _task(clients: int, trainer: str) -> TaskSpec:
    return TaskSpec(dataset="synthetic", num_clients=clients, alpha=0.5, hidden=(512, 128), trainer=trainer,
                    synthetic_features=64, synthetic_classes=10, synthetic_examples=200 * clients + 1000)


def run_deployment(clients: int, rounds: int, encoding: str, trainer: str, cfg: RoundConfig) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="fl-bench-"))
    spec = DeploymentSpec(
        task=_task(clients, trainer),
        policy=RoundPolicy(rounds=rounds, window_seconds=120, start_clients=clients, min_fraction=1.0,
                           round_config=cfg),
        client=ClientOptions(encoding=encoding, topk_fraction=0.1),
        num_servers=2,
    )
    dep = Deployment(folder, spec)
    try:
        dep.start()
        st = dep.wait_for(lambda s: s["phase"] == "done", 1800, poll=0.2)
    finally:
        dep.stop()
        shutil.rmtree(folder, ignore_errors=True)
    hist = st["history"]
    # round 1 includes process start-up and JIT warm-up: time rounds 2..R between their closing instants
    span = hist[-1]["closed_wall"] - hist[0]["closed_wall"]
    per_client = [(r["bytes_up"] / r["reporting"], r["bytes_down"] / r["reporting"]) for r in hist[1:]]
    return {
        "rounds_per_s": (len(hist) - 1) / span,
        "bytes_up_per_client": float(np.mean([p[0] for p in per_client])),
        "bytes_down_per_client": float(np.mean([p[1] for p in per_client])),
        "reporting": [r["reporting"] for r in hist],
        "test_acc": hist[-1]["test_acc"],
    }


def run_in_process(clients: int, rounds: int, trainer: str, cfg: RoundConfig) -> dict:
    task = build_task(_task(clients, trainer))
    params = task.trainer.init_params(0)
    opt = ServerOptimizer()
    times = []
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        agg = PartialAggregate()
        for i, (x, y) in enumerate(task.clients):
            rng = np.random.default_rng([0, rnd, i])
            local, loss = task.trainer.train(params, x, y, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                                             prox_mu=cfg.prox_mu, rng=rng)
            agg.add(f"c{i}", {k: local[k].astype(np.float64) - params[k] for k in params}, len(x), loss)
        params, _ = opt.step(params, agg.mean_delta(), {})
        times.append(time.perf_counter() - t0)
    return {"rounds_per_s": 1.0 / float(np.mean(times[1:])),
            "test_acc": task.trainer.evaluate(params, *task.test)[1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--trainer", default="engine", choices=["engine", "numpy"])
    args = ap.parse_args()
    cfg = RoundConfig(epochs=1, batch_size=32, lr=0.05)
    task = build_task(_task(args.clients, args.trainer))
    n_params = sum(v.size for v in task.trainer.init_params(0).values())
    print(f"{args.clients} client processes, 2 FL-Servers, model {n_params:,} parameters "
          f"({4 * n_params / 1e6:.2f} MB float32), {args.rounds} rounds, trainer={args.trainer}")
    local = run_in_process(args.clients, args.rounds, args.trainer, cfg)
    print(f"in-process FedAvg (no network)       : {local['rounds_per_s']:.3f} rounds/s")
    results = {}
    for enc in ("dense", "q8", "topk"):
        r = run_deployment(args.clients, args.rounds, enc, args.trainer, cfg)
        results[enc] = r
        print(f"gRPC loopback deployment, {enc:5s} upload: {r['rounds_per_s']:.3f} rounds/s "
              f"(x{r['rounds_per_s'] / local['rounds_per_s']:.2f} of in-process), "
              f"per client per round: up {r['bytes_up_per_client'] / 1e3:.1f} kB, "
              f"down {r['bytes_down_per_client'] / 1e3:.1f} kB; reporting {min(r['reporting'])}-{max(r['reporting'])}")
    d = results["dense"]["bytes_up_per_client"]
    print(f"upload compression vs dense: q8 x{d / results['q8']['bytes_up_per_client']:.2f}, "
          f"top-10% x{d / results['topk']['bytes_up_per_client']:.2f}")
    print(f"raw model bytes {4 * n_params:,}; dense upload message / raw model = {d / (4 * n_params):.4f}")


if __name__ == "__main__":
    main()
