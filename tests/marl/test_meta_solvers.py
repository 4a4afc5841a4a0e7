"""Meta-solvers against closed forms (biased RPS has Nash (1/16, 10/16, 5/16)) and equilibrium conditions."""

import numpy as np
import pytest

from fedarena.envs import load_matrix_game
from fedarena.marl.meta_solvers import META_SOLVERS, get_meta_solver


def gains(payoffs, sigma):
    """How much each player gains by deviating to a best pure strategy (0 at a Nash equilibrium)."""
    A, B = payoffs
    x, y = sigma
    return (A @ y).max() - x @ A @ y, (x @ B).max() - x @ B @ y


def test_registry():
    assert set(META_SOLVERS) == {"nash", "prd", "regret_matching", "uniform", "last"}
    with pytest.raises(KeyError, match="unknown meta-solver 'nahs'"):
        get_meta_solver("nahs")


@pytest.mark.quick
def test_nash_biased_rps_closed_form():
    g = load_matrix_game("biased_rock_paper_scissors")
    x, y = get_meta_solver("nash")(g.payoffs)
    assert x == pytest.approx([1 / 16, 10 / 16, 5 / 16], abs=1e-9)
    assert y == pytest.approx([1 / 16, 10 / 16, 5 / 16], abs=1e-9)


@pytest.mark.quick
@pytest.mark.parametrize("seed", range(5))
def test_nash_on_random_rectangular_zero_sum_tables(seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(rng.integers(1, 9), rng.integers(1, 9)))
    payoffs = np.stack([A, -A])
    sigma = get_meta_solver("nash")(payoffs)
    for s in sigma:
        assert s.min() >= 0 and s.sum() == pytest.approx(1.0, abs=1e-12)
    assert max(gains(payoffs, sigma)) < 1e-8


def test_nash_rejects_general_sum_and_bad_shapes():
    pd = load_matrix_game("prisoners_dilemma")
    with pytest.raises(ValueError, match="zero-sum"):
        get_meta_solver("nash")(pd.payoffs)
    with pytest.raises(ValueError, match=r"payoffs: expected shape \(2, rows, cols\)"):
        get_meta_solver("uniform")(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="finite"):
        get_meta_solver("prd")(np.full((2, 2, 2), np.nan))


@pytest.mark.parametrize("name", ["prd", "regret_matching"])
def test_iterative_solvers_approach_equilibrium(name):
    g = load_matrix_game("rock_paper_scissors")
    sigma = get_meta_solver(name)(g.payoffs)
    assert max(gains(g.payoffs, sigma)) < 0.02
    pd = load_matrix_game("prisoners_dilemma")  # general-sum: both find mutual defection
    x, y = get_meta_solver(name)(pd.payoffs)
    assert x[1] > 0.95 and y[1] > 0.95  # time averages include the approach from uniform play


def test_uniform_and_last():
    p = np.zeros((2, 3, 4))
    u = get_meta_solver("uniform")(p)
    assert u[0].tolist() == [1 / 3] * 3 and u[1].tolist() == [0.25] * 4
    last = get_meta_solver("last")(p)
    assert last[0].tolist() == [0, 0, 1] and last[1].tolist() == [0, 0, 0, 1]
