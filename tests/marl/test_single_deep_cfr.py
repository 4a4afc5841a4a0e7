"""Single Deep CFR (Steinberger 2019): the mixture's behaviour policy against a hand computation, convergence on
Kuhn poker scored by OpenSpiel's own exploitability, a checkpoint that resumes the same run, and the ``deep_cfr``
kind's exported policy scored by OpenSpiel as the run scored it."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.envs import load_game
from fedarena.marl.deep_cfr import DeepCFR, DeepCFRConfig, mixture_average
from fedarena.marl.game_tree import game_tree
from fedarena.marl.policy_export import ExportedPolicy, load_policy, to_openspiel_policy

pyspiel = pytest.importorskip("pyspiel")
from open_spiel.python.algorithms import exploitability as os_exploitability  # noqa: E402

SMALL = DeepCFRConfig(traversals=512, hidden=(32,), advantage_steps=300, batch_size=128, average="mixture")


def _openspiel(policy) -> float:
    probs = {s: policy.probs[j] for j, s in enumerate(policy.tree.infostates)}
    return os_exploitability.exploitability(pyspiel.load_game("kuhn_poker"),
                                            to_openspiel_policy(ExportedPolicy("kuhn_poker", 2, probs)))


def test_mixture_average_is_the_reach_weighted_behaviour_policy():
    tree = game_tree(load_game("kuhn_poker"))    # actions: 0 pass/fold, 1 bet/call
    row = tree.infostate_index
    s1, s2 = tree.uniform_probs(), tree.uniform_probs()
    s1[row["0"]], s2[row["0"]] = [1.0, 0.0], [0.5, 0.5]          # player 0 with the jack: pass, then 50/50
    s1[row["0pb"]], s2[row["0pb"]] = [0.8, 0.2], [0.2, 0.8]      # ... facing a bet after passing
    s1[row["1b"]], s2[row["1b"]] = [0.7, 0.3], [0.1, 0.9]        # player 1 with the queen facing a bet
    avg = mixture_average(tree, [s1, s2], [1.0, 2.0])
    # '0': own reach 1 in both: (1 * 0 + 2 * 0.5) / 3 bets
    assert avg[row["0"]] == pytest.approx([2 / 3, 1 / 3], abs=1e-12)
    # '0pb': own reach = P(pass at '0') = 1 and 0.5: (1 * 1 * 0.2 + 2 * 0.5 * 0.8) / (1 * 1 + 2 * 0.5) calls
    assert avg[row["0pb"]] == pytest.approx([0.5, 0.5], abs=1e-12)
    # '1b': player 1 has not moved before, reach 1: (0.3 + 2 * 0.9) / 3 calls
    assert avg[row["1b"]] == pytest.approx([0.3, 0.7], abs=1e-12)


def test_single_deep_cfr_on_kuhn_converges():
    d = DeepCFR(load_game("kuhn_poker"), SMALL, seed=0)
    for _ in range(15):
        d.iteration()
    assert len(d.strategies) == 15 and d.memory_pi == []      # the mixture needs no strategy memory
    assert _openspiel(d.average_policy()) < 0.08               # uniform play: 0.4583


def test_checkpoint_resumes_the_same_run():
    game = load_game("kuhn_poker")
    a = DeepCFR(game, SMALL, seed=3)
    for _ in range(3):
        a.iteration()
    b = DeepCFR(game, SMALL, seed=99)
    b.load_state_dict(a.state_dict())
    for d in (a, b):
        for _ in range(2):
            d.iteration()
    assert a.nodes_touched == b.nodes_touched
    np.testing.assert_allclose(a.average_policy().probs, b.average_policy().probs, atol=1e-6)


def test_deep_cfr_kind_exports_what_it_scored(tmp_path):
    from fedarena.platform.runs import execute

    out = execute({"kind": "deep_cfr", "game": "kuhn_poker", "iterations": 6, "eval_every": 3, "traversals": 256,
                   "hidden": [16], "advantage_steps": 100, "batch_size": 64}, out=tmp_path / "run", quiet=True,
                  report=False)
    exported = load_policy(tmp_path / "run" / "policy.json")
    theirs = os_exploitability.exploitability(pyspiel.load_game("kuhn_poker"), to_openspiel_policy(exported))
    assert theirs == pytest.approx(out["exploitability"], abs=1e-9)
    assert out["iterations"] == 6 and out["nodes_touched"] > 0
