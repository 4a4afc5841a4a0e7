"""fedarena: multi-agent reinforcement learning and federated learning on its own engine.

Subpackages (imports point down only, see docs/architecture.md):
``platform`` (config, CLI, run folders), ``engine`` (graph IR, autodiff, backends),
``envs`` (games and environments), ``rl``, ``marl``, ``privacy``, ``federated``.

For scripts: ``fedarena.run(config_or_path, overrides={...}, out=None, seeds=None) -> Result`` runs an
experiment as ``fedarena run`` does, and ``fedarena.load_run(run_dir)`` reads a finished one
(:mod:`fedarena.platform.api`).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def run(config: Any, overrides: Any = None, *, out: Any = None, seeds: Any = None, quiet: bool = True,
        report: bool = True, parallel: int = 0) -> Any:
    """Run an experiment and return its ``fedarena.platform.api.Result`` (see that module)."""
    from fedarena.platform.api import run as _run

    return _run(config, overrides, out=out, seeds=seeds, quiet=quiet, report=report, parallel=parallel)


def load_run(run_dir: Any) -> Any:
    """Read a run folder (or seed group folder) into a ``fedarena.platform.api.Result``."""
    from fedarena.platform.api import load_run as _load_run

    return _load_run(run_dir)
