"""MCCFR (external and outcome sampling): regret and average updates of one fixed sampled trajectory against a
hand computation on Kuhn poker, convergence of the average policy scored by OpenSpiel's exploitability, the lazy
walk on a game too large to compile, and the ``mccfr`` kind end to end."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.envs import load_game
from fedarena.envs.efg import CHANCE
from fedarena.marl.mccfr import LazyMCCFRSolver, MCCFROptions, MCCFRSolver, _discount_factors
from fedarena.marl.policy_export import ExportedPolicy, to_openspiel_policy

pyspiel = pytest.importorskip("pyspiel")
from open_spiel.python.algorithms import exploitability as os_exploitability  # noqa: E402

PASS, BET = 0, 1


def _fixed_sampler(solver, cards=(0, 1), choices=None):
    """Replace the solver's multinomial draws (one sample: ``batch=1``): chance deals ``cards`` (J to player 0,
    Q to player 1); a player history takes the action ``choices[infostate]``."""
    tree = solver.tree

    def draw(nodes, counts, probs):
        out = np.zeros(probs.shape, dtype=np.int64)
        for k, n in enumerate(nodes):
            if tree.actor[n] == CHANCE:
                kids = np.flatnonzero(tree.parent == n)
                out[k, int(np.flatnonzero(tree.action[kids] == cards[0 if tree.parent[n] < 0 else 1])[0])] = counts[k]
            else:
                out[k, choices[tree.infostates[tree.infoset[n]]]] = counts[k]
        return out

    solver._draw = draw


def _row(solver, key, which="regrets"):
    return getattr(solver, which)[solver.tree.infostate_index[key]]


def test_external_sampling_update_equals_hand_computation_on_kuhn():
    """Deal J/Q; player 1 bets after a pass ("1p") and calls a bet ("1b"); player 0 explores both of its actions
    under uniform play. Leaves: "0p 1b 0p" = -1 (fold), "0p 1b 0b" = -2 (Q wins 2), "0b 1b" = -2.
    v(0pb) = -1.5 -> r(0pb) = (+0.5, -0.5); v(0p) = -1.5, v(0b) = -2, v(0) = -1.75 -> r(0) = (+0.25, -0.25).
    The opponent's reached histories "1p", "1b" add sigma = (0.5, 0.5) to the average's numerator."""
    s = MCCFRSolver(load_game("kuhn_poker"), MCCFROptions(sampling="external", batch=1))
    _fixed_sampler(s, choices={"1p": BET, "1b": BET})
    s.iterations = 1
    s._external(0)
    np.testing.assert_allclose(_row(s, "0pb"), [0.5, -0.5])
    np.testing.assert_allclose(_row(s, "0"), [0.25, -0.25])
    touched = {k for k in s.tree.infostates if np.any(_row(s, k) != 0)}
    assert touched == {"0", "0pb"}
    np.testing.assert_allclose(_row(s, "1p", "cumulative_policy"), [0.5, 0.5])
    np.testing.assert_allclose(_row(s, "1b", "cumulative_policy"), [0.5, 0.5])
    assert s.cumulative_policy.sum() == pytest.approx(2.0)
    # histories touched: root, deal, "0", its two children, "0pb" and its two leaves, the "0b 1b" leaf
    assert s.nodes_touched == 9


def test_outcome_sampling_update_equals_hand_computation_on_kuhn():
    """Deal J/Q; player 0 (updating, epsilon 0.6 over uniform play: sampling probabilities 1/2) passes, player 1
    bets, player 0 calls: u = -2, q_i = 1/4, W = -8. At "0pb" (sampled call): pi(z|h) = 1/2, r = (-W/2, W/2)
    = (4, -4); at "0" (sampled pass): pi(z|h pass) = 1/2, pi(z|h) = 1/4, r = (W/4, -W/4) = (-2, 2).
    Average numerators pi_i(h) sigma / q(h): at "0" q = 1/6 (the deal) -> 6 * (1/2, 1/2); at "0pb"
    pi_i = 1/2, q = 1/6 * 1/2 * 1/2 -> 12 * (1/2, 1/2)."""
    s = MCCFRSolver(load_game("kuhn_poker"), MCCFROptions(sampling="outcome", batch=1, exploration=0.6))
    _fixed_sampler(s, choices={"0": PASS, "1p": BET, "0pb": BET})
    s.iterations = 1
    s._outcome(0)
    np.testing.assert_allclose(_row(s, "0pb"), [4.0, -4.0])
    np.testing.assert_allclose(_row(s, "0"), [-2.0, 2.0])
    np.testing.assert_allclose(_row(s, "0", "cumulative_policy"), [3.0, 3.0])
    np.testing.assert_allclose(_row(s, "0pb", "cumulative_policy"), [6.0, 6.0])
    assert s.cumulative_policy.sum() == pytest.approx(18.0)


def _openspiel_exploitability(game_name, policy_dict):
    tab = to_openspiel_policy(ExportedPolicy(game_name, 2, policy_dict))
    return os_exploitability.exploitability(pyspiel.load_game(game_name), tab)


@pytest.mark.parametrize("sampling, batch, iterations, bound", [("external", 1, 500, 0.1),
                                                                ("external", 64, 100, 0.03),
                                                                ("outcome", 64, 400, 0.03)])
def test_average_policy_converges_on_kuhn(sampling, batch, iterations, bound):
    """Uniform play is 0.4583 exploitable; the average policy falls below ``bound`` (OpenSpiel's exploitability)."""
    s = MCCFRSolver(load_game("kuhn_poker"), MCCFROptions(sampling=sampling, batch=batch), seed=3).run(iterations)
    e = _openspiel_exploitability("kuhn_poker", s.average_policy_dict())
    assert e < bound
    assert s.nodes_touched > 0


def test_lazy_walk_converges_on_kuhn_and_runs_where_nothing_compiles():
    lazy = LazyMCCFRSolver(load_game("kuhn_poker"), MCCFROptions(sampling="external"), seed=0).run(300)
    assert _openspiel_exploitability("kuhn_poker", lazy.average_policy_dict()) < 0.05
    big = LazyMCCFRSolver(load_game("oshi_zumo"), MCCFROptions(sampling="outcome"), seed=0).run(5)
    assert big.nodes_touched > 10 and big.num_infostates > 0
    for row in big.average_policy_dict().values():
        assert row.sum() == pytest.approx(1.0)


def test_discounted_and_linear_options():
    pos, neg, avg = _discount_factors(2, (1.5, 0.0, 2.0))
    assert pos == pytest.approx(2 ** 1.5 / (2 ** 1.5 + 1)) and neg == 0.5 and avg == pytest.approx((2 / 3) ** 2)
    s = MCCFRSolver(load_game("kuhn_poker"), MCCFROptions(batch=16, averaging="linear", discount=(1.5, 0.0, 2.0)),
                    seed=0).run(200)
    assert _openspiel_exploitability("kuhn_poker", s.average_policy_dict()) < 0.05
    for bad, field in ((dict(sampling="chance"), "sampling"), (dict(batch=0), "batch"),
                       (dict(averaging="square"), "averaging"), (dict(exploration=0.0), "exploration")):
        with pytest.raises(ValueError, match=field):
            MCCFROptions(**bad)


def test_checkpoint_round_trip_continues_the_same_run():
    game = load_game("kuhn_poker")
    a = MCCFRSolver(game, MCCFROptions(batch=8), seed=5).run(10)
    b = MCCFRSolver(game, MCCFROptions(batch=8), seed=0)
    b.load_state_dict(a.state_dict())
    a.run(5), b.run(5)
    np.testing.assert_array_equal(a.regrets, b.regrets)
    np.testing.assert_array_equal(a.cumulative_policy, b.cumulative_policy)


def test_mccfr_kind_logs_exploitability_nodes_and_exports_a_policy(tmp_path):
    from fedarena.marl.policy_export import evaluate_exported, load_policy
    from fedarena.platform.runs import execute, read_metrics

    out = execute({"kind": "mccfr", "game": "kuhn_poker", "iterations": 30, "batch": 32, "eval_every": 10},
                  out=tmp_path / "run", quiet=True, report=False)
    rows = [r for r in read_metrics(tmp_path / "run") if "exploitability" in r]
    assert [r["step"] for r in rows] == [1, 10, 20, 30]
    assert all(r["nodes_touched"] > 0 for r in rows) and rows[-1]["exploitability"] < rows[0]["exploitability"]
    exported = load_policy(tmp_path / "run" / "policy.json")
    assert exported.game == "kuhn_poker" and len(exported.policy) == 12
    result = evaluate_exported(tmp_path / "run", None, {})
    assert result["exploitability"] == pytest.approx(out["exploitability"], abs=1e-12)


def test_mccfr_kind_walks_large_games_lazily(tmp_path):
    from fedarena.platform.runs import execute

    out = execute({"kind": "mccfr", "game": "oshi_zumo", "sampling": "outcome", "iterations": 5, "eval_every": 5},
                  out=tmp_path / "run", quiet=True, report=False)
    assert out["walk"] == "lazy" and "exploitability" not in out and out["nodes_touched"] > 0


def test_lazy_walk_through_the_kind_on_a_small_game_is_scored_exactly(tmp_path):
    from fedarena.marl.policy_export import load_policy
    from fedarena.platform.runs import execute

    out = execute({"kind": "mccfr", "game": "kuhn_poker", "lazy": True, "iterations": 3, "eval_every": 1},
                  out=tmp_path / "run", quiet=True, report=False)
    assert out["walk"] == "lazy" and out["exploitability"] > 0
    exported = load_policy(tmp_path / "run" / "policy.json")
    assert len(exported.policy) == 12 and exported.meta["complete"] is True
    assert _openspiel_exploitability("kuhn_poker", exported.policy) == pytest.approx(out["exploitability"], abs=1e-9)


def _rows_without_times(run_dir):
    from fedarena.platform.runs import read_metrics

    return [{k: v for k, v in r.items() if k not in ("wall_time", "solver_time")} for r in read_metrics(run_dir)]


def test_mccfr_kind_resume_equals_the_uninterrupted_run(tmp_path):
    from fedarena.platform.runs import execute

    cfg = {"kind": "mccfr", "game": "kuhn_poker", "iterations": 30, "batch": 16, "eval_every": 5,
           "checkpoint": {"every": 10}}
    straight = execute(cfg, out=tmp_path / "b", quiet=True, report=False)
    execute({**cfg, "iterations": 20}, out=tmp_path / "a", quiet=True, report=False)
    resumed = execute(resume=tmp_path / "a", overrides=["iterations=30"], quiet=True, report=False)
    assert _rows_without_times(tmp_path / "a") == _rows_without_times(tmp_path / "b")
    assert [r["step"] for r in _rows_without_times(tmp_path / "a")] == [1, 5, 10, 15, 20, 25, 30]
    assert resumed["exploitability"] == straight["exploitability"]
    assert resumed["nodes_touched"] == straight["nodes_touched"]
    assert resumed.get("first_below_0.05/iteration") == straight.get("first_below_0.05/iteration")
    # a budget below the checkpoint's step runs nothing and returns the checkpointed state's summary
    again = execute(resume=tmp_path / "a", overrides=["iterations=10"], quiet=True, report=False)
    assert again["iterations"] == 30 and again["exploitability"] == straight["exploitability"]
