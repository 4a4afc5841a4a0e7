"""fedarena vs OpenSpiel on Kuhn and Leduc poker: the same computations in one run, times and ratios.

Measured, with what is asserted:
- one CFR+ iteration: OpenSpiel's C++ ``pyspiel.CFRPlusSolver`` vs :class:`fedarena.marl.cfr.CFRSolver`; asserted:
  the exploitability of both average policies after the same number of iterations agrees to 1e-9 relative
  (same algorithm, same conventions: regret matching+, linear averaging, alternating updates);
- one exact exploitability: OpenSpiel's Python ``exploitability.exploitability`` vs
  :func:`fedarena.marl.exploitability`, on the same policies (uniform and a CFR+ average, mapped state by state);
  asserted: equal to 1e-9;
- one XFP iteration: OpenSpiel's Python ``fictitious_play.XFPSolver`` vs :class:`fedarena.marl.xfp.XFPSolver`; not
  asserted equal: both compute exact best responses, but break ties differently (fedarena: values within a
  relative 1e-12 are tied and the lowest action wins; OpenSpiel: Python's ``max``, the strictly largest float),
  and Kuhn poker has exactly tied best responses whose sums differ by rounding, so the trajectories part after a
  few iterations and the printed exploitabilities differ (on Kuhn at 20 iterations: 0.0456 vs 0.0417). The
  script prints whether they agree.

Run: ``python benchmarks/games_vs_openspiel.py [--quick]`` (needs ``open-spiel``, in the ``dev`` extra).
Acceptance targets on Leduc (printed as ratios, not asserted: timings vary with machine load): CFR+ >= 2x,
exploitability >= 5x, XFP >= 20x faster.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time



def timed(fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls."""
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def infostate_map(ours_game, their_game) -> dict[str, str]:
    """Our information-state string -> OpenSpiel's, by walking both trees in step."""
    names: dict[str, str] = {}
    stack = [(ours_game.new_initial_state(), their_game.new_initial_state())]
    while stack:
        a, b = stack.pop()
        if a.is_terminal():
            continue
        if a.is_chance_node():
            acts = [x for x, _ in a.chance_outcomes()]
        else:
            names.setdefault(a.information_state_string(), b.information_state_string())
            acts = a.legal_actions()
        for x in acts:
            stack.append((a.child(x), b.child(x)))
    return names


def to_openspiel(policy, their_game, names):
    from open_spiel.python import policy as os_policy

    tab = os_policy.TabularPolicy(their_game)
    for ours, theirs in names.items():
        tab.policy_for_key(theirs)[:] = policy[ours]
    return tab


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = ap.parse_args(argv)
    try:
        import pyspiel
        from open_spiel.python.algorithms import exploitability as os_exploitability
        from open_spiel.python.algorithms import fictitious_play as os_fp
    except ImportError:
        print("open-spiel is not installed (pip install open-spiel, or the dev extra)")
        return 1
    from fedarena.envs import load_game
    from fedarena.marl import exploitability
    from fedarena.marl.cfr import CFRSolver
    from fedarena.marl.game_tree import _build
    from fedarena.marl.policy import uniform_policy
    from fedarena.marl.xfp import XFPSolver

    q = args.quick
    rows = []

    def report(what, game, theirs_s, ours_s, check=""):
        ratio = theirs_s / ours_s
        rows.append((what, game, theirs_s, ours_s, ratio))
        print(f"{what:<34} {game:<12} openspiel {theirs_s * 1e3:10.3f} ms   fedarena {ours_s * 1e3:9.3f} ms"
              f"   ratio {ratio:7.1f}x  {check}", flush=True)

    for name in ("kuhn_poker", "leduc_poker"):
        ours_game, their_game = load_game(name), pyspiel.load_game(name)
        t0 = time.perf_counter()
        _build(ours_game)
        build_s = time.perf_counter() - t0
        print(f"\n== {name}: fedarena tree compilation (once per game, cached) {build_s * 1e3:.1f} ms")
        names = infostate_map(ours_game, their_game)

        # --- CFR+
        n_cfr = (20 if q else 200) if name == "leduc_poker" else (200 if q else 2000)
        theirs = pyspiel.CFRPlusSolver(their_game)
        t_theirs = timed(lambda: [theirs.evaluate_and_update_policy() for _ in range(n_cfr)], 1) / n_cfr
        ours = CFRSolver(ours_game, plus=True)
        t_ours = timed(lambda: ours.run(n_cfr), 1) / n_cfr
        e_theirs = os_exploitability.exploitability(their_game, theirs.average_policy())
        e_ours = exploitability(ours_game, ours.average_policy())
        assert abs(e_theirs - e_ours) <= 1e-9 * max(1.0, abs(e_theirs)), (name, e_theirs, e_ours)
        report("CFR+ iteration (C++ vs numpy)", name, t_theirs, t_ours,
               f"expl after {n_cfr}: {e_theirs:.3e} vs {e_ours:.3e} (asserted equal)")

        # --- exact exploitability, same policies on both sides
        reps = 3 if q else (10 if name == "leduc_poker" else 50)
        for label, pol in (("uniform", uniform_policy(ours_game)), ("CFR+ avg", ours.average_policy())):
            tab = to_openspiel(pol, their_game, names)
            t_theirs = timed(lambda: os_exploitability.exploitability(their_game, tab), reps)
            t_ours = timed(lambda: exploitability(ours_game, pol), reps * 5)
            a, b = os_exploitability.exploitability(their_game, tab), exploitability(ours_game, pol)
            assert abs(a - b) < 1e-9, (a, b)
            report(f"exploitability ({label})", name, t_theirs, t_ours, f"both {b:.12f}")

        # --- XFP
        n_their = (2 if q else 5) if name == "leduc_poker" else (20 if q else 100)
        n_ours = 10 * n_their
        theirs = os_fp.XFPSolver(their_game)
        t_theirs = timed(lambda: [theirs.iteration() for _ in range(n_their)], 1) / n_their
        ours = XFPSolver(ours_game)
        t_ours = timed(lambda: ours.run(n_ours), 1) / n_ours
        e_theirs = os_exploitability.exploitability(their_game, theirs.average_policy())
        same = XFPSolver(ours_game).run(n_their)
        e_ours = exploitability(ours_game, same.average_policy())
        agree = "agree" if abs(e_theirs - e_ours) <= 1e-9 else "differ: ties broken differently, see docstring"
        report("XFP iteration (Python vs numpy)", name, t_theirs, t_ours,
               f"expl after {n_their}: {e_theirs:.4f} vs {e_ours:.4f} ({agree})")

    print("\nsummary (ratio = OpenSpiel time / fedarena time; acceptance on Leduc: CFR+ >= 2, exploitability >= 5, XFP >= 20)")
    for what, game, a, b, r in rows:
        print(f"  {game:<12} {what:<34} {r:7.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
