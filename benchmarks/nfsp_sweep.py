"""NFSP settings over several seeds: exact exploitability of the average policy at regular episode counts.

Starts from the nfsp section of a config (``experiments/kuhn_nfsp.yaml`` by default) with JSON overrides, runs
each seed in its own process and prints, per seed, the exploitability of the average network and of the
reservoir's empirical table (the action frequencies in ``M_SL`` per information state, uniform where a state
was never stored). When the two agree the average network fits its data, and a bad average comes from the
best responses that filled the reservoir, not from the supervised learning.

    python benchmarks/nfsp_sweep.py                                       # the shipped Kuhn settings
    python benchmarks/nfsp_sweep.py --set '{"replay_capacity": 200000}'   # one change
    python benchmarks/nfsp_sweep.py --config experiments/leduc_nfsp.yaml --episodes 300000 --every 50000 --seeds 0
"""

from __future__ import annotations

import argparse
import json
import os
import time
from multiprocessing import Pool

import numpy as np

from fedarena.envs import load_game
from fedarena.marl import exploitability
from fedarena.marl.nfsp import NFSP, NFSPConfig, tabular_from_tables
from fedarena.marl.policy import TabularPolicy
from fedarena.platform.config import build, load_yaml


def reservoir_policy(agent: NFSP) -> TabularPolicy:
    """The empirical policy of every player's reservoir (action counts per information state)."""
    t = agent.tables
    row_of = {t.tensors[i].tobytes(): i for i in range(len(t.infostates))}
    counts = np.zeros((len(t.infostates), agent.A))
    for r in agent.reservoir:
        n = len(r)
        if n:
            rows = np.array([row_of[x.tobytes()] for x in r.data["obs"][:n].astype(np.float32)])
            np.add.at(counts, rows, r.data["action"][:n])
    probs = np.where(counts.sum(axis=1, keepdims=True) > 0, counts, t.legal.astype(np.float64))
    return tabular_from_tables(t, probs / probs.sum(axis=1, keepdims=True))


def run_seed(job: tuple) -> tuple[int, list[float], list[float], float]:
    game_name, config, seed, episodes, every = job
    game = load_game(game_name)
    agent = NFSP(game, config, seed=seed)
    t0, net, table = time.process_time(), [], []
    while agent.episodes < episodes:
        agent.train(min(every, episodes - agent.episodes))
        net.append(exploitability(game, agent.average_policy()))
        table.append(exploitability(game, reservoir_policy(agent)))
    return seed, net, table, time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "experiments", "kuhn_nfsp.yaml"))
    ap.add_argument("--set", default="{}", help="JSON object of NFSPConfig fields to override")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--episodes", type=int, default=200_000)
    ap.add_argument("--every", type=int, default=20_000)
    ap.add_argument("--processes", type=int, default=2)
    args = ap.parse_args()
    raw = load_yaml(args.config)
    over = json.loads(args.set)
    if not isinstance(over, dict):
        ap.error(f"--set: expected a JSON object, got {args.set!r}")
    config = build(NFSPConfig, {**raw.get("nfsp", {}), **over}, "nfsp")
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = [(raw.get("game", "kuhn_poker"), config, s, args.episodes, args.every) for s in seeds]
    with Pool(max(1, min(args.processes, len(seeds)))) as pool:
        results = pool.map(run_seed, jobs)
    print(f"{raw.get('game', 'kuhn_poker')}, {config}")
    print(f"exploitability every {args.every} episodes")
    for seed, net, table, cpu in results:
        print(f"seed {seed} ({cpu:.0f} s CPU) network:  " + " ".join(f"{x:.3f}" for x in net))
        print(f"{'':>{len(str(seed)) + 17}}reservoir: " + " ".join(f"{x:.3f}" for x in table))
    final = np.array([r[1][-1] for r in results])
    print(f"final, network: {' '.join(f'{x:.3f}' for x in final)}; mean {final.mean():.3f}, "
          f"min {final.min():.3f}, max {final.max():.3f}")


if __name__ == "__main__":
    main()
