"""The simulation's Ray backend on a two-node Ray cluster (ray.cluster_utils.Cluster on this machine), run in a
subprocess because the test session shares one Ray instance: clients are trained on both nodes and the global
model equals the in-process backend's bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_ray_backend_on_two_nodes_equals_in_process():
    pytest.importorskip("ray")
    script = Path(__file__).with_name("fedsim_two_node.py")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cluster_nodes"] == 2 and out["nodes"] == 2
    assert out["max_abs_diff"] == 0.0
