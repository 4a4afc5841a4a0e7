"""The federated views' data from a ``fedsim`` run folder (:mod:`fedarena.federated.fedsim_experiment`).

Per round, ``metrics.jsonl`` holds the global test accuracy, the clients' held-out accuracy summary
(``client_acc_mean``, ``client_acc_p10``, ``client_acc_worst``) and the exact bytes up and down; those curves
are drawn from the metric rows.  This module reads the two arrays the kind saves beside them:
``label_histogram.npy`` (``H[i, c]``: examples of class c held by client i) and, with ``evaluation.personalize_epochs``,
``personalization.npy`` (per-client held-out accuracy of the global model, and after local fine-tuning).
Arrays are read through :mod:`fedarena.board.confined` (no links, regular files of at most
:data:`MAX_ARRAY_BYTES`) and loaded with ``allow_pickle=False``; a missing, truncated, oversized or ill-shaped
file is reported, not raised.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from fedarena.board.confined import Unreadable, read_bytes
from fedarena.board.folders import finite_or_none, has_entry

ROUND_METRICS = ("test_acc", "client_acc_mean", "client_acc_p10", "client_acc_worst")
BYTES_METRICS = ("bytes_up", "bytes_down")
MAX_CLIENTS = 100  # the label histogram shows the first this many clients
MAX_ARRAY_BYTES = 2 * 1024 * 1024
MAX_CLASSES = 100  # and the first this many classes


def _load(run_dir: Path, name: str, ndim: int) -> tuple[np.ndarray | None, str | None]:
    if not has_entry(run_dir, name):
        return None, None
    try:
        a = np.load(io.BytesIO(read_bytes(run_dir, name, MAX_ARRAY_BYTES)), allow_pickle=False)
    except (Unreadable, OSError, ValueError, EOFError) as exc:
        return None, f"{name}: unreadable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if not isinstance(a, np.ndarray) or a.ndim != ndim or not np.issubdtype(a.dtype, np.number):
        return None, f"{name}: expected a {ndim}-d numeric array, got {getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', ()))}"
    return a, None


def fl_data(run_dir: Path) -> dict[str, Any]:
    """``{"label_histogram": [[...]] | None, "clients_shown", "clients", "personalization": {"before": [...],
    "after": [...]} | None, "problems": [...]}`` of a run folder (JSON-ready; NaN becomes null)."""
    out: dict[str, Any] = {"label_histogram": None, "clients": 0, "clients_shown": 0, "personalization": None,
                           "problems": []}
    hist, why = _load(run_dir, "label_histogram.npy", 2)
    if why:
        out["problems"].append(why)
    if hist is not None:
        out["clients"] = int(hist.shape[0])
        shown = hist[:MAX_CLIENTS, :MAX_CLASSES]
        out["clients_shown"] = int(shown.shape[0])
        out["label_histogram"] = shown.astype(float).tolist()
    pers, why = _load(run_dir, "personalization.npy", 2)
    if why:
        out["problems"].append(why)
    if pers is not None:
        if pers.shape[0] != 2:
            out["problems"].append(f"personalization.npy: expected 2 rows (before, after), got {pers.shape[0]}")
        else:
            out["personalization"] = {"before": finite_or_none(pers[0].astype(float).tolist()),
                                      "after": finite_or_none(pers[1].astype(float).tolist())}
    return out


def is_fl_run(run_dir: Path, kind: str) -> bool:
    """A ``fedsim`` run, or any run folder holding the label histogram of a federated split."""
    return kind == "fedsim" or has_entry(run_dir, "label_histogram.npy")
