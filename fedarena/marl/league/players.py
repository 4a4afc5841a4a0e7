"""Scripted reference players for the board games, batched: ``player(obs, mask, rng) -> actions``, and
:func:`evaluate`, a learner's win/draw/loss record against one of them (or against parameters) from both seats.

- :func:`random_player`: uniform over the legal moves.
- :func:`minimax_player`: perfect tic-tac-toe, uniform among the optimal moves. All 5,478 positions reachable
  from the empty board are solved once by negamax (game values +1/0/-1 from the mover's view, no depth
  preference) into a table indexed by the base-3 code of the board (0 empty, 1 mover's, 2 opponent's).
- :func:`one_ply_player`: connect four with one ply of lookahead: win now if possible, else block a column where
  the opponent would win next, else uniform over the legal moves (uniform within each of those sets).
- :func:`two_ply_player`: connect four, one-ply's wins and blocks plus avoiding moves that hand the opponent an
  immediate win, with a preference for the centre (an imitation expert; it beats one-ply in about 70% of games).

Every player also gives ``probs(obs, mask)``, its move distribution, so imitation can fit it exactly.
Observations are those of :class:`~fedarena.envs.boardgames.BoardGameBatch` (mover's plane first).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Protocol

import numpy as np

from fedarena.envs.boardgames import BoardGameBatch, C4_COLS, C4_ROWS, connect_four_won, tictactoe_won
from fedarena.marl.league.agent import play


class ScriptedPlayer(Protocol):
    name: str

    def __call__(self, obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...

    def probs(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray: ...


def _sample(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw per row of the row-stochastic ``p`` (B, A)."""
    u = rng.random((p.shape[0], 1))
    idx = (np.cumsum(p, axis=1) < u * p.sum(axis=1, keepdims=True)).sum(axis=1)
    return np.minimum(idx, p.shape[1] - 1)


