"""The quickstart shows its lesson (issue 21, item 8): on biased rock-paper-scissors self-play's average strategy
stays at the cycle's mean (1/3, 1/3, 1/3), not the equilibrium, while fictitious play's average converges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedarena.envs.matrix import load_matrix_game
from fedarena.marl.matrix_dynamics import exploitability
from fedarena.platform.runs import execute, read_metrics

ROOT = Path(__file__).resolve().parents[2]
NASH = np.array([1, 10, 5]) / 16  # closed form of the biased game's (unique, symmetric) equilibrium


def test_quickstart_numbers_and_plots(tmp_path):
    out = tmp_path / "q"
    s = execute(ROOT / "experiments/quickstart.yaml", ["iterations=3000"], out=out, quiet=True)
    game = load_matrix_game("biased_rock_paper_scissors")
    assert s["game"] == "biased_rock_paper_scissors"
    np.testing.assert_allclose(s["nash_p0"], NASH, atol=1e-6)
    # closed form: against uniform play the best pure reply (paper) earns 25/3, so the uniform profile's
    # exploitability is 25/3; self-play's average sits there
    u = np.full(3, 1 / 3)
    assert exploitability(game, [u, u]) == pytest.approx(25 / 3)
    assert s["selfplay/exploitability_average"] == pytest.approx(25 / 3, rel=0.01)
    np.testing.assert_allclose(s["selfplay/p0_average"], u, atol=0.002)
    assert s["selfplay/p0_average_distance_to_nash"] > 0.55
    # fictitious play's average is close to the equilibrium and its exploitability keeps falling
    assert s["fictitious_play/p0_average_distance_to_nash"] < 0.08  # 0.054 at 3000, 0.013 at 10000
    assert s["fictitious_play/exploitability_average"] < 0.3
    rows = read_metrics(out)
    fp = [r["fictitious_play/exploitability_average"] for r in rows]
    assert fp[3000] < fp[300] < fp[30] / 2
    assert "fictitious_play's average approaches the equilibrium, selfplay's does not" in s["lesson"]
    assert (out / "report" / "exploitability.png").exists() and (out / "report" / "strategies.png").exists()
