"""Exported policies: named parameters, and the PyTorch and ONNX rebuilds act as the engine does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import fedarena
from fedarena import engine

ROOT = Path(__file__).resolve().parents[2]
TINY = {"ppo.num_envs": 2, "ppo.num_steps": 64, "ppo.update_epochs": 2, "ppo.num_minibatches": 2,
        "ppo.hidden": [16, 16], "eval.every": 128, "eval.episodes": 2, "total_steps": 256}


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "cartpole"
    return fedarena.run(ROOT / "experiments/ppo_cartpole.yaml", {**TINY, "ppo.normalize_obs": True}, out=out,
                        report=False)


def _observations(policy, n: int = 1000) -> np.ndarray:
    space = policy.env.build(1).observation_space
    space.seed(123)
    return np.stack([space.sample() for _ in range(n)]).astype(np.float32)


def _check_rebuilds(policy, tmp_path: Path, discrete: bool) -> None:
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    obs = _observations(policy)
    expected = policy.act(obs)
    x = policy.prepare(obs)
    module = policy.to_torch()
    with torch.no_grad():
        got = module(torch.from_numpy(x)).numpy()
        scores = module.scores(torch.from_numpy(x)).numpy()
    if policy.greedy.algorithm == "dqn":
        engine_scores = np.asarray(policy.greedy._q(policy.params, x))
    else:
        engine_scores = np.asarray(policy.greedy._forward(policy.params, x)[0][0])
    np.testing.assert_allclose(scores, engine_scores, rtol=1e-5, atol=1e-5)
    session = ort.InferenceSession(str(policy.to_onnx(tmp_path / "policy.onnx")), providers=["CPUExecutionProvider"])
    onnx_actions = session.run(["action"], {"obs": x})[0]
    if discrete:
        top2 = np.sort(engine_scores, axis=-1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 1e-5  # float32 rounding may flip an argmax only within that margin
        assert clear.sum() >= 990
        np.testing.assert_array_equal(got[clear], expected[clear])
        np.testing.assert_array_equal(onnx_actions[clear], expected[clear])
        assert len(set(expected.tolist())) > 1  # the test sees both actions
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(onnx_actions, expected, rtol=1e-5, atol=1e-5)
        assert np.ptp(expected) > 0


def test_params_npz_names_every_array_by_its_layer(cartpole):
    with np.load(cartpole.policies["final"] / "params.npz", allow_pickle=False) as z:
        keys = set(z.files) - {"__meta__"}
        assert {"pi/torso/l0/w", "pi/torso/l1/b", "pi/head/w", "v/head/b", "obs_norm/mean"} <= keys
        assert z["pi/torso/l0/w"].shape == (4, 16) and z["pi/head/w"].shape == (16, 2)
    policy = fedarena.load_policy(cartpole.run_dir)
    named = policy.named_parameters()
    assert set(named) == keys
    np.testing.assert_array_equal(named["pi/head/w"], policy.params["pi"]["head"]["w"])


def test_old_p0_files_still_load(cartpole, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    src = cartpole.policies["final"]
    (old / "manifest.json").write_text((src / "manifest.json").read_text())
    params = engine.load_params(src / "params.npz")
    engine.save_params(old / "params.npz", params)  # the engine's own writer: leaves p0, p1, ...
    with np.load(old / "params.npz") as z:
        assert "p0" in z.files
    again = fedarena.load_policy(old)
    obs = _observations(again, 50)
    np.testing.assert_array_equal(again.act(obs), fedarena.load_policy(src).act(obs))
    assert json.loads((old / "manifest.json").read_text())["algorithm"] == "ppo"


def test_ppo_cartpole_policy_rebuilt_in_torch_and_onnx_gives_the_engines_actions(cartpole, tmp_path):
    _check_rebuilds(fedarena.load_policy(cartpole.run_dir, "final"), tmp_path, discrete=True)


def test_gaussian_gsde_pendulum_policy_rebuilt_in_torch_and_onnx(tmp_path):
    res = fedarena.run(ROOT / "experiments/ppo_pendulum.yaml", {**TINY, "ppo.num_minibatches": 2},
                       out=tmp_path / "pendulum", report=False)
    _check_rebuilds(fedarena.load_policy(res.run_dir), tmp_path, discrete=False)


def test_dueling_dqn_policy_rebuilt_in_torch_and_onnx(tmp_path):
    res = fedarena.run(ROOT / "experiments/dqn_cartpole.yaml",
                       {"total_steps": 512, "dqn.learning_starts": 128, "dqn.hidden": [16], "dqn.batch_size": 16,
                        "eval.every": 256, "eval.episodes": 2}, out=tmp_path / "dqn", report=False)
    policy = fedarena.load_policy(res.run_dir)
    assert {"torso/l0/w", "value/w", "advantage/w"} <= set(policy.named_parameters())
    _check_rebuilds(policy, tmp_path, discrete=True)
