"""FedAvg in Flower 1.42's simulation engine vs fedarena's in-process simulation, in one run.

Task (issue 15): scikit-learn digits, 100 IID clients, 10 per round, an MLP 64-32-10, E = 1, B = 10,
lr 0.1, 50 rounds; both sides use the same split and initial model and evaluate the global model on
the same held-out test set after the last round. Repeat r seeds minibatch order (both sides) and
fedarena's client sampling with seed + r; Flower samples clients with its own generator, so the
accuracies are compared as means over the repeats. Flower's clients train with fedarena's numpy
reference trainer (:class:`fedarena.federated.trainer.NumpyMLPTrainer`, the same arithmetic as the
engine trainer), so the difference in wall time is the simulation engine. Wall time covers the whole
federated run on each side (Flower: ``run_simulation``, which starts its Ray backend; fedarena:
building the simulation, compiling its step and all rounds); interpreter start and imports are
excluded on both sides (scikit-learn is imported and digits read once before either side is timed); Flower's
time of the rounds alone (``strategy.start`` inside its ServerApp, after the backend started) is printed too. Then
fedarena alone: 1,000 clients per round for 20 rounds on FedProx's
Synthetic(1, 1) with 10,000 clients (examples per device ``floor(lognormal(3, 1)) + 10``, at most 200;
softmax regression 60 -> 10 from zero, lr 0.05, evaluated after the last round), printing client updates per second
and peak memory (tracemalloc peak of Python allocations and the process's peak RSS).

Through the CLI: ``fedarena run experiments/fedsim_digits.yaml`` set to the same task (IID, no held-out split, no
personalization, ``--no-report``) in a fresh interpreter per repeat, timed end to end from outside (interpreter
start, imports, data, run folder, all rounds), after one untimed run that fills the bytecode cache (as an installed
package has it); its ratio to Flower's wall time is printed beside the Python one. The issue's softmax-regression
command (``model.hidden=[]``, ``model.zero_init=true``) is timed the same way.

    python benchmarks/fl_vs_flower.py [--repeats 3] [--skip-flower] [--skip-large] [--skip-cli]
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc

import numpy as np

from fedarena.federated import data as fdata
from fedarena.federated import simulation as sim
from fedarena.federated import strategy as st
from fedarena.federated.trainer import NumpyMLPTrainer, mlp_init

SIZES = (64, 32, 10)
CLIENTS, PER_ROUND, ROUNDS, EPOCHS, BATCH, LR = 100, 10, 50, 1, 10, 0.1


def digits_task(seed: int) -> fdata.FederatedData:
    return fdata.load(fdata.DataSpec("digits", partition=fdata.PartitionSpec("iid", CLIENTS), held_out_fraction=0.0),
                      seed)


def run_fedarena(seed: int, run_seed: int) -> tuple[float, float]:
    """``seed``: data split and initial model; ``run_seed``: client sampling and minibatch order."""
    t0 = time.perf_counter()
    d = digits_task(seed)
    model = sim.BatchedMLP(SIZES)
    s = sim.Simulation(model, st.FedAvg(st.FitConfig(EPOCHS, BATCH, LR), clients_per_round=PER_ROUND),
                       d.x, d.y, d.train, [f"c{i}" for i in range(CLIENTS)], d.num_classes, seed=run_seed, test=None)
    state, _ = s.run(ROUNDS, s.init_state(mlp_init(SIZES, seed)))
    wall = time.perf_counter() - t0
    return wall, sim.evaluate_params(model, state.params, *d.test_set())[1]


def run_flower(seed: int, run_seed: int) -> tuple[float, float, float]:
    """(wall time of ``run_simulation``, final accuracy, time of the 50 rounds alone inside the ServerApp)."""
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    names = [f"l{i}.{k}" for i in range(len(SIZES) - 1) for k in ("w", "b")]
    client_app = ClientApp()
    cache: dict[str, fdata.FederatedData] = {}  # pickled empty into every actor: the split is built once per actor

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        if "d" not in cache:  # every client process builds the same split once (nothing crosses a network)
            cache["d"] = digits_task(seed)
        d = cache["d"]
        pid = int(context.node_config["partition-id"])
        x, y = d.client(pid)
        arrays = msg.content["arrays"].to_numpy_ndarrays()
        params = dict(zip(names, arrays))
        rng = np.random.default_rng([run_seed, int(msg.content["config"]["server-round"]), pid])
        local, loss = NumpyMLPTrainer(SIZES).train(params, x, y, epochs=EPOCHS, batch_size=BATCH, lr=LR, prox_mu=0.0,
                                                  rng=rng)
        content = RecordDict({"arrays": ArrayRecord([local[k] for k in names]),
                              "metrics": MetricRecord({"num-examples": len(x), "train_loss": float(loss)})})
        return Message(content=content, reply_to=msg)

    final: dict[str, float] = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        init = mlp_init(SIZES, seed)
        strategy = FedAvg(fraction_train=PER_ROUND / CLIENTS, fraction_evaluate=0.0, min_train_nodes=PER_ROUND,
                          min_available_nodes=CLIENTS)
        t_rounds = time.perf_counter()
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord([init[k] for k in names]), num_rounds=ROUNDS)
        final["rounds_s"] = time.perf_counter() - t_rounds
        params = dict(zip(names, result.arrays.to_numpy_ndarrays()))
        d = digits_task(seed)
        final["acc"] = NumpyMLPTrainer(SIZES).evaluate(params, *d.test_set())[1]

    t0 = time.perf_counter()
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    return time.perf_counter() - t0, final.get("acc", float("nan")), final.get("rounds_s", float("nan"))


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI_TASK = ["--set", "data.partition=iid", "--set", "data.held_out_fraction=0.0", "--set", "evaluation.personalize_epochs=0"]
"""``--set`` overrides that make experiments/fedsim_digits.yaml this benchmark's task (its defaults: 100 clients,
10 per round, MLP 64-32-10, E = 1, B = 10, lr 0.1, 50 rounds)"""
CLI_SOFTMAX = ["--set", "model.hidden=[]", "--set", "model.zero_init=true", *CLI_TASK]


def run_cli(overrides: list[str], seed: int) -> tuple[float, float, float]:
    """(wall seconds of one ``fedarena run`` in a fresh interpreter, its final test accuracy, its CPU seconds: user +
    system, which a loaded machine inflates less than the wall time)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "fedarena.platform.cli", "run", os.path.join(ROOT, "experiments", "fedsim_digits.yaml"),
               *overrides, "--set", f"seed={seed}", "--no-report", "--quiet", "--out", os.path.join(out, "run")]
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"fedarena run failed: {proc.stderr.strip()[-500:]}")
    acc = [float(line.split(":")[1]) for line in proc.stdout.splitlines() if line.strip().startswith("test_acc:")]
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return wall, acc[-1] if acc else float("nan"), cpu


