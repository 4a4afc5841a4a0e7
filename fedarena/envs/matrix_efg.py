"""A two-player matrix game as an extensive-form game: the row player moves, then the column player moves
without seeing the row (one information state each, ``"row"`` and ``"col"``), then the payoffs are paid.

This is the standard embedding of a normal-form game in extensive form (Shoham & Leyton-Brown,
*Multiagent Systems*, sec. 5.2.2), so every extensive-form algorithm also runs on matrix games.
"""

from __future__ import annotations

import numpy as np

from fedarena.envs.efg import TERMINAL, Game, State
from fedarena.envs.matrix import MatrixGame

ROW_STATE, COL_STATE = "row", "col"


class MatrixGameState(State):
    def __init__(self, game: MatrixGame) -> None:
        self._game = game
        self._actions: list[int] = []

    def current_player(self) -> int:
        return len(self._actions) if len(self._actions) < 2 else TERMINAL

    def legal_actions(self) -> list[int]:
        p = self.current_player()
        return [] if p == TERMINAL else list(range(self._game.num_actions[p]))

    def chance_outcomes(self) -> list[tuple[int, float]]:
        return []

    def _apply(self, action: int) -> None:
        self._actions.append(action)

    def information_state_string(self, player: int | None = None) -> str:
        if player is None:
            player = self.current_player()
        if player not in (0, 1):
            raise ValueError(f"player: expected 0 or 1, got {player}")
        return ROW_STATE if player == 0 else COL_STATE

    def returns(self) -> np.ndarray:
        if len(self._actions) < 2:
            return np.zeros(2)
        i, j = self._actions
        return np.array(self._game.payoffs[:, i, j], dtype=np.float64)

    def clone(self) -> "MatrixGameState":
        c = MatrixGameState(self._game)
        c._actions = list(self._actions)
        return c

    def history(self) -> list[int]:
        return list(self._actions)


class MatrixExtensiveGame(Game):
    """``matrix`` (a :class:`~fedarena.envs.matrix.MatrixGame`) seen through the extensive-form API."""

    num_players = 2

    def __init__(self, matrix: MatrixGame) -> None:
        self.matrix = matrix
        self.name = matrix.name
        self.num_distinct_actions = max(matrix.num_actions)

    def new_initial_state(self) -> MatrixGameState:
        return MatrixGameState(self.matrix)

    def action_name(self, action: int) -> str:
        return f"{action}"

    @property
    def is_zero_sum(self) -> bool:
        return self.matrix.is_zero_sum

    def __repr__(self) -> str:
        return f"MatrixExtensiveGame({self.matrix.name})"


def matrix_to_extensive(matrix: MatrixGame) -> MatrixExtensiveGame:
    """Convert a two-player matrix game into the extensive-form API."""
    if not isinstance(matrix, MatrixGame):
        raise TypeError(f"matrix: expected a fedarena.envs.MatrixGame, got {type(matrix).__name__}")
    return MatrixExtensiveGame(matrix)
