"""OpenSpiel games as fedarena extensive-form games (optional extra: ``pip install open_spiel``).

:class:`OpenSpielGame` wraps any OpenSpiel game with explicit chance (or none) as a
:class:`fedarena.envs.efg.Game`, so the exact algorithms (exploitability, CFR, XFP, PSRO) and the
PettingZoo adapter run on it. Simultaneous-move games go through OpenSpiel's turn-based conversion
(``pyspiel.convert_to_turn_based``: the players move one after another and a player's information state
does not show the moves of the same round; Lanctot et al., 2019, "OpenSpiel"). Information-state
strings and tensors are OpenSpiel's own, so a tabular policy keyed by them is the same policy in both
libraries. Game parameters are given in OpenSpiel's syntax: ``"liars_dice"``, ``"kuhn_poker(players=3)"``,
``"goofspiel(num_cards=4,imp_info=True,points_order=descending)"``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any, Iterator

import numpy as np

from fedarena.envs.efg import CHANCE, TERMINAL, Game, State


class OpenSpielGameError(KeyError):
    """A game string OpenSpiel cannot load, or a game the adapter cannot represent (one-line message)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it plain
        return str(self.args[0])


def _pyspiel() -> Any:
    try:
        import pyspiel
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise OpenSpielGameError("game: OpenSpiel games need the optional extra open_spiel "
                                 "(pip install open_spiel)") from None
    return pyspiel


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """OpenSpiel's C++ error handler prints ``OpenSpiel exception: ...`` to file descriptor 2 before raising;
    the exception carries the same text, so the print is swallowed to keep CLI errors to one line."""
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        try:
            os.dup2(sink.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def registered_game_names() -> list[str]:
    """The short names OpenSpiel can load (``pyspiel.registered_names()``)."""
    return list(_pyspiel().registered_names())


def load_openspiel(spec: str) -> Any:
    """``pyspiel.load_game(spec)`` (converted to turn-based if simultaneous) with one-line errors."""
    pyspiel = _pyspiel()
    base = spec.split("(", 1)[0].strip()
    if base not in pyspiel.registered_names():
        raise OpenSpielGameError(f"game: '{base}' is neither a fedarena game nor an OpenSpiel game "
                                 "(see pyspiel.registered_names())")
    try:
        with _quiet_stderr():
            game = pyspiel.load_game(spec)
    except pyspiel.SpielError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else "rejected"
        raise OpenSpielGameError(f"game: OpenSpiel cannot load '{spec}': {reason}") from None
    gtype = game.get_type()
    if gtype.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS:
        game = pyspiel.convert_to_turn_based(game)
        gtype = game.get_type()
    if gtype.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        raise OpenSpielGameError(f"game: '{spec}' has {gtype.dynamics} dynamics; only sequential and "
                                 "simultaneous-move games are extensive-form games")
    if gtype.chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC:
        raise OpenSpielGameError(f"game: '{spec}' samples its chance events without listing their "
                                 "probabilities; the extensive form needs explicit chance")
    if not gtype.provides_information_state_string:
        raise OpenSpielGameError(f"game: '{spec}' provides no information-state strings")
    return game


class OpenSpielState(State):
    """A history of an OpenSpiel game (wraps a ``pyspiel.State``)."""

    __slots__ = ("_s",)

    def __init__(self, state: Any) -> None:
        self._s = state

    def current_player(self) -> int:
        if self._s.is_terminal():
            return TERMINAL
        if self._s.is_chance_node():
            return CHANCE
        return int(self._s.current_player())

    def legal_actions(self) -> list[int]:
        if self._s.is_terminal():
            return []
        return list(self._s.legal_actions())

    def chance_outcomes(self) -> list[tuple[int, float]]:
        if not self._s.is_chance_node():
            return []
        return [(int(a), float(p)) for a, p in self._s.chance_outcomes()]

    def _apply(self, action: int) -> None:
        self._s.apply_action(action)

    def child(self, action: int) -> "OpenSpielState":
        c = OpenSpielState(self._s.clone())
        c.apply_action(action)
        return c

    def information_state_string(self, player: int | None = None) -> str:
        p = self.current_player() if player is None else player
        return self._s.information_state_string(p)

    def information_state_tensor(self, player: int | None = None) -> np.ndarray:
        p = self.current_player() if player is None else player
        return np.asarray(self._s.information_state_tensor(p), dtype=np.float32)

    def observation_tensor(self, player: int | None = None) -> np.ndarray:
        p = self.current_player() if player is None else player
        return np.asarray(self._s.observation_tensor(p), dtype=np.float32)

    def returns(self) -> np.ndarray:
        return np.asarray(self._s.returns(), dtype=np.float64)

    def clone(self) -> "OpenSpielState":
        return OpenSpielState(self._s.clone())

    def history(self) -> list[int]:
        return list(self._s.history())

    @property
    def pyspiel_state(self) -> Any:
        """The wrapped ``pyspiel.State`` (do not mutate it behind this object's back)."""
        return self._s

    def __str__(self) -> str:
        return str(self._s)


class OpenSpielGame(Game):
    """An OpenSpiel game behind the fedarena :class:`~fedarena.envs.efg.Game` API.

    Equal game strings give equal (and equally hashed) games, so the compiled game tree is cached once per
    game string. ``pyspiel_game`` is the (turn-based) OpenSpiel game itself.
    """

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.pyspiel_game = load_openspiel(spec)
        self.name = spec
        self.num_players = int(self.pyspiel_game.num_players())
        self.num_distinct_actions = int(self.pyspiel_game.num_distinct_actions())
        gtype = self.pyspiel_game.get_type()
        self._zero_sum = gtype.utility.name == "ZERO_SUM"
        self._has_tensor = bool(gtype.provides_information_state_tensor)
        self._has_observation = bool(gtype.provides_observation_tensor)
        self._perfect_information = gtype.information == _pyspiel().GameType.Information.PERFECT_INFORMATION

    def new_initial_state(self) -> OpenSpielState:
        return OpenSpielState(self.pyspiel_game.new_initial_state())

    def action_name(self, action: int) -> str:
        s = self.pyspiel_game.new_initial_state()
        player = 0 if s.is_chance_node() else s.current_player()
        return self.pyspiel_game.action_to_string(player, action)

    @property
    def is_zero_sum(self) -> bool:
        return self._zero_sum

    @property
    def perfect_information(self) -> bool:
        """True when every player sees the whole state (OpenSpiel's ``PERFECT_INFORMATION``: chess, tic-tac-toe)."""
        return self._perfect_information

    def information_state_tensor_shape(self) -> tuple[int, ...]:
        """OpenSpiel's information-state tensor shape; raises if the game provides none."""
        if not self._has_tensor:
            raise ValueError(f"game {self.name}: OpenSpiel provides no information-state tensor for it")
        return tuple(self.pyspiel_game.information_state_tensor_shape())

    def observation_tensor_shape(self) -> tuple[int, ...]:
        """OpenSpiel's observation tensor shape; raises if the game provides none."""
        if not self._has_observation:
            raise ValueError(f"game {self.name}: OpenSpiel provides no observation tensor for it")
        return tuple(self.pyspiel_game.observation_tensor_shape())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpenSpielGame) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(("openspiel", self.spec))

    def __repr__(self) -> str:
        return f"OpenSpielGame({self.spec!r})"
