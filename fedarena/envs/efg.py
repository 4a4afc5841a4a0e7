"""The extensive-form game API: histories with a player to move (or chance), legal actions, information states.

Follows the standard definition of a finite extensive-form game with imperfect information and chance
(Shoham & Leyton-Brown, *Multiagent Systems*, sec. 5.2; Osborne & Rubinstein, ch. 11): a state is a
history; at each non-terminal history either chance moves with known probabilities or one player acts;
a player cannot tell apart the histories of one information state, named by a string.
Actions are integers ``0 .. num_distinct_actions - 1``; chance outcomes are integers too.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass
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


# ----------------------------------------------------------------------------- size bounds

DEFAULT_MAX_TREE_NODES = 1_000_000
"""Histories an exact method may enumerate unless told otherwise. Compiling a tree costs about 0.7 KB per
history (measured on Leduc and liar's dice), so the default keeps a compiled tree under about 1 GB."""

MAX_TREE_NODES_ENV = "FEDARENA_MAX_TREE_NODES"
"""Environment variable that replaces :data:`DEFAULT_MAX_TREE_NODES` (for CLI runs)."""


class TreeTooLargeError(RuntimeError):
    """A game whose tree is above the bound an exact method may enumerate (one-line message: the game, the
    size estimate, the bound and the sampled method to use instead). A user error (CLI exit status 2)."""

    user_error = True


def max_tree_nodes(value: int | None = None) -> int:
    """The bound in force: ``value`` when given, else ``$FEDARENA_MAX_TREE_NODES``, else the default."""
    if value is None:
        raw = os.environ.get(MAX_TREE_NODES_ENV)
        if raw is None:
            return DEFAULT_MAX_TREE_NODES
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{MAX_TREE_NODES_ENV}: expected a whole number of histories, got {raw!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_tree_nodes: expected a positive whole number of histories, got {value!r}")
    return value


@dataclass(frozen=True)
class TreeSizeEstimate:
    """Knuth's estimate of the number of histories; ``lower_bound``: the estimate stopped early, the tree is larger."""

    histories: float
    probes: int           # paths walked
    planned: int          # paths the estimate is the mean of
    lower_bound: bool = False

    def __str__(self) -> str:
        if self.lower_bound:
            return (f"more than {self.histories:.3g} histories (Knuth's estimator, stopped after {self.probes} "
                    f"of {self.planned} probes)")
        return f"{self.histories:.3g} histories (Knuth's estimator, {self.probes} probes)"


def estimate_tree_size(game: Game, probes: int = 1024, seed: int = 0, stop_above: float | None = None
                       ) -> TreeSizeEstimate:
    """Knuth's (1975) unbiased estimate of the number of histories: walk ``probes`` random root-to-leaf paths,
    choosing uniformly among the children at every node (chance nodes too); a path whose branching factors are
    ``b_0, b_1, ...`` estimates ``1 + b_0 + b_0 b_1 + ...``; the estimate is the mean over paths. With
    ``stop_above``, stops as soon as the paths so far prove the mean exceeds it (a lower bound is returned), so
    chess or oshi_zumo are refused after a few plies. Costs ``probes`` playouts, never the tree."""
    rng = np.random.default_rng(seed)
    limit = float("inf") if stop_above is None else float(stop_above) * probes
    total = 0.0
    for k in range(probes):
        s = game.new_initial_state()
        weight, est = 1.0, 1.0
        while not s.is_terminal():
            actions = [a for a, _ in s.chance_outcomes()] if s.is_chance_node() else s.legal_actions()
            weight *= len(actions)
            est += weight
            if total + est > limit:
                return TreeSizeEstimate((total + est) / probes, k + 1, probes, lower_bound=True)
            s._apply(int(actions[int(rng.integers(len(actions)))]))
        total += est
    return TreeSizeEstimate(total / probes, probes, probes)


def tree_too_large(game: Game, size: str, bound: int, method: str, alternative: str) -> TreeTooLargeError:
    """The one-line error of an exact ``method`` refusing ``game``."""
    return TreeTooLargeError(
        f"game {game.name}: {method} enumerates the whole game tree, estimated at {size}, above max_tree_nodes="
        f"{bound:,} (raise it with {MAX_TREE_NODES_ENV}); use {alternative}")


def check_tree_size(game: Game, max_nodes: int | None = None, method: str = "an exact method",
                    alternative: str = "a sampled method instead") -> TreeSizeEstimate:
    """Refuse (:class:`TreeTooLargeError`) a game whose estimated tree is above the bound; returns the estimate."""
    bound = max_tree_nodes(max_nodes)
    est = estimate_tree_size(game, stop_above=bound)
    if est.histories > bound:
        raise tree_too_large(game, str(est), bound, method, alternative)
    return est


def all_histories(game: Game, max_nodes: int | None = None) -> list[State]:
    """Every history of ``game`` in depth-first order (for small games, tests and compilation); more than
    ``max_nodes`` (default :func:`max_tree_nodes`) raises :class:`TreeTooLargeError` before memory runs out."""
    bound = max_tree_nodes(max_nodes)
    out: list[State] = []
    stack = [game.new_initial_state()]
    while stack:
        s = stack.pop()
        out.append(s)
        if len(out) > bound:
            raise tree_too_large(game, f"more than {bound:,} histories (counted)", bound, "all_histories",
                                 "a sampled method instead")
        if s.is_terminal():
            continue
        actions: Sequence[int] = (
            [a for a, _ in s.chance_outcomes()] if s.is_chance_node() else s.legal_actions()
        )
        for a in reversed(actions):
            stack.append(s.child(a))
    return out
