"""XFP (Heinrich et al., 2015): the thresholds OpenSpiel's XFP reaches on Kuhn, and the identity with PSRO
under the uniform meta-solver (fictitious self-play), which computes the same average another way."""

import numpy as np
import pytest

from fedarena.envs import load_game
from fedarena.marl import exploitability
from fedarena.marl.psro import PSRO
from fedarena.marl.xfp import XFPSolver


def test_xfp_kuhn_thresholds():
    game = load_game("kuhn_poker")
    s = XFPSolver(game)
    history = []
    for _ in range(100):
        s.iteration()
        history.append(exploitability(game, s.average_policy()))
    assert history[0] == pytest.approx(0.3125, abs=1e-12)   # uniform mixed with one best response
    assert history[9] <= 0.0834
    assert history[99] <= 0.0240


def test_xfp_average_equals_fictitious_self_play_mixture():
    """After k iterations the XFP average is the uniform mixture of the initial policy and k best
    responses; PSRO with the 'uniform' meta-solver builds exactly that population."""
    game = load_game("kuhn_poker")
    s = XFPSolver(game)
    p = PSRO(game, meta_solver="uniform")
    for _ in range(12):
        s.iteration()
        p.iteration()
        assert exploitability(game, s.average_policy()) == pytest.approx(p.exploitability(), abs=1e-12)


def test_xfp_value_return_and_checkpoint():
    game = load_game("leduc_poker")
    s = XFPSolver(game)
    values = s.iteration()
    # best-response values against uniform play sum to twice its exploitability (zero-sum game)
    assert values.sum() / 2 == pytest.approx(2.373611111111111, abs=1e-12)
    t = XFPSolver(game)
    t.load_state_dict(s.state_dict())
    s.iteration(), t.iteration()
    assert np.array_equal(s.policy, t.policy)
    rps = load_game("matching_pennies")
    m = XFPSolver(rps).run(20)
    e20 = exploitability(rps, m.average_policy())
    m.run(980)
    assert exploitability(rps, m.average_policy()) < e20 / 5  # fictitious play converges on zero-sum games
