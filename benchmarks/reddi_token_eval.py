"""Cost of the language models' every-token test accuracy (``test_token_acc``) beside the last-token ``test_acc`` at
Reddi et al. 2021's model sizes (docs/reproductions.md, "Adaptive Federated Optimization"): for the Stack Overflow
word LSTM (96 / 670 / 96, 10,004 outputs, 21 ids) and the Shakespeare character LSTM (8, 2 x 256, 90 outputs, 81
ids), random parameters and ``--n`` random left-aligned test sequences, the process CPU seconds and the peak memory
tracemalloc traces during the call (numpy's buffers included; a compiled program's kept buffers are allocated by the
warm-up call) of :func:`fedarena.federated.simulation.evaluate_params` (last-token loss and accuracy) and of
:meth:`fedarena.federated.models.BatchedZooModel.token_accuracies` (every position, the data set's masks), each
after one warm-up call that compiles its programs.

    nice -n 10 env OMP_NUM_THREADS=1 python benchmarks/reddi_token_eval.py [--n 2000]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from fedarena.federated.datasets import token_accuracy_masks
from fedarena.federated.models import BatchedZooModel
from fedarena.federated.simulation import evaluate_params

CASES = {"stackoverflow": ("word_lstm", 21, 10_004, "tff_stackoverflow_nwp"),
         "shakespeare": ("char_lstm", 81, 90, "tff_shakespeare")}


def _measure(fn) -> tuple[float, float]:
    fn()  # compile
    tracemalloc.start()
    c0 = time.process_time()
    fn()
    cpu = time.process_time() - c0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return cpu, peak / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    for name, (arch, features, classes, dataset) in CASES.items():
        model = BatchedZooModel(arch, features, classes)
        params = model.init_params(0)
        x = rng.integers(1, classes, (a.n, features))
        for i, n in enumerate(rng.integers(2, features + 1, a.n)):
            x[i, n:] = 0
        x = x.astype(np.float32)
        y = x[np.arange(a.n), (x != 0).sum(1) - 1].astype(np.int64)
        masks = token_accuracy_masks(dataset, classes)
        last = _measure(lambda: evaluate_params(model, params, x, y))
        every = _measure(lambda: model.token_accuracies(params, x, masks))
        print(f"{name} ({arch}, {a.n} sequences of {features} ids): last-token test_acc {last[0]:.1f} CPU s, peak "
              f"{last[1]:.0f} MiB; every-token {'/'.join(masks)} {every[0]:.1f} CPU s, peak {every[1]:.0f} MiB "
              f"({every[0] / max(last[0], 1e-9):.2f}x CPU)", flush=True)


if __name__ == "__main__":
    main()
