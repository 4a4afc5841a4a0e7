"""fedarena: multi-agent reinforcement learning and federated learning on its own engine.

Subpackages (imports point down only, see docs/architecture.md):
``platform`` (config, CLI, run folders), ``engine`` (graph IR, autodiff, backends),
``envs`` (games and environments), ``rl``, ``marl``, ``privacy``, ``federated``.

For scripts (README, "Python API"): ``fedarena.run(config_or_path, overrides={...}, out=None, seeds=None) -> Result``
runs an experiment as ``fedarena run`` does, ``fedarena.load_run(run_dir)`` reads a finished one
(:mod:`fedarena.platform.api`), ``fedarena.evaluate(run)`` replays its exported policy as ``fedarena evaluate``,
``fedarena.load_policy(run)`` loads that policy (:class:`fedarena.rl.evaluation.Policy`: act, evaluate, PyTorch
and ONNX rebuilds), and ``fedarena.sweep(config, grid=... | space=..., samples= | optuna=)`` runs a hyperparameter sweep
(:mod:`fedarena.platform.sweep`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__version__ = "0.1.0"

__all__ = ["run", "load_run", "evaluate", "load_policy", "sweep", "Result"]


def run(config: Any, overrides: Any = None, *, out: Any = None, seeds: Any = None, quiet: bool = True,
        report: bool = True, parallel: int = 0) -> Any:
    """Run an experiment and return its ``fedarena.platform.api.Result`` (see that module)."""
    from fedarena.platform.api import run as _run

    return _run(config, overrides, out=out, seeds=seeds, quiet=quiet, report=report, parallel=parallel)


def load_run(run_dir: Any) -> Any:
    """Read a run folder (or seed group folder) into a ``fedarena.platform.api.Result``."""
    from fedarena.platform.api import load_run as _load_run

    return _load_run(run_dir)


def evaluate(run: Any, *, episodes: int | None = None, policy: str = "final", seed: int | None = None,
             render: str | None = None, render_episodes: int = 1) -> dict[str, Any]:
    """Replay a run's exported policy as ``fedarena evaluate`` does (:func:`fedarena.platform.api.evaluate`)."""
    from fedarena.platform.api import evaluate as _evaluate

    return _evaluate(run, episodes=episodes, policy=policy, seed=seed, render=render, render_episodes=render_episodes)


def load_policy(run: Any, which: str = "final") -> Any:
    """The exported policy of an RL run (a run folder, its ``Result``, or a policy folder itself) as a
    :class:`fedarena.rl.evaluation.Policy`; ``which``: ``final`` or ``best``."""
    from fedarena.rl.evaluation import load_policy as _load_policy

    path = Path(getattr(run, "run_dir", run))
    return _load_policy(path / "policies" / which if (path / "config.yaml").exists() else path)


def sweep(config: Any, *, grid: Any = None, space: Any = None, samples: int = 0, optuna: int = 0,
          overrides: Any = None, out: Any = None, parallel: int = 0, ray: bool = False, metric: str | None = None,
          mode: str | None = None, seed: int = 0, quiet: bool = True) -> Any:
    """Run a hyperparameter sweep and return its ``fedarena.platform.sweep.SweepResult`` (see that module)."""
    from fedarena.platform.sweep import sweep as _sweep

    return _sweep(config, grid=grid, space=space, samples=samples, optuna=optuna, overrides=overrides, out=out,
                  parallel=parallel, ray=ray, metric=metric, mode=mode, seed=seed, quiet=quiet)


def __getattr__(name: str) -> Any:
    if name == "Result":
        from fedarena.platform.api import Result

        return Result
    raise AttributeError(f"module 'fedarena' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
