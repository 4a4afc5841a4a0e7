"""Ray access: a bounded local instance by default, or an existing cluster given ``cluster.address``."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

from fedarena.platform.experiment import ClusterConfig


def init_ray(cluster: ClusterConfig | None = None):
    """Start (or connect to) Ray once per process and return the ``ray`` module.

    With ``cluster.address`` unset, a new local instance is started with at most ``num_cpus`` CPUs and an
    object store of ``object_store_mb`` MiB (sized for a 2-core, small-memory machine), even when another Ray
    instance is running on the machine (Ray would otherwise join that one, ignoring the limits); with an address
    (``auto`` or ``host:port``) the process joins that cluster instead.
    """
    import ray

    cluster = cluster or ClusterConfig()
    if ray.is_initialized():
        return ray
    with _keeping_sigterm_handler():
        _init(ray, cluster)
    return ray


def _init(ray, cluster: ClusterConfig) -> None:
    if cluster.address:
        ray.init(address=cluster.address, log_to_driver=False)
    else:
        ray.init(
            address="local",
            num_cpus=cluster.num_cpus,
            object_store_memory=cluster.object_store_mb * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )


@contextlib.contextmanager
def _keeping_sigterm_handler() -> Iterator[None]:
    """``ray.init`` replaces the driver's SIGTERM handler with ``sys.exit``; keep the run's own
    (:func:`fedarena.platform.loop.stop_signals`: SIGTERM ends the run ``interrupted`` with a checkpoint)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)


@contextlib.contextmanager
def ray_cluster(cluster: ClusterConfig | None = None, shutdown: bool = True) -> Iterator[object]:
    """``with ray_cluster(cfg.cluster) as ray: ...``: shuts a local instance it started down afterwards."""
    import ray

    started = not ray.is_initialized()
    init_ray(cluster)
    try:
        yield ray
    finally:
        if started and shutdown:
            ray.shutdown()
