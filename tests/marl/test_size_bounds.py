"""Size bounds of the exact game methods: Knuth's tree-size estimate against exact counts, one-line refusals of
games above ``max_tree_nodes`` (library and CLI, exit status 2), and the counting cap inside the compilers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedarena.envs import load_game
from fedarena.envs.efg import (MAX_TREE_NODES_ENV, TreeTooLargeError, all_histories, estimate_tree_size,
                               max_tree_nodes)
from fedarena.envs.efg_vector import compile_tables
from fedarena.marl.cfr import CFRSolver
from fedarena.marl.exploitability import exploitability
from fedarena.marl.game_tree import _build, game_tree
from fedarena.marl.psro import PSRO
from fedarena.marl.xfp import XFPSolver

pytest.importorskip("pyspiel")


@pytest.mark.parametrize("name", ["kuhn_poker", "leduc_poker", "kuhn_poker(players=3)"])
def test_knuth_estimate_is_close_to_the_exact_count(name):
    game = load_game(name)
    exact = len(all_histories(game))
    est = estimate_tree_size(game, probes=4096, seed=1)
    assert not est.lower_bound
    assert abs(est.histories - exact) < 0.1 * exact


def test_estimate_stops_early_and_reports_a_lower_bound():
    est = estimate_tree_size(load_game("chess"), stop_above=1e6)
    assert est.lower_bound and est.histories > 1e6 and est.probes < est.planned


@pytest.mark.parametrize("name", ["chess", "oshi_zumo", "leduc_poker(players=3)"])
@pytest.mark.parametrize("method, word", [(CFRSolver, "CFR"), (XFPSolver, "XFP"), (PSRO, "PSRO"),
                                          (lambda g: exploitability(g, {}), "exact exploitability"),
                                          (compile_tables, "batched game tables")])
def test_exact_methods_refuse_large_games_in_one_line(name, method, word):
    with pytest.raises(TreeTooLargeError) as e:
        method(load_game(name))
    msg = str(e.value)
    assert "\n" not in msg and name in msg and word in msg and "mccfr" in msg and "max_tree_nodes=1,000,000" in msg


def test_bound_is_configurable_by_argument_and_environment(monkeypatch):
    leduc = load_game("leduc_poker")  # 9,457 histories
    with pytest.raises(TreeTooLargeError):
        game_tree(leduc, max_nodes=5_000)
    assert game_tree(leduc, max_nodes=20_000).num_nodes == 9457
    monkeypatch.setenv(MAX_TREE_NODES_ENV, "5000")
    assert max_tree_nodes() == 5000
    with pytest.raises(TreeTooLargeError, match="max_tree_nodes=5,000"):
        CFRSolver(load_game("leduc_poker"))
    monkeypatch.setenv(MAX_TREE_NODES_ENV, "lots")
    with pytest.raises(ValueError, match=MAX_TREE_NODES_ENV):
        max_tree_nodes()


def test_compilers_count_and_stop_at_the_bound():
    """The estimate can miss deep, rarely reached subtrees; the compilers' own count is the guarantee."""
    kuhn = load_game("kuhn_poker")  # 58 histories
    with pytest.raises(TreeTooLargeError, match="counted"):
        _build(kuhn, 30)
    with pytest.raises(TreeTooLargeError, match="counted"):
        all_histories(kuhn, max_nodes=30)
    assert _build(kuhn, 58).num_nodes == 58


def test_cli_refuses_psro_on_oshi_zumo_with_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fedarena.platform.cli", "run", "experiments/kuhn_psro.yaml",
                        "--set", "game=oshi_zumo", "--out", str(tmp_path / "run"), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "oshi_zumo" in lines[0] and "mccfr" in lines[0]
