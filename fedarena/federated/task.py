"""Federated learning tasks: a data set split over clients with Dirichlet label skew, plus a trainer.

The non-IID split follows Hsu, Qi & Brown, "Measuring the Effects of Non-Identical Data Distribution
for Federated Visual Classification" (2019): for every class c, client shares ``p_c ~ Dir(alpha 1_K)``
and the class's examples are dealt out in those proportions (small alpha = strong skew); the draw is
repeated until every client holds at least ``min_examples``. Every process of a deployment rebuilds
the same split from the same :class:`TaskSpec`, so no data ever crosses the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedarena.federated.trainer import LocalTrainer, NumpyMLPTrainer


@dataclass(frozen=True)
class TaskSpec:
    dataset: str = "digits"
    """'digits' (scikit-learn's 8x8 digits, 1797 examples, 10 classes) or 'synthetic' (Gaussian blobs)"""
    num_clients: int = 20
    alpha: float = 0.5
    """Dirichlet concentration of the label skew; 0 means an IID (uniform random) split"""
    test_fraction: float = 0.2
    hidden: tuple[int, ...] = (64,)
    seed: int = 0
    trainer: str = "engine"
    """'engine' (fedarena.engine MLP) or 'numpy' (reference MLP)"""
    synthetic_features: int = 64
    synthetic_classes: int = 10
    synthetic_examples: int = 4000
    min_examples: int = 5
    model: dict[str, Any] = field(default_factory=dict)
    """a model other than the MLP: the fields of fedsim's ``model`` section
    (:class:`fedarena.federated.config.ModelConfig`, e.g. ``{"arch": "cnn_emnist", "widths": [4, 8]}``), trained
    by :class:`~fedarena.federated.engine_trainer.BatchedModelTrainer`; empty or ``arch: mlp`` = the MLP of
    ``hidden`` with ``trainer``"""

    def __post_init__(self) -> None:
        if self.dataset not in ("digits", "synthetic"):
            raise ValueError(f"task.dataset: unknown '{self.dataset}' (digits or synthetic)")
        if self.num_clients < 1:
            raise ValueError(f"task.num_clients: must be >= 1, got {self.num_clients}")
        if self.alpha < 0:
            raise ValueError(f"task.alpha: must be >= 0, got {self.alpha}")
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"task.test_fraction: must lie in (0, 1), got {self.test_fraction}")
        if self.trainer not in ("engine", "numpy"):
            raise ValueError(f"task.trainer: unknown '{self.trainer}' (engine or numpy)")
        if self.model.get("arch", "mlp") != "mlp" and self.trainer != "engine":
            raise ValueError(f"task.trainer: model {self.model['arch']} trains on the engine, not '{self.trainer}'")


@dataclass(frozen=True)
class Task:
    spec: TaskSpec
    clients: list[tuple[np.ndarray, np.ndarray]]
    test: tuple[np.ndarray, np.ndarray]
    trainer: LocalTrainer
    sizes: tuple[int, ...]


def dirichlet_split(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
                    min_examples: int = 1, max_tries: int = 1000) -> list[np.ndarray]:
    """Index sets, one per client, dealing each class out with Dirichlet(alpha) proportions."""
    n = len(labels)
    if num_clients * min_examples > n:
        raise ValueError(f"num_clients: {num_clients} clients x {min_examples} examples exceed {n} examples")
    if alpha == 0:
        return [np.sort(p) for p in np.array_split(rng.permutation(n), num_clients)]
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_examples:
            return [np.sort(np.array(p, dtype=np.int64)) for p in parts]
    raise ValueError(f"alpha: no split with >= {min_examples} examples per client in {max_tries} draws")


def _dataset(spec: TaskSpec) -> tuple[np.ndarray, np.ndarray]:
    if spec.dataset == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
    rng = np.random.default_rng([spec.seed, 7])
    centers = rng.standard_normal((spec.synthetic_classes, spec.synthetic_features)) * 1.5
    y = rng.integers(0, spec.synthetic_classes, spec.synthetic_examples)
    x = centers[y] + rng.standard_normal((spec.synthetic_examples, spec.synthetic_features))
    return x.astype(np.float32), y.astype(np.int64)


def make_trainer(spec: TaskSpec, sizes: tuple[int, ...]) -> LocalTrainer:
    if spec.model.get("arch", "mlp") != "mlp":
        from fedarena.federated.config import ModelConfig
        from fedarena.federated.engine_trainer import BatchedModelTrainer

        cfg = ModelConfig(**spec.model)
        return BatchedModelTrainer(cfg.build(sizes[0], sizes[-1]), sizes[-1])
    if spec.trainer == "numpy":
        return NumpyMLPTrainer(sizes)
    from fedarena.federated.engine_trainer import EngineMLPTrainer

    return EngineMLPTrainer(sizes)


def _split(spec: TaskSpec):
    x, y = _dataset(spec)
    rng = np.random.default_rng([spec.seed, 11])
    order = rng.permutation(len(x))
    n_test = int(round(spec.test_fraction * len(x)))
    test_idx, train_idx = order[:n_test], order[n_test:]
    parts = dirichlet_split(y[train_idx], spec.num_clients, spec.alpha, rng, spec.min_examples)
    return x, y, test_idx, train_idx, parts


def max_shard(spec: TaskSpec) -> int:
    """The largest number of training examples one client of ``spec`` holds (the bound servers put on claims)."""
    return max(len(p) for p in _split(spec)[4])


def build_task(spec: TaskSpec) -> Task:
    """Deterministically build the split, test set and trainer of ``spec``."""
    x, y, test_idx, train_idx, parts = _split(spec)
    xtr, ytr = x[train_idx], y[train_idx]
    n_classes = int(y.max()) + 1
    sizes = (x.shape[1], *spec.hidden, n_classes)
    return Task(spec, [(xtr[p], ytr[p]) for p in parts], (x[test_idx], y[test_idx]), make_trainer(spec, sizes), sizes)
