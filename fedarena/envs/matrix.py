"""Two-player normal-form (matrix) games given by payoff tables.

A game is a payoff tensor ``payoffs[player, row_action, col_action]``. The named games follow their
textbook definitions (Shoham & Leyton-Brown, *Multiagent Systems*, ch. 3; Shapley, 1964, for Shapley's game).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True, eq=False)
class MatrixGame:
    """A two-player normal-form game; ``payoffs[p, i, j]`` is player ``p``'s payoff when row plays i, column j."""

    name: str
    payoffs: np.ndarray
    row_actions: tuple[str, ...]
    col_actions: tuple[str, ...]

    def __post_init__(self) -> None:
        p = np.asarray(self.payoffs, dtype=np.float64)
        if p.ndim != 3 or p.shape[0] != 2:
            raise ValueError(f"payoffs: expected shape (2, rows, cols), got {p.shape}")
        if p.shape[1] < 1 or p.shape[2] < 1:
            raise ValueError(f"payoffs: each player needs at least one action, got shape {p.shape}")
        if not np.all(np.isfinite(p)):
            raise ValueError("payoffs: every entry must be a finite number")
        if len(self.row_actions) != p.shape[1] or len(self.col_actions) != p.shape[2]:
            raise ValueError(
                f"actions: expected {p.shape[1]} row and {p.shape[2]} column names, "
                f"got {len(self.row_actions)} and {len(self.col_actions)}"
            )
        p.setflags(write=False)
        object.__setattr__(self, "payoffs", p)

    @property
    def num_actions(self) -> tuple[int, int]:
        return self.payoffs.shape[1], self.payoffs.shape[2]

    @property
    def is_zero_sum(self) -> bool:
        return bool(np.allclose(self.payoffs[0] + self.payoffs[1], 0.0))

    def action_names(self, player: int) -> tuple[str, ...]:
        return self.row_actions if player == 0 else self.col_actions

    def expected_payoffs(self, row_strategy: np.ndarray, col_strategy: np.ndarray) -> np.ndarray:
        """Both players' expected payoffs under mixed strategies, shape (2,)."""
        return np.einsum("pij,i,j->p", self.payoffs, row_strategy, col_strategy)

    def action_values(self, player: int, opponent_strategy: np.ndarray) -> np.ndarray:
        """Expected payoff of each pure action of ``player`` against the opponent's mixed strategy."""
        if player == 0:
            return self.payoffs[0] @ opponent_strategy
        return opponent_strategy @ self.payoffs[1]


def _game(name: str, row: Sequence[Sequence[float]], col: Sequence[Sequence[float]], actions: Sequence[str],
          col_actions: Sequence[str] | None = None) -> MatrixGame:
    return MatrixGame(name, np.array([row, col], dtype=np.float64), tuple(actions), tuple(col_actions or actions))


def rock_paper_scissors() -> MatrixGame:
    a = [[0, -1, 1], [1, 0, -1], [-1, 1, 0]]
    return _game("rock_paper_scissors", a, -np.array(a), ["rock", "paper", "scissors"])


def biased_rock_paper_scissors() -> MatrixGame:
    """RPS with unequal stakes (the variant used in OpenSpiel's examples); its Nash is (1/16, 10/16, 5/16)."""
    a = [[0, -25, 50], [25, 0, -5], [-50, 5, 0]]
    return _game("biased_rock_paper_scissors", a, -np.array(a), ["rock", "paper", "scissors"])


def matching_pennies() -> MatrixGame:
    a = [[1, -1], [-1, 1]]
    return _game("matching_pennies", a, -np.array(a), ["heads", "tails"])


def prisoners_dilemma() -> MatrixGame:
    """Payoffs (T, R, P, S) = (5, 3, 1, 0); defection strictly dominates."""
    row = [[3, 0], [5, 1]]
    col = [[3, 5], [0, 1]]
    return _game("prisoners_dilemma", row, col, ["cooperate", "defect"])


def shapley_game() -> MatrixGame:
    """Shapley's (1964) 3x3 game, on which fictitious play cycles without converging."""
    row = [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    col = [[0, 1, 0], [0, 0, 1], [1, 0, 0]]
    return _game("shapley_game", row, col, ["a", "b", "c"])


MATRIX_GAMES = {
    "rock_paper_scissors": rock_paper_scissors,
    "biased_rock_paper_scissors": biased_rock_paper_scissors,
    "matching_pennies": matching_pennies,
    "prisoners_dilemma": prisoners_dilemma,
    "shapley_game": shapley_game,
}


def load_matrix_game(name: str) -> MatrixGame:
    """A named matrix game; unknown names list the known ones."""
    if name not in MATRIX_GAMES:
        raise KeyError(f"game: unknown matrix game '{name}'; known: {', '.join(sorted(MATRIX_GAMES))}")
    return MATRIX_GAMES[name]()


def matrix_game_from_table(payoffs: Sequence, name: str = "custom") -> MatrixGame:
    """A game from a payoff table: either [row_matrix, col_matrix] or one matrix for a zero-sum game."""
    p = np.asarray(payoffs, dtype=np.float64)
    if p.ndim == 2:
        p = np.stack([p, -p])
    if p.ndim != 3 or p.shape[0] != 2:
        raise ValueError(
            f"payoffs: expected one matrix (zero-sum) or two matrices [row, col] of the same shape, got shape {p.shape}"
        )
    return MatrixGame(name, p, tuple(f"a{i}" for i in range(p.shape[1])), tuple(f"b{j}" for j in range(p.shape[2])))
