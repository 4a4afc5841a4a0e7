"""Exported policies scored by OpenSpiel: every ``policy*.json`` under the given run or seed-group folders loads into
an OpenSpiel ``TabularPolicy`` (:func:`fedarena.marl.policy_export.to_openspiel_policy`), and OpenSpiel's own
``exploitability`` of it is printed beside fedarena's exact exploitability of the same file; the script exits 1
when any pair differs by more than ``--tol`` (default 1e-9).

    python benchmarks/exported_vs_openspiel.py runs/nfsp-liars-dice-seeds      # a seed group: every seed's file
    python benchmarks/exported_vs_openspiel.py runs/deep_cfr-...                # one run

OpenSpiel's Python best response walks the whole tree: on liar's dice (one die each) it takes about 15 s of CPU
per policy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyspiel
from open_spiel.python.algorithms import exploitability as os_exploitability

from fedarena.marl.policy_export import exact_exploitability, load_policy, to_openspiel_policy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="run folders or seed-group folders")
    ap.add_argument("--tol", type=float, default=1e-9, help="largest accepted |OpenSpiel - fedarena|")
    args = ap.parse_args()
    paths = sorted(p for f in args.folders for p in f.rglob("policy*.json") if "report" not in p.parts)
    if not paths:
        print(f"no policy*.json under {', '.join(map(str, args.folders))}", file=sys.stderr)
        return 2
    worst = 0.0
    print(f"{'policy file':60s} {'OpenSpiel':>20s} {'fedarena':>20s} {'|difference|':>12s}")
    for path in paths:
        exported = load_policy(path)
        theirs = float(os_exploitability.exploitability(pyspiel.load_game(exported.game),
                                                        to_openspiel_policy(exported)))
        ours = exact_exploitability(exported)
        worst = max(worst, abs(theirs - ours))
        print(f"{str(path):60s} {theirs:20.15f} {ours:20.15f} {abs(theirs - ours):12.2e}", flush=True)
    print(f"largest difference {worst:.2e} (tolerance {args.tol:g})")
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
