"""Throughput of the league on Ray with 1 CPU vs 2 CPUs, measured in one run (docs/league.md).

Each configuration runs in its own subprocess pinned to that many cores (``os.sched_setaffinity``, inherited
by the local Ray instance it starts, so Ray's ``num_cpus`` bound is also the real one): a tic-tac-toe league
of one main agent and one main exploiter, one rollout actor per learner, ``--iterations`` iterations after
one warm-up iteration. Prints env steps/s, games/s and learner updates/s of each and the 2-CPU / 1-CPU
ratio; ``--repeats`` alternates the two configurations to expose the noise of a shared machine.

    python benchmarks/league_scaling.py --iterations 6 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(cpus: int, iterations: int, games: int) -> None:
    os.sched_setaffinity(0, set(range(cpus)))
    sys.path.insert(0, os.path.dirname(HERE))
    from fedarena.marl.league.agent import AgentConfig, BoardAgent
    from fedarena.marl.league.experiment import LeagueExperimentConfig, RayLeagueConfig
    from fedarena.marl.league.games import get_game
    from fedarena.marl.league.ray_execution import RayLeague
    from fedarena.marl.league.roles import RoleConfig
    from fedarena.platform.cluster import init_ray
    from fedarena.platform.experiment import ClusterConfig

    cfg = LeagueExperimentConfig(
        kind="league", game="tictactoe", execution="ray", iterations=iterations, games_per_iteration=games,
        num_envs=128, roles=RoleConfig(main_agents=1, main_exploiters=1, league_exploiters=0,
                                       snapshot_min_steps=2_000, snapshot_max_steps=4_000),
        agent=AgentConfig(), ray=RayLeagueConfig(rollout_actors=1, actor_cpus=cpus / 4),
        cluster=ClusterConfig(num_cpus=cpus, object_store_mb=200))
    ray = init_ray(cfg.cluster)
    g = get_game(cfg.game)
    league = RayLeague(cfg, tempfile.mkdtemp(), BoardAgent(g.observation_shape, g.num_actions, cfg.agent).init_params(0))
    league.iteration()   # warm-up: jit compilation, actor start
    t0 = time.perf_counter()
    steps = games_done = updates = 0
    for _ in range(iterations):
        for r in league.iteration():
            steps += r.env_steps
            games_done += r.games
            updates += 1
    wall = time.perf_counter() - t0
    league.shutdown()
    ray.shutdown()
    print(json.dumps({"cpus": cpus, "env_steps_per_s": steps / wall, "games_per_s": games_done / wall,
                      "updates_per_s": updates / wall, "seconds": wall}))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--games", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.iterations, a.games)
        return 0
    if len(os.sched_getaffinity(0)) < 2:
        print("needs 2 cores", file=sys.stderr)
        return 2
    with open("/proc/loadavg") as f:
        print("load average at start:", f.read().split()[:3])
    results: dict[int, list[dict]] = {1: [], 2: []}
    for _ in range(a.repeats):
        for cpus in (1, 2):
            out = subprocess.run([sys.executable, __file__, "--child", str(cpus), "--iterations", str(a.iterations),
                                  "--games", str(a.games)], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[cpus].append(r)
            print(json.dumps(r))
    for key in ("env_steps_per_s", "updates_per_s"):
        ratios = [b[key] / a_[key] for a_, b in zip(results[1], results[2])]
        print(f"{key}: 2 CPUs / 1 CPU = " + ", ".join(f"{x:.2f}" for x in ratios)
              + f" (mean {sum(ratios) / len(ratios):.2f}, per repeat)")
    with open("/proc/loadavg") as f:
        print("load average at end:", f.read().split()[:3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
