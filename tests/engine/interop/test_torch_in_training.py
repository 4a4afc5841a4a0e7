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

FEDSIM = {"kind": "fedsim", "dataset": "digits", "num_clients": 20, "partition": "iid", "rounds": 4,
          "clients_per_round": 10, "epochs": 2, "batch_size": 10, "lr": 0.3, "seed": 3,
          "model": "torch:torch_models:digits_cnn"}


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
    with pytest.raises(ConfigError, match="model: cannot import module 'no_such_models'"):
        execute(dict(FEDSIM, model="torch:no_such_models:f"), out=tmp_path / "a", quiet=True)
    with pytest.raises(ConfigError, match=r"model: .*expected \(10,\) class logits"):
        execute(dict(FEDSIM, model="torch:torch_models:three_logits"), out=tmp_path / "b", quiet=True)
    with pytest.raises(ConfigError, match="model: a torch model trains with backend vmap"):
        execute(dict(FEDSIM, backend="ray"), out=tmp_path / "c", quiet=True)
