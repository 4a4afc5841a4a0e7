"""The OpenSpiel adapter against OpenSpiel itself: NashConv of random policies, CFR+, XFP and PSRO on
converted games, parameter parsing, one-line errors, and the imperfect-recall check of the compiled tree."""

from __future__ import annotations

import numpy as np
import pytest

pyspiel = pytest.importorskip("pyspiel")

from fedarena.envs import CHANCE, TERMINAL, Game, State, load_game  # noqa: E402
from fedarena.envs.openspiel import OpenSpielGame  # noqa: E402
from fedarena.marl import exploitability, nash_conv, policy_from_array  # noqa: E402
from fedarena.marl.cfr import CFRSolver  # noqa: E402
from fedarena.marl.game_tree import ImperfectRecallError, game_tree  # noqa: E402
from fedarena.marl.psro import PSRO  # noqa: E402
from fedarena.marl.xfp import XFPSolver  # noqa: E402

GOOFSPIEL4 = "goofspiel(num_cards=4,imp_info=True,points_order=descending)"


def random_policy(tree, rng: np.random.Generator) -> np.ndarray:
    p = rng.dirichlet(np.ones(tree.num_actions), size=tree.num_infostates) * tree.legal
    return p / p.sum(axis=1, keepdims=True)


def to_pyspiel(tree, probs: np.ndarray):
    return pyspiel.TabularPolicy({s: [(int(a), float(probs[i, a])) for a in np.flatnonzero(tree.legal[i])]
                                  for i, s in enumerate(tree.infostates)})


# liar's dice with 3-sided dice keeps the test short (the 6-sided game is in benchmarks/openspiel_adapter.py)
@pytest.mark.parametrize("spec", ["kuhn_poker(players=3)", GOOFSPIEL4, "liars_dice(dice_sides=3)"])
def test_nash_conv_of_random_policies_equals_openspiel(spec):
    game = load_game(spec)
    assert isinstance(game, OpenSpielGame)
    tree = game_tree(game)
    rng = np.random.default_rng(7)
    for _ in range(10):
        probs = random_policy(tree, rng)
        ours = nash_conv(game, policy_from_array(game, probs))
        theirs = pyspiel.nash_conv(game.pyspiel_game, to_pyspiel(tree, probs), False)
        assert ours == pytest.approx(theirs, abs=1e-9)


@pytest.mark.quick
def test_parameters_are_parsed_and_simultaneous_games_become_turn_based():
    g = load_game("kuhn_poker(players=3)")
    assert g.num_players == 3 and g.num_distinct_actions == 2
    gs = load_game(GOOFSPIEL4)
    assert gs.pyspiel_game.get_type().dynamics == pyspiel.GameType.Dynamics.SEQUENTIAL
    s = gs.new_initial_state()
    assert s.current_player() == 0
    s.apply_action(3)  # player 0 plays card 4; player 1 moves next without seeing it
    assert s.current_player() == 1
    other = gs.new_initial_state()
    other.apply_action(0)
    assert s.information_state_string(1) == other.information_state_string(1)
    assert load_game(GOOFSPIEL4) == gs and hash(load_game(GOOFSPIEL4)) == hash(gs)
    d = load_game("liars_dice")
    s = d.new_initial_state()
    assert s.current_player() == CHANCE and len(s.chance_outcomes()) == 6
    assert d.information_state_tensor_shape() == tuple(d.pyspiel_game.information_state_tensor_shape())


def test_openspiel_kuhn_equals_fedarena_kuhn_under_cfr_plus():
    # OpenSpiel's Kuhn information states are fedarena's ("1pb"), so CFR+ must produce the same policy
    ours = CFRSolver(load_game("kuhn_poker"), plus=True).run(50).average_policy()
    theirs = CFRSolver(load_game("openspiel:kuhn_poker"), plus=True).run(50).average_policy()
    assert ours.infostates == theirs.infostates
    np.testing.assert_allclose(ours.probs, theirs.probs, atol=1e-12)


