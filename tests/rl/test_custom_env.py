"""Custom environments from the CLI (env_id 'module:EnvId' and 'package.module:make_env', env_kwargs) and the
per-environment wrappers (frame stack, action repeat, time limit)."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from fedarena.platform.cli import main
from fedarena.platform.runs import read_metrics

# A corridor: reward 1 for action 1, 0 for action 0, `length` steps; the optimal return is `length`.
ENV_MODULE = """
    import gymnasium as gym
    import numpy as np

    class Corridor(gym.Env):
        action_space = gym.spaces.Discrete(2)

        def __init__(self, length=10):
            self.length = length
            self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)

        def _obs(self):
            return np.array([self.t / self.length, 1.0], np.float32)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return self._obs(), {}

        def step(self, action):
            self.t += 1
            return self._obs(), float(action == 1), self.t >= self.length, False, {}

    gym.register("Corridor-v0", entry_point=Corridor)

    def make_corridor(length=10):
        return Corridor(length)
"""
PPO = ["--set", "ppo.num_envs=4", "--set", "ppo.num_steps=32", "--set", "ppo.num_minibatches=2",
       "--set", "ppo.update_epochs=4", "--set", "ppo.hidden=[16]", "--set", "ppo.learning_rate=0.01",
       "--set", "eval.every=512", "--set", "eval.episodes=2", "--quiet", "--no-report"]


@pytest.fixture
def corridor(tmp_path, monkeypatch):
    (tmp_path / "corridor_env.py").write_text(textwrap.dedent(ENV_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _run(tmp_path, name, *sets):
    out = tmp_path / name
    assert main(["run", "experiments/ppo_cartpole.yaml", *PPO, *sets, "--out", str(out)]) == 0
    return out, read_metrics(out), json.loads((out / "status.json").read_text())["summary"]


def test_module_env_id_trains_from_the_cli(corridor, tmp_path):
    out, rows, summary = _run(tmp_path, "registered", "--set", "env_id=corridor_env:Corridor-v0",
                              "--set", "total_steps=4096", "--set", "target_return=10")
    assert summary["reached_target"] and summary["final_eval_return"] == 10.0  # the optimum
    assert rows[0]["eval_return"] < 10.0 if "eval_return" in rows[0] else True
    manifest = json.loads((out / "policies" / "final" / "manifest.json").read_text())
    assert manifest["env"]["env_id"] == "corridor_env:Corridor-v0"


def test_entry_point_with_kwargs_and_wrappers(corridor, tmp_path, capsys):
    out, rows, summary = _run(
        tmp_path, "wrapped", "--set", "env_id=corridor_env:make_corridor", "--set", "env_kwargs={length: 12}",
        "--set", "wrappers.action_repeat=2", "--set", "wrappers.time_limit=4", "--set", "wrappers.frame_stack=3",
        "--set", "total_steps=4096", "--set", "target_return=8")
    # action repeat 2 sums two rewards per agent step; the time limit cuts episodes at 4 agent steps (8 env steps)
    assert summary["final_eval_return"] == 8.0
    assert all(r["eval_length"] <= 4 for r in rows if "eval_length" in r)
    manifest = json.loads((out / "policies" / "final" / "manifest.json").read_text())
    assert manifest["observation_space"]["shape"] == [3, 2]  # three stacked frames
    assert manifest["env"]["env_kwargs"] == {"length": 12} and manifest["env"]["wrappers"]["frame_stack"] == 3
    assert main(["evaluate", str(out)]) == 0
    assert "mean_return: 8" in capsys.readouterr().out


def test_frame_stack_and_action_repeat_against_the_plain_env(corridor):
    from fedarena.envs.gym_envs import EnvWrappers, make_env

    plain = make_env("corridor_env:make_corridor", {"length": 6})
    wrapped = make_env("corridor_env:make_corridor", {"length": 6}, EnvWrappers(frame_stack=2, action_repeat=3))
    o, _ = plain.reset(seed=0)
    w, _ = wrapped.reset(seed=0)
    np.testing.assert_array_equal(w, np.stack([o, o]))  # reset pads with the first observation
    total = 0.0
    for _ in range(3):
        o, r, *_ = plain.step(1)
        total += r
    w, rw, term, trunc, _ = wrapped.step(1)
    assert rw == total == 3.0 and not term
    np.testing.assert_array_equal(w[-1], o)