def run_large(seed: int) -> dict[str, float]:
    tracemalloc.start()
    t0 = time.perf_counter()
    d = fdata.synthetic_fedprox(1.0, 1.0, 10_000, seed, size_mean=3.0, size_sigma=1.0, size_min=10, size_max=200)
    t_data = time.perf_counter() - t0
    model = sim.BatchedMLP((60, 10))
    s = sim.Simulation(model, st.FedAvg(st.FitConfig(1, 10, 0.05), clients_per_round=1000), d.x, d.y, d.train,
                       [f"c{i}" for i in range(d.num_clients)], d.num_classes, seed=seed, held_out=d.held_out,
                       test=d.test_set(), eval_every=20)
    t1 = time.perf_counter()
    zero = {k: np.zeros_like(v) for k, v in model.init_params(seed).items()}  # softmax regression from 0
    state, recs = s.run(20, s.init_state(zero))
    wall = time.perf_counter() - t1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    updates = sum(r.metrics["reporting"] for r in recs)
    return {"data_s": t_data, "wall_s": wall, "updates": updates, "updates_per_s": updates / wall,
            "examples": int(d.sizes().sum()), "test_acc": recs[-1].metrics["test_acc"],
            "client_acc_p10": recs[-1].metrics.get("client_acc_p10", float("nan")),
            "tracemalloc_peak_mb": peak / 2**20,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-flower", action="store_true")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--skip-cli", action="store_true")
    args = ap.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    print(f"digits, {CLIENTS} clients, {PER_ROUND}/round, MLP {SIZES}, E={EPOCHS}, B={BATCH}, lr={LR}, {ROUNDS} rounds;"
          f" {os.cpu_count()} CPUs")
    digits_task(args.seed)  # imports scikit-learn and reads digits once: interpreter-level start-up, excluded
    fa, fl = [], []
    for r in range(args.repeats):
        w, acc = run_fedarena(args.seed, args.seed + r)
        fa.append((w, acc))
        print(f"  repeat {r}: fedarena {w:7.3f} s  acc {acc:.4f}", flush=True)
        if not args.skip_flower:
            w2, acc2, rounds_s = run_flower(args.seed, args.seed + r)
            fl.append((w2, acc2, rounds_s))
            print(f"  repeat {r}: flower   {w2:7.3f} s  acc {acc2:.4f}   ratio {w2 / w:6.1f}x   (rounds alone "
                  f"{rounds_s:.3f} s, ratio {rounds_s / w:6.1f}x)", flush=True)
    fw = [w for w, _ in fa]
    facc = statistics.mean(a for _, a in fa)
    print(f"fedarena wall: median {statistics.median(fw):.3f} s (min {min(fw):.3f}, max {max(fw):.3f}); "
          f"final acc mean {facc:.4f} over {len(fa)} repeats")
    if fl:
        lw = [w for w, _, _ in fl]
        ratios = [b / a for (a, _), (b, _, _) in zip(fa, fl)]
        rratios = [c / a for (a, _), (_, _, c) in zip(fa, fl)]
        lacc = statistics.mean(a for _, a, _ in fl)
        print(f"flower   wall: median {statistics.median(lw):.3f} s (min {min(lw):.3f}, max {max(lw):.3f}); "
              f"final acc mean {lacc:.4f} over {len(fl)} repeats")
        print(f"speed-up (flower / fedarena, per repeat): median {statistics.median(ratios):.1f}x "
              f"(min {min(ratios):.1f}x, max {max(ratios):.1f}x); gap of the mean final accuracies "
              f"{abs(facc - lacc) * 100:.2f} points (Flower samples clients with its own unseeded generator)")
        print(f"speed-up against Flower's rounds alone (its Ray backend already up): median "
              f"{statistics.median(rratios):.1f}x (min {min(rratios):.1f}x, max {max(rratios):.1f}x)")
    if not args.skip_cli:
        run_cli(CLI_TASK, args.seed)  # fills the bytecode cache; not timed
        cli = [run_cli(CLI_TASK, args.seed) for _ in range(args.repeats)]
        soft = [run_cli(CLI_SOFTMAX, args.seed) for _ in range(args.repeats)]
        cw, sw = [w for w, _, _ in cli], [w for w, _, _ in soft]
        print(f"fedarena through the CLI (fresh interpreter, end to end): median {statistics.median(cw):.3f} s "
              f"(min {min(cw):.3f}; CPU {statistics.median(c for _, _, c in cli):.3f} s), final acc {cli[0][1]:.4f}; "
              f"the issue's softmax-regression command: median {statistics.median(sw):.3f} s (min {min(sw):.3f}; CPU "
              f"{statistics.median(c for _, _, c in soft):.3f} s), final acc {soft[0][1]:.4f}")
        if fl:
            lmed = statistics.median(w for w, _, _ in fl)
            print(f"speed-up (flower / fedarena): Python {lmed / statistics.median(fw):.1f}x, "
                  f"CLI {lmed / statistics.median(cw):.1f}x (medians)")
    if not args.skip_large:
        r = run_large(args.seed)
        print(f"Synthetic(1,1), 10,000 clients ({r['examples']} examples), 1,000 clients/round, 20 rounds: "
              f"{r['wall_s']:.2f} s ({r['updates_per_s']:.0f} client updates/s; data generation {r['data_s']:.2f} s), "
              f"final test acc {r['test_acc']:.4f}, client acc p10 {r['client_acc_p10']:.4f}, "
              f"peak traced memory {r['tracemalloc_peak_mb']:.0f} MiB, peak RSS {r['peak_rss_mb']:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
