"""Leduc hold'em poker (Southey et al., 2005, "Bayes' bluff: opponent modelling in poker"; rules as in
OpenSpiel's ``leduc_poker``).

Six cards: ranks J < Q < K in two suits (card ``c`` has rank ``c // 2``). Each player antes 1 and gets
one private card (player 0 first). Two betting rounds, player 0 opening each; raises are 2 in the first
round and 4 in the second, at most two raises per round. A public card is dealt between the rounds. At
showdown a player whose card pairs the public card wins, else the higher rank wins; equal ranks split.
Actions: 0 = fold (only when facing a raise), 1 = call/check, 2 = raise.
Information state: ``"<card>:<round-1 bets>"`` and, in round two, ``"/<public card>:<round-2 bets>"``,
with cards named rank + suit (``Js``, ``Jh``, ``Qs``, ...) and bets ``f``/``c``/``r``, e.g. ``"Kh:rc/Js:cr"``.

Tensors (OpenSpiel's ``leduc_poker`` layouts for two players, float32, for player ``i``):

- ``information_state_tensor`` (30 = 2 + 6 + 6 + 2 x 4 x 2): one-hot of ``i`` (2), one-hot of ``i``'s card
  (6), one-hot of the public card (6, zeros before it is dealt), then per round four move slots of two bits
  ``[call, raise]`` (a round has at most four moves that do not end the game; a fold ends it and is never
  seen in an information state);
- ``observation_tensor`` (16 = 2 + 6 + 6 + 2): one-hot of ``i``, of ``i``'s card, of the public card, then
  each player's contribution to the pot, antes included.

A player who has no card yet has zeros in the private-card block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedarena.envs.efg import CHANCE, TERMINAL, Game, State

FOLD, CALL, RAISE = 0, 1, 2
_LETTER = {FOLD: "f", CALL: "c", RAISE: "r"}
_RAISE_SIZE = (2, 4)
_MAX_RAISES = 2
NUM_CARDS = 6
_ROUND_SLOTS = 4
INFORMATION_STATE_TENSOR_SIZE = 2 + 2 * NUM_CARDS + 2 * _ROUND_SLOTS * 2
OBSERVATION_TENSOR_SIZE = 2 + 2 * NUM_CARDS + 2


def card_name(card: int) -> str:
    return "JQK"[card // 2] + "sh"[card % 2]


class LeducState(State):
    def __init__(self) -> None:
        self._cards: list[int] = []          # private 0, private 1, then the public card
        self._rounds: list[list[int]] = [[]]
        self._contrib = [1, 1]
        self._folded: int | None = None

    # -- bookkeeping
    def _round_over(self, bets: list[int]) -> bool:
        return len(bets) >= 2 and bets[-1] == CALL

    def current_player(self) -> int:
        if self._folded is not None:
            return TERMINAL
        if len(self._cards) < 2:
            return CHANCE
        bets = self._rounds[-1]
        if self._round_over(bets):
            if len(self._rounds) == 2:
                return TERMINAL
            return CHANCE  # the public card; __apply opens round two
        return len(bets) % 2

    def legal_actions(self) -> list[int]:
        p = self.current_player()
        if p == TERMINAL:
            return []
        if p == CHANCE:
            return [a for a, _ in self.chance_outcomes()]
        bets = self._rounds[-1]
        actions = []
        if self._contrib[p] < self._contrib[1 - p]:
            actions.append(FOLD)
        actions.append(CALL)
        if bets.count(RAISE) < _MAX_RAISES:
            actions.append(RAISE)
        return actions

    def chance_outcomes(self) -> list[tuple[int, float]]:
        if self.current_player() != CHANCE:
            return []
        rest = [c for c in range(NUM_CARDS) if c not in self._cards]
        return [(c, 1.0 / len(rest)) for c in rest]

    def _apply(self, action: int) -> None:
        if self.current_player() == CHANCE:
            self._cards.append(action)
            if len(self._cards) == 3:
                self._rounds.append([])
            return
        p = self.current_player()
        if action == FOLD:
            self._folded = p
        elif action == CALL:
            self._contrib[p] = self._contrib[1 - p]
        else:
            self._contrib[p] = self._contrib[1 - p] + _RAISE_SIZE[len(self._rounds) - 1]
        self._rounds[-1].append(action)

    # -- observations and payoffs
    def information_state_string(self, player: int | None = None) -> str:
        if player is None:
            player = self.current_player()
        if player not in (0, 1):
            raise ValueError(f"player: expected 0 or 1, got {player}")
        if len(self._cards) <= player:
            raise ValueError(f"player {player} has no card yet at history {self.history()}")
        text = card_name(self._cards[player]) + ":" + "".join(_LETTER[a] for a in self._rounds[0])
        if len(self._cards) == 3:
            text += "/" + card_name(self._cards[2]) + ":" + "".join(_LETTER[a] for a in self._rounds[1])
        return text

    def _tensor_head(self, player: int | None, size: int) -> np.ndarray:
        if player is None:
            player = self.current_player()
        if player not in (0, 1):
            raise ValueError(f"player: expected 0 or 1, got {player}")
        t = np.zeros(size, dtype=np.float32)
        t[player] = 1.0
        if len(self._cards) > player:
            t[2 + self._cards[player]] = 1.0
        if len(self._cards) == 3:
            t[2 + NUM_CARDS + self._cards[2]] = 1.0
        return t

    def information_state_tensor(self, player: int | None = None) -> np.ndarray:
        """OpenSpiel's layout (see the module docstring), shape ``(30,)``."""
        t = self._tensor_head(player, INFORMATION_STATE_TENSOR_SIZE)
        base = 2 + 2 * NUM_CARDS
        for r, bets in enumerate(self._rounds):
            for k, a in enumerate(bets):
                if a != FOLD:
                    t[base + r * 2 * _ROUND_SLOTS + 2 * k + (a == RAISE)] = 1.0
        return t

    def observation_tensor(self, player: int | None = None) -> np.ndarray:
        """OpenSpiel's layout (see the module docstring), shape ``(16,)``."""
        t = self._tensor_head(player, OBSERVATION_TENSOR_SIZE)
        t[2 + 2 * NUM_CARDS:] = self._contrib
        return t

    def returns(self) -> np.ndarray:
        if self.current_player() != TERMINAL:
            return np.zeros(2)
        if self._folded is not None:
            loser = self._folded
        else:
            public = self._cards[2] // 2
            ranks = [self._cards[0] // 2, self._cards[1] // 2]
            score = [(r == public) * 10 + r for r in ranks]
            if score[0] == score[1]:
                return np.zeros(2)
            loser = 0 if score[0] < score[1] else 1
        out = np.zeros(2)
        out[loser] = -self._contrib[loser]
        out[1 - loser] = self._contrib[loser]
        return out

    def clone(self) -> "LeducState":
        c = LeducState()
        c._cards = list(self._cards)
        c._rounds = [list(r) for r in self._rounds]
        c._contrib = list(self._contrib)
        c._folded = self._folded
        return c

    def history(self) -> list[int]:
        h = self._cards[:2] + list(self._rounds[0])
        if len(self._cards) == 3:
            h += [self._cards[2]] + list(self._rounds[1])
        return h


@dataclass(frozen=True)
class LeducPoker(Game):
    name: str = "leduc_poker"
    num_players: int = 2
    num_distinct_actions: int = 3
    def information_state_tensor_shape(self) -> tuple[int, ...]:
        """OpenSpiel's shape (a method, as ``pyspiel.Game.information_state_tensor_shape``)."""
        return (INFORMATION_STATE_TENSOR_SIZE,)

    def observation_tensor_shape(self) -> tuple[int, ...]:
        return (OBSERVATION_TENSOR_SIZE,)

    def new_initial_state(self) -> LeducState:
        return LeducState()

    def action_name(self, action: int) -> str:
        return {FOLD: "fold", CALL: "call", RAISE: "raise"}[action]
