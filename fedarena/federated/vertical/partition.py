"""Vertical partitions of a tabular data set for experiments: two parties, split features, partly shared IDs.

Simulates the setting of Yang et al., *Federated Learning* (2019), ch. 5: companies A (features and
labels) and B (features) share only part of their users. Each party gets its own ID list in its own
order; only PSI (:mod:`.psi`) tells them which rows correspond.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PartyData:
    ids: list[str]
    x: np.ndarray
    y: np.ndarray | None = None


def vertical_partition(x: np.ndarray, y: np.ndarray, features_a: int, shared_fraction: float,
                       seed: int) -> tuple[PartyData, PartyData]:
    """A gets columns [:features_a] and y, B the rest; ``shared_fraction`` of all rows are held by both,
    the other rows by exactly one party (alternately)."""
    x, y = np.asarray(x, np.float64), np.asarray(y)
    if not 0 < features_a < x.shape[1]:
        raise ValueError(f"features_a: must be in 1..{x.shape[1] - 1}, got {features_a}")
    if not 0.0 <= shared_fraction <= 1.0:
        raise ValueError(f"shared_fraction: must be in [0, 1], got {shared_fraction}")
    rng = np.random.default_rng(seed)
    n = len(x)
    perm = rng.permutation(n)
    n_shared = int(round(shared_fraction * n))
    shared, rest = perm[:n_shared], perm[n_shared:]
    rows_a = np.concatenate([shared, rest[0::2]])
    rows_b = np.concatenate([shared, rest[1::2]])
    rows_a, rows_b = rng.permutation(rows_a), rng.permutation(rows_b)
    ids = [f"user-{int(v):08d}" for v in rng.choice(10**8, size=n, replace=False)]
    a = PartyData([ids[i] for i in rows_a], x[rows_a, :features_a], y[rows_a])
    b = PartyData([ids[i] for i in rows_b], x[rows_b, features_a:])
    return a, b


def train_test_rows(n_rows: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A public split of the aligned rows (both parties derive it from the shared seed)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction: must be in (0, 1), got {test_fraction}")
    perm = np.random.default_rng([seed, 7]).permutation(n_rows)
    n_test = max(1, int(round(test_fraction * n_rows)))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def standardize(x: np.ndarray, train_rows: np.ndarray) -> np.ndarray:
    """Each party scales its own columns with its own training-row statistics."""
    mu = x[train_rows].mean(axis=0)
    sd = x[train_rows].std(axis=0)
    return (x - mu) / np.where(sd > 0, sd, 1.0)
