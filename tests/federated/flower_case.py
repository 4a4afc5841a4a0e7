"""The Flower interop case of test_flower.py: a small digits federation, a fedarena strategy with its robust rule,
clipping and top-k error-feedback uploads. ``python flower_case.py OUT.npz`` runs it in Flower's
``run_simulation`` (which starts Flower's own Ray, so the test runs this file in its own process) and saves
the final global model and the per-round metrics the strategy logged."""

from __future__ import annotations

import sys

import numpy as np

SIZES = (64, 16, 10)
CLIENTS, PER_ROUND, ROUNDS, SEED = 8, 5, 3, 3


def case():
    from fedarena.federated import compression as cz
    from fedarena.federated import data as fd
    from fedarena.federated import stages
    from fedarena.federated import strategy as st

    d = fd.load(fd.DataSpec("digits", partition=fd.PartitionSpec("iid", CLIENTS), held_out_fraction=0.2), SEED)
    strategy = st.RobustAggregate(st.FitConfig(1, 10, 0.1), clients_per_round=PER_ROUND, rule="trimmed_mean",
                                  trim_fraction=0.2, server_optimizer=st.ServerOptimizer("fedadam", lr=0.05))
    codec = cz.Codec("topk", fraction=0.1)
    return d, strategy, codec, [stages.Clip(1.0)]


def main(out: str) -> int:
    import logging

    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from fedarena.federated import flower
    from fedarena.federated.trainer import mlp_init

    logging.getLogger("flwr").setLevel(logging.WARNING)
    d, strategy, codec, upload_stages = case()
    mod = flower.UploadMod(upload_stages, codec, error_feedback=True, seed=SEED)
    client_app = flower.fedarena_client_app(d.x, d.y, d.train, SIZES, num_classes=d.num_classes, seed=SEED,
                                            held_out=d.held_out, mods=[mod])
    server_app = ServerApp()
    result: dict = {}

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        fs = flower.FlowerStrategy(strategy, codec=codec, seed=SEED, evaluate_clients=True,
                                   min_available_nodes=CLIENTS)
        import time
        t0 = time.perf_counter()
        res = fs.start(grid=grid, initial_arrays=flower.params_to_record(mlp_init(SIZES, SEED)), num_rounds=ROUNDS)
        result["rounds_s"] = time.perf_counter() - t0
        result["params"] = flower.record_to_params(res.arrays)
        result["history"] = fs.history
        result["eval"] = {r: dict(m) for r, m in res.evaluate_metrics_clientapp.items()}

    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 1, "include_dashboard": False,
                                                 "object_store_memory": 80 * 2**20}})
    if "params" not in result:
        print("the ServerApp did not finish", file=sys.stderr)
        return 1
    hist = result["history"]
    print("rounds_s", result["rounds_s"], flush=True)
    ev = result["eval"].get(ROUNDS, {})
    np.savez(out, **{f"param/{k}": v for k, v in result["params"].items()},
             reporting=np.array([h["reporting"] for h in hist]), bytes_up=np.array([h["bytes_up"] for h in hist]),
             client_acc_mean=np.array(ev.get("client_acc_mean", np.nan)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
