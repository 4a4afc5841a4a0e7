"""The lazy MCCFR walk's bounds: independent of Python's recursion limit on long games (chess, oshi_zumo at their
default parameters), Knuth's estimate of one external-sampling iteration against the exact expected size counted
by brute force, the refusal of external sampling where that estimate is too large, the per-iteration node budget,
the cap on stored information states, checkpoint and resume, and the row-by-row policy export."""

from __future__ import annotations

import inspect
import json
import sys

import numpy as np
import pytest

from fedarena.envs import load_game
from fedarena.envs.efg import CHANCE, TERMINAL
from fedarena.marl.mccfr import (LazyMCCFRSolver, LazyWalkLimitError, MCCFROptions, check_external_traversal,
                                 estimate_external_traversal)
from fedarena.platform.errors import ConfigError, RunError


class _LowRecursionLimit:
    """Python's recursion limit at ``margin`` frames above the caller's depth."""

    def __init__(self, margin: int):
        self.margin = margin

    def __enter__(self):
        self.old = sys.getrecursionlimit()
        sys.setrecursionlimit(len(inspect.stack(0)) + self.margin)

    def __exit__(self, *exc):
        sys.setrecursionlimit(self.old)


def test_lazy_walks_do_not_depend_on_the_recursion_limit():
    chess = LazyMCCFRSolver(load_game("chess"), MCCFROptions(sampling="outcome"), seed=0)
    zumo = LazyMCCFRSolver(load_game("oshi_zumo"), MCCFROptions(sampling="outcome"), seed=0)
    deep = LazyMCCFRSolver(load_game("oshi_zumo"), MCCFROptions(sampling="external"), seed=0,
                           max_traversal_nodes=5000)
    with _LowRecursionLimit(60):
        chess.run(2)
        zumo.run(3)
        with pytest.raises(LazyWalkLimitError, match="max_traversal_nodes=5,000"):
            deep.iteration()
    assert chess.nodes_touched > 4 * 60          # the sampled chess games are longer than the frames allowed
    assert zumo.iterations == 3 and zumo.num_infostates > 0
    for row in zumo.average_policy_dict().values():
        assert row.sum() == pytest.approx(1.0)


def _expected_external_size(state, player) -> float:
    """Brute force: the expected number of histories of ``player``'s external-sampling tree when chance plays by
    its probabilities and the other players uniformly (the first iteration's policies)."""
    p = state.current_player()
    if p == TERMINAL:
        return 1.0
    if p == CHANCE:
        return 1.0 + sum(q * _expected_external_size(state.child(a), player) for a, q in state.chance_outcomes())
    kids = [_expected_external_size(state.child(a), player) for a in state.legal_actions()]
    return 1.0 + (sum(kids) if p == player else float(np.mean(kids)))


@pytest.mark.parametrize("name", ["kuhn_poker", "leduc_poker"])
def test_external_traversal_estimate_matches_the_brute_force_expectation(name):
    game = load_game(name)
    exact = sum(_expected_external_size(game.new_initial_state(), i) for i in range(game.num_players))
    est = estimate_external_traversal(game, probes=2000, seed=1)
    assert not est.lower_bound and est.probes == 2000
    assert est.histories == pytest.approx(exact, rel=0.05)
    # the solver's first walk (uniform policies) touches that many histories on average
    touched = []
    for seed in range(300):
        s = LazyMCCFRSolver(game, MCCFROptions(sampling="external"), seed=seed)
        s._budget = s.max_traversal_nodes
        s._external(0)
        touched.append(s.nodes_touched)
    assert np.mean(touched) == pytest.approx(_expected_external_size(game.new_initial_state(), 0), rel=0.1)


@pytest.mark.parametrize("name", ["chess", "oshi_zumo"])
def test_external_sampling_is_refused_in_one_line_where_one_iteration_is_too_large(name, tmp_path):
    from fedarena.platform.runs import execute

    with pytest.raises(LazyWalkLimitError) as info:
        check_external_traversal(load_game(name))
    assert info.value.user_error
    with pytest.raises(ConfigError) as info:
        execute({"kind": "mccfr", "game": name, "iterations": 3}, out=tmp_path / "run", quiet=True, report=False)
    msg = str(info.value)
    assert "\n" not in msg and f"game {name}" in msg and "max_traversal_nodes=1,000,000" in msg
    assert "sampling: outcome" in msg and "histories" in msg
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "failed" and "sampling: outcome" in status["error"]


def test_three_player_leduc_runs_lazily_with_both_samplings(tmp_path):
    from fedarena.platform.runs import execute

    game = load_game("leduc_poker(players=3)")
    assert check_external_traversal(game).histories < 1000
    for sampling in ("external", "outcome"):
        out = execute({"kind": "mccfr", "game": "leduc_poker(players=3)", "sampling": sampling, "iterations": 4,
                       "eval_every": 2}, out=tmp_path / sampling, quiet=True, report=False)
        assert out["walk"] == "lazy" and out["iterations"] == 4
        assert (tmp_path / sampling / "policy.json").exists()


