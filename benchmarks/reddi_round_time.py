"""Seconds per round of the Reddi et al. 2021 table configs at the paper's model sizes, to state how long each
full cell would take on this machine (docs/reproductions.md, "Adaptive Federated Optimization").

For each config (experiments/reddi_*.yaml) it writes a small population in the data set's real file format with
the paper's per-client sizes -- EMNIST writers of 100 images, Shakespeare roles of 40 snippets of 90 characters
(about 45 sequences of 81 ids), Stack Overflow users of 400 sentences, CIFAR-100 clients of 100 images -- with
random content (the time of a round does not depend on what the pixels or words are), runs ``--rounds`` rounds of
its FedAvg column with the paper's model, clients per round, E and B, evaluating only after the last round: once
for 1 round and once for ``1 + --rounds`` rounds, and prints the difference per round (wall and process CPU
seconds of a round after the first, which compiles the step).

    nice -n 10 env OMP_NUM_THREADS=1 python benchmarks/reddi_round_time.py [--rounds 2] [--only emnist,...]
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import h5py
import numpy as np

import fedarena

ROOT = pathlib.Path(__file__).parents[1]


def _h5(path, clients):
    with h5py.File(path, "w") as f:
        for cid, feats in clients.items():
            for k, v in feats.items():
                kw = {"dtype": h5py.string_dtype()} if v.dtype == object else {}
                f.create_dataset(f"examples/{cid}/{k}", data=v, **kw)


def emnist(folder, rng, k):
    for split, n in (("train", 100), ("test", 12)):
        _h5(folder / f"fed_emnist_{split}.h5", {f"w{i}": {"pixels": rng.random((n, 28, 28), np.float32),
                                                          "label": rng.integers(0, 62, n).astype(np.int32)}
                                               for i in range(k)})


def shakespeare(folder, rng, k):
    chars = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ,.;:!?'ABCDEFGHIJKLMNOPQRSTUVWXYZ", np.uint8)
    for split, n in (("train", 40), ("test", 5)):
        _h5(folder / f"shakespeare_{split}.h5",
            {f"r{i}": {"snippets": np.array([rng.choice(chars, 90).tobytes() for _ in range(n)], dtype=object)}
             for i in range(k)})


def stackoverflow(folder, rng, k):
    words = [f"w{i}" for i in range(12_000)]
    (folder / "stackoverflow.word_count").write_text("".join(f"{w} {20_000 - i}\n" for i, w in enumerate(words)))
    for split, n in (("train", 400), ("test", 40)):
        clients = {}
        for u in range(k):
            sents = [" ".join(rng.choice(words, int(rng.integers(5, 30)))) for _ in range(n)]
            clients[f"{u:08d}"] = {"tokens": np.array([s.encode() for s in sents], dtype=object)}
        _h5(folder / f"stackoverflow_{split}.h5", clients)


def cifar100(folder, rng, k):
    for split, n in (("train", 100), ("test", 100)):
        _h5(folder / f"fed_cifar100_{split}.h5", {str(i): {"image": rng.integers(0, 256, (n, 32, 32, 3), np.uint8),
                                                          "label": rng.integers(0, 100, n).astype(np.int64),
                                                          "coarse_label": rng.integers(0, 20, n).astype(np.int64)}
                                                 for i in range(k)})


TASKS = {"emnist": ("reddi_emnist_cr", emnist, 20), "shakespeare": ("reddi_shakespeare", shakespeare, 20),
         "stackoverflow": ("reddi_stackoverflow_nwp", stackoverflow, 60), "cifar100": ("reddi_cifar100", cifar100, 20)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default=",".join(TASKS))
    a = ap.parse_args()
    for name in a.only.split(","):
        config, write, k = TASKS[name]
        with tempfile.TemporaryDirectory() as tmp:
            folder = pathlib.Path(tmp) / "data"
            folder.mkdir()
            write(folder, np.random.default_rng(0), k)
            times = []
            for rounds in (1, 1 + a.rounds):
                over = {"base.data.path": str(folder), "base.data.num_clients": k, "base.data.test_clients": 5,
                        "base.rounds": rounds, "base.evaluation.every": 10_000, "variants": [{"label": "FedAvg"}]}
                t0, c0 = time.perf_counter(), time.process_time()
                fedarena.run(ROOT / "experiments" / f"{config}.yaml", over, out=pathlib.Path(tmp) / f"run{rounds}")
                times.append((time.perf_counter() - t0, time.process_time() - c0))
        (w1, c1), (w2, c2) = times
        print(f"{config}: one round of FedAvg {(w2 - w1) / a.rounds:.1f} s wall, {(c2 - c1) / a.rounds:.1f} s CPU "
              f"(a 1-round run: {w1:.1f} s wall, {c1:.1f} s CPU)", flush=True)


if __name__ == "__main__":
    main()
