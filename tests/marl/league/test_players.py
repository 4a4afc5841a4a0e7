"""Scripted players: the tic-tac-toe solution against OpenSpiel's alpha-beta search and hand positions, the one-ply
connect-four player against a brute-force scan of the grid, evaluate()'s bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest
import pyspiel
from open_spiel.python.algorithms import minimax

from fedarena import engine
from fedarena.envs.boardgames import BoardGameBatch
from fedarena.marl.league.agent import AgentConfig, BoardAgent
from fedarena.marl.league.players import (evaluate, minimax_player, one_ply_player, random_player, tictactoe_codes,
                                          tictactoe_exact_results, tictactoe_solution, two_ply_player)


@pytest.fixture(autouse=True)
def one_engine_thread():
    """Small batches: the engine's thread pool only adds synchronisation (slow on a loaded machine)."""
    before = engine.get_num_threads()
    engine.set_num_threads(1)
    yield
    engine.set_num_threads(before)


def _ttt_obs(cells: str) -> tuple[np.ndarray, np.ndarray]:
    """cells: 9 chars of 'm' (mover), 't' (opponent), '.' (empty), row-major."""
    o = np.zeros((1, 3, 3, 2), np.float32)
    for i, ch in enumerate(cells):
        if ch != ".":
            o[0, i // 3, i % 3, 0 if ch == "m" else 1] = 1.0
    return o, np.array([[ch == "." for ch in cells]])


def test_solution_counts_and_hand_positions() -> None:
    sol = tictactoe_solution()
    assert sol.reachable.sum() == 5478  # positions reachable from the empty board (the classic count)
    assert sol.value[0] == 0 and sol.optimal[0].all()  # every first move draws under perfect play
    mm = minimax_player()
    # the mover wins at once on the top row; the only optimal move is square 2
    o, m = _ttt_obs("mm.tt....")
    np.testing.assert_array_equal(mm.probs(o, m)[0] > 0, np.eye(9, dtype=bool)[2])
    # the mover must block square 2 (no win of its own); with (4, 7) it then draws
    o, m = _ttt_obs("tt..m..m.")
    np.testing.assert_array_equal(mm.probs(o, m)[0] > 0, np.eye(9, dtype=bool)[2])
    # against a corner opening the second player must take the centre; the edges and corners lose
    o, m = _ttt_obs("t........")
    np.testing.assert_array_equal(mm.probs(o, m)[0] > 0, np.eye(9, dtype=bool)[4])
    # a lost position (two open threats against the mover): values carry no depth preference, every move is optimal
    o, m = _ttt_obs("tt.mt.m..")
    assert sol.value[tictactoe_codes(o)[0]] == -1 and (mm.probs(o, m)[0] > 0).sum() == m.sum()


def test_solution_equals_openspiel_alpha_beta_on_random_positions() -> None:
    sol = tictactoe_solution()
    game = pyspiel.load_game("tic_tac_toe")
    rng = np.random.default_rng(0)
    checked = 0
    while checked < 25:
        state = game.new_initial_state()
        for _ in range(rng.integers(3, 7)):
            if state.is_terminal():
                break
            state.apply_action(int(rng.choice(state.legal_actions())))
        if state.is_terminal():
            continue
        me = state.current_player()
        child_values = {}
        for a in state.legal_actions():
            child = state.clone()
            child.apply_action(a)
            child_values[a] = child.returns()[me] if child.is_terminal() else \
                minimax.alpha_beta_search(game, state=child, maximizing_player_id=me)[0]
        best = max(child_values.values())
        board = np.array(state.observation_tensor(me)).reshape(3, 9)  # planes: empty, o (player 1), x (player 0)
        mine, theirs = board[2 - me], board[1 + me]
        obs = np.stack([mine, theirs], axis=-1).reshape(1, 3, 3, 2)
        code = tictactoe_codes(obs)[0]
        assert sol.value[code] == best
        assert {a for a in range(9) if sol.optimal[code, a]} == {a for a, v in child_values.items() if v == best}
        checked += 1


def _brute_wins(grid: np.ndarray, who: int) -> set[int]:
    """Columns where dropping ``who``'s stone into ``grid`` (6x7, row 0 top, 0 empty) makes four in a row,
    counted cell by cell along the four directions through the new stone."""
    out = set()
    for c in range(7):
        empty = [r for r in range(6) if grid[r, c] == 0]
        if not empty:
            continue
        r = max(empty)
        for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
            run = 1
            for sign in (1, -1):
                y, x = r + sign * dr, c + sign * dc
                while 0 <= y < 6 and 0 <= x < 7 and grid[y, x] == who:
                    run, y, x = run + 1, y + sign * dr, x + sign * dc
            if run >= 4:
                out.add(c)
    return out


def test_one_ply_equals_brute_force_scan() -> None:
    rng = np.random.default_rng(1)
    env = BoardGameBatch("connect_four", 24)
    obs, mask, _ = env.reset()
    player = one_ply_player()
    seen = {"win": 0, "block": 0, "free": 0, "unsafe": 0}
    for _ in range(36):
        probs = player.probs(obs, mask)
        probs2 = two_ply_player().probs(obs, mask)
        for i in range(len(obs)):
            grid = obs[i, :, :, 0] * 1 + obs[i, :, :, 1] * 2
            win, block = _brute_wins(grid, 1), _brute_wins(grid, 2)
            want = win or block or set(np.flatnonzero(mask[i]).tolist())
            seen["win" if win else "block" if block else "free"] += 1
            assert set(np.flatnonzero(probs[i] > 0).tolist()) == want
            np.testing.assert_allclose(probs[i][list(want)], 1.0 / len(want))
            # two_ply: the same wins and blocks, else the columns after which the opponent cannot win at once
            legal = np.flatnonzero(mask[i]).tolist()
            safe = []
            for c in legal:
                g = grid.copy()
                g[max(r for r in range(6) if g[r, c] == 0), c] = 1
                if c not in _brute_wins(g, 2):
                    safe.append(c)
            want2 = win or block or set(safe or legal)
            assert set(np.flatnonzero(probs2[i] > 0).tolist()) == want2
            seen["unsafe"] += not (win or block) and len(safe) < len(legal)
        obs, mask, *_ = env.step(random_player()(obs, mask, rng))
    assert min(seen.values()) > 10


def test_players_sample_legal_moves_from_their_distribution() -> None:
    rng = np.random.default_rng(2)
    o, m = _ttt_obs("m.t......")
    o, m = np.repeat(o, 4000, 0), np.repeat(m, 4000, 0)
    for player in (random_player(), minimax_player()):
        a = player(o, m, rng)
        freq = np.bincount(a, minlength=9) / len(a)
        np.testing.assert_allclose(freq, player.probs(o[:1], m[:1])[0], atol=0.03)


def test_evaluate_counts_both_seats() -> None:
    agent = BoardAgent((3, 3, 2), 9, AgentConfig(hidden=(16,)))
    params = agent.init_params(0)
    r = evaluate(agent, params, minimax_player(), "tictactoe", 51, seed=0)
    assert r["games"] == 51 and r["wins"] + r["draws"] + r["losses"] == 51
    assert r["wins_seat0"] + r["draws_seat0"] + r["losses_seat0"] == 26
    assert r["wins"] == 0  # nobody beats perfect play
    s = evaluate(agent, params, random_player(), "tictactoe", 51, seed=0)
    assert s == evaluate(agent, params, random_player(), "tictactoe", 51, seed=0)  # seeded


def test_exact_tictactoe_results_match_simulation() -> None:
    agent = BoardAgent((3, 3, 2), 9, AgentConfig(hidden=(16,)))
    params = agent.init_params(1)
    exact = tictactoe_exact_results(agent, params)
    for name, player in (("random", random_player()), ("minimax", minimax_player())):
        sim = evaluate(agent, params, player, "tictactoe", 3000, seed=1)
        for k, counted in (("win", "wins"), ("draw", "draws"), ("loss", "losses")):
            for seat in (0, 1):
                # 1500 games a seat: 4 standard errors of a rate are at most 0.052
                assert abs(exact[f"{name}_{k}_seat{seat}"] - sim[f"{counted}_seat{seat}"] / 1500) < 0.052
        assert abs(sum(exact[f"{name}_{k}"] for k in ("win", "draw", "loss")) - 1.0) < 1e-9
    assert exact["minimax_win"] == 0.0