def test_cfr_plus_xfp_and_psro_on_goofspiel_match_openspiel():
    from open_spiel.python import policy as os_policy
    from open_spiel.python.algorithms import cfr as os_cfr
    from open_spiel.python.algorithms import exploitability as os_expl

    game = load_game(GOOFSPIEL4)
    solver = CFRSolver(game, plus=True).run(20)
    ref = os_cfr.CFRPlusSolver(game.pyspiel_game)
    for _ in range(20):
        ref.evaluate_and_update_policy()
    theirs = os_expl.exploitability(game.pyspiel_game, ref.average_policy())
    assert exploitability(game, solver.average_policy()) == pytest.approx(theirs, abs=1e-9)

    xfp = XFPSolver(game).run(5)
    tab = os_policy.TabularPolicy(game.pyspiel_game)
    avg = xfp.average_policy()
    for s, row in tab.state_lookup.items():
        tab.action_probability_array[row] = avg[s]
    assert exploitability(game, avg) == pytest.approx(os_expl.exploitability(game.pyspiel_game, tab), abs=1e-9)

    psro = PSRO(game, meta_solver="nash").run(4)
    joint = psro.joint_policy()
    for s, row in tab.state_lookup.items():
        tab.action_probability_array[row] = joint[s]
    assert psro.exploitability() == pytest.approx(os_expl.exploitability(game.pyspiel_game, tab), abs=1e-9)


def test_bad_game_strings_are_one_line_key_errors():
    with pytest.raises(KeyError) as e:
        load_game("goofspiel(num_cards=x)")
    assert "OpenSpiel cannot load 'goofspiel(num_cards=x)'" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(KeyError, match="unknown game 'no_such_game'") as e:
        load_game("no_such_game")
    assert "\n" not in str(e.value)
    with pytest.raises(KeyError, match="Missing closing bracket"):
        load_game("liars_dice(")


def test_cli_exits_2_on_a_game_string_openspiel_cannot_parse(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("kind: cfr\ngame: 'goofspiel(num_cards=x)'\niterations: 1\n")
    r = subprocess.run([sys.executable, "-m", "fedarena", "run", str(cfg), "--out", str(tmp_path / "run")],
                       capture_output=True, text=True)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "OpenSpiel cannot load" in lines[0], r.stderr


# ----------------------------------------------------------------------------- imperfect recall


class _ForgetfulState(State):
    """Player 0 picks L/R, player 1 then picks (without seeing it), then player 0 moves again having
    forgotten her first move: her second information state "second" holds histories with different
    own pasts, at equal depth and with equal legal actions (so only the recall check can catch it)."""

    def __init__(self, moves=()):
        self.moves = list(moves)

    def current_player(self):
        return TERMINAL if len(self.moves) == 3 else (0, 1, 0)[len(self.moves)]

    def legal_actions(self):
        return [] if len(self.moves) == 3 else [0, 1]

    def chance_outcomes(self):
        return []

    def _apply(self, action):
        self.moves.append(action)

    def information_state_string(self, player=None):
        player = self.current_player() if player is None else player
        if player == 1:
            return "p1"
        return "first" if not self.moves else "second"

    def returns(self):
        if len(self.moves) < 3:
            return np.zeros(2)
        u = float(self.moves[0] == self.moves[2])
        return np.array([u, -u])

    def clone(self):
        return _ForgetfulState(self.moves)

    def history(self):
        return list(self.moves)


class _Forgetful(Game):
    name = "forgetful"
    num_players = 2
    num_distinct_actions = 2

    def new_initial_state(self):
        return _ForgetfulState()


def test_imperfect_recall_is_refused_naming_the_information_state():
    with pytest.raises(ImperfectRecallError, match="imperfect recall at information state 'second' of player 0"):
        game_tree(_Forgetful())
    with pytest.raises(ImperfectRecallError, match="imperfect recall"):
        exploitability(_Forgetful(), {"first": [0.5, 0.5], "p1": [0.5, 0.5], "second": [0.5, 0.5]})


def test_openspiel_imperfect_recall_variant_is_refused():
    # OpenSpiel's imperfect-recall liar's dice: a bidder remembers only the current bid
    with pytest.raises(ImperfectRecallError, match="information state 'P0 "):
        game_tree(load_game("liars_dice_ir(dice_sides=3)"))
