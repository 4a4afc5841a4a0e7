"""Deep CFR on Kuhn poker: the memories hold what the external-sampling traversals produced, and a few iterations
of small networks already play far better than uniform, scored by OpenSpiel's exact exploitability."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.envs import load_game
from fedarena.marl.deep_cfr import DeepCFR, DeepCFRConfig
from fedarena.marl.policy_export import ExportedPolicy, to_openspiel_policy

pyspiel = pytest.importorskip("pyspiel")
from open_spiel.python.algorithms import exploitability as os_exploitability  # noqa: E402


def _openspiel(policy):
    probs = {s: policy.probs[j] for j, s in enumerate(policy.tree.infostates)}
    return os_exploitability.exploitability(pyspiel.load_game("kuhn_poker"),
                                            to_openspiel_policy(ExportedPolicy("kuhn_poker", 2, probs)))


def test_deep_cfr_on_kuhn_beats_uniform_and_its_network_fits_its_memory():
    d = DeepCFR(load_game("kuhn_poker"), DeepCFRConfig(traversals=512, hidden=(32,), advantage_steps=100,
                                                        policy_steps=400, batch_size=128), seed=0)
    for _ in range(8):
        d.iteration()
    # the memories: one entry per player per iteration, weights t * visits
    assert [len(m) for m in d.memory_v] == [8, 8] and len(d.memory_pi) == 16
    rows, _, w = d.memory_v[0][2]
    assert np.all(w % 3 == 0) and set(d.tree.infostate_player[rows]) == {0}
    table = _openspiel(d.average_policy_table())
    net = _openspiel(d.average_policy())
    assert table < 0.25 and net < 0.25        # uniform play: 0.4583
    assert abs(net - table) < 0.1
