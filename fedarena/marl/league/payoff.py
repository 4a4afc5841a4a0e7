"""The league's payoff table: decayed win/draw/loss counts for every ordered pair of players that has played
(Vinyals et al., 2019, pseudocode ``Payoff``).

Each result first multiplies the pair's counts (both directions) by ``decay``, then adds one game, so the
win rate of A against B, ``(wins + draws / 2) / games``, weights recent games more. Pairs that never played
have win rate 0.5. Players are integer ids ``0..n-1`` in the order they joined.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

RESULTS = (1, 0, -1)  # win, draw, loss for the home player


class Payoff:
    def __init__(self, decay: float = 0.99) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay: expected a number in (0, 1], got {decay}")
        self.decay = float(decay)
        self.wins = np.zeros((0, 0))
        self.draws = np.zeros((0, 0))
        self.losses = np.zeros((0, 0))
        self.games = np.zeros((0, 0))
        self.total_games = np.zeros((0, 0), dtype=np.int64)   # undecayed game counts (for "no gap" checks)

    @property
    def num_players(self) -> int:
        return self.games.shape[0]

    def add_player(self) -> int:
        n = self.num_players
        for name in ("wins", "draws", "losses", "games", "total_games"):
            old = getattr(self, name)
            new = np.zeros((n + 1, n + 1), dtype=old.dtype)
            new[:n, :n] = old
            setattr(self, name, new)
        return n

    def _check(self, *ids: int) -> None:
        for i in ids:
            if not 0 <= int(i) < self.num_players:
                raise IndexError(f"player: unknown player id {i} (the table has {self.num_players})")

    def update(self, home: int, away: int, result: int) -> None:
        """Record one game; ``result`` is +1 / 0 / -1 for ``home``."""
        self._check(home, away)
        if result not in RESULTS:
            raise ValueError(f"result: expected +1, 0 or -1, got {result!r}")
        for stats in (self.wins, self.draws, self.losses, self.games):
            stats[home, away] *= self.decay
            stats[away, home] *= self.decay
        self.games[home, away] += 1.0
        self.games[away, home] += 1.0
        self.total_games[home, away] += 1
        self.total_games[away, home] += 1
        if result == 1:
            self.wins[home, away] += 1.0
            self.losses[away, home] += 1.0
        elif result == 0:
            self.draws[home, away] += 1.0
            self.draws[away, home] += 1.0
        else:
            self.wins[away, home] += 1.0
            self.losses[home, away] += 1.0

    def win_rate(self, home: int, away: int) -> float:
        self._check(home, away)
        g = self.games[home, away]
        return 0.5 if g == 0 else float((self.wins[home, away] + 0.5 * self.draws[home, away]) / g)

    def win_rates(self, home: int, away: Sequence[int]) -> np.ndarray:
        """The home player's win rates against each of ``away`` (0.5 where they never played)."""
        return np.array([self.win_rate(home, a) for a in away], dtype=np.float64)

    def matrix(self, ids: Sequence[int] | None = None) -> np.ndarray:
        """``M[i, j]`` = win rate of ``ids[i]`` against ``ids[j]`` (0.5 on unplayed pairs and the diagonal)."""
        ids = list(range(self.num_players)) if ids is None else list(ids)
        idx = np.asarray(ids, dtype=np.int64)
        g = self.games[np.ix_(idx, idx)]
        w = self.wins[np.ix_(idx, idx)] + 0.5 * self.draws[np.ix_(idx, idx)]
        return np.where(g > 0, w / np.where(g > 0, g, 1.0), 0.5)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "wins": self.wins.copy(), "draws": self.draws.copy(),
                "losses": self.losses.copy(), "games": self.games.copy(), "total_games": self.total_games.copy()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Payoff":
        p = cls(float(state["decay"]))
        for name in ("wins", "draws", "losses", "games"):
            setattr(p, name, np.asarray(state[name], dtype=np.float64).copy())
        p.total_games = np.asarray(state["total_games"], dtype=np.int64).copy()
        shapes = {getattr(p, n).shape for n in ("wins", "draws", "losses", "games", "total_games")}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2 or next(iter(shapes))[0] != next(iter(shapes))[1]:
            raise ValueError(f"payoff: state arrays must be square and of one shape, got {sorted(shapes)}")
        return p
