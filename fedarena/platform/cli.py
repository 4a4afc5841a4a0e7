"""The ``fedarena`` command: run, sweep, evaluate, list, show and report experiments, and serve the board
(``python -m fedarena`` too).

Exit status: 0 on success; 2 for a *user error*, 1 for an *internal error*; 128 + the signal's
number when interrupted (130 for Ctrl-C / SIGINT, 143 for SIGTERM). Either error
prints one line on stderr (``fedarena: error: ...``) and, for ``run`` with a config whose kind is known, the run
folder's ``status.json`` says ``failed`` with the same message (a config rejected at load still gets its folder;
see :mod:`fedarena.platform.runs`); ``--debug`` shows the traceback instead. ``show`` writes nothing.
The rule (:mod:`fedarena.platform.errors`): a user error is an exception deriving from
``fedarena.platform.errors.UserError`` (``ConfigError``, ``RunError``, ``CheckpointError``,
``MissingDependencyError``, ``EnvironmentFailure``) or whose class sets ``user_error = True`` (lower layers such
as ``fedarena.envs`` mark their input errors that way): bad config values, unknown environment ids, missing
optional packages, an environment that raises, unreadable run folders. Anything else is a bug in fedarena.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Sequence

from fedarena.platform.config import ConfigError
from fedarena.platform.errors import EXIT_USER, exit_status, is_user_error, one_line

EXIT_USAGE = EXIT_USER


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
    r.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                   help="run one run per seed under a group folder, with a group report (as `seeds:` in the config)")
    r.add_argument("--parallel", type=int, default=0, metavar="N",
                   help="with --seeds: runs at a time (default 0 = one per CPU, at most one per seed)")
    r.add_argument("--profile-run", metavar="FILE",
                   help="profile the run (the kind's imports, config, run folder, the kind's steps, metrics) with "
                        "cProfile: statistics to FILE (python -m pstats FILE), a summary of where the time went "
                        "to FILE.txt (with the CPU time spent before, on interpreter start and the CLI's imports)")

    sw = sub.add_parser("sweep", help="a hyperparameter sweep: one run per trial and a report naming the best",
                        description="Vary config fields (dotted paths) by grid, random search or Optuna; trials run "
                                    "in parallel processes or on Ray Tune (--ray, with ASHA early stopping). Writes "
                                    "runs/<kind>-sweep-<UTC time>-<id>/ unless --out is given.")
    sw.add_argument("config", help="experiment config (YAML)")
    how = sw.add_mutually_exclusive_group(required=True)
    how.add_argument("--grid", nargs="+", metavar="FIELD=V1,V2", help="every combination of these values")
    how.add_argument("--random", nargs="+", metavar="ARG",
                     help="N FIELD=DIST ...: N random trials; DIST: uniform(a,b), loguniform(a,b), int(a,b), "
                          "choice(v1,v2,...)")
    how.add_argument("--optuna", nargs="+", metavar="ARG",
                     help="N FIELD=DIST ...: N trials proposed by Optuna's TPE sampler")
    sw.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                    help="override a value of the base config; repeatable")
    sw.add_argument("--metric", help="what to rank trials by (default: the kind's main metric, e.g. eval_return)")
    sw.add_argument("--mode", choices=("max", "min"), help="maximise or minimise the metric (default by its name)")
    sw.add_argument("--parallel", type=int, default=0, metavar="N", help="trials at a time (default 1)")
    sw.add_argument("--ray", action="store_true", help="run the trials as Ray Tune trials with ASHA early stopping")
    sw.add_argument("--seed", type=int, default=0, help="seed of the random / Optuna sampler (default 0)")
    sw.add_argument("--out", help="sweep folder to write")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")

    ev = sub.add_parser("evaluate", help="replay a run's exported policy for evaluation episodes",
                        description="Load a run's exported policy (final or best) and play deterministic evaluation "
                                    "episodes with the run's evaluation seeds; prints the mean return.")
    ev.add_argument("run_dir", help="a run folder written by an RL kind")
    ev.add_argument("--episodes", type=int, default=None, help="episodes to play (default: the run's eval.episodes)")
    ev.add_argument("--policy", choices=("final", "best"), default="final", help="which exported policy to load")
    ev.add_argument("--seed", type=int, default=None, help="seed of the first episode (default: the run's eval seed)")
    ev.add_argument("--render", choices=("rgb_array",), default=None,
                    help="also record episodes as frames (an animated GIF per episode under RUN_DIR/evaluation/)")
    ev.add_argument("--render-episodes", type=int, default=1, metavar="N",
                    help="with --render: how many of the episodes to record (default 1)")

    sub.add_parser("list", help="list experiment kinds and the configs under experiments/",
                   description="List the registered experiment kinds and the configs found under experiments/.")

    s = sub.add_parser("show", help="print the fully resolved config",
                       description="Print a config after defaults and --set overrides are applied.")
    s.add_argument("config", help="experiment config (YAML)")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value; repeatable")
    s.add_argument("--docs", action="store_true", help="list every field with its type, default and description")
    s.add_argument("--migrate", action="store_true",
                   help="print the config rewritten from an old flat layout into the kind's nested sections (the "
                        "file's leading comments kept); the file itself is not changed")

    b = sub.add_parser("board", help="serve the training board (runs, live curves, compare, lineage, profiles)",
                       description="A read-only local web server over a folder of run folders: runs list, live "
                                   "run pages, comparison, lineage, engine profiles, FL and league views.")
    b.add_argument("runs_dir", nargs="?", default="runs", help="folder holding run folders (default: runs)")
    b.add_argument("--port", type=int, default=8050, help="port to listen on (default 8050; 0 picks a free one)")
    b.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1, this machine only); beyond loopback the board asks "
                        "for an access token, printed in its URL")
    b.add_argument("--allow-host", dest="allow_hosts", action="append", default=[], metavar="NAME",
                   help="also answer to requests for this host name (default: localhost, 127.0.0.1, [::1] and "
                        "the --host address); repeatable")
    b.add_argument("--token", default=None, help="the access token to require (default: a new random one when "
                                                 "--host is beyond loopback, none on loopback)")
    b.add_argument("--no-token", action="store_true",
                   help="serve beyond loopback without a token (anyone who can reach the port reads the runs)")

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

    if args.migrate:
        sys.stdout.write(_migrated(args.config, args.overrides))
        return 0
    experiment, cfg = resolve(args.config, args.overrides)
    if args.docs:
        print("\n".join(cfgmod.describe(experiment.config, cfg)))
    else:
        sys.stdout.write(cfgmod.dump_yaml(cfg))
    return 0


def _migrated(path: str, overrides: list[str]) -> str:
    """``fedarena show --migrate``: the file's leading comment lines, then its data moved into the kind's current
    layout (:func:`fedarena.platform.config.migrate`), checked by building the kind's config from it."""
    import yaml

    from fedarena.platform import config as cfgmod
    from fedarena.platform.runs import load_given

    data, experiment = load_given(path, overrides)
    nested = cfgmod.migrate(experiment.config, data)
    cfgmod.build(experiment.config, nested)  # what is printed loads (or names its bad field)
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    header = [line for line in lines[:next((i for i, t in enumerate(lines) if not t.startswith("#")), len(lines))]]
    body = yaml.safe_dump(nested, sort_keys=False, default_flow_style=None, width=120)
    return "".join(f"{line}\n" for line in header) + body


