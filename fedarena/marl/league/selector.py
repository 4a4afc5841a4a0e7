"""Matchmaking over the payoff table: a probability over candidate opponents for a player, either by a PFSP
weighting of the player's win rates (:mod:`fedarena.marl.league.pfsp`) or by a PSRO meta-solver of
:mod:`fedarena.marl.meta_solvers` run on the candidates' own empirical game (Lanctot et al., 2017).

The empirical game of players ``ids`` is zero-sum and symmetric: ``A[i, j] = 2 P[i beats j] - 1`` (the
expected score, wins +1 / draws 0 / losses -1, estimated from the decayed counts), ``payoffs = [A, -A]``.
A meta-solver's row strategy is then the mixture opponents are drawn from; :func:`league_mixture` with
``nash`` is the league's Nash mixture.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fedarena.marl.league.payoff import Payoff
from fedarena.marl.league.pfsp import WEIGHTINGS, pfsp
from fedarena.marl.meta_solvers import META_SOLVERS, get_meta_solver

METHODS = tuple(sorted(WEIGHTINGS)) + tuple(sorted(META_SOLVERS))


def check_method(name: str, field: str = "selector") -> str:
    if name not in WEIGHTINGS and name not in META_SOLVERS:
        raise ValueError(f"{field}: unknown opponent selector '{name}'; PFSP weightings: "
                         f"{', '.join(sorted(WEIGHTINGS))}; meta-solvers: {', '.join(sorted(META_SOLVERS))}")
    return name


def empirical_game(payoff: Payoff, ids: Sequence[int]) -> np.ndarray:
    """``[A, -A]`` with ``A[i, j] = 2 P[ids[i] beats ids[j]] - 1``, antisymmetrised (exact for the table's
    counts; it only removes rounding)."""
    a = 2.0 * payoff.matrix(ids) - 1.0
    a = 0.5 * (a - a.T)
    return np.stack([a, -a])


def league_mixture(payoff: Payoff, ids: Sequence[int], solver: str = "nash") -> np.ndarray:
    """A meta-solver's mixture over players ``ids`` in their empirical game."""
    if not ids:
        raise ValueError("ids: the mixture needs at least one player")
    return np.asarray(get_meta_solver(solver)(empirical_game(payoff, ids))[0], dtype=np.float64)


def select(method: str, payoff: Payoff, home: int, candidates: Sequence[int]) -> np.ndarray:
    """Probabilities over ``candidates`` as opponents of ``home``."""
    if method in WEIGHTINGS:
        return pfsp(payoff.win_rates(home, candidates), method)
    if method in META_SOLVERS:
        p = np.clip(league_mixture(payoff, candidates, method), 0.0, None)
        return p / p.sum()
    raise ValueError(check_method(method))
