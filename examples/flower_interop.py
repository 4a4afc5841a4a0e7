"""Flower and fedarena together, both ways (``pip install -e ".[flower]"``).

1. Flower runs fedarena: Flower's ``run_simulation`` with a fedarena strategy (FedAvg with a Byzantine-robust
   coordinate-wise median and FedAdam on the server) as the ServerApp's strategy, fedarena's simulated clients as
   the ClientApp, and fedarena's upload stages (clipping, then 8-bit stochastic quantization of the model
   difference) as a Flower client mod.
2. fedarena runs Flower: a ClientApp written against Flower's API alone (numpy SGD) as the local trainer of
   fedarena's in-process simulation, with fedarena's per-client evaluation.

``server_app`` and ``client_app`` are module-level Flower apps of the kind Flower's deployment runtime loads;
examples/flower_deployment/ is such an app, run by its run.sh on a SuperLink and three SuperNodes.
Run: ``python examples/flower_interop.py [--rounds 10]``.
"""

from __future__ import annotations

import argparse
import logging

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedarena.federated import compression as cz
from fedarena.federated import data as fd
from fedarena.federated import flower, stages
from fedarena.federated import simulation as sim
from fedarena.federated import strategy as st
from fedarena.federated.trainer import NumpyMLPTrainer, mlp_init

SIZES = (64, 32, 10)
CLIENTS, PER_ROUND, SEED = 20, 10, 0
DATA = fd.load(fd.DataSpec("digits", partition=fd.PartitionSpec("iid", CLIENTS), held_out_fraction=0.2), SEED)
STRATEGY = st.RobustAggregate(st.FitConfig(1, 10, 0.1), clients_per_round=PER_ROUND, rule="median",
                              server_optimizer=st.ServerOptimizer("fedadam", lr=0.03))
CODEC = cz.Codec("quantize", bits=8)

# --- 1. Flower runs fedarena -------------------------------------------------------------------------------------

client_app = flower.fedarena_client_app(
    DATA.x, DATA.y, DATA.train, SIZES, num_classes=DATA.num_classes, seed=SEED, held_out=DATA.held_out,
    mods=[flower.UploadMod([stages.Clip(2.0)], CODEC, error_feedback=True, seed=SEED)])


def make_server_app(num_rounds: int) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = flower.FlowerStrategy(STRATEGY, codec=CODEC, seed=SEED, evaluate_clients=True,
                                         min_available_nodes=CLIENTS)
        result = strategy.start(grid=grid, initial_arrays=flower.params_to_record(mlp_init(SIZES, SEED)),
                                num_rounds=num_rounds)
        params = flower.record_to_params(result.arrays)
        _, acc = sim.evaluate_params(sim.BatchedMLP(SIZES), params, *DATA.test_set())
        last = result.evaluate_metrics_clientapp[num_rounds]
        up = sum(h["bytes_up"] for h in strategy.history)
        dense = sum(h["reporting"] for h in strategy.history) * 4 * sum(v.size for v in params.values())
        print(f"[Flower run_simulation, fedarena strategy] after {num_rounds} rounds: test accuracy {acc:.3f}, "
              f"clients' held-out accuracy mean {last['client_acc_mean']:.3f} / worst "
              f"{last['client_acc_worst']:.3f}, uploads {up} B ({dense / up:.1f}x fewer than float32)", flush=True)

    return app


server_app = make_server_app(10)


# --- 2. fedarena runs Flower -------------------------------------------------------------------------------------

flower_only_app = ClientApp()


@flower_only_app.train()
def train(msg: Message, context: Context) -> Message:
    """A Flower ClientApp in Flower's own terms: ArrayRecord in; ArrayRecord, num-examples and train_loss out."""
    pid = int(context.node_config["partition-id"])
    arrays = msg.content["arrays"]
    cfg = msg.content["config"]
    x, y = DATA.client(pid)
    local, loss = NumpyMLPTrainer(SIZES).train(
        {k: arrays[k].numpy() for k in arrays.keys()}, x, y, epochs=int(cfg["epochs"]),
        batch_size=int(cfg["batch-size"]), lr=float(cfg["lr"]), prox_mu=float(cfg["prox-mu"]),
        rng=np.random.default_rng([SEED, int(cfg["server-round"]), pid]))
    return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in local.items()}),
                               "metrics": MetricRecord({"num-examples": len(y), "train_loss": loss})}),
                   reply_to=msg)


def fedarena_runs_flower(rounds: int) -> None:
    ids = [f"c{i}" for i in range(CLIENTS)]
    s = sim.Simulation(sim.BatchedMLP(SIZES), STRATEGY, DATA.x, DATA.y, DATA.train, ids, DATA.num_classes, seed=SEED,
                       held_out=DATA.held_out, test=DATA.test_set(), upload_stages=[stages.Clip(2.0)],
                       upload=cz.UploadCompression(CODEC, error_feedback=True),
                       client_trainer=flower.ClientAppTrainer(flower_only_app, ids))
    _, recs = s.run(rounds)
    m = recs[-1].metrics
    print(f"[fedarena simulation, Flower ClientApp] after {rounds} rounds: test accuracy {m['test_acc']:.3f}, "
          f"clients' held-out accuracy mean {m['client_acc_mean']:.3f} / worst {m['client_acc_worst']:.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    fedarena_runs_flower(args.rounds)
    run_simulation(server_app=make_server_app(args.rounds), client_app=client_app, num_supernodes=CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
