"""The published device profiles (issue 35, ``devices.profiles: published``): each tier's numbers against the cited
raw measurements converted by hand, a run that draws them, and the tier lists and a named distribution refused
together in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedarena.federated.config import DevicesConfig
from fedarena.federated.devices import PUBLISHED_TIERS
from fedarena.platform.cli import main

REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path) -> Path:
    cfg = yaml.safe_load((REPO / "experiments" / "heterofl_digits.yaml").read_text())
    cfg["rounds"] = 2
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_published_tiers_are_the_cited_measurements():
    mib = 1024 * 1024
    # (heap limit MiB, inference ms, MACs of the benchmarked model, upload Mbit/s, download Mbit/s)
    cited = [(256, 32.2, 569e6, 21.08, 166.13), (192, 123.3, 569e6, 12.61, 56.74), (48, 1250.0, 300e6, 5.09, 17.77)]
    assert len(PUBLISHED_TIERS) == len(cited)
    for tier, (heap, ms, macs, up, down) in zip(PUBLISHED_TIERS, cited):
        assert tier.memory_bytes == heap * mib
        assert tier.flops_per_s == pytest.approx(2 * macs / (ms / 1000), rel=1e-3)
        assert tier.up_bytes_per_s == pytest.approx(up * 1e6 / 8)
        assert tier.down_bytes_per_s == pytest.approx(down * 1e6 / 8)
    assert sum(t.fraction for t in PUBLISHED_TIERS) == pytest.approx(1.0)
    assert DevicesConfig(profiles="published").tiers() is PUBLISHED_TIERS


def test_published_profiles_drive_a_run(tmp_path):
    """The digits MLP fits every published tier's memory, so every client trains the full width."""
    args = ["run", str(_config(tmp_path)), "--out", str(tmp_path / "r"), "--quiet", "--no-report",
            "--set", "devices.profiles=published",
            "--set", "devices.tier_fraction=[]", "--set", "devices.tier_memory_mb=[]",
            "--set", "devices.tier_gflops=[]", "--set", "devices.tier_up_mbps=[]", "--set", "devices.tier_down_mbps=[]"]
    assert main(args) == 0
    import csv

    with open(tmp_path / "r" / "device_costs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and {r["level"] for r in rows} == {"0"}
    assert {r["tier"] for r in rows} <= {"0", "1", "2"}
    assert all(float(r["memory_bytes"]) <= float(r["memory_budget"]) for r in rows)


def test_named_profiles_and_tier_lists_together_is_one_line_exit_2(tmp_path, capsys):
    args = ["run", str(_config(tmp_path)), "--out", str(tmp_path / "r"), "--quiet",
            "--set", "devices.profiles=published"]
    assert main(args) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "devices.profiles: published names a tier distribution, and the tier lists give another" \
        in err[0], err
