"""Leduc hold'em rules (Southey et al., 2005), checked by hand-worked hands and, when open-spiel is
installed, history by history against OpenSpiel's ``leduc_poker``."""

import numpy as np
import pytest

from fedarena.envs import CHANCE, IllegalActionError, load_game
from fedarena.envs.efg import all_histories
from fedarena.envs.leduc import CALL, FOLD, RAISE

F, C, R = FOLD, CALL, RAISE


def play(actions):
    s = load_game("leduc_poker").new_initial_state()
    for a in actions:
        s.apply_action(a)
    return s


@pytest.mark.quick
def test_hand_with_pair_and_reraises():
    # p0 gets Js (0), p1 gets Qh (3); r1: raise, raise, call (5 each); public Qs (2) pairs p1;
    # r2: check, raise, raise, call -> 5 + 4 + 4 = 13 each, p1 wins 13
    s = play([0, 3, R, R, C, 2, C, R, R, C])
    assert s.is_terminal()
    assert s.returns().tolist() == [-13.0, 13.0]


def test_legal_actions_fold_only_facing_a_raise_and_raise_cap():
    s = play([0, 3])
    assert s.legal_actions() == [C, R]
    s.apply_action(R)
    assert s.legal_actions() == [F, C, R]
    s.apply_action(R)
    assert s.legal_actions() == [F, C]  # two raises this round
    with pytest.raises(IllegalActionError):
        s.apply_action(R)
    s.apply_action(C)
    assert s.current_player() == CHANCE
    assert [a for a, _ in s.chance_outcomes()] == [1, 2, 4, 5]
    assert all(p == 0.25 for _, p in s.chance_outcomes())


@pytest.mark.quick
def test_fold_and_split_pot():
    s = play([0, 3, R, F])
    assert s.returns().tolist() == [1.0, -1.0]
    s = play([0, 1, C, C, 4, C, C])  # Js vs Jh, board Ks: equal ranks split
    assert s.returns().tolist() == [0.0, 0.0]
    s = play([0, 5, C, C, 2, C, C])  # Js vs Kh, board Qs: higher rank wins the antes
    assert s.returns().tolist() == [-1.0, 1.0]


def test_information_state_strings():
    s = play([5, 0, R, C, 2, C])
    assert s.current_player() == 1
    assert s.information_state_string() == "Js:rc/Qs:c"
    assert s.information_state_string(0) == "Kh:rc/Qs:c"


def test_tree_size():
    hs = all_histories(load_game("leduc_poker"))
    assert len(hs) == 9457  # the size OpenSpiel reports for leduc_poker
    assert len({h.information_state_string() for h in hs if h.current_player() >= 0}) == 936


def _parallel_walk(ours, theirs, out):
    out.append((ours, theirs))
    if ours.is_terminal():
        assert theirs.is_terminal()
        return
    if ours.is_chance_node():
        mine, other = ours.chance_outcomes(), theirs.chance_outcomes()
        assert [a for a, _ in mine] == [a for a, _ in other]
        assert [q for _, q in mine] == pytest.approx([q for _, q in other])
        actions = [a for a, _ in ours.chance_outcomes()]
    else:
        assert ours.current_player() == theirs.current_player()
        assert ours.legal_actions() == list(theirs.legal_actions())
        actions = ours.legal_actions()
    for a in actions:
        _parallel_walk(ours.child(a), theirs.child(a), out)


def test_matches_openspiel_history_by_history():
    pyspiel = pytest.importorskip("pyspiel")
    from open_spiel.python import policy as os_policy
    from open_spiel.python.algorithms import exploitability as os_exploitability
    from fedarena.marl import exploitability

    pairs = []
    _parallel_walk(load_game("leduc_poker").new_initial_state(),
                   pyspiel.load_game("leduc_poker").new_initial_state(), pairs)
    assert len(pairs) == 9457
    names = {}
    for ours, theirs in pairs:
        if ours.is_terminal():
            assert ours.returns().tolist() == list(theirs.returns())
        elif not ours.is_chance_node():
            key = ours.information_state_string()
            other = theirs.information_state_string()
            assert names.setdefault(key, other) == other  # same partition into information states
    assert len(set(names.values())) == len(names) == 936

    # exploitability of a random policy agrees with OpenSpiel's (independent implementation)
    rng = np.random.default_rng(0)
    game = pyspiel.load_game("leduc_poker")
    tab = os_policy.TabularPolicy(game)
    ours_policy = {}
    for ours, theirs in pairs:
        if ours.is_terminal() or ours.is_chance_node():
            continue
        key = ours.information_state_string()
        if key in ours_policy:
            continue
        legal = ours.legal_actions()
        p = np.zeros(3)
        p[legal] = rng.dirichlet(np.ones(len(legal)))
        ours_policy[key] = p
        tab.policy_for_key(names[key])[:] = p
    expected = os_exploitability.exploitability(game, tab)
    assert exploitability(load_game("leduc_poker"), ours_policy) == pytest.approx(expected, abs=1e-12)


def test_expected_returns_match_monte_carlo_play():
    from fedarena.marl.best_response import expected_returns
    from fedarena.marl.policy import uniform_policy

    game = load_game("leduc_poker")
    rng = np.random.default_rng(11)
    u = uniform_policy(game)
    probs = np.where(u.tree.legal, rng.random(u.probs.shape) + 0.1, 0.0)
    probs /= probs.sum(axis=1, keepdims=True)
    policy = {s: probs[i] for i, s in enumerate(u.infostates)}
    n = 3000
    out = np.empty((n, 2))
    for k in range(n):
        s = game.new_initial_state()
        while not s.is_terminal():
            if s.is_chance_node():
                acts, ps = zip(*s.chance_outcomes())
            else:
                acts = s.legal_actions()
                ps = [policy[s.information_state_string()][a] for a in acts]
            j = min(int(np.searchsorted(np.cumsum(ps), rng.random(), side="right")), len(acts) - 1)
            s.apply_action(acts[j])
        out[k] = s.returns()
    exact = expected_returns(game, policy)
    se = out.std(axis=0, ddof=1) / np.sqrt(n)
    assert np.all(np.abs(out.mean(axis=0) - exact) < 4 * se)
