"""BoardGameBatch against PettingZoo's tictactoe_v3 / connect_four_v3: random games played move by move in both,
observations, masks, movers, rewards and terminations compared at every step."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.classic import connect_four_v3, tictactoe_v3

from fedarena.envs.boardgames import BoardGameBatch, connect_four_won, tictactoe_won

MAKERS = {"tictactoe": tictactoe_v3.env, "connect_four": connect_four_v3.env}


@pytest.mark.parametrize("game,steps", [("tictactoe", 400), ("connect_four", 500)])
def test_matches_pettingzoo_move_by_move(game: str, steps: int) -> None:
    n = 6
    rng = np.random.default_rng(1)
    batch = BoardGameBatch(game, n)
    envs = [MAKERS[game]() for _ in range(n)]
    for e in envs:
        e.reset(seed=0)
    obs, mask, to_play = batch.reset()
    finished = 0
    for _ in range(steps):
        actions = np.zeros(n, dtype=np.int64)
        for i, e in enumerate(envs):
            agent = e.agent_selection
            o = e.observe(agent)
            assert to_play[i] == e.agents.index(agent)
            np.testing.assert_array_equal(obs[i], o["observation"].astype(np.float32))
            np.testing.assert_array_equal(mask[i], o["action_mask"].astype(bool))
            actions[i] = rng.choice(np.flatnonzero(o["action_mask"]))
        obs, mask, to_play, rewards, done = batch.step(actions)
        for i, e in enumerate(envs):
            e.step(int(actions[i]))
            ended = all(e.terminations.values())
            assert done[i] == ended
            expect = [e.rewards[a] for a in e.possible_agents] if ended else [0, 0]
            np.testing.assert_array_equal(rewards[i], np.asarray(expect, dtype=np.float32))
            if ended:
                finished += 1
                e.reset(seed=0)
    assert finished > 3 * n  # many complete games, wins for both seats and (tic-tac-toe) draws among them


def test_illegal_and_malformed_moves_are_rejected() -> None:
    b = BoardGameBatch("connect_four", 2)
    b.reset()
    for _ in range(6):
        b.step(np.array([3, 0]))
    with pytest.raises(ValueError, match="illegal move on boards \\[0\\]"):
        b.step(np.array([3, 1]))
    with pytest.raises(ValueError, match="out of range"):
        b.step(np.array([7, 1]))
    with pytest.raises(ValueError, match="expected \\(2,\\) integers"):
        b.step(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="game: expected one of"):
        BoardGameBatch("chess", 1)


def _brute_force_c4(board: np.ndarray) -> bool:
    for r in range(6):
        for c in range(7):
            for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
                cells = [(r + k * dr, c + k * dc) for k in range(4)]
                if all(0 <= y < 6 and 0 <= x < 7 and board[y, x] for y, x in cells):
                    return True
    return False


def test_win_detection_equals_brute_force_on_random_stone_sets() -> None:
    rng = np.random.default_rng(2)
    boards = rng.random((3000, 6, 7)) < 0.3  # row 0 = bottom here; any stone set, gravity not needed
    bits = np.zeros(len(boards), dtype=np.uint64)
    for r in range(6):
        for c in range(7):
            bits |= boards[:, r, c].astype(np.uint64) << np.uint64(7 * c + r)
    expect = np.array([_brute_force_c4(b) for b in boards])
    assert 0.2 < expect.mean() < 0.9
    np.testing.assert_array_equal(connect_four_won(bits), expect)
    t = rng.random((2000, 9)) < 0.45
    tb = (t.astype(np.uint64) << np.arange(9, dtype=np.uint64)).sum(axis=1).astype(np.uint64)
    lines = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
    np.testing.assert_array_equal(tictactoe_won(tb), [any(row[list(li)].all() for li in lines) for row in t])


def test_pass_leaves_a_board_untouched() -> None:
    b = BoardGameBatch("tictactoe", 3)
    b.reset()
    # board 0 passes from its second step on; board 2's seat 0 completes the top row (0, 1, 2) on the fifth move
    plays = ([4, 4, 0], [-1, 0, 3], [-1, 3, 1], [-1, 8, 4], [-1, 6, 2])
    for a in plays[:2]:
        obs, mask, to_play, rewards, done = b.step(np.array(a))
    assert b.moves == 5
    np.testing.assert_array_equal(to_play, [1, 0, 0])
    np.testing.assert_array_equal(obs[0, 1, 1], [0, 1])  # board 0's mover (seat 1) sees seat 0's centre stone
    assert not done.any() and not rewards.any()
    for a in plays[2:]:
        obs, mask, to_play, rewards, done = b.step(np.array(a))
    np.testing.assert_array_equal(done, [False, False, True])
    np.testing.assert_array_equal(rewards[2], [1.0, -1.0])
    np.testing.assert_array_equal(rewards[:2], 0.0)
    assert b.moves == 11 and to_play[0] == 1 and mask[0].sum() == 8
