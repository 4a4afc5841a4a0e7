"""Extensive-form games by name: ``load_game("kuhn_poker")``, ``"leduc_poker"``, or any named matrix game
(``"rock_paper_scissors"``, ...) converted to extensive form."""

from __future__ import annotations

from fedarena.envs.efg import Game
from fedarena.envs.kuhn import KuhnPoker
from fedarena.envs.leduc import LeducPoker
from fedarena.envs.matrix import MATRIX_GAMES, load_matrix_game
from fedarena.envs.matrix_efg import matrix_to_extensive

EXTENSIVE_GAMES = {"kuhn_poker": KuhnPoker, "leduc_poker": LeducPoker}


def game_names() -> list[str]:
    return sorted(EXTENSIVE_GAMES) + sorted(MATRIX_GAMES)


def load_game(name: str) -> Game:
    """The game called ``name``; unknown names raise ``KeyError`` listing the known ones."""
    if not isinstance(name, str):
        raise TypeError(f"game: expected a game name (str), got {type(name).__name__}")
    if name in EXTENSIVE_GAMES:
        return EXTENSIVE_GAMES[name]()
    if name in MATRIX_GAMES:
        return matrix_to_extensive(load_matrix_game(name))
    raise KeyError(f"game: unknown game '{name}'; known: {', '.join(game_names())}")
