"""Run by test_league_ray.py in its own process: a two-node Ray cluster on this machine
(ray.cluster_utils.Cluster), a tiny league joined through ``cluster.address``; learner and rollout actors are
spread over both nodes (Ray's state API says where), the second node is removed mid-run, and the league
finishes on the head node. Prints one JSON line."""

from __future__ import annotations

import json
import sys
import tempfile


def main() -> int:
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_league_ray import check_store_and_payoff, tiny_config

    from fedarena.marl.league.agent import BoardAgent
    from fedarena.marl.league.games import get_game
    from fedarena.marl.league.ray_execution import RayLeague
    from fedarena.marl.league.store import SnapshotStore
    from fedarena.platform.cluster import init_ray
    from fedarena.platform.experiment import ClusterConfig

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 80 * 2**20,
                                                            "include_dashboard": True, "dashboard_port": 0})
    second = cluster.add_node(num_cpus=2, object_store_memory=80 * 2**20)
    try:
        cfg = tiny_config(cluster=ClusterConfig(address=cluster.address))
        init_ray(cfg.cluster)
        cluster.wait_for_nodes()
        dashboard = "http://" + ray._private.worker.get_dashboard_url()   # the state API talks to the dashboard
        g = get_game(cfg.game)
        init = BoardAgent(g.observation_shape, g.num_actions, cfg.agent).init_params(0)
        root = tempfile.mkdtemp()
        league = RayLeague(cfg, root, init)

        def actor_nodes() -> set[str]:
            alive = list_actors(address=dashboard, filters=[("state", "=", "ALIVE")], limit=1000)
            return {a.node_id for a in alive if a.class_name in ("LearnerActor", "RolloutActor")}

        league.iteration()
        league.iteration()
        nodes_before = actor_nodes()
        before = set(SnapshotStore(root).names())
        futures = league.submit()
        cluster.remove_node(second)                 # mid-iteration: its actors die and restart on the head
        league.collect(futures)
        for _ in range(3):
            league.iteration()
        state = league.manager_state()
        check_store_and_payoff(SnapshotStore(root), state, 6, len(league.learner_ids))
        print(json.dumps({"cluster_nodes": 2, "actor_nodes_before": len(nodes_before),
                          "alive_nodes_after": sum(n["Alive"] for n in ray.nodes()),
                          "actor_nodes_after": len(actor_nodes()),
                          "snapshots_lost": sorted(before - set(SnapshotStore(root).names())), "iterations": 6}))
        league.shutdown()
        return 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
