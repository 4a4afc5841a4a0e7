"""Prioritized fictitious self-play (PFSP) weightings (Vinyals et al., 2019, Methods, "Prioritized fictitious
self-play", and the pseudocode's ``pfsp``).

An opponent B of player A is drawn with probability proportional to ``f(P[A beats B])``:

- ``squared``: ``f(x) = (1 - x)^2`` (hardest opponents first; AlphaStar's main agents),
- ``variance``: ``f(x) = x (1 - x)`` (opponents of about equal strength; the curriculum branches),
- ``linear``: ``f(x) = 1 - x``,
- ``linear_capped``: ``f(x) = min(0.5, 1 - x)`` (AlphaStar's league exploiters).

When every weight is zero (A beats all candidates with certainty) the draw is uniform, as in the pseudocode.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

WEIGHTINGS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "squared": lambda x: (1.0 - x) ** 2,
    "variance": lambda x: x * (1.0 - x),
    "linear": lambda x: 1.0 - x,
    "linear_capped": lambda x: np.minimum(0.5, 1.0 - x),
}


def check_weighting(name: str, field: str = "weighting") -> str:
    if name not in WEIGHTINGS:
        raise ValueError(f"{field}: unknown PFSP weighting '{name}'; known: {', '.join(sorted(WEIGHTINGS))}")
    return name


def pfsp(win_rates: np.ndarray, weighting: str = "linear") -> np.ndarray:
    """Probabilities over opponents given the player's win rates against each (values in [0, 1])."""
    x = np.asarray(win_rates, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"win_rates: expected a non-empty vector, got shape {x.shape}")
    if not np.all((x >= 0.0) & (x <= 1.0)):
        raise ValueError("win_rates: every entry must lie in [0, 1]")
    w = WEIGHTINGS[check_weighting(weighting)](x)
    total = w.sum()
    if total < 1e-10:
        return np.full(x.size, 1.0 / x.size)
    return w / total
