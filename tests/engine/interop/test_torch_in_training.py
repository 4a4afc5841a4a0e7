"""Converted torch models train inside fedarena: the fedsim kind with ``model: torch:...`` and PPO with
``ppo.torso: torch:...`` (the factories live in ``torch_models.py`` next to this file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedarena.platform.config import ConfigError
from fedarena.platform.runs import execute, read_metrics

torch = pytest.importorskip("torch")
HERE = Path(__file__).parent

FEDSIM = {"kind": "fedsim", "rounds": 4, "seed": 3, "data": {"dataset": "digits", "num_clients": 20, "partition": "iid"},
          "clients": {"per_round": 10, "epochs": 2, "batch_size": 10, "lr": 0.3},
          "model": {"arch": "torch:torch_models:digits_cnn"}}


@pytest.fixture
def factories_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def test_fedsim_trains_a_converted_torch_cnn(tmp_path, factories_on_path):
    from fedarena.federated.fedsim_experiment import FedSimConfig, build
    from fedarena.federated.simulation import evaluate_params
    from fedarena.platform.config import build as build_config

    cfg = build_config(FedSimConfig, FEDSIM)
    _, sim = build(cfg)
    params = sim.model.init_params(cfg.seed)
    assert "conv.weight" in params and "bn.running_var" in params  # the state_dict names
    loss0, acc0 = evaluate_params(sim.model, params, *sim.test)
    execute(FEDSIM, out=tmp_path / "run", quiet=True, report=False)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert acc0 < 0.3 and rows[-1]["test_acc"] > 0.7, (acc0, [r["test_acc"] for r in rows])
    assert rows[-1]["test_loss"] < 0.5 * loss0


def test_fedsim_torch_model_errors_name_the_field(tmp_path, factories_on_path):
    with pytest.raises(ConfigError, match="model.arch: cannot import module 'no_such_models'"):
        execute(dict(FEDSIM, model={"arch": "torch:no_such_models:f"}), out=tmp_path / "a", quiet=True)
    with pytest.raises(ConfigError, match=r"model.arch: .*expected \(10,\) class logits"):
        execute(dict(FEDSIM, model={"arch": "torch:torch_models:three_logits"}), out=tmp_path / "b", quiet=True)
    with pytest.raises(ConfigError, match="model.arch: a torch model trains with execution.backend vmap"):
        execute(dict(FEDSIM, execution={"backend": "ray"}), out=tmp_path / "c", quiet=True)


PPO = {"kind": "ppo", "env_id": "CartPole-v1", "seed": 1, "total_steps": 8192, "target_return": None,
       "ppo": {"num_envs": 8, "num_steps": 64, "num_minibatches": 2, "update_epochs": 8, "learning_rate": 3e-3,
               "torso": "torch:torch_models:tanh_torso"}}


def test_ppo_learns_cartpole_with_a_converted_torch_torso(tmp_path, factories_on_path):
    from gymnasium import spaces

    from fedarena.rl.ppo import PPO as Agent
    from fedarena.rl.ppo import PPOConfig

    agent = Agent(spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2), PPOConfig(**dict(PPO["ppo"])))
    params = agent.weights().params
    assert "0.weight" in params["pi"]["torso"] and "2.bias" in params["v"]["torso"]
    assert not np.allclose(params["pi"]["torso"]["0.weight"], params["v"]["torso"]["0.weight"])
    execute(PPO, out=tmp_path / "ppo", quiet=True, report=False)
    returns = [r["episode_return"] for r in read_metrics(tmp_path / "ppo")]
    assert len(returns) == 16
    # random CartPole play lasts ~22 steps; the trained policy balances several times longer
    assert np.mean(returns[:2]) < 40 and returns[-1] > 100, returns


def test_ppo_torso_errors_name_the_field(tmp_path, factories_on_path):
    from gymnasium import spaces

    from fedarena.rl.ppo import PPO as Agent
    from fedarena.rl.ppo import PPOConfig

    with pytest.raises(ConfigError, match="ppo.torso: cannot import module 'no_such_models'"):
        execute(dict(PPO, ppo=dict(PPO["ppo"], torso="torch:no_such_models:f")), out=tmp_path / "a", quiet=True)
    with pytest.raises(ValueError, match=r"ppo.torso: .*a torso gives \(batch, features\)"):
        Agent(spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2),
              PPOConfig(torso="torch:torch_models:flat_output_torso"))
