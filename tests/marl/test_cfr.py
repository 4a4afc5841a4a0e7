"""CFR and CFR+ (Zinkevich et al., 2007; Tammelin et al., 2015): convergence thresholds and agreement with
OpenSpiel's C++ solvers iterate by iterate."""

import numpy as np
import pytest

from fedarena.envs import load_game
from fedarena.marl import exploitability
from fedarena.marl.best_response import expected_returns
from fedarena.marl.cfr import CFRSolver, regret_matching


@pytest.mark.quick
def test_cfr_plus_kuhn_after_100():
    game = load_game("kuhn_poker")
    s = CFRSolver(game, plus=True).run(100)
    e = exploitability(game, s.average_policy())
    assert e <= 0.0013
    assert expected_returns(game, s.average_policy())[0] == pytest.approx(-1 / 18, abs=5e-3)


def test_cfr_plus_leduc_after_100_and_1000():
    game = load_game("leduc_poker")
    s = CFRSolver(game, plus=True).run(100)
    assert exploitability(game, s.average_policy()) <= 0.0135
    s.run(900)
    assert exploitability(game, s.average_policy()) <= 0.0003


def test_vanilla_cfr_converges_on_kuhn_and_matrix_games():
    game = load_game("kuhn_poker")
    s = CFRSolver(game, plus=False)
    s.run(50)
    e50 = exploitability(game, s.average_policy())
    s.run(450)
    assert exploitability(game, s.average_policy()) < e50 / 3
    rps = load_game("biased_rock_paper_scissors")
    s = CFRSolver(rps, plus=True).run(2000)
    assert s.average_policy()["row"] == pytest.approx([1 / 16, 10 / 16, 5 / 16], abs=2e-3)


@pytest.mark.parametrize("name,plus", [("kuhn_poker", True), ("kuhn_poker", False), ("leduc_poker", True)])
def test_matches_openspiel_cpp_solver(name, plus):
    pyspiel = pytest.importorskip("pyspiel")
    from open_spiel.python.algorithms import exploitability as os_exploitability

    iterations = 30 if name == "leduc_poker" else 100
    theirs = (pyspiel.CFRPlusSolver if plus else pyspiel.CFRSolver)(pyspiel.load_game(name))
    for _ in range(iterations):
        theirs.evaluate_and_update_policy()
    ours = CFRSolver(load_game(name), plus=plus).run(iterations)
    expected = os_exploitability.exploitability(pyspiel.load_game(name), theirs.average_policy())
    assert exploitability(load_game(name), ours.average_policy()) == pytest.approx(expected, abs=1e-10)


@pytest.mark.quick
def test_regret_matching_and_checkpoint_roundtrip():
    game = load_game("kuhn_poker")
    s = CFRSolver(game)
    r = np.array([[2.0, -1.0]] * 12)
    r[0] = [-1.0, -3.0]
    p = regret_matching(s.tree, r)
    assert p[0].tolist() == [0.5, 0.5] and p[1].tolist() == [1.0, 0.0]
    s.run(7)
    state = s.state_dict()
    t = CFRSolver(game)
    t.load_state_dict(state)
    s.run(5)
    t.run(5)
    assert np.array_equal(s.average_policy().probs, t.average_policy().probs)
    with pytest.raises(ValueError, match="checkpoint field 'regrets'"):
        t.load_state_dict({**state, "regrets": np.zeros((3, 2))})
