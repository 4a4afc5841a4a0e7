"""Games and environments: matrix games, poker games, batched numpy environments, gymnasium/PettingZoo adapters,
OpenSpiel games. PettingZoo adapters and runners live in :mod:`fedarena.envs.pettingzoo_adapters` and
:mod:`fedarena.envs.pettingzoo_batch` (imported on demand, so importing this package does not load PettingZoo)."""

from fedarena.envs.matrix import MatrixGame, load_matrix_game, matrix_game_from_table
from fedarena.envs.efg import CHANCE, TERMINAL, Game, IllegalActionError, State
from fedarena.envs.games import UnknownGameError, load_game
from fedarena.envs.openspiel import OpenSpielGame
from fedarena.envs.matrix_efg import matrix_to_extensive

__all__ = ["MatrixGame", "load_matrix_game", "matrix_game_from_table"]
__all__ += ["CHANCE", "TERMINAL", "Game", "IllegalActionError", "State", "load_game", "matrix_to_extensive"]
__all__ += ["OpenSpielGame", "UnknownGameError"]