def _uniform(sets: np.ndarray) -> np.ndarray:
    sets = sets.astype(np.float64)
    return sets / sets.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class TablePlayer:
    """A scripted player given by its move distribution ``policy(obs, mask) -> probs (B, A)``."""

    name: str
    policy: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def probs(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        mask = np.asarray(mask, dtype=bool)
        if len(mask) and not mask.any(axis=1).all():
            raise ValueError("mask: a row has no legal action")
        return self.policy(np.asarray(obs), mask)

    def __call__(self, obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return _sample(self.probs(obs, mask), rng)


def random_player() -> TablePlayer:
    return TablePlayer("random", lambda obs, mask: _uniform(mask))


# ---------------------------------------------------------------- tic-tac-toe: exact solution

_POW3 = 3 ** np.arange(9, dtype=np.int64)


@dataclass(frozen=True)
class TicTacToeSolution:
    """Negamax values and optimal moves of every tic-tac-toe position, indexed by the base-3 board code."""

    value: np.ndarray        # (3**9,) int8: +1/0/-1 for the mover; 0 for codes that are not reachable
    optimal: np.ndarray      # (3**9, 9) bool: the moves achieving ``value`` (none at terminal positions)
    reachable: np.ndarray    # (3**9,) bool: reachable from the empty board with the mover to play
    terminal: np.ndarray     # (3**9,) bool


def board_code(mine: int, theirs: int) -> int:
    return int(sum(_POW3[i] * (1 if mine >> i & 1 else 2 if theirs >> i & 1 else 0) for i in range(9)))


@lru_cache(maxsize=1)
def tictactoe_solution() -> TicTacToeSolution:
    """Solve tic-tac-toe by negamax with memoisation (computed once per process, then reused)."""
    size = 3 ** 9
    value = np.zeros(size, np.int8)
    optimal = np.zeros((size, 9), bool)
    reachable = np.zeros(size, bool)
    terminal = np.zeros(size, bool)
    seen: dict[tuple[int, int], int] = {}
    full = (1 << 9) - 1

    def won(b: int) -> bool:
        return bool(tictactoe_won(np.array([b], dtype=np.uint64))[0])

    def solve(mine: int, theirs: int) -> int:
        key = (mine, theirs)
        if key in seen:
            return seen[key]
        code = board_code(mine, theirs)
        reachable[code] = True
        if won(theirs) or (mine | theirs) == full:
            v = -1 if won(theirs) else 0
            terminal[code] = True
        else:
            vals = {}
            for a in range(9):
                if not (mine | theirs) >> a & 1:
                    vals[a] = -solve(theirs, mine | 1 << a)
            v = max(vals.values())
            for a, x in vals.items():
                optimal[code, a] = x == v
        value[code] = v
        seen[key] = v
        return v

    solve(0, 0)
    for arr in (value, optimal, reachable, terminal):
        arr.setflags(write=False)
    return TicTacToeSolution(value, optimal, reachable, terminal)


def tictactoe_codes(obs: np.ndarray) -> np.ndarray:
    """Base-3 codes (B,) of tic-tac-toe observations (B, 3, 3, 2) from the mover's view."""
    if np.shape(obs)[1:] != (3, 3, 2):
        raise ValueError(f"obs: expected tic-tac-toe observations (B, 3, 3, 2), got {np.shape(obs)}")
    o = np.asarray(obs).reshape(len(obs), 9, 2)
    return ((o[:, :, 0] > 0.5) * 1 + (o[:, :, 1] > 0.5) * 2) @ _POW3


def minimax_player() -> TablePlayer:
    sol = tictactoe_solution()

    def policy(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        codes = tictactoe_codes(obs)
        bad = ~sol.reachable[codes] | sol.terminal[codes]
        if bad.any():
            raise ValueError(f"obs: rows {np.flatnonzero(bad)[:8].tolist()} are not positions with a move to make")
        return _uniform(sol.optimal[codes])

    return TablePlayer("minimax", policy)


# ---------------------------------------------------------------- connect four: one-ply lookahead

_C4_BITS = np.array([7 * c + (C4_ROWS - 1 - r) for r in range(C4_ROWS) for c in range(C4_COLS)], dtype=np.uint64)


def connect_four_bitboards(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mine, theirs, heights)``: the mover's and opponent's bitboards (7-bit-column layout) and the column
    heights (B, 7) of connect four observations (B, 6, 7, 2)."""
    if np.shape(obs)[1:] != (C4_ROWS, C4_COLS, 2):
        raise ValueError(f"obs: expected connect four observations (B, 6, 7, 2), got {np.shape(obs)}")
    o = np.asarray(obs).reshape(len(obs), C4_ROWS * C4_COLS, 2) > 0.5
    mine = (o[:, :, 0].astype(np.uint64) << _C4_BITS).sum(axis=1, dtype=np.uint64)
    theirs = (o[:, :, 1].astype(np.uint64) << _C4_BITS).sum(axis=1, dtype=np.uint64)
    heights = (o[:, :, 0] | o[:, :, 1]).reshape(len(obs), C4_ROWS, C4_COLS).sum(axis=1)
    return mine, theirs, heights


def winning_moves(stones: np.ndarray, heights: np.ndarray) -> np.ndarray:
    """(B, 7) bool: dropping a stone of ``stones`` in each column completes four in a row."""
    out = np.zeros(heights.shape, bool)
    for c in range(C4_COLS):
        h = heights[:, c]
        ok = h < C4_ROWS
        bit = np.uint64(1) << (7 * c + np.minimum(h, C4_ROWS - 1)).astype(np.uint64)
        out[:, c] = ok & connect_four_won(stones | bit)
    return out


def one_ply_player() -> TablePlayer:
    def policy(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        mine, theirs, heights = connect_four_bitboards(obs)
        win = winning_moves(mine, heights) & mask
        block = winning_moves(theirs, heights) & mask
        choice = np.where(win.any(axis=1, keepdims=True), win, np.where(block.any(axis=1, keepdims=True), block, mask))
        return _uniform(choice)

    return TablePlayer("one_ply", policy)


CENTRE_WEIGHTS = np.array([1.0, 2.0, 3.0, 4.0, 3.0, 2.0, 1.0])  # two_ply: preference for central columns


def unsafe_moves(theirs: np.ndarray, heights: np.ndarray) -> np.ndarray:
    """(B, 7) bool: a stone dropped in the column lets the opponent (``theirs``) win at once on the cell above it."""
    above = np.minimum(heights + 1, C4_ROWS)
    return winning_moves(theirs, above) & (heights + 1 < C4_ROWS)


def two_ply_player() -> TablePlayer:
    """Connect four, two plies: win now, else block, else avoid the columns whose next cell would give the
    opponent an immediate win (unless every legal column does), choosing among the rest with weights 1-2-3-4-3-2-1
    toward the centre. An imitation expert stronger than :func:`one_ply_player`."""

    def policy(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        mine, theirs, heights = connect_four_bitboards(obs)
        win = winning_moves(mine, heights) & mask
        block = winning_moves(theirs, heights) & mask
        safe = mask & ~unsafe_moves(theirs, heights)
        quiet = np.where(safe.any(axis=1, keepdims=True), safe, mask) * CENTRE_WEIGHTS
        w = np.where(win.any(axis=1, keepdims=True), win, np.where(block.any(axis=1, keepdims=True), block, quiet))
        w = w.astype(np.float64)
        return w / w.sum(axis=1, keepdims=True)

    return TablePlayer("two_ply", policy)


# ---------------------------------------------------------------- exact evaluation (tic-tac-toe)

def tictactoe_exact_results(agent: Any, params: dict[str, np.ndarray]) -> dict[str, float]:
    """Exact outcome probabilities of ``agent``'s greedy policy in tic-tac-toe, from each seat, against a uniform
    random player and against :func:`minimax_player` (uniform among optimal moves), by enumerating every game.

    The greedy move of every reachable position is computed in one batch; the game tree is then walked with the
    opponent's move probabilities. Keys: ``{random,minimax}_{win,draw,loss}_seat{0,1}`` and the seat averages
    ``{random,minimax}_{win,draw,loss}``."""
    sol = tictactoe_solution()
    codes = np.flatnonzero(sol.reachable & ~sol.terminal)
    digits = (codes[:, None] // _POW3[None, :]) % 3
    obs = np.stack([digits == 1, digits == 2], axis=-1).reshape(len(codes), 3, 3, 2).astype(np.float32)
    logits, _ = agent.policy(params, obs, digits == 0)
    greedy = dict(zip(codes.tolist(), np.argmax(logits, axis=1).tolist()))
    full = (1 << 9) - 1
    opponents = {"random": lambda code, legal: np.full(len(legal), 1.0 / len(legal)),
                 "minimax": lambda code, legal: _uniform(sol.optimal[code][None, legal])[0]}

    def won(b: int) -> bool:
        return bool(tictactoe_won(np.array([b], dtype=np.uint64))[0])

    out: dict[str, float] = {}
    for name, dist in opponents.items():
        memo: dict[tuple[int, int, bool], np.ndarray] = {}

        def walk(mover: int, other: int, agent_moves: bool) -> np.ndarray:
            """(win, draw, loss) probabilities for the agent; ``mover`` holds the stones of the side to move."""
            key = (mover, other, agent_moves)
            if key in memo:
                return memo[key]
            code = board_code(mover, other)
            legal = [a for a in range(9) if not (mover | other) >> a & 1]
            moves = [(greedy[code], 1.0)] if agent_moves else list(zip(legal, dist(code, legal)))
            total = np.zeros(3)
            for a, p in moves:
                if p == 0:
                    continue
                nxt = mover | 1 << a
                if won(nxt):
                    total += p * (np.array([1.0, 0, 0]) if agent_moves else np.array([0, 0, 1.0]))
                elif (nxt | other) == full:
                    total += p * np.array([0, 1.0, 0])
                else:
                    total += p * walk(other, nxt, not agent_moves)
            memo[key] = total
            return total

        for seat in (0, 1):
            w, d, lo = walk(0, 0, seat == 0)
            out.update({f"{name}_win_seat{seat}": w, f"{name}_draw_seat{seat}": d, f"{name}_loss_seat{seat}": lo})
        for k in ("win", "draw", "loss"):
            out[f"{name}_{k}"] = 0.5 * (out[f"{name}_{k}_seat0"] + out[f"{name}_{k}_seat1"])
    return {k: float(v) for k, v in out.items()}


# ---------------------------------------------------------------- evaluation

def evaluate(agent: Any, params: dict[str, np.ndarray], opponent: Any, game: str, num_games: int, seed: int,
             greedy: bool = True, num_envs: int = 100) -> dict[str, float]:
    """Win/draw/loss counts and rates of ``agent`` with ``params`` (its argmax with ``greedy``) against
    ``opponent`` (a scripted player or parameters) over ``num_games`` games, half from each seat (seat 0 the
    first ``ceil(num_games / 2)``). Also the per-seat counts ``wins_seat0`` ... ``losses_seat1``."""
    rng = np.random.default_rng(seed)
    first = (num_games + 1) // 2
    out: dict[str, float] = {}
    for seat, count in ((0, first), (1, num_games - first)):
        if count == 0:
            r = np.zeros(0)
        else:
            env = BoardGameBatch(game, min(num_envs, count))
            _, results = play(agent, env, params, [opponent], np.ones(1), count, rng, collect=False, greedy=greedy,
                              learner_seats=np.full(count, seat))
            r = np.array([x for _, x in results])
        out.update({f"wins_seat{seat}": float((r > 0).sum()), f"draws_seat{seat}": float((r == 0).sum()),
                    f"losses_seat{seat}": float((r < 0).sum())})
    for k in ("wins", "draws", "losses"):
        out[k] = out[f"{k}_seat0"] + out[f"{k}_seat1"]
    out["games"] = float(num_games)
    out.update(win_rate=out["wins"] / num_games, draw_rate=out["draws"] / num_games,
               loss_rate=out["losses"] / num_games)
    return out


__all__ = ["ScriptedPlayer", "TablePlayer", "TicTacToeSolution", "connect_four_bitboards", "evaluate",
           "minimax_player", "one_ply_player", "random_player", "tictactoe_codes", "tictactoe_exact_results", "tictactoe_solution",
           "two_ply_player", "unsafe_moves", "winning_moves"]
