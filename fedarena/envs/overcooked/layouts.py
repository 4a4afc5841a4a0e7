"""Overcooked kitchen layouts of Carroll et al. (2019), "On the Utility of Learning about Humans for Human-AI
Coordination", written from the grids of ``overcooked-ai``'s layout files.

Grid characters: ``X`` counter, ``O`` onion dispenser, ``D`` dish (plate) dispenser, ``P`` pot, ``S`` serving
location, space floor, ``1``/``2`` the start cells of ``agent_0``/``agent_1`` (players 1 and 2 of the paper).
Every non-floor cell blocks movement; only floor cells hold agents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# cell kinds of Layout.kind
FLOOR, COUNTER, ONION_PILE, PLATE_PILE, POT, GOAL = range(6)
_KIND = {" ": FLOOR, "1": FLOOR, "2": FLOOR, "X": COUNTER, "O": ONION_PILE, "D": PLATE_PILE, "P": POT, "S": GOAL}

GRIDS: dict[str, tuple[str, ...]] = {
    "cramped_room": ("XXPXX",
                     "O  2O",
                     "X1  X",
                     "XDXSX"),
    "asymmetric_advantages": ("XXXXXXXXX",
                              "O XSXOX S",
                              "X   P 1 X",
                              "X2  P   X",
                              "XXXDXDXXX"),
}


@dataclass(frozen=True)
class Layout:
    """A parsed kitchen: ``kind`` (H, W) cell kinds, ``pot_index`` (H, W) the pot's number or -1, pot cells
    ``pots`` (P, 2) as (x, y), and the agents' start cells ``start`` (2, 2) as (x, y)."""

    name: str
    kind: np.ndarray
    pot_index: np.ndarray
    pots: np.ndarray
    start: np.ndarray

    @property
    def height(self) -> int:
        return self.kind.shape[0]

    @property
    def width(self) -> int:
        return self.kind.shape[1]


def parse_layout(name: str, grid: tuple[str, ...]) -> Layout:
    rows = len(grid)
    cols = len(grid[0])
    if any(len(r) != cols for r in grid):
        raise ValueError(f"layout {name}: rows of different lengths")
    kind = np.zeros((rows, cols), dtype=np.int8)
    start = np.zeros((2, 2), dtype=np.int64)
    seen = set()
    for y, row in enumerate(grid):
        for x, ch in enumerate(row):
            if ch not in _KIND:
                raise ValueError(f"layout {name}: unknown cell '{ch}' at ({x}, {y})")
            kind[y, x] = _KIND[ch]
            if ch in "12":
                start[int(ch) - 1] = (x, y)
                seen.add(ch)
    if seen != {"1", "2"}:
        raise ValueError(f"layout {name}: needs the start cells 1 and 2")
    border = np.concatenate([kind[0], kind[-1], kind[:, 0], kind[:, -1]])
    if (border == FLOOR).any():
        raise ValueError(f"layout {name}: floor on the border (agents could leave the grid)")
    ys, xs = np.nonzero(kind == POT)
    pots = np.stack([xs, ys], axis=1).astype(np.int64)
    pot_index = np.full(kind.shape, -1, dtype=np.int64)
    pot_index[ys, xs] = np.arange(len(xs))
    return Layout(name, kind, pot_index, pots, start)


LAYOUTS: dict[str, Layout] = {name: parse_layout(name, grid) for name, grid in GRIDS.items()}
