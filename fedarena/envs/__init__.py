"""Games and environments: matrix games, poker games, batched numpy environments, gymnasium/PettingZoo adapters."""

from fedarena.envs.matrix import MatrixGame, load_matrix_game, matrix_game_from_table

__all__ = ["MatrixGame", "load_matrix_game", "matrix_game_from_table"]
