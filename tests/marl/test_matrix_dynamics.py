"""Self-play and fictitious play on matrix games, against closed forms and the issue's thresholds."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.envs.matrix import load_matrix_game, matrix_game_from_table
from fedarena.marl.matrix_dynamics import Dynamics, best_response, exploitability, nash_conv


def _run(algorithm, game, iterations, initial=(0, 0)):
    d = Dynamics.start(algorithm, game, initial)
    history = []
    for _ in range(iterations):
        d.step(game)
        history.append((exploitability(game, d.current_strategies(game)), exploitability(game, d.average_strategies())))
    return d, history


def test_nash_conv_closed_forms():
    rps = load_matrix_game("rock_paper_scissors")
    u = np.full(3, 1 / 3)
    assert nash_conv(rps, [u, u]) == pytest.approx(0.0, abs=1e-15)
    rock, paper = np.eye(3)[0], np.eye(3)[1]
    # (rock, rock): each could gain 1 by switching to paper -> NashConv 2, exploitability 1
    assert nash_conv(rps, [rock, rock]) == pytest.approx(2.0)
    assert exploitability(rps, [paper, rock]) == pytest.approx(1.0)
    # biased RPS equilibrium (1/16, 10/16, 5/16) is exact
    b = load_matrix_game("biased_rock_paper_scissors")
    eq = np.array([1, 10, 5]) / 16
    assert nash_conv(b, [eq, eq]) == pytest.approx(0.0, abs=1e-12)
    pd = load_matrix_game("prisoners_dilemma")
    d = np.array([0.0, 1.0])
    assert nash_conv(pd, [d, d]) == 0.0
    c = np.array([1.0, 0.0])
    assert nash_conv(pd, [c, c]) == pytest.approx(4.0)  # each gains T - R = 2


def test_best_response_ties_go_to_lowest_action():
    rps = load_matrix_game("rock_paper_scissors")
    assert best_response(rps, 0, np.full(3, 1 / 3)) == 0
    assert best_response(rps, 1, np.eye(3)[2]) == 0  # rock beats scissors
    assert best_response(rps, 0, np.eye(3)[0]) == 1


@pytest.mark.quick
def test_selfplay_cycles_at_maximum_exploitability():
    rps = load_matrix_game("rock_paper_scissors")
    d, history = _run("selfplay", rps, 300)
    assert all(cur == 1.0 for cur, _ in history)
    assert len({tuple(d.current)}) == 1
    # pure strategies cycle rock -> paper -> scissors -> rock
    seq = []
    d = Dynamics.start("selfplay", rps, (0, 0))
    for _ in range(6):
        d.step(rps)
        seq.append(tuple(d.current))
    assert seq == [(1, 0), (1, 2), (0, 2), (0, 1), (2, 1), (2, 0)]


def test_fictitious_play_rps_thresholds():
    rps = load_matrix_game("rock_paper_scissors")
    d, history = _run("fictitious_play", rps, 10_000)
    assert history[999][1] <= 0.05
    assert history[9_999][1] <= 0.015
    assert np.allclose(d.average_strategies()[0], 1 / 3, atol=0.02)


def test_prisoners_dilemma_both_converge_to_defection():
    pd = load_matrix_game("prisoners_dilemma")
    for algorithm in ("selfplay", "fictitious_play"):
        d, history = _run(algorithm, pd, 50)
        assert d.current == [1, 1]
        assert history[-1][0] == 0.0


def test_matching_pennies_fictitious_play_converges_and_custom_tables():
    mp = load_matrix_game("matching_pennies")
    _, history = _run("fictitious_play", mp, 2000)
    assert history[-1][1] < 0.02
    g = matrix_game_from_table([[0, -1, 1], [1, 0, -1], [-1, 1, 0]])
    assert g.is_zero_sum and g.num_actions == (3, 3)
    with pytest.raises(ValueError, match="payoffs"):
        matrix_game_from_table([1, 2, 3])
    with pytest.raises(KeyError, match="unknown matrix game"):
        load_matrix_game("chess")


def test_shapley_game_fictitious_play_does_not_converge():
    g = load_matrix_game("shapley_game")
    _, history = _run("fictitious_play", g, 3000)
    # Shapley (1964): the empirical play cycles with growing periods; NashConv stays bounded away from 0
    assert min(avg for _, avg in history[1000:]) > 0.05


def test_report_of_a_run_that_starts_at_the_equilibrium(tmp_path):
    """Both players start at defect in the prisoner's dilemma: every exploitability is exactly 0 (the closed form),
    and the report still draws (a log axis cannot hold only zeros)."""
    import json
    from pathlib import Path

    from fedarena.platform.runs import execute

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "run"
    execute(root / "experiments/prisoners_dilemma.yaml", ["initial_actions=[1, 1]", "iterations=20"], out=out,
            quiet=True)
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "completed"
    assert all(v == 0.0 for k, v in status["summary"].items() if "exploitability" in k)
    assert (out / "report" / "exploitability.png").stat().st_size > 0
