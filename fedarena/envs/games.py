"""Extensive-form games by name: ``load_game("kuhn_poker")``, ``"leduc_poker"``, any named matrix game
(``"rock_paper_scissors"``, ...) converted to extensive form, or any OpenSpiel game string
(``"liars_dice"``, ``"kuhn_poker(players=3)"``, ``"goofspiel(num_cards=4,imp_info=True)"``; an
``openspiel:`` prefix forces OpenSpiel's version of a name fedarena also has) through
:mod:`fedarena.envs.openspiel`."""

from __future__ import annotations

import difflib
import importlib.util

from fedarena.envs.efg import Game
from fedarena.envs.kuhn import KuhnPoker
from fedarena.envs.leduc import LeducPoker
from fedarena.envs.matrix import MATRIX_GAMES, load_matrix_game
from fedarena.envs.matrix_efg import matrix_to_extensive
from fedarena.envs.openspiel import OpenSpielGame, OpenSpielGameError, registered_game_names

EXTENSIVE_GAMES = {"kuhn_poker": KuhnPoker, "leduc_poker": LeducPoker}
OPENSPIEL_PREFIX = "openspiel:"

UnknownGameError = OpenSpielGameError
"""The ``KeyError`` raised for a name no library knows or a game string OpenSpiel rejects (plain message)."""


def game_names() -> list[str]:
    return sorted(EXTENSIVE_GAMES) + sorted(MATRIX_GAMES)


def load_game(name: str) -> Game:
    """The game called ``name``. fedarena's own games come first; other names (or names with parameters)
    go to OpenSpiel when it is installed. Unknown names and unparsable game strings raise ``KeyError``
    with a one-line message."""
    if not isinstance(name, str):
        raise TypeError(f"game: expected a game name (str), got {type(name).__name__}")
    if name in EXTENSIVE_GAMES:
        return EXTENSIVE_GAMES[name]()
    if name in MATRIX_GAMES:
        return matrix_to_extensive(load_matrix_game(name))
    spec = name[len(OPENSPIEL_PREFIX):] if name.startswith(OPENSPIEL_PREFIX) else name
    if importlib.util.find_spec("pyspiel") is None:
        raise UnknownGameError(f"game: unknown game '{name}'; known: {', '.join(game_names())} "
                               "(install open_spiel for OpenSpiel's games)")
    base = spec.split("(", 1)[0].strip()
    openspiel_names = registered_game_names()
    if base not in openspiel_names:
        close = difflib.get_close_matches(base, game_names() + openspiel_names, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UnknownGameError(f"game: unknown game '{name}'{hint}; known: {', '.join(game_names())}, "
                               "or any OpenSpiel game (pyspiel.registered_names())")
    return OpenSpielGame(spec)
