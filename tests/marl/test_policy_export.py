"""Exported policies (policy.json): they load into OpenSpiel and OpenSpiel's exploitability of them equals
fedarena's to 1e-9 (Kuhn, Leduc), the file round-trips bit for bit, bad files are one-line errors, and
``fedarena evaluate`` scores a CFR run's export exactly."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from fedarena.envs import load_game
from fedarena.marl.cfr import CFRSolver
from fedarena.marl.exploitability import exploitability
from fedarena.marl.mccfr import MCCFROptions, MCCFRSolver
from fedarena.marl.policy_export import (PolicyFileError, export_policy, load_policy, to_openspiel_policy)

pyspiel = pytest.importorskip("pyspiel")
from open_spiel.python.algorithms import exploitability as os_exploitability  # noqa: E402


@pytest.mark.parametrize("name, solver", [
    ("kuhn_poker", lambda g: CFRSolver(g, plus=True).run(50).average_policy()),
    ("leduc_poker", lambda g: CFRSolver(g, plus=True).run(20).average_policy()),
    ("leduc_poker", lambda g: MCCFRSolver(g, MCCFROptions(batch=64), seed=0).run(20).average_policy_dict()),
    ("liars_dice(dice_sides=3)", lambda g: CFRSolver(g, plus=True).run(5).average_policy()),
])
def test_exported_policy_scores_the_same_in_openspiel(tmp_path, name, solver):
    game = load_game(name)
    policy = solver(game)
    ours = exploitability(game, policy)
    path = export_policy(tmp_path / "policy.json", name, policy, algorithm="test")
    exported = load_policy(path)
    tab = to_openspiel_policy(exported)
    theirs = os_exploitability.exploitability(pyspiel.load_game(name), tab)
    assert abs(theirs - ours) <= 1e-9
    assert ours > 0


def test_file_round_trips_bit_for_bit_and_documents_itself(tmp_path):
    game = load_game("kuhn_poker")
    pol = CFRSolver(game).run(7).average_policy()
    path = export_policy(tmp_path / "p.json", "kuhn_poker", pol, algorithm="cfr+", iterations=7)
    doc = json.loads(path.read_text())
    assert doc["format"] == "fedarena.tabular_policy/1" and doc["game"] == "kuhn_poker" and doc["num_actions"] == 2
    assert doc["algorithm"] == "cfr+" and len(doc["policy"]) == 12
    loaded = load_policy(path)
    for j, key in enumerate(pol.tree.infostates):
        np.testing.assert_array_equal(loaded.policy[key], pol.probs[j])
    assert exploitability(game, loaded.policy) == exploitability(game, pol)


@pytest.mark.parametrize("content, word", [("not json", "not a JSON"), ('{"format": "x"}', "format"),
                                           ('{"format": "fedarena.tabular_policy/1", "game": "kuhn_poker", '
                                            '"num_actions": 2, "policy": {"0": [0.5, 0.6]}}', "policy['0']")])
def test_bad_files_are_one_line_errors(tmp_path, content, word):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(PolicyFileError) as e:
        load_policy(path)
    assert word in str(e.value) and "\n" not in str(e.value)


def test_fedarena_evaluate_scores_a_cfr_run_exactly(tmp_path):
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "fedarena.platform.cli", "run", "experiments/leduc_cfr.yaml",
                    "--set", "game=kuhn_poker", "--set", "iterations=30", "--out", str(run), "--quiet",
                    "--no-report"], check=True, capture_output=True, text=True, timeout=600)
    r = subprocess.run([sys.executable, "-m", "fedarena.platform.cli", "evaluate", str(run)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    value = float(next(ln for ln in r.stdout.splitlines() if "exploitability" in ln).split(":")[1])
    solver = CFRSolver(load_game("kuhn_poker"), plus=True).run(30)
    assert value == pytest.approx(exploitability(load_game("kuhn_poker"), solver.average_policy()), abs=1e-12)
    tab = to_openspiel_policy(load_policy(run / "policy.json"))
    assert os_exploitability.exploitability(pyspiel.load_game("kuhn_poker"), tab) == pytest.approx(value, abs=1e-9)


def test_psro_runs_export_each_meta_mixture_and_evaluate_scores_them(tmp_path):
    from fedarena.marl.policy_export import evaluate_exported
    from fedarena.platform.runs import execute

    out = execute({"kind": "psro", "game": "kuhn_poker", "iterations": 4, "meta_solvers": ["nash", "uniform"]},
                  out=tmp_path / "run", quiet=True, report=False)
    result = evaluate_exported(tmp_path / "run", None, {})
    for m in ("nash", "uniform"):
        assert result[f"{m}/exploitability"] == pytest.approx(out[f"{m}/exploitability"], abs=1e-12)
        tab = to_openspiel_policy(load_policy(tmp_path / "run" / f"policy_{m}.json"))
        theirs = os_exploitability.exploitability(pyspiel.load_game("kuhn_poker"), tab)
        assert theirs == pytest.approx(result[f"{m}/exploitability"], abs=1e-9)


def test_nfsp_runs_export_each_seed_and_evaluate_scores_them(tmp_path):
    from fedarena.marl.policy_export import evaluate_exported
    from fedarena.platform.runs import execute

    tiny = {"num_games": 32, "hidden": [16], "replay_capacity": 2000, "reservoir_capacity": 2000,
            "min_buffer_size_to_learn": 100, "batch_size": 32, "learn_every": 16}
    out = execute({"kind": "nfsp", "game": "kuhn_poker", "episodes": 300, "eval_every": 300, "learner_seeds": [0, 1],
                   "nfsp": tiny}, out=tmp_path / "run", quiet=True, report=False)
    result = evaluate_exported(tmp_path / "run", None, {})
    for s in (0, 1):
        assert result[f"seed{s}/exploitability"] == pytest.approx(out[f"seed{s}/exploitability"], abs=1e-12)
