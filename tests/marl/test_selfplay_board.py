"""The ``selfplay_ppo`` kind on the numpy-batched boards: resume equals an uninterrupted run, the snapshot pool and
the opponent mixture, the PettingZoo backend, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedarena.marl.league.agent import AgentConfig
from fedarena.marl.selfplay import BoardSelfPlay, SelfPlayConfig
from fedarena.platform import checkpoint as ckpt
from fedarena.platform.config import ConfigError
from fedarena.platform.errors import RunError
from fedarena.platform.runs import execute

TINY = {"kind": "selfplay_ppo", "env_id": "pettingzoo.classic.tictactoe_v3", "seed": 4, "num_envs": 8,
        "updates": 4, "games_per_update": 16, "eval_every": 1, "eval_episodes": 6,
        "selfplay": {"latest_prob": 0.5, "snapshot_every": 1, "pool_size": 3},
        "agent": {"hidden": [16], "minibatch_size": 32, "update_epochs": 2},
        "checkpoint": {"every": 1, "keep": 3}}


def _rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if "wall" not in k} for r in rows]


def test_resume_equals_an_uninterrupted_run(tmp_path):
    full = tmp_path / "full"
    execute(TINY, out=full, quiet=True, report=False)
    half = tmp_path / "half"
    execute(dict(TINY, updates=2), out=half, quiet=True, report=False)
    assert [r["step"] for r in _rows(half)] == [1, 2]
    summary = execute(None, ["updates=4"], resume=half, quiet=True, report=False)
    assert summary["updates"] == 4 and summary["episodes"] == 4 * 16
    a, b = _rows(full), _rows(half)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert a == b  # every metric of every update, evaluations included
    (_, sa), (_, sb) = ckpt.load_newest_valid(full / "checkpoints"), ckpt.load_newest_valid(half / "checkpoints")
    la, lb = sa["experiment"]["selfplay"]["learner"], sb["experiment"]["selfplay"]["learner"]
    assert la.keys() == lb.keys()
    for k in la:
        np.testing.assert_array_equal(la[k], lb[k], err_msg=k)
    assert [s["update"] for s in sb["experiment"]["selfplay"]["pool"]] == [2, 3, 4]


def test_pool_grows_every_snapshot_every_updates_and_the_mixture_weights():
    sp = BoardSelfPlay("tictactoe", 8, 16, AgentConfig(hidden=(16,), minibatch_size=32, update_epochs=1),
                       SelfPlayConfig(latest_prob=0.25, snapshot_every=2, pool_size=2), seed=0)
    opps, probs = sp.opponents()
    assert len(opps) == 2 and probs.tolist() == [0.25, 0.75] and opps[0] is sp.params
    for u in range(1, 6):
        results, metrics = sp.iteration()
        assert len(results) == 16 and set(np.unique(results)) <= {-1.0, 0.0, 1.0} and np.isfinite(metrics["loss"])
        if u == 4:
            at_four = {k: v.copy() for k, v in sp.params.items()}
    assert [s.update for s in sp.pool.snapshots] == [2, 4]
    for k, v in at_four.items():
        np.testing.assert_array_equal(sp.pool.snapshots[1].params[k], v)
    opps, probs = sp.opponents()
    np.testing.assert_allclose(probs, [0.25, 0.375, 0.375])
    assert sp.episodes == 80 and sp.learner_moves > 80 * 2


def test_board_selfplay_state_round_trips():
    cfg = AgentConfig(hidden=(16,), minibatch_size=32, update_epochs=1)
    a = BoardSelfPlay("connect_four", 4, 8, cfg, SelfPlayConfig(snapshot_every=1, pool_size=2), seed=1)
    a.iteration()
    state = a.state_dict()
    b = BoardSelfPlay("connect_four", 4, 8, cfg, SelfPlayConfig(snapshot_every=1, pool_size=2), seed=9)
    b.load_state_dict(ckpt.decode_state(ckpt.encode_state(state)))
    ra, _ = a.iteration()
    rb, _ = b.iteration()
    np.testing.assert_array_equal(ra, rb)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    bad = BoardSelfPlay("tictactoe", 4, 8, cfg, SelfPlayConfig(), seed=1)
    with pytest.raises(ValueError, match="state_dict|checkpoint"):
        bad.load_state_dict(state)


def test_pettingzoo_backend_runs_and_refuses_resume(tmp_path):
    cfg = {"kind": "selfplay_ppo", "env_id": "game:kuhn_poker", "num_envs": 2, "env_steps": 32, "eval_every": 1,
           "eval_episodes": 4, "ppo": {"num_steps": 16, "update_epochs": 1, "num_minibatches": 1, "hidden": [8]}}
    summary = execute(cfg, out=tmp_path / "kuhn", quiet=True, report=False)
    assert summary["updates"] == 1 and 0.0 <= summary["vs_random/win"] <= 1.0
    with pytest.raises(RunError, match="PettingZoo self-play backend .* has no checkpoints"):
        execute(None, ["env_steps=64"], resume=tmp_path / "kuhn", quiet=True, report=False)


@pytest.mark.parametrize("override,field", [({"env_id": "pettingzoo.classic.nosuch_v1"}, "env_id"),
                                            ({"games_per_update": 0}, "games_per_update"),
                                            ({"agent": {"network": "rnn"}}, "agent.network")])
def test_bad_config_is_a_one_line_error(tmp_path, override, field):
    with pytest.raises(ConfigError, match=field):
        execute(dict(TINY, **override), out=tmp_path / "bad", quiet=True, report=False)
