"""A population of 1,000,000 clients on disk: fedsim's memory stays bounded and its round time flat (issue 31).

Writes a LEAF-format FEMNIST-like population (``all_data_*.json`` shards of 50,000 users each, the LEAF
layout ``{"users", "num_samples", "user_data"}``): every user holds ``1 + floor(LogNormal(0, 0.9))`` examples
(capped at 40; mean about 2) -- a heavy-tailed size distribution like LEAF's, scaled down so that a million
users fit on disk (about 3.2 GB: 28x28 binarised images written as 0/1 integers, drawn from a pool of 1,024
label-dependent prototypes, 62 labels). Then, each in a fresh process:

1. ``index``: the first run's one scan of the files into the cached per-user index (time, peak RSS);
2. ``run``: fedsim's data and Simulation built from ``data.path`` (``leaf_femnist``, the cached index), then
   rounds of ``--per-round`` clients (MLP 784-32-62, E = 1, B = 8), timed one by one (peak RSS).

The same is done for a ``--small`` population (the first users of the same generator), and the script prints
the peak RSS of each run and the ratio of the mean round times (rounds 2..R; round 1 includes the engine's
compilation). Targets: peak RSS <= 1.5 GB with 1,000,000 clients; round time within 1.5x of 10,000 clients.

    nice -n 10 env OMP_NUM_THREADS=1 python benchmarks/fedsim_population.py [--clients 1000000] [--small 10000]
        [--per-round 1000] [--rounds 5] [--dir /tmp/fedsim_population]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SHARD = 50_000


def sizes(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng([seed, 1])
    return np.minimum(1 + np.floor(rng.lognormal(0.0, 0.9, n)).astype(np.int64), 40)


def generate(folder: Path, n: int, seed: int = 0) -> None:
    """``n`` users in LEAF JSON shards under ``folder`` (skipped when already there)."""
    done = folder / "COMPLETE"
    if done.exists() and done.read_text() == str(n):
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 2])
    proto = (rng.random((1024, 784)) < 0.2).astype(np.int64)
    proto_label = np.arange(1024) % 62
    rows = ["[" + ",".join(map(str, p)) + "]" for p in proto]
    ns = sizes(n, seed)
    for s in range(0, n, SHARD):
        users = [f"u{k:07d}" for k in range(s, min(n, s + SHARD))]
        parts = []
        for k, u in zip(range(s, s + len(users)), users):
            pick = rng.integers(0, 1024, ns[k])
            parts.append(f'"{u}": {{"x": [{",".join(rows[j] for j in pick)}], '
                         f'"y": [{",".join(str(proto_label[j]) for j in pick)}]}}')
        with open(folder / f"all_data_{s // SHARD:03d}.json", "w") as fh:
            fh.write('{"users": ' + json.dumps(users) + ', "num_samples": '
                     + json.dumps(ns[s: s + len(users)].tolist()) + ', "user_data": {')
            fh.write(", ".join(parts))
            fh.write("}}")
    done.write_text(str(n))


def _config(folder: Path, n: int, per_round: int) -> dict:
    return {"kind": "fedsim", "seed": 0, "rounds": 1,
            "data": {"dataset": "leaf_femnist", "path": str(folder), "num_clients": n, "held_out_fraction": 0.0,
                     "prefetch_threads": 2},
            "model": {"hidden": [32]}, "clients": {"per_round": per_round, "epochs": 1, "batch_size": 8, "lr": 0.05},
            "evaluation": {"every": 1000}, "execution": {"threads": 1}, "privacy": {"seed": 0}}


def child(mode: str, folder: Path, n: int, per_round: int, rounds: int) -> dict:
    from fedarena.federated.fedsim_experiment import FedSimConfig, build
    from fedarena.platform.config import build as build_config

    cfg = build_config(FedSimConfig, _config(folder, n, per_round))
    t0 = time.perf_counter()
    d, sim = build(cfg)
    out = {"build_s": time.perf_counter() - t0, "clients": d.num_clients, "examples": int(d.x.shape[0])}
    if mode == "run":
        state = sim.init_state(cfg.model.init_params(sim.model, cfg.seed))
        sim.final_round = -1  # no forced evaluation: the rounds alone are timed
        times, waits = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            state, rec = sim.round(state)
            times.append(time.perf_counter() - t)
            waits.append(sim.x.pop_timings()["data_wait_s"])
        out.update(round_s=times, data_wait_s=waits, reporting=len(rec.reporting))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _spawn(mode: str, folder: Path, n: int, args) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, str(folder), str(n), str(args.per_round), str(args.rounds)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--per-round", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/tmp/fedsim_population")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        mode, folder, n, per_round, rounds = args.child
        print(json.dumps(child(mode, Path(folder), int(n), int(per_round), int(rounds))))
        return
    res = {}
    for n in (args.small, args.clients):
        folder = Path(args.dir) / f"leaf_{n}"
        t = time.perf_counter()
        generate(folder, n)
        disk = sum(f.stat().st_size for f in folder.glob("*.json"))
        print(f"{n:>9,} users: files {disk / 1e9:.2f} GB (generated or found in {time.perf_counter() - t:.0f} s)",
              flush=True)
        ix = _spawn("index", folder, n, args)
        print(f"{n:>9,} users: index + build {ix['build_s']:.1f} s, peak RSS {ix['peak_rss_mb']:.0f} MB, "
              f"{ix['examples']:,} examples", flush=True)
        res[n] = r = _spawn("run", folder, n, args)
        print(f"{n:>9,} users: build from the cached index {r['build_s']:.1f} s; rounds of {args.per_round} clients: "
              + ", ".join(f"{s:.2f}" for s in r["round_s"]) + " s; data wait "
              + ", ".join(f"{s:.2f}" for s in r["data_wait_s"]) + f" s; peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    small, big = (np.mean(res[n]["round_s"][1:]) for n in (args.small, args.clients))
    print(f"mean round time (rounds 2..{args.rounds}): {args.small:,} users {small:.2f} s, {args.clients:,} users "
          f"{big:.2f} s, ratio {big / small:.2f} (target <= 1.5); peak RSS of the {args.clients:,}-user run "
          f"{res[args.clients]['peak_rss_mb']:.0f} MB (target <= 1536)")


if __name__ == "__main__":
    main()
