"""Numpy-batched tic-tac-toe and connect four: ``N`` boards stepped together, rules, observations, legal-action
masks and rewards equal to PettingZoo's ``tictactoe_v3`` and ``connect_four_v3`` (tested move by move against them).

Each seat's stones are one ``uint64`` bitboard per board. Tic-tac-toe uses bit ``i`` for PettingZoo's square
``i`` and tests the 8 winning lines as masks. Connect four uses the usual 7-bits-per-column layout (Tromp's
bitboard: bit ``7 c + h`` is column ``c``, height ``h`` from the bottom, row 6 of every column a sentinel left
empty), so four in a row along direction ``s`` (1 vertical, 7 horizontal, 6 and 8 the diagonals) is
``m = b & (b >> s); m & (m >> 2 s) != 0``. Observations are built from the bitboards by one table of bit
positions per cell, from the mover's view as PettingZoo gives them (plane 0 the mover's stones, plane 1 the
opponent's), as float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GAMES = ("tictactoe", "connect_four")

TICTACTOE_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
C4_ROWS, C4_COLS = 6, 7
C4_SHIFTS = (1, 7, 6, 8)  # vertical, horizontal, the two diagonals in the 7-bit-column layout
PASS = -1  # the action that leaves a board untouched in BoardGameBatch.step


@dataclass(frozen=True)
class GameSpec:
    """A game's geometry: observation shape (H, W, 2), actions, and the bit of every cell (H * W,)."""

    name: str
    observation_shape: tuple[int, int, int]
    num_actions: int
    cell_bits: np.ndarray  # (H*W,) uint64: bit position of cell (r, c) in row-major order
    full: int              # bitboard of a full board


def _spec(game: str) -> GameSpec:
    if game == "tictactoe":
        return GameSpec(game, (3, 3, 2), 9, np.arange(9, dtype=np.uint64), (1 << 9) - 1)
    if game == "connect_four":
        # PettingZoo row r counts from the top; bitboard height 5 - r
        bits = np.array([7 * c + (C4_ROWS - 1 - r) for r in range(C4_ROWS) for c in range(C4_COLS)], dtype=np.uint64)
        full = sum(((1 << C4_ROWS) - 1) << (7 * c) for c in range(C4_COLS))
        return GameSpec(game, (C4_ROWS, C4_COLS, 2), C4_COLS, bits, full)
    raise ValueError(f"game: expected one of {', '.join(GAMES)}, got {game!r}")


_TTT_MASKS = np.array([sum(1 << i for i in line) for line in TICTACTOE_LINES], dtype=np.uint64)
_ONE = np.uint64(1)


def tictactoe_won(b: np.ndarray) -> np.ndarray:
    """(N,) bool: the bitboards ``b`` (N,) uint64 hold a complete tic-tac-toe line."""
    return ((b[:, None] & _TTT_MASKS[None, :]) == _TTT_MASKS[None, :]).any(axis=1)


def connect_four_won(b: np.ndarray) -> np.ndarray:
    """(N,) bool: the bitboards ``b`` (N,) uint64 (7-bit-column layout) hold four in a row."""
    won = np.zeros(b.shape, dtype=bool)
    for s in C4_SHIFTS:
        m = b & (b >> np.uint64(s))
        won |= (m & (m >> np.uint64(2 * s))) != 0
    return won


