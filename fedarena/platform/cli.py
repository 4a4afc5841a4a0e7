"""The ``fedarena`` command: run, list, show and report experiments (``python -m fedarena`` too).

Errors in the user's input (config, overrides, run folders) print one line and exit with status 2;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from fedarena.platform.config import ConfigError

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedarena",
        description="fedarena: multi-agent RL and federated learning experiments from YAML configs.",
    )
    p.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    r = sub.add_parser("run", help="run an experiment from a YAML config (or resume one)",
                       description="Run an experiment. Results go to runs/<kind>-<UTC time>-<id>/ unless --out is given.")
    r.add_argument("config", nargs="?", help="experiment config (YAML); optional with --resume")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value (YAML syntax), e.g. --set iterations=500; repeatable")
    r.add_argument("--out", help="run folder to write (default: runs/<kind>-<UTC timestamp>-<id>)")
    r.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run from its newest valid checkpoint")
    r.add_argument("--quiet", action="store_true", help="no progress bar; only warnings and the final summary")
    r.add_argument("--no-report", action="store_true", help="skip rendering the report at the end")

    sub.add_parser("list", help="list experiment kinds and the configs under experiments/",
                   description="List the registered experiment kinds and the configs found under experiments/.")

    s = sub.add_parser("show", help="print the fully resolved config",
                       description="Print a config after defaults and --set overrides are applied.")
    s.add_argument("config", help="experiment config (YAML)")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value; repeatable")
    s.add_argument("--docs", action="store_true", help="list every field with its type, default and description")

    rep = sub.add_parser("report", help="re-render the report of a run folder",
                         description="Re-create report/ (plots and index.html) of a run folder from its metrics.")
    rep.add_argument("run_dir", help="a run folder, e.g. runs/matrix_dynamics-20260101T000000Z-abc123")
    return p


def _experiments_dir() -> Path:
    here = Path.cwd() / "experiments"
    if here.is_dir():
        return here
    return Path(__file__).resolve().parents[2] / "experiments"


def cmd_list() -> int:
    from fedarena.platform.config import load_yaml
    from fedarena.platform.registry import list_kinds

    kinds = list_kinds()
    width = max(len(k.name) for k in kinds)
    print("Experiment kinds:")
    for k in kinds:
        print(f"  {k.name:<{width}}  {k.description}")
    exp_dir = _experiments_dir()
    configs = sorted(exp_dir.glob("*.yaml")) if exp_dir.is_dir() else []
    print(f"\nConfigs in {exp_dir}:")
    for path in configs:
        try:
            kind = load_yaml(path).get("kind", "?")
        except ConfigError:
            kind = "(unreadable)"
        print(f"  {path.name:<32} kind: {kind}")
    if not configs:
        print("  (none)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from fedarena.platform import config as cfgmod
    from fedarena.platform.runs import resolve

    experiment, cfg = resolve(args.config, args.overrides)
    if args.docs:
        print("\n".join(cfgmod.describe(experiment.config)))
    else:
        sys.stdout.write(cfgmod.dump_yaml(cfg))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from fedarena.platform.runs import execute

    if args.config is None and args.resume is None:
        raise ConfigError("run: give a CONFIG file, or --resume RUN_DIR")
    summary = execute(args.config, args.overrides, out=args.out, resume=args.resume, quiet=args.quiet,
                      report=not args.no_report)
    run_dir = summary.pop("run_dir")
    report = summary.pop("report", None)
    if summary.pop("already_completed", False):
        print(f"run {run_dir} had already completed; nothing to resume")
    print("summary:")
    for k, v in summary.items():
        print(f"  {k}: {v:.6g}" if isinstance(v, float) else f"  {k}: {v}")
    print(f"run folder: {run_dir}")
    if report:
        print(f"report: {report}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedarena.platform.report import render

    print(f"report: {render(args.run_dir)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from fedarena.platform.runs import RunError

    try:
        if args.command == "list":
            return cmd_list()
        if args.command == "show":
            return cmd_show(args)
        if args.command == "run":
            return cmd_run(args)
        return cmd_report(args)
    except (ConfigError, RunError) as e:
        if args.debug:
            raise
        print(f"fedarena: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("fedarena: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
