"""Lineage across runs (MindInsight's model and data lineage): which config values produced which final
metrics, the config diff of runs compared side by side, and the parallel-coordinates dimensions of a kind.

Configs are flattened to dotted keys (``ppo.learning_rate``); a list is one value.  A lineage table shows the
keys whose values differ between the runs of a kind (the hyper-parameters of the sweep) plus, for federated
runs, the data settings (partitioner, its concentration, clients), beside every final summary number.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from fedarena.board.folders import is_number

MISSING = "(absent)"
DATA_KEYS = ("data.dataset", "data.partition", "data.alpha", "data.shards_per_client", "data.beta", "data.num_clients",
             "clients.per_round")
"""The FL data settings (dotted paths of :class:`fedarena.federated.fedsim_experiment.FedSimConfig`)."""
FLAT_DATA_KEYS = ("dataset", "partition", "alpha", "shards_per_client", "beta", "num_clients", "clients_per_round")
"""The same settings in the flat layout of fedsim runs made before the config sections (their config.json)."""
IGNORED = ("name", "kind")


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def display(v: Any) -> str:
    """A config value as text (YAML-like: lists as JSON, None as null)."""
    if v is MISSING:
        return MISSING
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, str):
        return v
    return json.dumps(v, default=str)


def config_diff(configs: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[Any]]]:
    """``(key, value per run)`` for every flattened key whose values are not all equal (absent counts)."""
    flat = [flatten(c) for c in configs]
    keys: dict[str, None] = {}
    for f in flat:
        keys.update(dict.fromkeys(f))
    out = []
    for k in keys:
        values = [f.get(k, MISSING) for f in flat]
        if any(_key(v) != _key(values[0]) for v in values[1:]):
            out.append((k, values))
    return out


def _key(v: Any) -> str:
    return MISSING if v is MISSING else json.dumps(v, sort_keys=True, default=str)


def is_federated(flat: Mapping[str, Any]) -> bool:
    """A flattened config (:func:`flatten`) of a fedsim run, nested or flat."""
    return ("data.num_clients" in flat and "data.partition" in flat) or ("num_clients" in flat and "partition" in flat)


@dataclass
class Lineage:
    """Config values vs final metrics over the runs of one kind."""

    kind: str
    run_ids: list[str]
    names: list[str]
    states: list[str]
    params: list[str]
    """config keys shown: those that vary between the runs, then the FL data settings"""
    data_params: list[str]
    metrics: list[str]
    config: list[dict[str, Any]]
    """per run: flattened config key -> value"""
    results: list[dict[str, Any]]
    """per run: metric -> final value (absent when the run has none)"""

    @property
    def columns(self) -> list[str]:
        """The config keys of the table: the varying ones, then the FL data settings not among them."""
        return [*self.params, *[d for d in self.data_params if d not in self.params]]

    def dimensions(self) -> list[dict[str, Any]]:
        """Plotly ``parcoords`` dimensions over the finished runs.

        A numeric config key is one numeric axis; any other (strings, lists, booleans, absent values) is a
        categorical axis whose ticks are the values' text.  Metrics are numeric axes; a metric that a
        finished run lacks or that is not finite in some run is left out of the plot.  With two or more runs,
        an axis on which every run has the same value is left out too (the table keeps all of them).
        """
        rows = [i for i, s in enumerate(self.states) if s == "finished"]
        metrics = [m for m in self.metrics
                   if all(is_number(self.results[i].get(m)) and math.isfinite(self.results[i][m]) for i in rows)]
        dims = []
        for p in self.columns:
            vals = [self.config[i].get(p, MISSING) for i in rows]
            if all(is_number(v) and math.isfinite(v) for v in vals):
                dims.append({"label": p, "values": [float(v) for v in vals]})
            else:
                cats = sorted({display(v) for v in vals})
                dims.append({"label": p, "values": [cats.index(display(v)) for v in vals],
                             "tickvals": list(range(len(cats))), "ticktext": cats})
        for m in metrics:
            dims.append({"label": m, "values": [float(self.results[i][m]) for i in rows]})
        if len(rows) > 1:
            dims = [d for d in dims if len(set(d["values"])) > 1]
        return dims

    def plotted_runs(self) -> list[str]:
        return [self.run_ids[i] for i, s in enumerate(self.states) if s == "finished"]


def lineage(kind: str, runs: Sequence[tuple[str, str, str, Mapping[str, Any], Mapping[str, Any]]]) -> Lineage:
    """Lineage of ``runs``: ``(run id, name, state, config, final metrics)`` of one kind, in the given order."""
    flat = [{k: v for k, v in flatten(cfg).items() if k not in IGNORED} for _, _, _, cfg, _ in runs]
    varying = [k for k, _ in config_diff(flat)] if len(flat) > 1 else []
    data_params = [k for k in DATA_KEYS + FLAT_DATA_KEYS if any(is_federated(f) and k in f for f in flat)]
    metrics: dict[str, None] = {}
    for *_, m in runs:
        metrics.update(dict.fromkeys(k for k, v in m.items() if is_number(v)))
    results = [{k: v for k, v in m.items() if is_number(v)} for *_, m in runs]
    return Lineage(kind=kind, run_ids=[r[0] for r in runs], names=[r[1] for r in runs], states=[r[2] for r in runs],
                   params=varying, data_params=data_params, metrics=list(metrics), config=flat, results=results)