def test_node_budget_stops_an_iteration_that_is_larger_than_estimated():
    s = LazyMCCFRSolver(load_game("leduc_poker"), MCCFROptions(sampling="external"), seed=0, max_traversal_nodes=12)
    with pytest.raises(LazyWalkLimitError, match=r"game leduc_poker: .*more than max_traversal_nodes=12 histories; "
                                                 r"use sampling: outcome"):
        s.iteration()
    assert s.nodes_touched == 13
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="max_infostates"):
            LazyMCCFRSolver(load_game("kuhn_poker"), max_infostates=bad)


def test_infostate_cap_stops_the_run_in_one_line_and_keeps_the_logged_rows(tmp_path):
    from fedarena.platform.runs import execute, read_metrics

    s = LazyMCCFRSolver(load_game("leduc_poker"), MCCFROptions(sampling="outcome"), seed=0, max_infostates=40)
    with pytest.raises(LazyWalkLimitError, match="max_infostates=40"):
        s.run(1000)
    assert s.num_infostates == 40
    cfg = {"kind": "mccfr", "game": "leduc_poker", "lazy": True, "sampling": "outcome", "iterations": 1000,
           "eval_every": 1, "max_infostates": 40, "checkpoint": {"every": 1}}
    with pytest.raises(RunError, match="max_infostates=40"):
        execute(cfg, out=tmp_path / "run", quiet=True, report=False)
    rows = read_metrics(tmp_path / "run")
    assert len(rows) >= 1 and all(r["information_states"] <= 40 for r in rows if "information_states" in r)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "failed" and "max_infostates=40" in status["error"]
    assert "\n" not in status["error"]
    assert status["last_checkpoint_step"] == status["last_step"] == rows[-1]["step"]   # the last whole iteration


def test_lazy_run_resumes_from_its_checkpoint_as_if_never_stopped(tmp_path):
    from fedarena.marl.policy_export import load_policy
    from fedarena.platform.runs import execute, read_metrics

    cfg = {"kind": "mccfr", "game": "oshi_zumo", "sampling": "outcome", "iterations": 8, "eval_every": 2,
           "checkpoint": {"every": 3}}
    straight = execute(cfg, out=tmp_path / "b", quiet=True, report=False)
    execute({**cfg, "iterations": 6}, out=tmp_path / "a", quiet=True, report=False)
    resumed = execute(resume=tmp_path / "a", overrides=["iterations=8"], quiet=True, report=False)
    def strip(d):
        return [{k: v for k, v in r.items() if k not in ("wall_time", "solver_time")} for r in read_metrics(d)]

    assert strip(tmp_path / "a") == strip(tmp_path / "b")
    assert [r["step"] for r in strip(tmp_path / "a")] == [1, 2, 4, 6, 8]
    assert resumed["nodes_touched"] == straight["nodes_touched"] and resumed["iterations"] == 8
    a, b = load_policy(tmp_path / "a" / "policy.json"), load_policy(tmp_path / "b" / "policy.json")
    assert a.policy.keys() == b.policy.keys()
    for key in a.policy:
        np.testing.assert_array_equal(a.policy[key], b.policy[key])
    s = LazyMCCFRSolver(load_game("kuhn_poker"), seed=0).run(3)
    t = LazyMCCFRSolver(load_game("kuhn_poker"), seed=0)
    t.load_state_dict(s.state_dict())
    s.run(2), t.run(2)
    assert s.tables.keys() == t.tables.keys() and all((s.tables[k] == t.tables[k]).all() for k in s.tables)
    bad = {**s.state_dict(), "tables": np.zeros((2, 1))}
    with pytest.raises(ValueError, match="tables"):
        t.load_state_dict(bad)


def test_lazy_export_is_the_policy_files_format_and_bounded(tmp_path, monkeypatch):
    from fedarena.marl import mccfr_experiment
    from fedarena.marl.policy_export import export_policy, load_policy
    from fedarena.platform.runs import execute

    s = LazyMCCFRSolver(load_game("leduc_poker"), MCCFROptions(sampling="outcome"), seed=0).run(30)
    meta = {"algorithm": "x", "iterations": 30, "complete": False}
    mccfr_experiment._stream_policy(tmp_path / "streamed.json", "leduc_poker", s, meta)
    export_policy(tmp_path / "whole.json", "leduc_poker", s.average_policy_dict(), **meta)
    a, b = load_policy(tmp_path / "streamed.json"), load_policy(tmp_path / "whole.json")
    assert a.meta == b.meta and a.policy.keys() == b.policy.keys() and len(a.policy) == s.num_infostates
    for key in a.policy:
        np.testing.assert_array_equal(a.policy[key], b.policy[key])
    # above the entry bound the run completes and says why there is no file
    monkeypatch.setattr(mccfr_experiment, "MAX_EXPORT_ENTRIES", 50)
    out = execute({"kind": "mccfr", "game": "oshi_zumo", "sampling": "outcome", "iterations": 2, "eval_every": 1},
                  out=tmp_path / "run", quiet=True, report=False)
    assert out["policy"].startswith("not exported:") and "above 50 entries" in out["policy"]
    assert not (tmp_path / "run" / "policy.json").exists()
