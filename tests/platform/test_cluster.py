"""Ray access: the session-wide local instance is bounded and runs remote work."""

from __future__ import annotations

from fedarena.platform.cluster import init_ray
from fedarena.platform.experiment import ClusterConfig


def test_local_ray_instance_is_bounded_and_runs_tasks(ray_session):
    ray = ray_session
    assert init_ray(ClusterConfig()) is ray  # a second call reuses the running instance
    assert ray.cluster_resources()["CPU"] <= 2

    @ray.remote(num_cpus=0.5)
    def square(x: int) -> int:
        return x * x

    assert ray.get([square.remote(i) for i in range(5)]) == [0, 1, 4, 9, 16]
