"""Ray backend of the simulation: groups of clients trained by Ray actors spread over a cluster.

Each actor holds the batched trainer (:class:`fedarena.federated.simulation.BatchedModel`, rebuilt from its
``spec``) and the
data set (shared once through the object store); the driver keeps the round loop, the strategy and
the stages, and sends every actor the global model and the padded training plans of its groups.
A group is trained by exactly the code of the in-process backend, so the same seed gives the same
model. Actors are placed with Ray's ``SPREAD`` strategy, so a multi-node cluster gets clients on
every node; :meth:`RayTrainer.nodes` says where each actor runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class _Worker:
    def __init__(self, spec: tuple, x: np.ndarray, onehot: np.ndarray) -> None:
        from fedarena.federated.simulation import batched_model

        self.model = batched_model(spec)
        self.x, self.onehot = x, onehot

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def train(self, params, jobs, cfg):
        return [self.model.train_group(params, plan, self.x, self.onehot, cfg, corr) for plan, corr in jobs]


class RayTrainer:
    """``num_workers`` actors (default: one per CPU of the cluster, at most 8), each with 1 CPU."""

    def __init__(self, spec: tuple, x: np.ndarray, onehot: np.ndarray, num_workers: int = 0) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("backend: the ray backend needs a running Ray instance (cluster.address)")
        n = num_workers or max(1, min(8, int(ray.cluster_resources().get("CPU", 1))))
        remote = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_Worker)
        xr, yr = ray.put(x), ray.put(onehot)
        self.workers = [remote.remote(spec, xr, yr) for _ in range(n)]

    def nodes(self) -> list[str]:
        import ray

        return ray.get([w.node.remote() for w in self.workers])

    def run(self, params, jobs: list[tuple[Any, Any]], cfg, groups_per_task: int = 1) -> list:
        """Train ``jobs`` (plan, corrections) round robin over the actors; results in job order."""
        import ray

        chunks = [jobs[i: i + groups_per_task] for i in range(0, len(jobs), max(1, groups_per_task))]
        pref = ray.put(params)
        futures = [self.workers[i % len(self.workers)].train.remote(pref, chunk, cfg) for i, chunk in enumerate(chunks)]
        out = []
        for res in ray.get(futures):
            out.extend(res)
        return out

    def close(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
