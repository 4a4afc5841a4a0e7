"""The error rule (fedarena.platform.errors): each runtime error is one line on stderr, exit status 2 for user
errors and 1 for internal ones, and status.json = failed with the same message."""

from __future__ import annotations

import json
import textwrap

import pytest

from fedarena.platform.cli import main

PPO = ["--set", "total_steps=256", "--set", "ppo.num_envs=2", "--set", "ppo.num_steps=64", "--set",
       "ppo.num_minibatches=2", "--set", "ppo.update_epochs=1", "--set", "ppo.hidden=[8]", "--set", "eval.every=0",
       "--set", "eval.episodes=2"]


def _fail(capsys, argv, status):
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == status, err
    assert len(lines) == 1, err  # one line, no traceback
    return lines[0]


def _status(run_dir):
    return json.loads((run_dir / "status.json").read_text())


def _module(tmp_path, monkeypatch, name, source):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_unknown_gymnasium_id_is_rejected_when_the_config_loads(tmp_path, capsys):
    out = tmp_path / "run"
    line = _fail(capsys, ["run", "experiments/ppo_cartpole.yaml", "--set", "env_id=CartPol-v1", "--out", str(out)], 2)
    assert line.startswith("fedarena: error:") and "CartPol-v1" in line and "Did you mean: `CartPole`" in line
    st = _status(out)
    assert st["state"] == "failed" and st["user_error"] and st["error"] in line
    assert not (out / "metrics.jsonl").exists()  # nothing ran
    # `show` validates as well
    assert "CartPol-v1" in _fail(capsys, ["show", "experiments/ppo_cartpole.yaml", "--set", "env_id=CartPol-v1"], 2)


def test_missing_optional_dependency_names_what_to_install(tmp_path, monkeypatch, capsys):
    _module(tmp_path, monkeypatch, "needs_box2d", """
        import gymnasium
        raise gymnasium.error.DependencyNotInstalled('Box2D is not installed, run `pip install "gymnasium[box2d]"`')
    """)
    out = tmp_path / "run"
    line = _fail(capsys, ["run", "experiments/ppo_cartpole.yaml", "--set", "env_id=needs_box2d:Lander-v0",
                          "--out", str(out)], 2)
    assert "a package it needs is not installed" in line and 'pip install "gymnasium[box2d]"' in line
    assert _status(out)["state"] == "failed"


def test_psro_on_a_general_sum_game(tmp_path, capsys):
    out = tmp_path / "run"
    line = _fail(capsys, ["run", "experiments/kuhn_psro.yaml", "--set", "game=prisoners_dilemma", "--out", str(out)], 2)
    assert line.startswith("fedarena: error:") and "meta_solvers: 'nash' solves zero-sum meta-games" in line
    assert "prisoners_dilemma" in line and "general-sum" in line
    assert _status(out)["error"] in line


def test_environment_that_raises_during_the_run(tmp_path, monkeypatch, capsys):
    _module(tmp_path, monkeypatch, "broken_env", """
        import gymnasium as gym
        import numpy as np

        class Broken(gym.Env):
            observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
            action_space = gym.spaces.Discrete(2)

            calls = 0

            def reset(self, seed=None, options=None):
                super().reset(seed=seed)
                self.t = 0
                return np.zeros(2, np.float32), {}

            def step(self, action):
                self.t += 1
                Broken.calls += 1
                if Broken.calls == 100:
                    raise ValueError("the simulator lost its state")
                return np.zeros(2, np.float32), 1.0, False, self.t % 10 == 0, {}

        def make():
            return Broken()
    """)
    out = tmp_path / "run"
    line = _fail(capsys, ["run", "experiments/ppo_cartpole.yaml", "--set", "env_id=broken_env:make", *PPO,
                          "--out", str(out), "--quiet"], 2)
    assert "environment 'broken_env:make' raised ValueError in step(): the simulator lost its state" in line
    st = _status(out)
    assert st["state"] == "failed" and st["user_error"] is True and st["error"] in line
    assert "Traceback" in (out / "run.log").read_text()  # the traceback is kept in the run's log


def test_internal_error_exits_1_and_debug_shows_the_traceback(tmp_path, monkeypatch, capsys):
    from fedarena.marl import matrix_dynamics

    def broken(self, game):
        raise ArithmeticError("counts")

    monkeypatch.setattr(matrix_dynamics.Dynamics, "step", broken)
    out = tmp_path / "run"
    line = _fail(capsys, ["run", "experiments/quickstart.yaml", "--out", str(out), "--quiet"], 1)
    assert line.startswith("fedarena: internal error: ArithmeticError: counts") and "--debug" in line
    st = _status(out)
    assert st["state"] == "failed" and st["user_error"] is False and st["error"] == "ArithmeticError: counts"
    with pytest.raises(ArithmeticError):
        main(["--debug", "run", "experiments/quickstart.yaml", "--out", str(tmp_path / "run2"), "--quiet"])


def test_show_docs_prints_the_files_values_and_the_defaults(capsys):
    assert main(["show", "experiments/ppo_cartpole.yaml", "--docs"]) == 0
    out = capsys.readouterr().out
    assert "  num_steps: 32  # default: 128; int;" in out  # the file's value, then the default
    assert "  gamma: 0.98  # default: 0.99; float;" in out
    assert "  clip_coef: 0.2  # default; float;" in out


