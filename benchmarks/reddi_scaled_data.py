"""Write a scaled-down EMNIST character-recognition population in TFF's HDF5 layout, for the scaled-down run of
the Reddi et al. 2021 table (``experiments/reddi_emnist_cr_scaled.yaml``, docs/reproductions.md).

No EMNIST is downloaded (the machines have no network): the images are scikit-learn's handwritten digits (8x8,
1,797 images, 10 classes) upsampled 3x into a 28x28 frame, so the files are TFF's ``fed_emnist_digitsonly``
layout (``examples/<writer>/pixels`` (n, 28, 28) float32 in [0, 1], ``label`` (n,) int32). Each of the 3,400
writers gets its own style -- a fixed shift of up to 2 pixels, an ink intensity in [0.6, 1] and pixel noise
(sd 0.05) -- and its own number of examples, drawn from a log-normal with median 90 and sigma 0.5, clipped to
[10, 400] (a stand-in for the spread of EMNIST's writers, not a fit to it); 10% of a writer's examples (at least
one) go to the test file, as TFF keeps a test split per writer. Training examples are drawn from the first 1,400
digits and test examples from the other 397, so test accuracy measures generalisation to unseen images.

    python benchmarks/reddi_scaled_data.py OUT_FOLDER [--clients 3400] [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np
from sklearn.datasets import load_digits


def _images(base: np.ndarray, idx: np.ndarray, rng: np.random.Generator, shift: tuple[int, int], ink: float):
    img = np.kron(base[idx] / 16.0, np.ones((1, 3, 3)))  # (n, 24, 24)
    out = np.zeros((len(idx), 28, 28), np.float32)
    dy, dx = 2 + shift[0], 2 + shift[1]
    out[:, dy: dy + 24, dx: dx + 24] = img * ink
    out += rng.normal(0, 0.05, out.shape).astype(np.float32)
    return np.clip(out, 0, 1)


def write(folder: Path, clients: int = 3400, seed: int = 0) -> tuple[int, int]:
    """Write ``fed_emnist_digitsonly_{train,test}.h5`` into ``folder``; returns (train, test) example counts."""
    digits = load_digits()
    base, labels = digits.images, digits.target
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(np.log(90), 0.5, clients)), 10, 400).astype(int)
    folder.mkdir(parents=True, exist_ok=True)
    n_train = n_test = 0
    with h5py.File(folder / "fed_emnist_digitsonly_train.h5", "w") as tr, \
            h5py.File(folder / "fed_emnist_digitsonly_test.h5", "w") as te:
        for c, n in enumerate(sizes):
            cid = f"w{c:05d}"
            shift = tuple(int(v) for v in rng.integers(-2, 3, 2))
            ink = float(rng.uniform(0.6, 1.0))
            k = max(1, int(round(0.1 * n)))
            for f, count, pool in ((tr, n - k, np.arange(1400)), (te, k, np.arange(1400, len(base)))):
                idx = rng.choice(pool, count)
                g = f.create_group(f"examples/{cid}")
                g.create_dataset("pixels", data=_images(base, idx, rng, shift, ink))
                g.create_dataset("label", data=labels[idx].astype(np.int32))
            n_train += n - k
            n_test += k
    return n_train, n_test


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--clients", type=int, default=3400)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    tr, te = write(Path(a.out), a.clients, a.seed)
    print(f"{a.clients} writers, {tr} training and {te} test examples in {a.out}")
