"""Run by test_fedsim_ray.py in its own process: a two-node Ray cluster on this machine
(ray.cluster_utils.Cluster), the simulation's Ray backend with one actor per node, compared with the in-process
backend. Prints one JSON line."""

from __future__ import annotations

import json
import sys

import numpy as np


def main() -> int:
    import ray
    from ray.cluster_utils import Cluster

    from fedarena.federated import simulation as sim
    from fedarena.federated import strategy as st

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 * 2**20,
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        rng = np.random.default_rng(0)
        sizes = [5 + (i * 7) % 23 for i in range(12)]
        x = rng.standard_normal((sum(sizes), 6)).astype(np.float32)
        y = rng.integers(0, 3, sum(sizes))
        off = np.cumsum([0, *sizes])
        train = [np.arange(off[i], off[i + 1]) for i in range(len(sizes))]
        ids = [f"c{i}" for i in range(len(sizes))]
        strategy = st.FedAvg(st.FitConfig(1, 4, 0.1), clients_per_round=8)

        def simulate(backend):
            s = sim.Simulation(sim.BatchedMLP((6, 5, 3)), strategy, x, y, train, ids, 3, seed=1, backend=backend,
                               ray_workers=2)
            state, _ = s.run(3)
            return state.params, s

        p_local, _ = simulate("vmap")
        p_ray, s = simulate("ray")
        nodes = s.ray_nodes()
        diff = max(float(np.max(np.abs(p_local[k] - p_ray[k]))) for k in p_local)
        print(json.dumps({"nodes": len(set(nodes)), "cluster_nodes": len(ray.nodes()), "max_abs_diff": diff}))
        return 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
