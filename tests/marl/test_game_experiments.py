"""The xfp, cfr and psro experiment kinds end to end through the platform: summaries, reports, resume."""

import json

import pytest

from fedarena.platform.config import ConfigError
from fedarena.platform.runs import execute, read_metrics


def test_xfp_kind_and_resume_matches_uninterrupted(tmp_path):
    cfg = {"kind": "xfp", "game": "kuhn_poker", "iterations": 10, "checkpoint": {"every": 5}}
    first = execute(cfg, out=tmp_path / "a", quiet=True, report=False)
    assert first["exploitability@10"] <= 0.0834
    resumed = execute(resume=tmp_path / "a", overrides=["iterations=20"], quiet=True, report=False)
    straight = execute({**cfg, "iterations": 20}, out=tmp_path / "b", quiet=True, report=False)
    assert resumed["exploitability"] == pytest.approx(straight["exploitability"], abs=1e-15)
    steps = [r["step"] for r in read_metrics(tmp_path / "a")]
    assert steps == list(range(0, 21))  # no duplicated or missing rows across the resume


def test_cfr_kind(tmp_path):
    out = execute({"kind": "cfr", "game": "kuhn_poker", "iterations": 100, "eval_every": 50},
                  out=tmp_path / "c", quiet=True, report=False)
    assert out["algorithm"] == "cfr+" and out["exploitability@100"] <= 0.0013
    rows = read_metrics(tmp_path / "c")
    assert [r["step"] for r in rows] == [1, 50, 100] and all("solver_time" in r for r in rows)


def test_psro_kind_compares_meta_solvers(tmp_path):
    out = execute({"kind": "psro", "game": "kuhn_poker", "iterations": 8,
                   "meta_solvers": ["nash", "uniform", "last"]}, out=tmp_path / "p", quiet=True)
    assert out["nash/exploitability"] < 1e-9
    assert 1 <= out["nash/first_iteration_below_1e-9"] <= 8
    assert out["uniform/exploitability"] > 1e-3 and out["last/first_iteration_below_1e-9"] is None
    status = json.loads((tmp_path / "p" / "status.json").read_text())
    assert status["state"] == "completed"
    assert (tmp_path / "p" / "report" / "exploitability.png").exists()


@pytest.mark.parametrize("cfg,match", [
    ({"kind": "psro", "meta_solvers": ["nash", "best"]}, "meta_solvers: unknown meta-solver 'best'"),
    ({"kind": "psro", "sample_episodes": -3}, "sample_episodes"),
    ({"kind": "xfp", "game": "texas"}, "unknown game 'texas'"),
    ({"kind": "cfr", "iterations": 0}, "iterations"),
])
def test_config_errors_name_the_field(tmp_path, cfg, match):
    with pytest.raises((ConfigError, ValueError), match=match):
        execute(cfg, out=tmp_path / "x", quiet=True)


def test_psro_resume_with_sampled_payoffs_is_deterministic(tmp_path):
    cfg = {"kind": "psro", "game": "kuhn_poker", "iterations": 3, "meta_solvers": ["nash", "uniform"],
           "sample_episodes": 300, "seed": 4, "checkpoint": {"every": 3}}
    execute(cfg, out=tmp_path / "a", quiet=True, report=False)
    resumed = execute(resume=tmp_path / "a", overrides=["iterations=6"], quiet=True, report=False)
    straight = execute({**cfg, "iterations": 6}, out=tmp_path / "b", quiet=True, report=False)
    for m in ("nash", "uniform"):  # the sampling generator's state came back from the checkpoint
        assert resumed[f"{m}/exploitability"] == straight[f"{m}/exploitability"]
    other_seed = execute({**cfg, "iterations": 6, "seed": 5}, out=tmp_path / "c", quiet=True, report=False)
    assert other_seed["nash/exploitability"] != straight["nash/exploitability"]


@pytest.mark.parametrize("name,kind", [("kuhn_xfp", "xfp"), ("kuhn_psro", "psro"), ("leduc_psro", "psro"),
                                       ("leduc_cfr", "cfr")])
def test_shipped_configs_resolve(name, kind):
    from pathlib import Path

    from fedarena.platform.runs import resolve

    path = Path(__file__).resolve().parents[2] / "experiments" / f"{name}.yaml"
    _, cfg = resolve(path)
    assert cfg.kind == kind
    if name == "kuhn_psro":
        assert cfg.meta_solvers == ["nash", "prd", "uniform", "last"]
