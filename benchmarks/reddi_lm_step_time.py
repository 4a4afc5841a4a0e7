"""Process CPU seconds of one batched local-SGD step of the Stack Overflow word LSTM at Reddi et al. 2021's size
(embedding 96, LSTM 670, projection 96, 10,004 outputs; 21-id sentences, B = 16), for a stack of ``--stack``
clients as ``execution.max_stacked_clients: 8`` trains them, after warm-up steps that compile the program: the
cost that a round of ``experiments/reddi_stackoverflow_nwp.yaml`` repeats (50 clients of ``s`` sentences take
ceil(50 / 8) stacks x ceil(s / 16) steps; docs/reproductions.md, "Adaptive Federated Optimization").

    nice -n 10 env OMP_NUM_THREADS=1 python benchmarks/reddi_lm_step_time.py [--stack 8] [--steps 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedarena.federated import simulation as sim
from fedarena.federated import strategy as st
from fedarena.federated.models import BatchedZooModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stack", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    B, G = 16, a.stack
    model = BatchedZooModel("word_lstm", 21, 10_004)
    params = model.init_params(0)
    rng = np.random.default_rng(0)
    n = G * B * (a.steps + 1)
    x = rng.integers(1, 10_004, (n, 21)).astype(np.float32)
    y = x[:, -1].astype(np.int64)
    onehot = sim._OneHot(y, 10_004)
    fit = st.FitConfig(epochs=1, batch_size=B, lr=0.316)

    def plan(steps: int) -> sim.GroupPlan:
        per = steps * B
        plans = [(np.arange(g * per, (g + 1) * per), np.arange(per).reshape(steps, B), np.zeros(steps, np.int64))
                 for g in range(G)]
        return sim.make_group_plan(plans, [steps] * G, B)

    t0, c0 = time.perf_counter(), time.process_time()
    model.train_group(params, plan(1), x, onehot, fit)  # compiles the step
    first = time.process_time() - c0, time.perf_counter() - t0
    c0, t0 = time.process_time(), time.perf_counter()
    model.train_group(params, plan(a.steps), x, onehot, fit)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    print(f"word_lstm, {G} stacked clients, B = {B}: {cpu / a.steps:.2f} CPU s ({wall / a.steps:.2f} s wall) a step "
          f"over {a.steps} warm steps; the first call (1 step, compiling) {first[0]:.1f} CPU s, {first[1]:.1f} s wall",
          flush=True)


if __name__ == "__main__":
    main()
