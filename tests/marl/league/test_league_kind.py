"""The ``league`` kind end to end on tiny leagues: tic-tac-toe with the imitation stage, rps_v2 with the exact
exploitability of the league's Nash mixture, bad configs, and resume after SIGKILL of the driver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fedarena
from fedarena.marl.league.games import rps_exploitability
from fedarena.marl.league.manager import LeagueManager
from fedarena.marl.league.roles import RoleConfig
from fedarena.marl.league.store import SnapshotStore
from fedarena.platform.config import ConfigError
from fedarena.platform.runs import read_metrics

TINY = {"kind": "league", "game": "tictactoe", "iterations": 3, "games_per_iteration": 24, "num_envs": 8,
        "roles": {"main_agents": 1, "main_exploiters": 1, "league_exploiters": 1,
                  "snapshot_min_steps": 20, "snapshot_max_steps": 40},
        "agent": {"hidden": [16], "minibatch_size": 64, "update_epochs": 1},
        "eval": {"every": 2, "games": 4}, "checkpoint": {"every": 1, "keep": 2}}


def test_rps_exploitability_is_the_closed_form():
    # symmetric zero-sum RPS with payoff A: exploitability of (p, p) is max_a (A p)_a (NashConv / 2)
    A = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]], dtype=float)
    for p in (np.array([1.0, 0, 0]), np.full(3, 1 / 3), np.array([0.5, 0.3, 0.2])):
        assert rps_exploitability(p) == pytest.approx(max(A @ p), abs=1e-12)


def test_tictactoe_league_with_imitation(tmp_path):
    cfg = {**TINY, "imitation": {"enabled": True, "games": 40, "epochs": 1},
           "reference_opponents": [{"name": "random", "share": 0.25}, {"name": "minimax", "share": 0.25}]}
    res = fedarena.run(cfg, out=tmp_path / "run", report=False)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "imitation/accuracy" in rows[0] and "eval/main-0/vs_minimax/loss_rate" in rows[-1]
    assert "main_train_score/vs_minimax" in rows[-1]         # games against references: outside the table
    assert all(len(r["elo"]) == r["league_size"] for r in rows)
    payoff = json.loads((tmp_path / "run" / "payoff.json").read_text())
    games = np.array(payoff["games"])
    # every league game is in the table, counted once per side: the exploiters' 2 x 3 x 24 and the main
    # agent's games against league players (its games against the scripted references stay outside)
    assert games.sum() == 2 * res.summary["games"]
    assert 2 * 3 * 24 < res.summary["games"] < 3 * 3 * 24
    store = SnapshotStore(tmp_path / "run" / "snapshots")
    names = store.verify()
    assert "initial-v0000" in names and "main-0-v0001" in names
    assert res.summary["snapshots"] == len(names) >= 3       # snapshot_max_steps forces more snapshots
    # the summary has the final main agent's exact results: recompute them from the final checkpoint's weights
    from fedarena.platform.checkpoint import list_checkpoints, load
    from fedarena.marl.league.agent import AgentConfig, BoardAgent
    from fedarena.marl.league.games import get_game
    from fedarena.marl.league.players import tictactoe_exact_results
    _, full = load(list_checkpoints(tmp_path / "run" / "checkpoints")[-1][1])
    learner = full["experiment"]["league"]["learners"]["0"]
    params = {k[len("params/"):]: np.asarray(v) for k, v in learner.items() if k.startswith("params/")}
    g = get_game("tictactoe")
    agent = BoardAgent(g.observation_shape, g.num_actions,
                       AgentConfig(hidden=(16,), minibatch_size=64, update_epochs=1))
    exact = tictactoe_exact_results(agent, params)
    for ref in ("random", "minimax"):
        for outcome in ("win", "draw", "loss"):
            assert res.summary[f"exact/main-0/vs_{ref}/{outcome}_rate"] == pytest.approx(exact[f"{ref}_{outcome}"])
        rates = [res.summary[f"exact/main-0/vs_{ref}/{o}_rate"] for o in ("win", "draw", "loss")]
        assert sum(rates) == pytest.approx(1.0)
    from fedarena.marl.league.experiment import plots_league
    from fedarena.platform.runs import resolve
    _, cfg_obj = resolve(tmp_path / "run" / "config.yaml")
    (tmp_path / "run" / "report").mkdir()
    assert plots_league(rows, cfg_obj, str(tmp_path / "run" / "report")) == [str(tmp_path / "run" / "report" / "league.png")]


def test_rps_league_nash_mixture_is_evaluated_exactly(tmp_path):
    cfg = {**TINY, "game": "rps", "iterations": 2, "eval": {"every": 1, "games": 4}, "evaluator_games": 8}
    fedarena.run(cfg, out=tmp_path / "run", report=False)
    row = read_metrics(tmp_path / "run")[-1]
    from fedarena.platform.checkpoint import list_checkpoints, load
    _, full = load(list_checkpoints(tmp_path / "run" / "checkpoints")[-1][1])
    state = full["experiment"]["league"]["manager"]
    m = LeagueManager.from_state(state, RoleConfig(**TINY["roles"]), SnapshotStore(tmp_path / "run" / "snapshots"))
    frozen = m.frozen
    # the evaluator played every new snapshot against the frozen players before it (8 games per pair)
    assert all(m.payoff.total_games[a, b] == 8 for a in frozen for b in frozen if a != b)
    ids, sigma = m.nash_mixture()
    from fedarena.marl.league.agent import AgentConfig, BoardAgent
    from fedarena.marl.league.games import get_game
    g = get_game("rps")
    agent = BoardAgent(g.observation_shape, g.num_actions, AgentConfig(hidden=(16,), minibatch_size=64, update_epochs=1))
    # independent recomputation: each snapshot's softmax at the one observation, mixed, then max_a (A p)_a
    A = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]], dtype=float)
    obs = np.zeros((1, 4), np.float32)
    obs[0, 3] = 1.0                      # rps_v2's first observation: 3 = nothing played yet
    mix = np.zeros(3)
    for j, w in zip(ids, sigma):
        logits, _ = agent.policy(m.frozen_params(j), obs, np.ones((1, 3), bool))
        mix += w * np.exp(logits[0]) / np.exp(logits[0]).sum()
    assert row["exploitability/nash_mixture"] == pytest.approx(max(A @ mix), abs=1e-6)


@pytest.mark.parametrize("override,message", [
    ({"game": "chess"}, "game: unknown league game 'chess'"),
    ({"execution": "slurm"}, "execution: expected one of local, ray"),
    ({"roles": {"main_agents": 0}}, "main_agents: must be >= 1"),
    ({"game": "rps", "imitation": {"enabled": True}}, "imitation.enabled: rps has no scripted expert"),
    ({"roles": {"league_exploiter_weighting": "cubic"}}, "league_exploiter_weighting: unknown opponent selector"),
    ({"reference_opponents": [{"name": "one_ply", "share": 0.2}]}, r"reference_opponents\[0\].name: 'one_ply' is not"),
    ({"reference_opponents": [{"name": "random", "share": 0.6}, {"name": "minimax", "share": 0.5}]},
     "reference_opponents: the shares must sum to less than 1"),
    ({"main_agent_batches": 0}, "main_agent_batches: must be >= 1"),
    ({"execution": "ray", "ray": {"rollout_actors": 3}}, "ray.actor_cpus: 3 learners x"),
])
def test_bad_config_names_the_field(tmp_path, override, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        fedarena.run({**TINY, **override}, out=tmp_path / "run")


def test_resume_after_sigkill_of_the_driver(tmp_path):
    cfg = {**TINY, "iterations": 6, "eval": {"every": 100, "games": 2}}
    path = tmp_path / "cfg.yaml"
    import yaml
    path.write_text(yaml.safe_dump(cfg))
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen([sys.executable, "-m", "fedarena", "run", str(path), "--out", str(run_dir), "--no-report"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ckpts = run_dir / "checkpoints"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if ckpts.exists() and len(list(ckpts.glob("ckpt-*.fdck"))) >= 1 and any(
                int(p.stem.split("-")[1]) >= 2 for p in ckpts.glob("ckpt-*.fdck")):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = set(SnapshotStore(run_dir / "snapshots").names())
    out = subprocess.run([sys.executable, "-m", "fedarena", "run", "--resume", str(run_dir), "--no-report"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "completed" and status["last_step"] == 6
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4, 5, 6]
    after = SnapshotStore(run_dir / "snapshots")
    # nothing written before the kill was lost: snapshots after the resumed checkpoint were set aside, not deleted
    aside = {p.name for p in (run_dir / "snapshots").glob("set-aside-*/*")}
    assert before <= set(after.names()) | aside
    after.verify()
    # the payoff table has every game of every iteration exactly once (iterations replayed after the
    # last checkpoint start from that checkpoint's table)
    assert status["summary"]["games"] == 6 * 3 * 24
