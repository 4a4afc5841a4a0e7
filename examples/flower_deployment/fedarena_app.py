"""The Flower app of ``run.sh``: digits over 3 SuperNodes (``partition-id`` 0..2 in their node config), fedarena's
coordinate-wise median as the strategy, clipping and top-10% error-feedback uploads as a Flower mod.
``result-path`` (run config): where the ServerApp saves the final model (``.npz``), for comparison with
fedarena's own simulation of the same federation (``python run.sh``'s last step)."""

from __future__ import annotations

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedarena.federated import compression as cz
from fedarena.federated import data as fd
from fedarena.federated import flower, stages
from fedarena.federated import strategy as st
from fedarena.federated.trainer import mlp_init

SIZES, CLIENTS, SEED = (64, 16, 10), 3, 0
DATA = fd.load(fd.DataSpec("digits", partition=fd.PartitionSpec("iid", CLIENTS), held_out_fraction=0.2), SEED)
CODEC = cz.Codec("topk", fraction=0.1)
STAGES = [stages.Clip(1.0)]
STRATEGY = st.RobustAggregate(st.FitConfig(1, 10, 0.1), rule="median")

client_app = flower.fedarena_client_app(DATA.x, DATA.y, DATA.train, SIZES, num_classes=DATA.num_classes, seed=SEED,
                                        held_out=DATA.held_out, mods=[flower.UploadMod(STAGES, CODEC, seed=SEED)])
server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    rounds = int(context.run_config["num-server-rounds"])
    fs = flower.FlowerStrategy(STRATEGY, codec=CODEC, seed=SEED, evaluate_clients=True, min_available_nodes=CLIENTS)
    res = fs.start(grid=grid, initial_arrays=flower.params_to_record(mlp_init(SIZES, SEED)), num_rounds=rounds)
    if context.run_config.get("result-path"):
        np.savez(str(context.run_config["result-path"]), **flower.record_to_params(res.arrays))
    print("fedarena strategy in Flower's deployment runtime:", fs.history,
          dict(res.evaluate_metrics_clientapp[rounds]), flush=True)


def simulate(rounds: int) -> dict[str, np.ndarray]:
    """The same federation in fedarena's in-process simulation (the model the deployment run should end with)."""
    from fedarena.federated import simulation as sim

    s = sim.Simulation(sim.BatchedMLP(SIZES), STRATEGY, DATA.x, DATA.y, DATA.train, [f"c{i}" for i in range(CLIENTS)],
                       DATA.num_classes, seed=SEED, held_out=DATA.held_out, upload_stages=STAGES,
                       upload=cz.UploadCompression(CODEC, error_feedback=True))
    state, _ = s.run(rounds)
    return state.params
