"""League building blocks against independent oracles: PFSP = AlphaStar's formulas, payoff decay by hand,
ratings order synthetic players of known strength, role branches, the store's checksums and immutability,
manager state round trips."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest

from fedarena.marl.league.manager import LeagueManager
from fedarena.marl.league.payoff import Payoff
from fedarena.marl.league.pfsp import pfsp
from fedarena.marl.league.ratings import Ratings
from fedarena.marl.league.roles import (MainAgent, Match, PlayerRecord, RoleConfig, ready_to_snapshot,
                                        remove_monotonic_suffix)
from fedarena.marl.league.selector import empirical_game, league_mixture, select
from fedarena.marl.league.store import SnapshotError, SnapshotStore


# -- PFSP: Vinyals et al. 2019 pseudocode, f(x) normalised, uniform when all weights vanish
@pytest.mark.parametrize("weighting,f", [
    ("squared", lambda x: (1 - x) ** 2),
    ("variance", lambda x: x * (1 - x)),
    ("linear", lambda x: 1 - x),
    ("linear_capped", lambda x: min(0.5, 1 - x)),
])
def test_pfsp_equals_alphastar_formula(weighting, f):
    x = [0.0, 0.1, 0.35, 0.5, 0.8, 0.97]
    w = [f(v) for v in x]
    assert np.allclose(pfsp(np.array(x), weighting), [v / sum(w) for v in w], rtol=0, atol=1e-15)


def test_pfsp_uniform_when_every_weight_is_zero_and_rejects_bad_input():
    assert np.array_equal(pfsp(np.array([1.0, 1.0, 1.0]), "squared"), np.full(3, 1 / 3))
    assert np.array_equal(pfsp(np.array([0.0, 1.0]), "variance"), np.full(2, 0.5))
    with pytest.raises(ValueError, match="weighting: unknown PFSP weighting 'cubic'"):
        pfsp(np.array([0.5]), "cubic")
    with pytest.raises(ValueError, match=r"win_rates: every entry must lie in \[0, 1\]"):
        pfsp(np.array([1.5]), "linear")


# -- payoff table: decayed counts written out by hand
def test_payoff_decayed_counts_by_hand():
    p = Payoff(decay=0.5)
    for _ in range(3):
        p.add_player()
    p.update(0, 1, 1)    # 0 beats 1
    p.update(0, 1, 0)    # draw: counts halve first
    p.update(1, 0, 1)    # 1 beats 0
    games = (1 * 0.5 + 1) * 0.5 + 1           # 1.75
    wins_0 = 1 * 0.5 * 0.5                    # 0.25
    draws = 1 * 0.5                           # 0.5
    assert p.games[0, 1] == p.games[1, 0] == games
    assert p.wins[0, 1] == wins_0 and p.losses[1, 0] == wins_0
    assert p.wins[1, 0] == 1.0 and p.losses[0, 1] == 1.0
    assert p.win_rate(0, 1) == pytest.approx((wins_0 + 0.5 * draws) / games)
    assert p.win_rate(0, 1) + p.win_rate(1, 0) == pytest.approx(1.0)
    assert p.win_rate(0, 2) == 0.5 and p.total_games[0, 1] == 3
    q = Payoff.from_state(json.loads(json.dumps({k: (v.tolist() if hasattr(v, "tolist") else v)
                                                  for k, v in p.state_dict().items()})))
    assert np.array_equal(q.matrix(), p.matrix())
    with pytest.raises(IndexError, match="unknown player id 7"):
        p.update(0, 7, 1)
    with pytest.raises(ValueError, match="result: expected"):
        p.update(0, 1, 2)


# -- ratings: synthetic players of known Elo strength (games drawn from Elo's own formula)
def test_ratings_order_synthetic_players_by_strength():
    rng = np.random.default_rng(3)
    true_elo = np.array([0.0, 150.0, 300.0, 450.0, 600.0])
    r = Ratings(draw_probability=0.1)
    for _ in range(2500):
        i, j = rng.choice(5, 2, replace=False)
        p_win = 1.0 / (1.0 + 10 ** ((true_elo[j] - true_elo[i]) / 400.0))
        u = rng.random()
        # draws with probability 0.1, the rest split by Elo's win probability
        result = 0 if u < 0.1 else (1 if u < 0.1 + 0.9 * p_win else -1)
        r.update(int(i), int(j), result)
    elo = np.array([r.elo(i) for i in range(5)])
    ts = np.array([r.trueskill(i)[0] for i in range(5)])
    assert list(np.argsort(elo)) == [0, 1, 2, 3, 4]
    assert list(np.argsort(ts)) == [0, 1, 2, 3, 4]
    # on the Elo scale the spread matches the truth (600 points) within sampling error
    assert abs((elo[4] - elo[0]) - 600.0) < 120.0
    back = Ratings.from_state(json.loads(json.dumps(r.state_dict())))
    assert back.elo(3) == r.elo(3) and back.trueskill(2) == r.trueskill(2)


# -- roles
class _League:
    def __init__(self, players, payoff):
        self.players, self.payoff = players, payoff


def _league(n_main_snaps: int):
    players = [PlayerRecord(0, "main-0", "main", True), PlayerRecord(1, "main_exploiter-0", "main_exploiter", True)]
    players += [PlayerRecord(2 + k, f"main-0-v{k + 1:04d}", "main", False, 0, f"main-0-v{k + 1:04d}") for k in range(n_main_snaps)]
    payoff = Payoff()
    for _ in players:
        payoff.add_player()
    return _League(players, payoff)


def test_main_agent_branch_shares_and_selfplay_curriculum():
    league = _league(3)
    role = MainAgent(RoleConfig())
    rng = np.random.default_rng(0)
    branches = [role.get_match(0, league, rng).branch for _ in range(4000)]
    share = {b: branches.count(b) / len(branches) for b in set(branches)}
    # untrained league: all win rates 0.5 -> PFSP 0.5, verification finds forgetting (0.5 < 0.7) in 0.15 ...
    assert share["pfsp"] == pytest.approx(0.5, abs=0.03)
    # ... unless the monotonic suffix is all there is (three equal rates: nothing increases -> nothing kept)
    assert "verify_forgetting" not in share
    assert share["selfplay"] == pytest.approx(0.5, abs=0.03)
    # a main agent it cannot beat (win rate <= 0.3) sends it to that agent's snapshots (variance PFSP)
    players = [PlayerRecord(0, "main-0", "main", True), PlayerRecord(1, "main-1", "main", True),
               PlayerRecord(2, "main-1-v0001", "main", False, 1, "main-1-v0001"),
               PlayerRecord(3, "main-1-v0002", "main", False, 1, "main-1-v0002")]
    lost = _League(players, Payoff())
    for _ in players:
        lost.payoff.add_player()
    for _ in range(50):
        lost.payoff.update(0, 1, -1)
    lost.payoff.update(0, 2, 1)       # win rate 1 vs v0001 -> variance weight 0: always v0002
    picks = {role._selfplay_branch(0, 1, lost, rng) for _ in range(20)}
    assert picks == {Match(3, True, "selfplay_curriculum")}
    assert role._selfplay_branch(1, 0, lost, rng) == Match(0, False, "selfplay")


def test_remove_monotonic_suffix_and_snapshot_rule():
    assert remove_monotonic_suffix(np.array([0.2, 0.6, 0.5, 0.4]), [1, 2, 3, 4])[1] == [1, 2]
    assert remove_monotonic_suffix(np.array([0.9, 0.8]), [1, 2])[1] == []
    league = _league(1)
    role = MainAgent(RoleConfig(snapshot_min_steps=100, snapshot_max_steps=1000))
    assert not ready_to_snapshot(role, 0, league, 99)
    assert not ready_to_snapshot(role, 0, league, 500)          # win rate 0.5 vs its snapshot
    for _ in range(20):
        league.payoff.update(0, 2, 1)
    assert ready_to_snapshot(role, 0, league, 500)
    assert ready_to_snapshot(MainAgent(RoleConfig(snapshot_min_steps=0, snapshot_max_steps=10)), 0, _league(1), 11)


def test_role_config_defaults_are_alphastar_and_errors_name_the_field():
    c = RoleConfig()
    assert (c.pfsp_share, c.verification_share, c.snapshot_win_rate, c.league_exploiter_reset_prob) == (0.5, 0.15, 0.7, 0.25)
    assert (c.snapshot_min_steps, c.snapshot_max_steps) == (2_000_000_000, 4_000_000_000)
    assert (c.main_weighting, c.curriculum_weighting, c.league_exploiter_weighting) == ("squared", "variance", "linear_capped")
    with pytest.raises(ValueError, match="main_weighting: unknown opponent selector"):
        RoleConfig(main_weighting="cubic")
    with pytest.raises(ValueError, match="pfsp_share, verification_share"):
        RoleConfig(pfsp_share=0.9, verification_share=0.2)


# -- selector: meta-solver over the empirical game; RPS-like cycle -> uniform Nash
def test_selector_nash_over_a_cyclic_league_is_uniform():
    p = Payoff(decay=1.0)
    for _ in range(3):
        p.add_player()
    for a, b in ((0, 1), (1, 2), (2, 0)):      # 0 beats 1 beats 2 beats 0, always
        for _ in range(10):
            p.update(a, b, 1)
    g = empirical_game(p, [0, 1, 2])
    assert np.allclose(g[0], [[0, 1, -1], [-1, 0, 1], [1, -1, 0]])
    assert np.allclose(league_mixture(p, [0, 1, 2]), 1 / 3, atol=1e-8)
    # a dominated fourth player gets no Nash weight
    p.add_player()
    for k in range(3):
        for _ in range(10):
            p.update(k, 3, 1)
    assert league_mixture(p, [0, 1, 2, 3])[3] == pytest.approx(0.0, abs=1e-8)
    assert np.allclose(select("squared", p, 3, [0, 1, 2]), 1 / 3)


# -- store
def test_store_checksum_immutability_and_corruption(tmp_path):
    store = SnapshotStore(tmp_path)
    w = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}
    ref = store.save("main-0", 1, w, step=10)
    assert store.names() == ["main-0-v0001"] and ref.manifest["step"] == 10
    got = store.load("main-0-v0001", ref.sha256)
    assert np.array_equal(got["w"], w["w"]) and not got["w"].flags.writeable
    assert not (os.stat(tmp_path / "main-0-v0001" / "params.npz").st_mode & stat.S_IWUSR)
    with pytest.raises(SnapshotError, match="already exists"):
        store.save("main-0", 1, w)
    path = tmp_path / "main-0-v0001" / "params.npz"
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match=r"^snapshot main-0-v0001: params.npz checksum mismatch") as e:
        store.load("main-0-v0001")
    assert "\n" not in str(e.value)
    with pytest.raises(SnapshotError, match="not in the store"):
        store.load("main-0-v0002")
    # a manifest rewritten to match the corrupt file is still caught by the league's recorded checksum
    m = json.loads((tmp_path / "main-0-v0001" / "manifest.json").read_text())
    m["sha256"] = __import__("hashlib").sha256(bytes(data)).hexdigest()
    os.chmod(tmp_path / "main-0-v0001" / "manifest.json", 0o644)
    (tmp_path / "main-0-v0001" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        store.load("main-0-v0001", ref.sha256)


# -- manager
def test_manager_composition_snapshots_and_state_round_trip(tmp_path):
    roles = RoleConfig(snapshot_min_steps=10, snapshot_max_steps=20)
    init = {"w": np.zeros(4, np.float32)}
    m = LeagueManager(roles, SnapshotStore(tmp_path), init, seed=1)
    assert [p.name for p in m.players] == ["main-0", "main_exploiter-0", "league_exploiter-0",
                                           "league_exploiter-1", "main-0-v0001"]
    ids, probs, _ = m.get_matches(1, 32)           # the main exploiter plays the main agent
    assert ids == [0] and probs[0] == 1.0
    assert m.maybe_snapshot(1, init) is None       # no steps yet
    m.add_steps(1, 21)
    ev = m.maybe_snapshot(1, {"w": np.ones(4, np.float32)})
    assert ev is not None and ev.reset and ev.record.parent == 1      # main exploiters always reset
    assert np.array_equal(m.frozen_params(ev.record.id)["w"], np.ones(4))
    m.report_many(0, [(4, 1), (5, -1), (4, 0)])
    state = json.loads(json.dumps(m.state_dict(), default=lambda a: a.tolist()))
    back = LeagueManager.from_state(state, roles, SnapshotStore(tmp_path))
    assert back.state_dict()["players"] == m.state_dict()["players"]
    assert np.array_equal(back.payoff.matrix(), m.payoff.matrix())
    assert back.get_matches(2, 8)[0] == m.get_matches(2, 8)[0]      # same rng stream continues
