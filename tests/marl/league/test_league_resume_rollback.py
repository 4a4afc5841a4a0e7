"""Resuming a league from an older checkpoint (the newest one lost, or holding a league state that does not load)
ends exactly as the uninterrupted run: the snapshots written after that checkpoint are set aside (kept, not
reused) and the replayed iterations write the same snapshots, metrics, payoff table and final results again.
The oracle is the uninterrupted run itself."""

from __future__ import annotations

import json
import shutil

import pytest

import fedarena
from fedarena.marl.league.store import SnapshotStore
from fedarena.platform import checkpoint as ckpt
from fedarena.platform.runs import execute, read_metrics

CFG = {"kind": "league", "game": "tictactoe", "iterations": 4, "games_per_iteration": 24, "num_envs": 8,
       "roles": {"main_agents": 1, "main_exploiters": 1, "league_exploiters": 1,
                 "snapshot_min_steps": 20, "snapshot_max_steps": 40},
       "agent": {"hidden": [16], "minibatch_size": 64, "update_epochs": 1},
       "eval": {"every": 2, "games": 4}, "checkpoint": {"every": 1, "keep": 3}}


def _timeless(d: dict) -> dict:
    """Everything but wall-clock measurements (times and rates per second)."""
    return {k: v for k, v in d.items()
            if k not in ("wall_time", "run_dir", "report") and "seconds" not in k and not k.startswith("throughput/")}


def _store(run_dir) -> dict[str, str]:
    store = SnapshotStore(run_dir / "snapshots")
    return {name: store.manifest(name)["sha256"] for name in store.names()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("league") / "reference"
    return out, fedarena.run(CFG, out=out, report=False)


def _lose(checkpoints) -> None:
    ckpt.checkpoint_path(checkpoints, 4).unlink()


def _without_learners(checkpoints) -> None:
    """The newest checkpoint reads cleanly but its league state lacks the learners (the league cannot load it)."""
    _, full = ckpt.load(ckpt.checkpoint_path(checkpoints, 4))
    del full["experiment"]["league"]["learners"]
    ckpt.save(checkpoints, 4, full, keep=3)


@pytest.mark.parametrize("spoil", [_lose, _without_learners], ids=["lost", "without_learners"])
def test_resume_from_the_second_newest_checkpoint_equals_the_uninterrupted_run(tmp_path, reference, spoil):
    reference_dir, reference = reference
    resumed = tmp_path / "resumed"
    shutil.copytree(reference_dir, resumed)
    # the newest checkpoint is unusable: the run resumes from the one before it, after which snapshots were written
    spoil(resumed / "checkpoints")
    _, older = ckpt.load(ckpt.checkpoint_path(resumed / "checkpoints", 3))
    recorded = set(older["experiment"]["league"]["manager"]["checksums"])
    later = set(_store(resumed)) - recorded
    assert later, "no snapshot was written in the last iteration; the test would not exercise the rollback"
    status = json.loads((resumed / "status.json").read_text())
    (resumed / "status.json").write_text(json.dumps({**status, "state": "running"}))

    summary = execute(None, [], resume=resumed, quiet=True, report=False)

    log = (resumed / "run.log").read_text()
    assert "resumed from checkpoint at step 3" in log
    assert ("skipping bad checkpoint" in log) == (spoil is _without_learners)
    aside = sorted(resumed.glob("snapshots/set-aside-*"))
    assert len(aside) == 1 and {p.name for p in aside[0].iterdir()} == later   # kept, out of the league's way
    assert _store(resumed) == _store(reference_dir)
    assert [_timeless(r) for r in read_metrics(resumed)] == [_timeless(r) for r in reference.rows]
    assert _timeless(summary) == _timeless(reference.summary)
    assert any(k.startswith("exact/") for k in summary)   # the exact win/draw/loss rates are compared too
    assert (json.loads((resumed / "payoff.json").read_text())
            == json.loads((reference_dir / "payoff.json").read_text()))
