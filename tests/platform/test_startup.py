"""What `fedarena run` pays before its kind runs: importing fedarena, the CLI and the fedsim kind pulls in no heavy
library (checked on sys.modules in a fresh interpreter), the digits data come from scikit-learn's shipped CSV
without importing scikit-learn (its own loader is the oracle), and --profile-run writes where the time went."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "matplotlib", "grpc", "pyspiel", "sklearn", "scipy", "pandas", "ml_dtypes", "optuna",
         "tensorboardX", "flwr")


def _loaded_after(code: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", f"import json, sys\n{code}\n"
                           f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_fedarena_and_the_cli_loads_no_heavy_library():
    assert _loaded_after("import fedarena, fedarena.platform.cli, fedarena.platform.runs") == []


def test_the_fedsim_kind_and_engine_load_no_heavy_library():
    code = ("from fedarena.platform.registry import get_kind; get_kind('fedsim'); import fedarena.engine;"
            "from fedarena.federated.data import load_digits; load_digits()")
    assert _loaded_after(code) == []


def test_digits_equal_scikit_learns_loader():
    from sklearn.datasets import load_digits as sklearn_digits

    from fedarena.federated.data import load_digits

    x, y = load_digits()
    ref = sklearn_digits()
    assert x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(x, (ref.data / 16.0).astype(np.float32))
    np.testing.assert_array_equal(y, ref.target)


def test_profile_run_writes_statistics_and_summary(tmp_path):
    import pstats

    from fedarena.platform.cli import main

    prof = tmp_path / "prof" / "run.prof"
    rc = main(["run", str(ROOT / "experiments" / "fedsim_digits.yaml"), "--set", "rounds=2", "--set",
               "evaluation.personalize_epochs=0", "--no-report", "--quiet", "--out", str(tmp_path / "run"),
               "--profile-run", str(prof)])
    assert rc == 0
    stats = pstats.Stats(str(prof))
    assert any(name == "round" and f.endswith("simulation.py") for f, _, name in stats.stats)  # type: ignore[attr-defined]
    text = (tmp_path / "prof" / "run.prof.txt").read_text()
    assert "importing modules:" in text and "fedarena.federated.simulation" in text
