"""``fedarena sweep``: trial folders, values read from each trial's own rows, the best trial, Optuna and Ray Tune."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fedarena
from fedarena.platform.cli import main
from fedarena.platform.errors import ConfigError
from fedarena.platform.runs import read_metrics
from fedarena.platform.sweep import load_sweep, parse_distributions, parse_grid, split_values

ROOT = Path(__file__).resolve().parents[2]
TINY_PPO = ["--set", "total_steps=128", "--set", "ppo.num_envs=4", "--set", "ppo.num_steps=16", "--set",
            "ppo.update_epochs=1", "--set", "eval.every=64", "--set", "eval.episodes=2", "--set", "checkpoint.every=0"]
GRID = ["ppo.learning_rate=1e-3,3e-3,1e-2", "ppo.hidden=[8],[16]"]


def _last(run_dir: Path, metric: str) -> float:
    return [r[metric] for r in read_metrics(run_dir) if metric in r][-1]


def _check_grid_sweep(out: Path, ray: bool) -> None:
    info = json.loads((out / "sweep.json").read_text())
    trials = sorted(p for p in out.iterdir() if p.name.startswith("trial-"))
    assert len(trials) == 6 and all((t / "config.yaml").exists() for t in trials)
    combos = {(t["params"]["ppo.learning_rate"], json.dumps(t["params"]["ppo.hidden"])) for t in info["trials"]}
    assert combos == {(lr, h) for lr in (1e-3, 3e-3, 1e-2) for h in ("[8]", "[16]")}
    for t in info["trials"]:  # each trial ran with its own parameters
        cfg = fedarena.load_run(out / t["trial"]).config
        assert cfg["ppo"]["learning_rate"] == t["params"]["ppo.learning_rate"]
        assert cfg["ppo"]["hidden"] == t["params"]["ppo.hidden"]
    values = {t["trial"]: _last(out / t["trial"], "eval_return") for t in info["trials"]
              if t["state"] == "completed" or ray}
    best = max(values, key=values.get)
    assert info["metric"] == "eval_return" and info["mode"] == "max"
    assert values[info["best"]["trial"]] == values[best] and info["best"]["value"] == values[best]
    html = (out / "report" / "index.html").read_text()
    assert f"Best trial: <b>{info['best']['trial']}</b>" in html and html.count('<a href="../trial-') == 6
    assert (out / "report" / "parallel_coordinates.png").stat().st_size > 10_000


@pytest.mark.slow
def test_grid_of_two_fields_by_three_values_writes_six_runs_and_names_the_best(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", str(ROOT / "experiments/ppo_cartpole.yaml"), "--grid", *GRID, *TINY_PPO,
                 "--parallel", "2", "--out", str(out), "--quiet"]) == 0
    _check_grid_sweep(out, ray=False)
    info = json.loads((out / "sweep.json").read_text())
    assert all(t["state"] == "completed" for t in info["trials"]) and info["state"] == "completed"
    assert f"best: {info['best']['trial']} eval_return" in capsys.readouterr().out


@pytest.mark.slow
def test_the_same_grid_on_ray_tune_with_asha(tmp_path, ray_session):
    pytest.importorskip("ray.tune")
    out = tmp_path / "sweep"
    res = fedarena.sweep(ROOT / "experiments/ppo_cartpole.yaml", grid=GRID, overrides=TINY_PPO[1::2], out=out,
                         ray=True)
    _check_grid_sweep(out, ray=True)
    assert {t.state for t in res.trials} <= {"completed", "stopped early (ASHA)"}
    assert (out / "ray_results").is_dir() and json.loads((out / "sweep.json").read_text())["ray"] is True


@pytest.mark.slow
def test_random_and_optuna_sweeps_of_another_kind(tmp_path):
    pytest.importorskip("optuna")
    config = ROOT / "experiments/prisoners_dilemma.yaml"
    rnd = fedarena.sweep(config, space={"iterations": "int(10,40)"}, samples=2, out=tmp_path / "random", seed=1)
    assert [10 <= t.params["iterations"] <= 40 for t in rnd.trials] == [True, True]
    opt = fedarena.sweep(config, space={"iterations": "int(10,40)", "checkpoint.keep": "choice(1,2)"},
                         optuna=3, out=tmp_path / "optuna", parallel=2)
    assert len(opt.trials) == 3 and all(t.state == "completed" for t in opt.trials)
    assert opt.metric == "selfplay/exploitability_current" and opt.mode == "min"
    for t in opt.trials:  # the value is the trial's own summary number
        status = json.loads((tmp_path / "optuna" / t.name / "status.json").read_text())
        assert t.value == status["summary"][opt.metric]
        assert fedarena.load_run(tmp_path / "optuna" / t.name).config["iterations"] == t.params["iterations"]
        assert fedarena.load_run(tmp_path / "optuna" / t.name).config["checkpoint"]["keep"] == t.params["checkpoint.keep"]
    assert opt.best.value == min(t.value for t in opt.trials)
    assert load_sweep(tmp_path / "optuna").best.name == opt.best.name


def test_bad_sweep_input_is_a_one_line_error(tmp_path, capsys):
    config = str(ROOT / "experiments/ppo_cartpole.yaml")
    assert main(["sweep", config, "--grid", "ppo.learnin_rate=1e-3,1e-2", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'ppo.learnin_rate'; did you mean 'ppo.learning_rate'?" in err
    assert not (tmp_path / "s").exists()
    assert main(["sweep", config, "--random", "x", "ppo.learning_rate=uniform(0,1)"]) == 2
    assert "--random: expected the number of trials first" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"loguniform\(a,b\) needs a > 0"):
        parse_distributions(["a=loguniform(0, 1)"], "--random")
    with pytest.raises(ConfigError, match="is not uniform"):
        parse_distributions(["a=normal(0, 1)"], "--random")


def test_values_split_at_top_level_commas_and_numbers_stay_numbers():
    assert split_values("1e-3, [8, 8],{a: 1}, x") == ["1e-3", "[8, 8]", "{a: 1}", "x"]
    assert parse_grid(["a.b=1e-3,2,[8, 8],relu"]) == {"a.b": [0.001, 2, [8, 8], "relu"]}
