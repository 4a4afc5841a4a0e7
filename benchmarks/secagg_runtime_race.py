"""Secure rounds over real gRPC processes: does any client get lost between rounds? (issue 17, finding 4)

Starts a loopback deployment (scheduler, FL-Servers and one OS process per client, as ``fedavg_grpc`` does)
with secure aggregation on every round (the consistency check on, as by default) and checks that every
selected client takes part in every round: the old FL-Server marked a client as having taken part in the
*next* round when the scheduler's reply to its last SecAgg message arrived after that round had opened,
which locked it out of the round (two clients lost in a 5-round run in the review). Windows are generous so
that a slow client on a loaded machine is not dropped for being slow; a stage closes as soon as every
expected message is in, so they do not slow an honest run down. Exits with status 1 if any round lacks a
client or is not aggregated.

    python benchmarks/secagg_runtime_race.py                     # 30 rounds, 20 clients, SecAgg
    python benchmarks/secagg_runtime_race.py --neighbours 6      # SecAgg+ with k = 6 through the runtime
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fedarena.federated.deployment import Deployment, DeploymentSpec  # noqa: E402
from fedarena.federated.protocol import RoundConfig  # noqa: E402
from fedarena.federated.scheduler import RoundPolicy  # noqa: E402
from fedarena.federated.server import ServerOptions  # noqa: E402
from fedarena.federated.task import TaskSpec, max_shard  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--neighbours", type=int, default=0, help="SecAgg+ neighbourhood size (0 = SecAgg)")
    ap.add_argument("--window", type=float, default=120.0, help="round window, seconds")
    ap.add_argument("--stage-seconds", type=float, default=60.0)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--folder", default="", help="deployment folder (default: a temporary one)")
    args = ap.parse_args()

    task = TaskSpec(dataset="synthetic", num_clients=args.clients, hidden=(16,), trainer="numpy",
                    synthetic_features=16, synthetic_classes=4, synthetic_examples=60 * args.clients)
    cfg = RoundConfig(epochs=1, batch_size=16, lr=0.1, secagg=True, secagg_neighbours=args.neighbours,
                      secagg_stage_seconds=args.stage_seconds)
    spec = DeploymentSpec(
        task=task,
        policy=RoundPolicy(rounds=args.rounds, window_seconds=args.window, start_clients=args.clients,
                           availability_s=3600.0, round_config=cfg),
        server=ServerOptions(max_examples=max_shard(task)),
        num_servers=args.servers,
    )
    folder = args.folder or tempfile.mkdtemp(prefix="secagg_race_")
    dep = Deployment(folder, spec)
    print(f"deployment in {folder}: {args.clients} clients, {args.servers} servers, {args.rounds} secure rounds"
          f"{f', SecAgg+ k={args.neighbours}' if args.neighbours else ''}", flush=True)
    t0 = time.monotonic()
    dep.start()
    seen = 0
    try:
        end = t0 + args.timeout
        while True:
            status = dep.wait_for(lambda s: len(s["history"]) > seen or s["phase"] == "done",
                                  timeout=max(1.0, end - time.monotonic()), poll=0.5)
            for row in status["history"][seen:]:
                print(f"round {row['round']:3d}: {row['outcome']:10s} {row['reporting']:3d}/{row['selected']} clients"
                      f"  t={row['needed']}  {row['duration_s']:.2f} s  ({row['close_reason']})", flush=True)
            seen = len(status["history"])
            if status["phase"] == "done":
                break
    finally:
        dep.stop()
    wall = time.monotonic() - t0
    history = status["history"]
    everyone = sorted(f"client{i:03d}" for i in range(args.clients))
    lost = {r["round"]: sorted(set(everyone) - set(r["clients"])) for r in history if r["clients"] != everyone}
    result = {
        "rounds": len(history), "clients": args.clients, "neighbours": args.neighbours,
        "aggregated": sum(r["outcome"] == "aggregated" for r in history),
        "rounds_missing_a_client": len(lost), "lost": lost,
        "mean_round_s": sum(r["duration_s"] for r in history) / max(1, len(history)), "wall_s": wall,
        "final_test_acc": history[-1].get("test_acc") if history else None,
    }
    print(json.dumps(result, indent=1))
    ok = result["aggregated"] == args.rounds and not lost
    print("OK: no client lost, every round aggregated" if ok else "FAILED: a client was lost or a round failed")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
