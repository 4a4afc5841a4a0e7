"""Kuhn poker (Kuhn, 1950, "A simplified two-person poker"; rules as in OpenSpiel's ``kuhn_poker``).

Three cards J < Q < K (0, 1, 2); each player antes 1 and is dealt one card (player 0 first); player 0
passes or bets 1, player 1 passes or bets, player 0 may call a late bet. Actions: 0 = pass (check/fold),
1 = bet (bet/call). Information state: the player's card digit then the public history, e.g. ``"1pb"``.

Tensors (OpenSpiel's ``kuhn_poker`` layouts, float32, for player ``i``):

- ``information_state_tensor`` (11 = 2 + 3 + 3 x 2): one-hot of ``i`` (2), one-hot of ``i``'s card (3), then
  for each of the (at most three) betting moves so far two bits ``[pass, bet]`` (zeros for moves not made);
- ``observation_tensor`` (7 = 2 + 3 + 2): one-hot of ``i`` (2), one-hot of ``i``'s card (3), each player's
  contribution to the pot, antes included (2).

A player who has no card yet has zeros in the card block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedarena.envs.efg import CHANCE, TERMINAL, Game, State

PASS, BET = 0, 1
_LETTER = {PASS: "p", BET: "b"}
_TERMINAL_BETTING = {"pp", "bp", "bb", "pbp", "pbb"}
INFORMATION_STATE_TENSOR_SIZE = 11
OBSERVATION_TENSOR_SIZE = 7


class KuhnState(State):
    def __init__(self) -> None:
        self._cards: list[int] = []
        self._bets: list[int] = []

    def _betting(self) -> str:
        return "".join(_LETTER[a] for a in self._bets)

    def current_player(self) -> int:
        if len(self._cards) < 2:
            return CHANCE
        if self._betting() in _TERMINAL_BETTING:
            return TERMINAL
        return len(self._bets) % 2

    def legal_actions(self) -> list[int]:
        p = self.current_player()
        if p == TERMINAL:
            return []
        if p == CHANCE:
            return [a for a, _ in self.chance_outcomes()]
        return [PASS, BET]

    def chance_outcomes(self) -> list[tuple[int, float]]:
        if self.current_player() != CHANCE:
            return []
        rest = [c for c in range(3) if c not in self._cards]
        return [(c, 1.0 / len(rest)) for c in rest]

    def _apply(self, action: int) -> None:
        if len(self._cards) < 2:
            self._cards.append(action)
        else:
            self._bets.append(action)

    def information_state_string(self, player: int | None = None) -> str:
        if player is None:
            player = self.current_player()
        if player not in (0, 1):
            raise ValueError(f"player: expected 0 or 1, got {player}")
        if len(self._cards) <= player:
            raise ValueError(f"player {player} has no card yet at history {self.history()}")
        return f"{self._cards[player]}{self._betting()}"

    def _tensor_head(self, player: int | None, size: int) -> tuple[int, np.ndarray]:
        if player is None:
            player = self.current_player()
        if player not in (0, 1):
            raise ValueError(f"player: expected 0 or 1, got {player}")
        t = np.zeros(size, dtype=np.float32)
        t[player] = 1.0
        if len(self._cards) > player:
            t[2 + self._cards[player]] = 1.0
        return player, t

    def information_state_tensor(self, player: int | None = None) -> np.ndarray:
        """OpenSpiel's layout (see the module docstring), shape ``(11,)``."""
        _, t = self._tensor_head(player, INFORMATION_STATE_TENSOR_SIZE)
        for k, a in enumerate(self._bets):
            t[5 + 2 * k + a] = 1.0
        return t

    def observation_tensor(self, player: int | None = None) -> np.ndarray:
        """OpenSpiel's layout (see the module docstring), shape ``(7,)``."""
        _, t = self._tensor_head(player, OBSERVATION_TENSOR_SIZE)
        pot = [1.0, 1.0]
        for k, a in enumerate(self._bets):
            pot[k % 2] += a
        t[5:7] = pot
        return t

    def returns(self) -> np.ndarray:
        betting = self._betting()
        if betting not in _TERMINAL_BETTING:
            return np.zeros(2)
        if betting == "bp":
            return np.array([1.0, -1.0])
        if betting == "pbp":
            return np.array([-1.0, 1.0])
        stake = 2.0 if "bb" in betting else 1.0
        winner = 0 if self._cards[0] > self._cards[1] else 1
        return np.array([stake, -stake]) if winner == 0 else np.array([-stake, stake])

    def clone(self) -> "KuhnState":
        c = KuhnState()
        c._cards = list(self._cards)
        c._bets = list(self._bets)
        return c

    def history(self) -> list[int]:
        return self._cards + self._bets


@dataclass(frozen=True)
class KuhnPoker(Game):
    name: str = "kuhn_poker"
    num_players: int = 2
    num_distinct_actions: int = 2
    information_state_tensor_shape: tuple[int, ...] = (INFORMATION_STATE_TENSOR_SIZE,)
    observation_tensor_shape: tuple[int, ...] = (OBSERVATION_TENSOR_SIZE,)

    def new_initial_state(self) -> KuhnState:
        return KuhnState()

    def action_name(self, action: int) -> str:
        return {PASS: "pass", BET: "bet"}[action]
