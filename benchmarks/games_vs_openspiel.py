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

- external-sampling MCCFR (``--mccfr``, Leduc and liar's dice with one die): OpenSpiel's C++
  ``pyspiel.ExternalSamplingMCCFRSolver`` (one sample per player per iteration, ``SIMPLE`` averaging) vs
  :class:`fedarena.marl.mccfr.MCCFRSolver` twice -- 512 samples per player per iteration with uniform averaging
  (the textbook algorithm, samples summed), and 4096 samples with discounted CFR's weights (alpha 1.5, beta 0,
  gamma 2; Brown & Sandholm, 2019) -- each run until
  its average policy's exact exploitability is <= the target (0.05) or a time budget is spent; exploitability is
  evaluated at geometrically spaced points (every 25% more solver time) outside the timed sections. Printed: solver
  wall time and histories touched to the target and their ratios; drawn: exploitability against solver wall time
  and against histories touched, side by side (``--figure``). Histories touched by OpenSpiel's solver are counted on
  OpenSpiel's Python ``ExternalSamplingSolver`` (the same algorithm; the C++ solver exposes no counter), run for the
  same number of iterations in a separate, untimed pass with a counting wrapper around its recursive
  ``_update_regrets``.

Run: ``python benchmarks/games_vs_openspiel.py [--quick] [--mccfr] [--figure PATH]`` (needs ``open-spiel``, in the
``dev`` extra). Acceptance targets on Leduc (printed as ratios, not asserted: timings vary with machine load):
CFR+ >= 2x, exploitability >= 5x, XFP >= 20x faster; ES-MCCFR reaches exploitability <= 0.05 >= 3x faster in wall
time than OpenSpiel's C++ ES-MCCFR.
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


def _race(step, evaluate, target: float, budget_s: float) -> list[tuple[float, int, float]]:
    """Run ``step(k)`` (k more iterations; returns the histories touched so far, or -1) until ``evaluate()`` <=
    ``target`` or ``budget_s`` of solver time; evaluations (untimed) after every 25% more solver time.
    Returns ``(solver seconds, iterations, exploitability)`` points."""
    points, t, it, chunk = [], 0.0, 0, 1
    while t < budget_s:
        t0 = time.perf_counter()
        step(chunk)
        t += time.perf_counter() - t0
        it += chunk
        e = evaluate()
        points.append((t, it, e))
        if e <= target:
            break
        chunk = max(1, int(round(it * 0.25)))
    return points


def _first_below(points, target):
    return next((p for p in points if p[2] <= target), None)


def _ours():
    from fedarena.marl.mccfr import MCCFROptions

    return {"ES batch 512": MCCFROptions(sampling="external", batch=512),
            "ES batch 4096, DCFR weights": MCCFROptions(sampling="external", batch=4096, discount=(1.5, 0.0, 2.0))}


