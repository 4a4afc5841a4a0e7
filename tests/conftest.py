"""Shared test fixtures: one local Ray instance for the whole session, started on first use; the per-equation
executor outside the whole-graph native tests."""

from __future__ import annotations

import os

import pytest

NATIVE_GRAPH_TESTS = {"test_native_graph.py"}
"""Test files that run jit's default whole-graph native code. Elsewhere the suite runs the per-equation executor
(``FEDARENA_NATIVE_GRAPH=0``) unless the variable is set for the run: native code compiles every new graph once with
the C compiler (~0.5 s), which on a fresh machine's empty cache doubled the RL tests' time (52 s vs 24 s). The two
are bit for bit equal, which test_native_graph.py checks on random programs, their gradients and training steps."""


@pytest.fixture(autouse=True)
def _per_equation_executor_outside_native_tests(request, monkeypatch):
    if request.node.path.name not in NATIVE_GRAPH_TESTS and "FEDARENA_NATIVE_GRAPH" not in os.environ:
        monkeypatch.setenv("FEDARENA_NATIVE_GRAPH", "0")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance shared by every test that asks for it; shut down at the end of the session."""
    ray = pytest.importorskip("ray")
    from fedarena.platform.cluster import init_ray
    from fedarena.platform.experiment import ClusterConfig

    started = not ray.is_initialized()
    init_ray(ClusterConfig(num_cpus=2, object_store_mb=200))
    yield ray
    if started:
        ray.shutdown()
