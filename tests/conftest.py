"""Shared test fixtures: one local Ray instance for the whole session, started on first use."""

from __future__ import annotations

import pytest


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
