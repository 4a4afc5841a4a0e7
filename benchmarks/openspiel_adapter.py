"""The OpenSpiel adapter's acceptance check and cost: NashConv of random policies through fedarena's compiled
tree vs OpenSpiel's C++ ``pyspiel.nash_conv`` on the same (turn-based) game, in one run.

    python benchmarks/openspiel_adapter.py [--policies 10] [--games liars_dice ...]

Prints, per game: histories, information states, tree compile time, the largest |NashConv difference| over
the random policies (acceptance: <= 1e-9), and the per-policy time of each library with their ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyspiel

from fedarena.envs import load_game
from fedarena.marl import nash_conv, policy_from_array
from fedarena.marl.game_tree import game_tree

GAMES = ("liars_dice", "goofspiel(num_cards=4,imp_info=True,points_order=descending)", "kuhn_poker(players=3)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", type=int, default=10)
    ap.add_argument("--games", nargs="+", default=list(GAMES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"{'game':62s} {'histories':>9s} {'infostates':>10s} {'compile s':>9s} {'max |diff|':>10s} "
          f"{'fedarena s':>10s} {'openspiel s':>11s} {'ratio':>6s}")
    for spec in args.games:
        game = load_game(spec)
        t0 = time.perf_counter()
        tree = game_tree(game)
        compile_s = time.perf_counter() - t0
        rng = np.random.default_rng(args.seed)
        worst, ours_s, theirs_s = 0.0, 0.0, 0.0
        for _ in range(args.policies):
            p = rng.dirichlet(np.ones(tree.num_actions), size=tree.num_infostates) * tree.legal
            p /= p.sum(axis=1, keepdims=True)
            t0 = time.perf_counter()
            ours = nash_conv(game, policy_from_array(game, p))
            ours_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            tab = pyspiel.TabularPolicy({s: [(int(a), float(p[i, a])) for a in np.flatnonzero(tree.legal[i])]
                                         for i, s in enumerate(tree.infostates)})
            theirs = pyspiel.nash_conv(game.pyspiel_game, tab, False)
            theirs_s += time.perf_counter() - t0
            worst = max(worst, abs(ours - theirs))
        n = args.policies
        print(f"{spec:62s} {tree.num_nodes:9d} {tree.num_infostates:10d} {compile_s:9.2f} {worst:10.2e} "
              f"{ours_s / n:10.4f} {theirs_s / n:11.4f} {theirs_s / max(ours_s, 1e-12):6.1f}x"
              f"  {'OK' if worst <= 1e-9 else 'FAIL'}")


if __name__ == "__main__":
    main()
