"""Kuhn poker (Kuhn, 1950, "A simplified two-person poker"; rules as in OpenSpiel's ``kuhn_poker``).

Three cards J < Q < K (0, 1, 2); each player antes 1 and is dealt one card (player 0 first); player 0
passes or bets 1, player 1 passes or bets, player 0 may call a late bet. Actions: 0 = pass (check/fold),
1 = bet (bet/call). Information state: the player's card digit then the public history, e.g. ``"1pb"``.

``KuhnPoker(num_players=n)`` is OpenSpiel's n-player generalisation (``kuhn_poker(players=n)``): ``n + 1``
cards, players act in turn; if all pass the highest card wins the antes; after the first bet every other
player acts once more (bet = call, pass = fold) and the highest card among the bettors wins the pot.

Tensors (OpenSpiel's ``kuhn_poker`` layouts, float32, for player ``i`` of ``n``; sizes for ``n = 2``):

- ``information_state_tensor`` (``n + (n + 1) + 2 (2n - 1)`` = 11): one-hot of ``i`` (n), one-hot of ``i``'s
  card (n + 1), then for each of the (at most 2n - 1) betting moves so far two bits ``[pass, bet]`` (zeros
  for moves not made);
- ``observation_tensor`` (``n + (n + 1) + n`` = 7): one-hot of ``i``, one-hot of ``i``'s card, each player's
  contribution to the pot, antes included.

A player who has no card yet has zeros in the card block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedarena.envs.efg import CHANCE, TERMINAL, Game, State

PASS, BET = 0, 1
_LETTER = {PASS: "p", BET: "b"}
INFORMATION_STATE_TENSOR_SIZE = 11
"""For two players."""
OBSERVATION_TENSOR_SIZE = 7
"""For two players."""


class KuhnState(State):
    def __init__(self, num_players: int = 2) -> None:
        self._n = num_players
        self._cards: list[int] = []
        self._bets: list[int] = []

    def _betting(self) -> str:
        return "".join(_LETTER[a] for a in self._bets)

    def _over(self) -> bool:
        n, bets = self._n, self._bets
        if BET in bets:
            return len(bets) >= bets.index(BET) + n
        return len(bets) == n

    def current_player(self) -> int:
        if len(self._cards) < self._n:
            return CHANCE
        if self._over():
            return TERMINAL
        return len(self._bets) % self._n

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
        rest = [c for c in range(self._n + 1) if c not in self._cards]
        return [(c, 1.0 / len(rest)) for c in rest]

    def _apply(self, action: int) -> None:
        if len(self._cards) < self._n:
            self._cards.append(action)
        else:
            self._bets.append(action)

    def _check_player(self, player: int | None) -> int:
        if player is None:
            player = self.current_player()
        if not 0 <= player < self._n:
            raise ValueError(f"player: expected 0..{self._n - 1}, got {player}")
        return player

    def information_state_string(self, player: int | None = None) -> str:
        player = self._check_player(player)
        if len(self._cards) <= player:
            raise ValueError(f"player {player} has no card yet at history {self.history()}")
        return f"{self._cards[player]}{self._betting()}"

    def _contributions(self) -> np.ndarray:
        pot = np.ones(self._n)
        for k, a in enumerate(self._bets):
            pot[k % self._n] += a
        return pot

    def _tensor_head(self, player: int | None, size: int) -> np.ndarray:
        player = self._check_player(player)
        t = np.zeros(size, dtype=np.float32)
        t[player] = 1.0
        if len(self._cards) > player:
            t[self._n + self._cards[player]] = 1.0
        return t

    def information_state_tensor(self, player: int | None = None) -> np.ndarray:
        """OpenSpiel's layout (see the module docstring), shape ``(11,)`` for two players."""
        n = self._n
        t = self._tensor_head(player, n + (n + 1) + 2 * (2 * n - 1))
        for k, a in enumerate(self._bets):
            t[2 * n + 1 + 2 * k + a] = 1.0
        return t

    def observation_tensor(self, player: int | None = None) -> np.ndarray:
        """OpenSpiel's layout (see the module docstring), shape ``(7,)`` for two players."""
        n = self._n
        t = self._tensor_head(player, 3 * n + 1)
        t[2 * n + 1:] = self._contributions()
        return t

    def returns(self) -> np.ndarray:
        n = self._n
        if len(self._cards) < n or not self._over():
            return np.zeros(n)
        contrib = self._contributions()
        if BET in self._bets:
            first = self._bets.index(BET)
            in_pot = {(first + k) % n for k in range(n) if self._bets[first + k] == BET}
        else:
            in_pot = set(range(n))
        winner = max(in_pot, key=lambda p: self._cards[p])
        out = -contrib
        out[winner] += contrib.sum()
        return out

    def clone(self) -> "KuhnState":
        c = KuhnState(self._n)
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

    def __post_init__(self) -> None:
        if not isinstance(self.num_players, int) or self.num_players < 2:
            raise ValueError(f"num_players: Kuhn poker needs at least 2 players, got {self.num_players!r}")
        if self.num_players != 2 and self.name == "kuhn_poker":
            object.__setattr__(self, "name", f"kuhn_poker(players={self.num_players})")

    def information_state_tensor_shape(self) -> tuple[int, ...]:
        """OpenSpiel's shape (a method, as ``pyspiel.Game.information_state_tensor_shape``)."""
        n = self.num_players
        return (n + (n + 1) + 2 * (2 * n - 1),)

    def observation_tensor_shape(self) -> tuple[int, ...]:
        return (3 * self.num_players + 1,)

    def new_initial_state(self) -> KuhnState:
        return KuhnState(self.num_players)

    def action_name(self, action: int) -> str:
        return {PASS: "pass", BET: "bet"}[action]
