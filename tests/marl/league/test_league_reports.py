"""Reports are idempotent: a learner's iteration report carries a sequence number and the manager counts each
number once (a learner killed between reporting its games and taking its snapshot replays the iteration on
restart); the evaluator's games of a snapshot are counted once, and every pair of frozen players is
evaluated once. The payoff table's counts are the oracle: one game adds one count to each side's pair."""

from __future__ import annotations

import json

import numpy as np

from fedarena.marl.league.agent import AgentConfig, BoardAgent
from fedarena.marl.league.games import get_game
from fedarena.marl.league.manager import LeagueManager
from fedarena.marl.league.roles import RoleConfig
from fedarena.marl.league.store import SnapshotStore
from fedarena.marl.league.training import LocalLeague, iteration_seq

ROLES = RoleConfig(main_agents=1, main_exploiters=1, league_exploiters=1, snapshot_min_steps=10,
                   snapshot_max_steps=20)


def manager(tmp_path) -> LeagueManager:
    return LeagueManager(ROLES, SnapshotStore(tmp_path), {"w": np.zeros(3, np.float32)}, seed=0)


def test_replayed_report_is_counted_once(tmp_path):
    m = manager(tmp_path)
    results = [(3, 1), (3, -1), (3, 0)]       # main-0 (id 0) against its initial snapshot (id 3)
    assert m.finish_iteration(0, 1, 12, results)
    counted = (m.payoff.total_games.copy(), m.games, m.steps[0], m.ratings.table())
    assert counted[0][0, 3] == 3 and counted[1] == 3 and counted[2] == 12
    assert not m.finish_iteration(0, 1, 12, results)        # the same iteration replayed
    assert not m.finish_iteration(0, 0, 12, results)        # an older one
    assert np.array_equal(m.payoff.total_games, counted[0]) and m.games == 3 and m.steps[0] == 12
    assert m.ratings.table() == counted[3]
    assert m.finish_iteration(1, 1, 5, [(0, 1)])            # numbers are per learner
    assert m.finish_iteration(0, 2, 12, results) and m.payoff.total_games[0, 3] == 6 and m.games == 7
    # the last counted numbers survive a checkpoint: a replay after resume is still ignored
    back = LeagueManager.from_state(json.loads(json.dumps(m.state_dict(), default=lambda a: a.tolist())), ROLES,
                                    SnapshotStore(tmp_path))
    assert not back.finish_iteration(0, 2, 12, results) and back.games == 7
    assert back.finish_iteration(0, 3, 12, results) and back.games == 10


def test_evaluation_of_a_snapshot_is_counted_once_and_each_pair_once(tmp_path):
    m = manager(tmp_path)
    first = m.players[-1].id                                 # main-0-v0001, the initial weights
    assert m.pending_evaluations(0) == [(first, [])]         # nothing joined before it
    assert m.report_evaluation(first, [])
    m.add_steps(1, 30)
    e1 = m.maybe_snapshot(1, {"w": np.ones(3, np.float32)}).record.id
    m.add_steps(2, 30)
    e2 = m.maybe_snapshot(2, {"w": np.full(3, 2.0, np.float32)}).record.id
    assert m.pending_evaluations(1) == [(e1, [first])] and m.pending_evaluations(2) == [(e2, [first, e1])]
    games = [(e2, first, 1), (e2, e1, -1), (e2, e1, 0)]
    assert m.report_evaluation(e2, games) and not m.report_evaluation(e2, games)
    assert m.pending_evaluations(2) == [] and m.games == 3
    assert m.payoff.total_games[e2, e1] == 2 and m.payoff.total_games[e1, e2] == 2
    assert m.report_evaluation(e1, [(e1, first, 1)])
    frozen = m.frozen
    assert all(m.payoff.total_games[a, b] > 0 for a in frozen for b in frozen if a != b)


def test_local_learner_replaying_a_reported_iteration_is_not_counted_twice(tmp_path):
    g = get_game("tictactoe")
    agent = BoardAgent(g.observation_shape, g.num_actions, AgentConfig(hidden=(16,), minibatch_size=64,
                                                                       update_epochs=1))
    m = LeagueManager(ROLES, SnapshotStore(tmp_path), agent.init_params(0), seed=0)
    league = LocalLeague(g, agent, m, num_envs=8, games_per_iteration=16, seed=0, main_batches=2)
    out = league.iteration()
    assert [r.learner for r in out] == [0, 0, 1, 2]          # the main agent plays two batches
    assert m.games == 4 * 16 and m.payoff.total_games.sum() == 2 * m.games
    assert [m.reported[i] for i in (0, 1, 2)] == [2, 1, 1]
    before = (m.games, m.payoff.total_games.copy(), dict(m.steps))
    # learner 1 restarted after reporting iteration 1's batch: the replay plays and learns but is not counted
    league.step_learner(1, iteration_seq(0, 1, 0))
    assert m.games == before[0] and np.array_equal(m.payoff.total_games, before[1]) and m.steps == before[2]
    league.iteration()
    assert m.games == 8 * 16 and [m.reported[i] for i in (0, 1, 2)] == [4, 2, 2]
