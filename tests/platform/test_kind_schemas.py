"""Every registered experiment kind: its schema builds from defaults, every field has a one-line doc, every
config under experiments/ validates against its kind, and `fedarena show` resolves it."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from fedarena.platform import config as cfgmod
from fedarena.platform.experiment import ExperimentConfig
from fedarena.platform.registry import KINDS, get_kind
from fedarena.platform.runs import resolve

ROOT = Path(__file__).resolve().parents[2]


def _undocumented(schema: type, prefix: str = "") -> list[str]:
    missing = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if not f.metadata.get("doc", "").strip():
            missing.append(prefix + f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            missing += _undocumented(hints[f.name], f"{prefix}{f.name}.")
    return missing


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_kind_schema_has_defaults_and_a_doc_for_every_field(kind):
    experiment = get_kind(kind)
    assert issubclass(experiment.config, ExperimentConfig)
    cfgmod.build(experiment.config, {"kind": kind})  # every field has a usable default
    assert _undocumented(experiment.config) == []


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    experiment, cfg = resolve(path)
    assert cfg.kind in KINDS
    assert cfgmod.build(experiment.config, cfgmod.to_dict(cfg)) == cfg  # the resolved config round-trips