class BoardGameBatch:
    """``num_envs`` boards of ``game`` ("tictactoe" | "connect_four"), seat 0 moving first in every game.

    :meth:`reset` returns ``(obs, mask, to_play)``: obs (N, *observation_shape) float32 from the mover's view,
    mask (N, num_actions) bool, to_play (N,) int. :meth:`step` plays one move on every board and returns
    ``(obs, mask, to_play, rewards, done)``; rewards (N, 2) float32 hold the final result (+1 win, -1 loss,
    0 draw) for seats 0 and 1 of games that ended with this move and 0 elsewhere; finished boards are reset
    in place, so their obs/mask/to_play are those of the new game; a board given ``PASS`` (-1) is left as it is.
    ``moves`` counts the moves played, summed over boards. The games are deterministic: ``seed`` is
    accepted for the batched-env signature and draws nothing.
    """

    def __init__(self, game: str, num_envs: int, seed: int | None = None) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs: must be >= 1, got {num_envs}")
        self.spec = _spec(game)
        self.game = game
        self.num_envs = int(num_envs)
        self.num_actions = self.spec.num_actions
        self.observation_shape = self.spec.observation_shape
        self.seed = seed
        n = self.num_envs
        self.stones = np.zeros((n, 2), dtype=np.uint64)  # per seat
        self.to_play = np.zeros(n, dtype=np.int64)
        self.heights = np.zeros((n, C4_COLS), dtype=np.int64)  # connect four only
        self._rows = np.arange(n)
        self.moves = 0  # moves played so far, summed over boards (the env steps of throughput counts)
        self._won = tictactoe_won if game == "tictactoe" else connect_four_won
        self._full = np.uint64(self.spec.full)

    # -- views
    def occupied(self) -> np.ndarray:
        return self.stones[:, 0] | self.stones[:, 1]

    def legal_mask(self) -> np.ndarray:
        if self.game == "tictactoe":
            occ = self.occupied()
            return ((occ[:, None] >> self.spec.cell_bits[None, :9]) & _ONE) == 0
        return self.heights < C4_ROWS

    def observe(self) -> np.ndarray:
        """(N, H, W, 2) float32: plane 0 the mover's stones, plane 1 the opponent's (PettingZoo's layout)."""
        mine = self.stones[self._rows, self.to_play]
        theirs = self.stones[self._rows, 1 - self.to_play]
        bits = self.spec.cell_bits[None, :]
        h, w, _ = self.observation_shape
        obs = np.empty((self.num_envs, h * w, 2), dtype=np.float32)
        obs[:, :, 0] = (mine[:, None] >> bits) & _ONE
        obs[:, :, 1] = (theirs[:, None] >> bits) & _ONE
        return obs.reshape((self.num_envs, h, w, 2))

    def _state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.observe(), self.legal_mask(), self.to_play.copy()

    # -- dynamics
    def reset(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.stones[:] = 0
        self.to_play[:] = 0
        self.heights[:] = 0
        return self._state()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Play ``actions[i]`` on board ``i``; a negative action (``PASS``) leaves that board untouched (a board
        with no game to play: its obs/mask/to_play stay, its reward is 0 and done False, no move is counted)."""
        a = np.asarray(actions)
        if a.shape != (self.num_envs,) or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"actions: expected ({self.num_envs},) integers, got {a.shape} {a.dtype}")
        a = a.astype(np.int64)
        if (a >= self.num_actions).any():
            raise ValueError(f"actions: out of range [0, {self.num_actions}) on boards "
                             f"{np.flatnonzero(a >= self.num_actions)[:8].tolist()}")
        rows = self._rows if (a >= 0).all() else np.flatnonzero(a >= 0)
        a = a[rows]
        legal = self.legal_mask()[rows, a]
        if not legal.all():
            raise ValueError(f"actions: illegal move on boards {rows[~legal][:8].tolist()}")
        seat = self.to_play[rows]
        self.moves += len(rows)
        if self.game == "tictactoe":
            bit = _ONE << a.astype(np.uint64)
        else:
            bit = _ONE << (7 * a + self.heights[rows, a]).astype(np.uint64)
            self.heights[rows, a] += 1
        self.stones[rows, seat] |= bit
        won = self._won(self.stones[rows, seat])
        ended = won | ((self.stones[rows, 0] | self.stones[rows, 1]) == self._full)
        rewards = np.zeros((self.num_envs, 2), dtype=np.float32)
        sign = won.astype(np.float32)
        rewards[rows, seat] = sign
        rewards[rows, 1 - seat] = -sign
        self.to_play[rows] = 1 - seat
        done = np.zeros(self.num_envs, dtype=bool)
        done[rows] = ended
        if ended.any():
            self.stones[done] = 0
            self.heights[done] = 0
            self.to_play[done] = 0
        obs, mask, to_play = self._state()
        return obs, mask, to_play, rewards, done


__all__ = ["BoardGameBatch", "GAMES", "PASS", "GameSpec", "connect_four_won", "tictactoe_won"]