def cmd_run(args: argparse.Namespace) -> int:
    from fedarena.platform.runs import execute

    if args.config is None and args.resume is None:
        raise ConfigError("run: give a CONFIG file, or --resume RUN_DIR")
    def run() -> dict:
        return execute(args.config, args.overrides, out=args.out, resume=args.resume, quiet=args.quiet,
                       report=not args.no_report, seeds=args.seeds, parallel=args.parallel)

    if args.profile_run:
        from fedarena.platform.run_profile import profile_call

        summary = profile_call(run, args.profile_run)
        print(f"profile: {args.profile_run} (summary: {args.profile_run}.txt)")
    else:
        summary = run()
    run_dir = summary.pop("run_dir")
    report = summary.pop("report", None)
    if summary.pop("already_completed", False):
        print(f"run {run_dir} had already completed; nothing to resume")
    print("summary:")
    if "reached_target/count" in summary:  # a seed group of a kind with a target
        print(f"  {summary['reached_target/count']} of {summary['reached_target/seeds']} seeds reached the target")
    for k, v in summary.items():
        print(f"  {k}: {v:.6g}" if isinstance(v, float) else f"  {k}: {v}")
    print(f"run folder: {run_dir}")
    if report:
        print(f"report: {report}")
    return 0


def _trials(values: list[str] | None, option: str) -> tuple[int, list[str]]:
    if not values:
        return 0, []
    try:
        n = int(values[0])
    except ValueError:
        raise ConfigError(f"{option}: expected the number of trials first, got '{values[0]}'") from None
    if n < 1:
        raise ConfigError(f"{option}: the number of trials must be >= 1, got {n}")
    return n, values[1:]


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedarena.platform.sweep import sweep

    samples, random = _trials(args.random, "--random")
    optuna, dists = _trials(args.optuna, "--optuna")
    result = sweep(args.config, grid=args.grid, space=random or dists, samples=samples, optuna=optuna,
                   overrides=args.overrides, out=args.out, parallel=args.parallel, ray=args.ray, metric=args.metric,
                   mode=args.mode, seed=args.seed, quiet=args.quiet)
    best = result.best
    print(f"sweep: {len(result.trials)} trials, {sum(t.state == 'completed' for t in result.trials)} completed")
    if best is not None:
        print(f"best: {best.name} {result.metric} = {best.value:.6g} at "
              + ", ".join(f"{k}={v}" for k, v in best.params.items()))
    print(f"sweep folder: {result.sweep_dir}")
    print(f"report: {result.report}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from fedarena.platform.api import evaluate

    result = evaluate(args.run_dir, episodes=args.episodes, policy=args.policy, seed=args.seed, render=args.render,
                      render_episodes=args.render_episodes)
    print("evaluation:")
    for k, v in result.items():  # full precision: comparable digit for digit with the run's eval_return
        print(f"  {k}: {v!r}" if isinstance(v, float) else f"  {k}: {v}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedarena.platform.report import render

    print(f"report: {render(args.run_dir)}")
    return 0


def cmd_board(args: argparse.Namespace) -> int:
    from fedarena.board import serve  # the board sits above the platform (tests/test_layering.py allows this one)
    from fedarena.platform.errors import RunError

    root = Path(args.runs_dir)
    if not root.is_dir():
        raise RunError(f"board {root}: not a folder (give the folder holding run folders, e.g. runs)")
    if any((root / f).exists() for f in ("status.json", "metrics.jsonl", "group.json")):
        print(f"board: {root} is a run folder; serving the folder that holds it", flush=True)
        root = root.resolve().parent
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port: expected 0..65535, got {args.port}")
    if args.token is not None and (args.no_token or len(args.token) < 8):
        raise ConfigError("--token: use at least 8 characters, and not with --no-token")
    try:
        serve(root, args.host, args.port, token=args.token, no_token=args.no_token, allow_hosts=tuple(args.allow_hosts))
    except OSError as e:
        raise RunError(f"board: cannot listen on {args.host}:{args.port} ({e.strerror or e})") from None
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {"list": lambda: cmd_list(), "show": lambda: cmd_show(args), "run": lambda: cmd_run(args),
                "evaluate": lambda: cmd_evaluate(args), "sweep": lambda: cmd_sweep(args), "report": lambda: cmd_report(args),
                "board": lambda: cmd_board(args)}
    try:
        return commands[args.command]()
    except KeyboardInterrupt as exc:  # Ctrl-C, or a stop signal turned into RunInterrupted by the run loop
        print("fedarena: interrupted", file=sys.stderr)
        return 128 + int(getattr(signal, getattr(exc, "signame", "SIGINT"), signal.SIGINT))
    except Exception as e:  # the error rule of the module docstring
        if args.debug:
            raise
        if is_user_error(e):
            print(f"fedarena: error: {one_line(e)}", file=sys.stderr)
        else:
            print(f"fedarena: internal error: {one_line(e)} (a bug in fedarena; --debug shows the traceback)",
                  file=sys.stderr)
        return exit_status(e)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