# -- without --out: a config whose kind is known still leaves its run folder under runs/ (in the current directory)

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _only_run_dir(cwd):
    runs = sorted((cwd / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def _rejected_folder(cwd, line, kind):
    run_dir = _only_run_dir(cwd)
    assert run_dir.name.startswith(f"{kind}-")
    st = _status(run_dir)
    assert st["state"] == "failed" and st["user_error"] is True and st["stage"] == "config"
    assert st["error"] and st["error"] in line and st["kind"] == kind
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "status.json"]  # nothing ran
    import yaml

    return run_dir, yaml.safe_load((run_dir / "config.yaml").read_text())


@pytest.mark.parametrize("argv, kind, needle, given", [
    (["experiments/ppo_cartpole.yaml", "--set", "env_id=CartPol-v1"], "ppo", "CartPol-v1", ("env_id", "CartPol-v1")),
    (["experiments/kuhn_psro.yaml", "--set", "game=prisoners_dilemma"], "psro", "general-sum",
     ("game", "prisoners_dilemma")),
    (["experiments/ppo_cartpole.yaml", "--set", "ppo.gamma=2.0"], "ppo", "ppo.gamma", None),
])
@pytest.mark.quick
def test_rejected_config_without_out_leaves_a_failed_run_folder(tmp_path, monkeypatch, capsys, argv, kind, needle,
                                                                 given):
    monkeypatch.chdir(tmp_path)
    argv = [str(REPO / argv[0]), *argv[1:]]
    line = _fail(capsys, ["run", *argv], 2)
    assert needle in line
    run_dir, saved = _rejected_folder(tmp_path, line, kind)
    assert saved["kind"] == kind
    if given is not None:
        assert saved[given[0]] == given[1]  # the config as given, override applied
    else:
        assert saved["ppo"]["gamma"] == 2.0


def test_missing_dependency_without_out_leaves_a_failed_run_folder(tmp_path, monkeypatch, capsys):
    _module(tmp_path, monkeypatch, "needs_box2d_too", """
        import gymnasium
        raise gymnasium.error.DependencyNotInstalled('Box2D is not installed, run `pip install "gymnasium[box2d]"`')
    """)
    monkeypatch.chdir(tmp_path)
    line = _fail(capsys, ["run", str(REPO / "experiments/ppo_cartpole.yaml"), "--set",
                          "env_id=needs_box2d_too:Lander-v0"], 2)
    assert 'pip install "gymnasium[box2d]"' in line
    _, saved = _rejected_folder(tmp_path, line, "ppo")
    assert saved["env_id"] == "needs_box2d_too:Lander-v0"


def test_environment_raising_without_out_leaves_a_failed_run_folder(tmp_path, monkeypatch, capsys):
    _module(tmp_path, monkeypatch, "reset_fails", """
        import gymnasium as gym
        import numpy as np

        class ResetFails(gym.Env):
            observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
            action_space = gym.spaces.Discrete(2)
            resets = 0

            def reset(self, seed=None, options=None):
                ResetFails.resets += 1
                if ResetFails.resets > 3:  # the load-time checks and the evaluator's env pass, training does not
                    raise RuntimeError("no licence server")
                return np.zeros(2, np.float32), {}

            def step(self, action):
                return np.zeros(2, np.float32), 1.0, False, False, {}

        def make():
            return ResetFails()
    """)
    monkeypatch.chdir(tmp_path)
    line = _fail(capsys, ["run", str(REPO / "experiments/ppo_cartpole.yaml"), "--set", "env_id=reset_fails:make",
                          *PPO, "--quiet"], 2)
    assert "no licence server" in line
    run_dir = _only_run_dir(tmp_path)
    st = _status(run_dir)
    assert st["state"] == "failed" and st["user_error"] is True and st["error"] in line and "stage" not in st
    assert "Traceback" in (run_dir / "run.log").read_text()  # it failed while running


def test_unparsable_config_leaves_no_folder_and_show_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nokind.yaml").write_text("seed: 1\n")
    (tmp_path / "broken.yaml").write_text("kind: ppo\nppo: [unclosed\n")
    assert "kind" in _fail(capsys, ["run", "nokind.yaml"], 2)
    _fail(capsys, ["run", "broken.yaml"], 2)
    assert "nope" in _fail(capsys, ["run", str(REPO / "experiments/ppo_cartpole.yaml"), "--set", "kind=nope"], 2)
    assert "CartPol-v1" in _fail(capsys, ["show", str(REPO / "experiments/ppo_cartpole.yaml"), "--set",
                                          "env_id=CartPol-v1"], 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.yaml", "nokind.yaml"]


def test_out_folder_of_a_rejected_config_says_the_latest_reason_and_can_be_reused(tmp_path, capsys):
    out = tmp_path / "run"
    cfg = str(REPO / "experiments/ppo_cartpole.yaml")
    _fail(capsys, ["run", cfg, "--set", "ppo.gamma=2.0", "--out", str(out)], 2)
    assert "ppo.gamma" in _status(out)["error"]
    line = _fail(capsys, ["run", cfg, "--set", "ppo.clip_coef=-1", "--out", str(out)], 2)
    assert "ppo.clip_coef" in _status(out)["error"] and _status(out)["error"] in line
    assert main(["run", cfg, *PPO, "--out", str(out), "--quiet", "--no-report"]) == 0
    capsys.readouterr()
    assert _status(out)["state"] == "completed"