def mccfr_benchmark(quick: bool, figure: str | None) -> list[tuple]:
    """ES-MCCFR, fedarena vs OpenSpiel C++, on Leduc and liar's dice(1 die); see the module docstring."""
    import pyspiel
    from open_spiel.python.algorithms import external_sampling_mccfr as os_es

    from fedarena.envs import load_game
    from fedarena.marl import exploitability
    from fedarena.marl.game_tree import game_tree
    from fedarena.marl.mccfr import MCCFRSolver

    OURS = _ours()
    target = 0.05
    results = []
    curves = {}
    for name, spec, budget in (("leduc_poker", "leduc_poker", 30.0 if quick else 240.0),
                               ("liars_dice(1)", "liars_dice(numdice=1)", 30.0 if quick else 300.0)):
        their_game = pyspiel.load_game(spec)
        ours_game = load_game(spec)
        t0 = time.perf_counter()
        tree = game_tree(ours_game)
        print(f"\n== ES-MCCFR on {name}: fedarena tree compilation (once) {time.perf_counter() - t0:.1f} s "
              f"({tree.num_nodes:,} histories; not counted in the solver time)", flush=True)
        theirs = pyspiel.ExternalSamplingMCCFRSolver(their_game, seed=1)
        p_theirs = _race(lambda k: [theirs.run_iteration() for _ in range(k)],
                         lambda: pyspiel.exploitability(their_game, theirs.average_policy()), target, budget)
        ours_runs = {}
        for label, opts in OURS.items():
            ours = MCCFRSolver(tree, opts, seed=1)
            pts = _race(ours.run, lambda: exploitability(tree, ours.average_policy()), target, budget)
            ours_runs[label] = (pts, ours.nodes_touched / ours.iterations)
        # histories touched per iteration of OpenSpiel's ES, on its Python twin (untimed)
        counter = os_es.ExternalSamplingSolver(their_game)
        touched = [0]
        recurse = counter._update_regrets

        def counting(state, player):
            touched[0] += 1
            return recurse(state, player)

        counter._update_regrets = counting
        n_count = min(2000 if not quick else 200, p_theirs[-1][1])
        for _ in range(n_count):
            counter.iteration()
        per_iteration = touched[0] / n_count
        curves[name] = {"OpenSpiel C++ ES-MCCFR": [(t, it * per_iteration, e) for t, it, e in p_theirs]}
        t, it, e = p_theirs[-1]
        print(f"  OpenSpiel C++ ES-MCCFR: last point {it} iterations, {t:.2f} s solver time, exploitability {e:.4f}; "
              f"{per_iteration:.1f} histories per iteration (counted over {n_count} iterations of its Python twin)")
        a = _first_below(p_theirs, target)
        for label, (pts, per_it) in ours_runs.items():
            curves[name][f"fedarena {label}"] = [(t, i * per_it, e) for t, i, e in pts]
            t, it, e = pts[-1]
            print(f"  fedarena {label}: last point {it} iterations, {t:.2f} s solver time, exploitability {e:.4f}; "
                  f"{per_it:.0f} sample-histories per iteration")
            b = _first_below(pts, target)
            if a and b:
                ratio_t = a[0] / b[0]
                ratio_n = (a[1] * per_iteration) / (b[1] * per_it)
                print(f"    to exploitability <= {target}: OpenSpiel {a[0]:.2f} s / "
                      f"{a[1] * per_iteration:.3g} histories, fedarena {b[0]:.2f} s / {b[1] * per_it:.3g} histories: "
                      f"wall-time ratio {ratio_t:.1f}x, "
                      f"histories ratio {ratio_n:.2f}x (OpenSpiel / fedarena)", flush=True)
                results.append((f"{label} to <= {target}", name, a[0], b[0], ratio_t))
            else:
                print(f"    to exploitability <= {target}: not reached within {budget:.0f} s by "
                      f"{'OpenSpiel' if not a else 'fedarena'}", flush=True)
    if figure:
        _draw(curves, target, figure)
    return results


def _draw(curves, target, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(curves), 2, figsize=(11, 4 * len(curves)), squeeze=False)
    for row, (name, series) in zip(axes, curves.items()):
        for label, pts in series.items():
            t, n, e = (list(v) for v in zip(*pts))
            row[0].plot(t, e, "o-", ms=3, lw=1.3, label=label)
            row[1].plot(n, e, "o-", ms=3, lw=1.3, label=label)
        for ax, xl in zip(row, ("solver wall time (s)", "histories touched")):
            ax.axhline(target, color="grey", ls=":", lw=1)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(xl)
            ax.set_ylabel("exact exploitability of the average policy")
            ax.set_title(name)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"figure: {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--mccfr", action="store_true", help="only the ES-MCCFR race (Leduc, liar's dice with one die)")
    ap.add_argument("--figure", default="mccfr_vs_openspiel.png", help="where --mccfr draws its curves")
    args = ap.parse_args(argv)
    if args.mccfr:
        rows = mccfr_benchmark(args.quick, args.figure)
        print("\nsummary (ratio = OpenSpiel time / fedarena time; acceptance on Leduc: ES-MCCFR >= 3)")
        for what, game, a, b, r in rows:
            print(f"  {game:<14} {what:<28} openspiel {a:8.2f} s  fedarena {b:8.2f} s  {r:7.1f}x")
        return 0
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
    from fedarena.envs.efg import max_tree_nodes
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
        _build(ours_game, max_tree_nodes())
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
