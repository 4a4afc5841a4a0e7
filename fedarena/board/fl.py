"""The federated views' data from a ``fedsim`` run folder (:mod:`fedarena.federated.fedsim_experiment`).

Per round, ``metrics.jsonl`` holds the global test accuracy, the clients' held-out accuracy summary
(``client_acc_mean``, ``client_acc_p10``, ``client_acc_worst``) and the exact bytes up and down; those curves
are drawn from the metric rows.  This module reads the two arrays the kind saves beside them:
``label_histogram.npy`` (``H[i, c]``: examples of class c held by client i) and, with ``personalize_epochs``,
``personalization.npy`` (per-client held-out accuracy of the global model, and after local fine-tuning).
Arrays are loaded with ``allow_pickle=False``; a missing, truncated or ill-shaped file is reported, not raised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedarena.board.folders import finite_or_none

ROUND_METRICS = ("test_acc", "client_acc_mean", "client_acc_p10", "client_acc_worst")
BYTES_METRICS = ("bytes_up", "bytes_down")
MAX_CLIENTS = 100  # the label histogram shows the first this many clients


def _load(path: Path, ndim: int) -> tuple[np.ndarray | None, str | None]:
    if not path.exists():
        return None, None
    try:
        a = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        return None, f"{path.name}: unreadable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if a.ndim != ndim or not np.issubdtype(a.dtype, np.number):
        return None, f"{path.name}: expected a {ndim}-d numeric array, got {a.dtype}{list(a.shape)}"
    return a, None


def fl_data(run_dir: Path) -> dict[str, Any]:
    """``{"label_histogram": [[...]] | None, "clients_shown", "clients", "personalization": {"before": [...],
    "after": [...]} | None, "problems": [...]}`` of a run folder (JSON-ready; NaN becomes null)."""
    out: dict[str, Any] = {"label_histogram": None, "clients": 0, "clients_shown": 0, "personalization": None,
                           "problems": []}
    hist, why = _load(run_dir / "label_histogram.npy", 2)
    if why:
        out["problems"].append(why)
    if hist is not None:
        out["clients"] = int(hist.shape[0])
        shown = hist[:MAX_CLIENTS]
        out["clients_shown"] = int(shown.shape[0])
        out["label_histogram"] = shown.astype(float).tolist()
    pers, why = _load(run_dir / "personalization.npy", 2)
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
    return kind == "fedsim" or (run_dir / "label_histogram.npy").exists()
