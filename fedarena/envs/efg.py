"""The extensive-form game API: histories with a player to move (or chance), legal actions, information states.

Follows the standard definition of a finite extensive-form game with imperfect information and chance
(Shoham & Leyton-Brown, *Multiagent Systems*, sec. 5.2; Osborne & Rubinstein, ch. 11): a state is a
history; at each non-terminal history either chance moves with known probabilities or one player acts;
a player cannot tell apart the histories of one information state, named by a string.
Actions are integers ``0 .. num_distinct_actions - 1``; chance outcomes are integers too.
"""

from __future__ import annotations

import abc
from typing import Sequence

import numpy as np

CHANCE = -1
"""``current_player()`` at a chance node."""
TERMINAL = -4
"""``current_player()`` at a terminal history."""


class IllegalActionError(ValueError):
    """An action that is not legal at the state it was applied to."""


class State(abc.ABC):
    """A history of an extensive-form game. ``apply_action`` mutates it; ``child`` and ``clone`` copy."""

    # --- what subclasses provide
    @abc.abstractmethod
    def current_player(self) -> int:
        """The player to act, :data:`CHANCE` at chance nodes, :data:`TERMINAL` at terminal histories."""

    @abc.abstractmethod
    def legal_actions(self) -> list[int]:
        """Legal actions of the player to act, ascending (chance outcomes at chance nodes; empty at terminals)."""

    @abc.abstractmethod
    def chance_outcomes(self) -> list[tuple[int, float]]:
        """``(outcome, probability)`` pairs at a chance node; the probabilities sum to one."""

    @abc.abstractmethod
    def _apply(self, action: int) -> None:
        """Advance the history by a legal action (already checked)."""

    @abc.abstractmethod
    def information_state_string(self, player: int | None = None) -> str:
        """What ``player`` (default: the player to act) knows at this history, as a string."""

    @abc.abstractmethod
    def returns(self) -> np.ndarray:
        """Each player's payoff at a terminal history (zeros before the end)."""

    @abc.abstractmethod
    def clone(self) -> "State":
        """An independent copy."""

    @abc.abstractmethod
    def history(self) -> list[int]:
        """The actions and chance outcomes played so far."""

    # --- shared behaviour
    def is_terminal(self) -> bool:
        return self.current_player() == TERMINAL

    def is_chance_node(self) -> bool:
        return self.current_player() == CHANCE

    def apply_action(self, action: int) -> None:
        """Apply ``action``; an action that is not legal here raises :class:`IllegalActionError`."""
        if self.is_terminal():
            raise IllegalActionError(f"action {action}: the game is over at history {self.history()}")
        legal = self.legal_actions()
        if action not in legal:
            raise IllegalActionError(f"action {action}: not legal at history {self.history()}; legal: {legal}")
        self._apply(int(action))

    def child(self, action: int) -> "State":
        """A copy of this state with ``action`` applied."""
        c = self.clone()
        c.apply_action(action)
        return c

    def __str__(self) -> str:
        return f"{type(self).__name__}(history={self.history()})"


class Game(abc.ABC):
    """A finite extensive-form game: its players, actions and initial state."""

    name: str
    num_players: int
    num_distinct_actions: int

    @abc.abstractmethod
    def new_initial_state(self) -> State:
        """The empty history."""

    def action_name(self, action: int) -> str:
        return str(action)

    @property
    def is_zero_sum(self) -> bool:
        return True


def all_histories(game: Game) -> list[State]:
    """Every history of ``game`` in depth-first order (for small games, tests and compilation)."""
    out: list[State] = []
    stack = [game.new_initial_state()]
    while stack:
        s = stack.pop()
        out.append(s)
        if s.is_terminal():
            continue
        actions: Sequence[int] = (
            [a for a, _ in s.chance_outcomes()] if s.is_chance_node() else s.legal_actions()
        )
        for a in reversed(actions):
            stack.append(s.child(a))
    return out
