"""Kuhn and Leduc information-state and observation tensors against OpenSpiel's, at every history."""

import numpy as np
import pytest

from fedarena.envs import load_game
from fedarena.envs.kuhn import KuhnPoker

pyspiel = pytest.importorskip("pyspiel")


def _walk(ours, theirs):
    """Both games side by side, depth first; yields matching (our state, OpenSpiel state) pairs."""
    stack = [(ours.new_initial_state(), theirs.new_initial_state())]
    while stack:
        a, b = stack.pop()
        assert a.history() == b.history()
        yield a, b
        if a.is_terminal():
            assert b.is_terminal()
            continue
        actions = [x for x, _ in a.chance_outcomes()] if a.is_chance_node() else a.legal_actions()
        assert actions == ([x for x, _ in b.chance_outcomes()] if b.is_chance_node() else b.legal_actions())
        for x in actions:
            stack.append((a.child(x), b.child(x)))


@pytest.mark.parametrize("name", ["kuhn_poker", "leduc_poker", "kuhn_poker(players=3)"])
def test_tensors_equal_openspiel_at_every_player_history(name):
    ours = KuhnPoker(num_players=3) if name == "kuhn_poker(players=3)" else load_game(name)
    theirs = pyspiel.load_game(name)
    assert ours.information_state_tensor_shape() == tuple(theirs.information_state_tensor_shape())
    assert ours.observation_tensor_shape() == tuple(theirs.observation_tensor_shape())
    checked, infostates = 0, set()
    for a, b in _walk(ours, theirs):
        if a.is_terminal():
            np.testing.assert_array_equal(a.returns(), b.returns())
        if a.is_terminal() or a.is_chance_node():
            continue
        for p in range(ours.num_players):
            if len(b.history()) <= p:
                continue
            t = a.information_state_tensor(p)
            assert t.dtype == np.float32 and t.shape == ours.information_state_tensor_shape()
            np.testing.assert_array_equal(t, np.asarray(b.information_state_tensor(p)), err_msg=str(a.history()))
            np.testing.assert_array_equal(a.observation_tensor(p), np.asarray(b.observation_tensor(p)),
                                          err_msg=str(a.history()))
            checked += 1
        infostates.add(a.information_state_string())
    # every information state of the game was visited (12 in Kuhn, 936 in Leduc)
    assert len(infostates) == {"kuhn_poker": 12, "leduc_poker": 936, "kuhn_poker(players=3)": 48}[name]
    assert checked > 2 * len(infostates)


@pytest.mark.parametrize("name", ["kuhn_poker", "leduc_poker"])
def test_tensor_identifies_the_information_state(name):
    """Perfect recall: two histories have the same information-state tensor iff the same information state."""
    game = load_game(name)
    from fedarena.envs.efg import all_histories

    seen: dict[bytes, str] = {}
    for s in all_histories(game):
        if s.is_terminal() or s.is_chance_node():
            continue
        key, text = s.information_state_tensor().tobytes(), s.information_state_string()
        assert seen.setdefault(key, text) == text
    assert len(set(seen.values())) == len(seen)
