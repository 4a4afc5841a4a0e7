"""The extensive-form API, load_game and the matrix-game converter."""

import itertools

import numpy as np
import pytest

from fedarena.envs import (TERMINAL, load_game, load_matrix_game, matrix_game_from_table,
                           matrix_to_extensive)
from fedarena.envs.matrix import MATRIX_GAMES


def test_load_game_names_and_errors():
    assert load_game("kuhn_poker").num_distinct_actions == 2
    assert load_game("leduc_poker").num_distinct_actions == 3
    for name in MATRIX_GAMES:
        assert load_game(name).name == name
    with pytest.raises(KeyError, match="unknown game 'kuhn'.*kuhn_poker"):
        load_game("kuhn")
    with pytest.raises(TypeError, match="game name"):
        load_game(3)


@pytest.mark.parametrize("name", sorted(MATRIX_GAMES))
def test_converted_matrix_game_pays_the_table(name):
    matrix = load_matrix_game(name)
    game = load_game(name)
    rows, cols = matrix.num_actions
    for i, j in itertools.product(range(rows), range(cols)):
        s = game.new_initial_state()
        assert s.current_player() == 0 and s.information_state_string() == "row"
        assert s.legal_actions() == list(range(rows))
        s.apply_action(i)
        assert s.current_player() == 1 and s.information_state_string() == "col"  # row choice hidden
        s.apply_action(j)
        assert s.current_player() == TERMINAL
        assert s.returns().tolist() == matrix.payoffs[:, i, j].tolist()


@pytest.mark.quick
def test_rectangular_matrix_game_and_exploitability_closed_form():
    from fedarena.marl import exploitability

    A = np.array([[3.0, -1.0, 0.5], [-2.0, 1.0, 0.0]])
    game = matrix_to_extensive(matrix_game_from_table(A))
    x, y = np.array([0.3, 0.7]), np.array([0.2, 0.5, 0.3])
    policy = {"row": x, "col": y}
    # closed form: NashConv = max_i (A y)_i - x A y + max_j (-x A)_j + x A y
    expected = ((A @ y).max() + (-(x @ A)).max()) / 2
    assert exploitability(game, policy) == pytest.approx(expected, abs=1e-12)
    with pytest.raises(TypeError, match="MatrixGame"):
        matrix_to_extensive(A)
