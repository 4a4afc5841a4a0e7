"""Kuhn poker rules (Kuhn, 1950): deals, legal actions, information states and payoffs."""


import numpy as np
import pytest

from fedarena.envs import CHANCE, TERMINAL, IllegalActionError, load_game
from fedarena.envs.efg import all_histories


def play(cards, bets):
    s = load_game("kuhn_poker").new_initial_state()
    for c in cards:
        s.apply_action(c)
    for b in bets:
        s.apply_action("pb".index(b))
    return s


@pytest.mark.quick
def test_deal_is_uniform_over_ordered_pairs():
    s = load_game("kuhn_poker").new_initial_state()
    assert s.current_player() == CHANCE
    assert s.chance_outcomes() == [(0, 1 / 3), (1, 1 / 3), (2, 1 / 3)]
    s.apply_action(1)
    assert s.chance_outcomes() == [(0, 0.5), (2, 0.5)]
    with pytest.raises(IllegalActionError, match="not legal"):
        s.apply_action(1)  # the card already dealt


@pytest.mark.parametrize("bets,expected", [
    ("pp", {(2, 0): 1, (0, 2): -1}),
    ("bp", {(2, 0): 1, (0, 2): 1}),
    ("pbp", {(2, 0): -1, (0, 2): -1}),
    ("bb", {(2, 0): 2, (0, 2): -2}),
    ("pbb", {(2, 0): 2, (0, 2): -2}),
])
def test_terminal_payoffs(bets, expected):
    for cards, r0 in expected.items():
        s = play(cards, bets)
        assert s.is_terminal() and s.current_player() == TERMINAL
        assert s.returns().tolist() == [r0, -r0]


def test_information_states_use_card_digit_and_history():
    s = play((1, 2), "pb")
    assert s.current_player() == 0
    assert s.information_state_string() == "1pb"
    assert s.information_state_string(1) == "2pb"
    assert s.legal_actions() == [0, 1]
    infostates = {h.information_state_string() for h in all_histories(load_game("kuhn_poker"))
                  if h.current_player() >= 0}
    expected = {f"{c}{h}" for c in "012" for h in ["", "p", "b", "pb"]}
    assert infostates == expected


@pytest.mark.quick
def test_game_tree_size_and_returns_are_zero_sum():
    hs = all_histories(load_game("kuhn_poker"))
    terminals = [h for h in hs if h.is_terminal()]
    assert len(hs) == 58 and len(terminals) == 30
    for h in terminals:
        assert h.returns().sum() == 0


def test_clone_is_independent_and_terminal_rejects_actions():
    s = play((0, 1), "p")
    c = s.clone()
    c.apply_action(1)
    assert s.history() == [0, 1, 0] and c.history() == [0, 1, 0, 1]
    t = play((0, 1), "pp")
    with pytest.raises(IllegalActionError, match="game is over"):
        t.apply_action(0)
    assert t.legal_actions() == []


def _sample_returns(policy, n, rng):
    """Monte Carlo play through the State API (independent of the compiled tree)."""
    game = load_game("kuhn_poker")
    out = np.empty((n, 2))
    for k in range(n):
        s = game.new_initial_state()
        while not s.is_terminal():
            if s.is_chance_node():
                acts, probs = zip(*s.chance_outcomes())
            else:
                acts = s.legal_actions()
                probs = [policy[s.information_state_string()][a] for a in acts]
            k_act = min(int(np.searchsorted(np.cumsum(probs), rng.random(), side="right")), len(acts) - 1)
            s.apply_action(acts[k_act])
        out[k] = s.returns()
    return out


def test_expected_returns_match_monte_carlo_play():
    from fedarena.marl.best_response import expected_returns

    rng = np.random.default_rng(3)
    game = load_game("kuhn_poker")
    keys = [f"{c}{h}" for c in "012" for h in ["", "p", "b", "pb"]]
    policy = {k: rng.dirichlet([1, 1]).tolist() for k in keys}
    exact = expected_returns(game, policy)
    samples = _sample_returns(policy, 8000, rng)
    se = samples.std(axis=0, ddof=1) / np.sqrt(len(samples))
    assert np.all(np.abs(samples.mean(axis=0) - exact) < 4 * se)
    assert exact.sum() == pytest.approx(0.0, abs=1e-12)
