"""The league on Ray with real actors (the session's Ray instance): a learner and a rollout actor are killed
with ``ray.kill`` in the middle of iterations; the league finishes, the restarted learner resumed from its
newest snapshot, the store lost no snapshot and the payoff table counts every game of every iteration once.
The two-node version (a second node removed mid-run) runs in a subprocess (league_two_node.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from fedarena.marl.league.agent import BoardAgent
from fedarena.marl.league.experiment import LeagueExperimentConfig
from fedarena.marl.league.games import get_game
from fedarena.marl.league.store import SnapshotStore

G = 16


def tiny_config(**kw) -> LeagueExperimentConfig:
    from fedarena.marl.league.agent import AgentConfig
    from fedarena.marl.league.roles import RoleConfig
    from fedarena.marl.league.experiment import RayLeagueConfig
    return LeagueExperimentConfig(kind="league", game="tictactoe", execution="ray", iterations=5,
                                  games_per_iteration=G, num_envs=8,
                                  roles=RoleConfig(main_agents=1, main_exploiters=1, league_exploiters=0,
                                                   snapshot_min_steps=10, snapshot_max_steps=20),
                                  agent=AgentConfig(hidden=(16,), minibatch_size=64, update_epochs=1),
                                  ray=RayLeagueConfig(rollout_actors=1, actor_cpus=0.5), **kw)


def check_store_and_payoff(store: SnapshotStore, state: dict, iterations: int, learners: int) -> None:
    checks = store.verify()                       # every snapshot loads and matches its checksum
    assert set(state["checksums"]) <= set(checks)
    for name in {re.sub(r"-v\d+$", "", n) for n in checks}:
        versions = sorted(int(n.rsplit("-v", 1)[1]) for n in checks if n.startswith(name + "-v"))
        assert versions == list(range(versions[0], versions[0] + len(versions))), f"gap in {name}: {versions}"
    total = np.asarray(state["payoff"]["total_games"])
    assert state["games"] == iterations * learners * G and total.sum() == 2 * state["games"]


def test_killed_learner_and_rollout_actor_restart_and_the_league_continues(ray_session, tmp_path):
    ray = ray_session
    from fedarena.marl.league.ray_execution import RayLeague

    cfg = tiny_config()
    g = get_game(cfg.game)
    init = BoardAgent(g.observation_shape, g.num_actions, cfg.agent).init_params(0)
    league = RayLeague(cfg, str(tmp_path / "store"), init)
    try:
        league.iteration()
        league.iteration()
        before = set(SnapshotStore(tmp_path / "store").names())
        exploiter = [i for i in league.learner_ids if league.players[i]["role"] == "main_exploiter"][0]
        main = [i for i in league.learner_ids if league.players[i]["role"] == "main"][0]
        futures = league.submit()
        ray.kill(league.learners[exploiter], no_restart=False)      # mid-iteration
        ray.kill(league.rollouts[main][0], no_restart=False)
        league.collect(futures)                                     # retried on the restarted actors
        league.iteration()
        league.iteration()
        assert ray.get(league.learners[exploiter].was_restarted.remote())
        state = league.manager_state()
        assert before <= set(SnapshotStore(tmp_path / "store").names())
        check_store_and_payoff(SnapshotStore(tmp_path / "store"), state, 5, len(league.learner_ids))
        # the restarted exploiter resumed from its newest snapshot (or the initial weights if it had none)
        assert len(league.learner_params(exploiter)) == len(init)
        saved = league.state_dict()
    finally:
        league.shutdown()
    # a new set of actors from the driver's saved state (what `fedarena run --resume` does) continues the league
    again = RayLeague(cfg, str(tmp_path / "store"), None, saved)
    try:
        main_params = saved["learners"][str(main)]["learner"]
        assert all(np.array_equal(np.asarray(v), np.asarray(main_params[k]))
                   for k, v in ray.get(again.learners[main].state_dict.remote())["learner"].items())
        again.iteration()
        check_store_and_payoff(SnapshotStore(tmp_path / "store"), again.manager_state(), 6, len(again.learner_ids))
    finally:
        again.shutdown()


def test_two_node_cluster_spreads_actors_and_survives_losing_a_node():
    script = Path(__file__).with_name("league_two_node.py")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3]) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cluster_nodes"] == 2 and out["actor_nodes_before"] == 2
    assert out["alive_nodes_after"] == 1 and out["actor_nodes_after"] == 1
    assert out["snapshots_lost"] == [] and out["iterations"] == 6


def test_evaluator_on_ray_plays_every_frozen_pair_once_and_a_replayed_report_counts_once(ray_session, tmp_path):
    ray = ray_session
    from fedarena.marl.league.ray_execution import RayLeague

    E = 4
    cfg = tiny_config(evaluator_games=E, main_agent_batches=2)
    g = get_game(cfg.game)
    init = BoardAgent(g.observation_shape, g.num_actions, cfg.agent).init_params(0)
    league = RayLeague(cfg, str(tmp_path / "store"), init)
    try:
        for _ in range(3):
            league.iteration()
        state = league.manager_state()
        total = np.asarray(state["payoff"]["total_games"])
        frozen = [p["id"] for p in state["players"] if not p["learning"]]
        assert len(frozen) >= 3
        # frozen players never train against each other: their games are the evaluator's, E per pair
        assert all(total[a, b] == E for a in frozen for b in frozen if a != b)
        pairs = len(frozen) * (len(frozen) - 1) // 2
        batches = 3 * (2 + 1)                                   # main agent 2 batches, exploiter 1, per iteration
        assert state["games"] == batches * G + pairs * E and total.sum() == 2 * state["games"]
        # a learner's retried call (same sequence number, as Ray replays it after a crash) is not counted again
        main = [i for i in league.learner_ids if league.players[i]["role"] == "main"][0]
        out = ray.get(league.learners[main].iteration.remote(G, 6))   # main's 6th batch was iteration 3's last
        assert out["games"] == G
        again = league.manager_state()
        assert again["games"] == state["games"] and np.array_equal(np.asarray(again["payoff"]["total_games"]), total)
    finally:
        league.shutdown()
