"""How long a fedsim round waits for its data: CIFAR-10 binary clients read, augmented and prefetched by the
per-client pipeline (fedarena.federated.datasets; issue 31's target: at most 10 % of a round waiting).

Writes 50,000 random CIFAR-10 binary records (``data_batch_1..5.bin``, 3073 bytes each, and a 1,000-record
``test_batch.bin``) unless present, splits them IID over 500 clients (100 images each), and runs fedsim rounds of
``--per-round`` clients (the McMahan et al. CNN, E = 1, B = 20; random crop + flip on) with ``--threads``
prefetch threads, then the same rounds with one prefetch thread. Prints each round's ``data_read_s``, ``data_map_s``, ``data_wait_s`` and ``data_wait_fraction`` from the pipeline's own
timings.

    nice -n 10 env OMP_NUM_THREADS=1 python benchmarks/fedsim_data_pipeline.py [--rounds 3] [--per-round 20]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def write_cifar10(folder: Path, seed: int = 0) -> None:
    if (folder / "test_batch.bin").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name, n in [(f"data_batch_{k}.bin", 10_000) for k in range(1, 6)] + [("test_batch.bin", 1_000)]:
        rec = rng.integers(0, 256, (n, 3073), dtype=np.uint8)
        rec[:, 0] = rng.integers(0, 10, n)
        (folder / name).write_bytes(rec.tobytes())


def rounds(folder: Path, threads: int, per_round: int, n_rounds: int) -> list[dict]:
    from fedarena.federated.fedsim_experiment import FedSimConfig, build
    from fedarena.platform.config import build as build_config

    cfg = build_config(FedSimConfig, {
        "kind": "fedsim", "seed": 0, "rounds": n_rounds,
        "data": {"dataset": "cifar10", "path": str(folder), "num_clients": 500, "held_out_fraction": 0.0,
                 "prefetch_threads": threads, "augment": True},
        "model": {"arch": "cnn", "image_shape": [3, 32, 32]},
        "clients": {"per_round": per_round, "epochs": 1, "batch_size": 20, "lr": 0.02},
        "evaluation": {"every": 1000}, "execution": {"threads": 1}, "privacy": {"seed": 0}})
    d, sim = build(cfg)
    state = sim.init_state(cfg.model.init_params(sim.model, cfg.seed))
    sim.final_round = -1
    out = []
    for _ in range(n_rounds):
        t = time.perf_counter()
        state, rec = sim.round(state)
        row = sim.x.pop_timings()
        row["round_s"] = time.perf_counter() - t
        row["data_wait_fraction"] = row["data_wait_s"] / row["round_s"]
        out.append(row)
    sim.x.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-round", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/fedsim_cifar10_bin")
    args = ap.parse_args()
    folder = Path(args.dir)
    write_cifar10(folder)
    for threads in (args.threads, 1):
        for r, row in enumerate(rounds(folder, threads, args.per_round, args.rounds), 1):
            print(f"prefetch threads {threads}, round {r}: {row['round_s']:.2f} s, read {row['data_read_s']:.3f} s, "
                  f"map {row['data_map_s']:.3f} s, wait {row['data_wait_s']:.3f} s "
                  f"({100 * row['data_wait_fraction']:.1f} % of the round), {row['data_examples_read']} examples",
                  flush=True)


if __name__ == "__main__":
    main()
