"""Final checkpoints, evaluation episodes, exported policies and `fedarena evaluate` (issue 21, items 1, 2, 6)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedarena.platform import checkpoint as ckpt
from fedarena.platform.cli import main
from fedarena.platform.runs import execute, read_metrics

PPO = {"kind": "ppo", "env_id": "CartPole-v1", "seed": 1, "total_steps": 640, "target_return": None,
       "checkpoint": {"every": 3, "keep": 2}, "eval": {"every": 256, "episodes": 4},
       "ppo": {"num_envs": 4, "num_steps": 32, "num_minibatches": 2, "update_epochs": 2, "hidden": [16]}}
DQN = {"kind": "dqn", "env_id": "CartPole-v1", "seed": 2, "total_steps": 700, "target_return": None,
       "steps_per_iteration": 200, "checkpoint": {"every": 3, "keep": 2}, "eval": {"every": 400, "episodes": 3},
       "dqn": {"num_envs": 2, "buffer_size": 1000, "batch_size": 16, "learning_starts": 100, "hidden": [16],
               "train_frequency": 8}}


def _evaluate(capsys, run_dir, *extra):
    assert main(["evaluate", str(run_dir), *extra]) == 0
    lines = capsys.readouterr().out.splitlines()
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}


@pytest.mark.parametrize("cfg", [PPO, DQN], ids=["ppo", "dqn"])
def test_runs_end_with_a_checkpoint_and_policies_that_evaluate_replays(tmp_path, capsys, cfg):
    out = tmp_path / cfg["kind"]
    summary = execute(cfg, out=out, quiet=True, report=False)
    rows = read_metrics(out)
    last = rows[-1]
    assert last["step"] % 3 != 0  # the last step is not a periodic checkpoint step ...
    assert ckpt.list_checkpoints(out / "checkpoints")[-1][0] == last["step"]  # ... and still has its checkpoint
    evals = [r for r in rows if "eval_return" in r]
    assert len(evals) >= 2 and "eval_return" in last  # periodic evaluations and one at the last iteration
    assert summary["final_eval_return"] == last["eval_return"]
    best = max(evals, key=lambda r: r["eval_return"])
    assert summary["best_eval_return"] == best["eval_return"]
    for which in ("final", "best"):
        manifest = json.loads((out / "policies" / which / "manifest.json").read_text())
        assert manifest["algorithm"] == cfg["kind"] and manifest["env"]["env_id"] == "CartPole-v1"
        assert manifest["observation_space"]["shape"] == [4] and manifest["action_space"] == {
            "type": "Discrete", "n": 2, "start": 0}
    # the same seeds give exactly the run's last (and best) evaluation
    assert float(_evaluate(capsys, out)["mean_return"]) == pytest.approx(last["eval_return"], abs=1e-9)
    assert float(_evaluate(capsys, out, "--policy", "best")["mean_return"]) == pytest.approx(best["eval_return"], abs=1e-9)
    assert int(_evaluate(capsys, out, "--episodes", "2")["episodes"]) == 2


def test_early_stopping_uses_evaluation_returns(tmp_path):
    cfg = dict(PPO, total_steps=20_000, target_return=40.0, eval={"every": 128, "episodes": 3},
               checkpoint={"every": 0, "keep": 1})
    out = tmp_path / "stop"
    summary = execute(cfg, out=out, quiet=True, report=False)
    rows = read_metrics(out)
    evals = [r for r in rows if "eval_return" in r]
    first = next(r for r in evals if r["eval_return"] >= 40.0)
    assert rows[-1] is not None and rows[-1]["step"] == first["step"]  # stopped at the first evaluation >= target
    assert summary["steps_to_target"] == first["env_steps"] and summary["target_measured_on"] == "eval_return"
    assert all(r["eval_return"] < 40.0 for r in evals[:-1])


def test_evaluate_with_render_writes_frames(tmp_path, capsys):
    out = tmp_path / "ppo"
    execute(dict(PPO, total_steps=128, eval={"every": 0, "episodes": 1}), out=out, quiet=True, report=False)
    res = _evaluate(capsys, out, "--render", "rgb_array")
    gif = out / "evaluation" / "episode-0.gif"
    assert gif.exists() and gif.stat().st_size > 1000
    from PIL import Image

    with Image.open(gif) as im:
        assert im.n_frames > 4 and im.size == (300, 200)  # CartPole's frames at half size, every second step
    assert int(res["rendered_episodes"]) == 1


def test_gaussian_policy_state_dependent_log_std_matches_torch():
    from gymnasium import spaces

    from fedarena.rl.distributions import DiagGaussian
    from fedarena.rl.networks import ActorCritic, torso_for
    from fedarena.rl.spaces import observation_adapter

    adapter = observation_adapter(spaces.Box(-1, 1, (3,), np.float32))
    dist = DiagGaussian(2, (-2.0, -2.0), (2.0, 2.0))
    net = ActorCritic(torso_for(adapter, (8,)), dist, log_std="state_dependent", log_std_init=-0.5)
    params = net.init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    mean, log_std = (np.asarray(a) for a in net.policy(params, x))
    assert log_std.shape == (5, 2) and np.ptp(log_std[:, 0]) > 0  # depends on the state
    h = np.tanh(x @ params["pi"]["torso"]["l0"]["w"] + params["pi"]["torso"]["l0"]["b"])
    np.testing.assert_allclose(log_std, h @ params["pi"]["log_std_head"]["w"] + params["pi"]["log_std_head"]["b"],
                               rtol=1e-5, atol=1e-6)
    a = np.random.default_rng(2).standard_normal((5, 2)).astype(np.float32)
    ref = torch.distributions.Normal(torch.tensor(mean), torch.tensor(np.exp(log_std))).log_prob(torch.tensor(a)).sum(-1)
    np.testing.assert_allclose(np.asarray(dist.log_prob(mean, log_std, a)), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_ppo_gaussian_with_normalization_smoke_and_statistics_in_checkpoint_and_export(tmp_path, capsys):
    cfg = dict(PPO, env_id="Pendulum-v1", total_steps=256, eval={"every": 0, "episodes": 2},
               checkpoint={"every": 0, "keep": 1},
               ppo=dict(PPO["ppo"], log_std="state_dependent", normalize_obs=True, normalize_reward=True,
                        max_grad_norm=0.5))
    out = tmp_path / "pend"
    execute(cfg, out=out, quiet=True, report=False)
    rows = read_metrics(out)
    assert all(np.isfinite(r["loss"]) and r["grad_norm"] >= 0 for r in rows)
    _, state = ckpt.load_newest_valid(out / "checkpoints")
    learner = state["experiment"]["learner"]
    stats = learner["normalization"]["obs"]
    assert stats["count"] == pytest.approx(256 + 1e-4)  # every observation of both rollouts
    assert np.all(stats["var"] > 0) and not np.allclose(stats["mean"], 0.0)
    assert "reward" in learner["normalization"]
    from fedarena import engine

    exported = engine.load_params(out / "policies" / "final" / "params.npz")
    np.testing.assert_allclose(exported["obs_norm"]["mean"], stats["mean"].astype(np.float32))
    assert float(_evaluate(capsys, out)["mean_return"]) == pytest.approx(rows[-1]["eval_return"], abs=1e-9)


def test_running_statistics_match_numpy():
    from fedarena.rl.normalization import RewardScaler, RunningMeanStd

    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 3)) for n in (5, 17, 1, 40)]
    rms = RunningMeanStd((3,))
    for b in batches:
        rms.update(b)
    allx = np.concatenate(batches)
    # the 1e-4 prior (mean 0, var 1) shifts the moments by O(1e-4 / n)
    np.testing.assert_allclose(rms.mean, allx.mean(axis=0), rtol=1e-4)
    np.testing.assert_allclose(rms.var, allx.var(axis=0), rtol=1e-4)
    reward = rng.normal(size=(6, 2))
    done = np.zeros((6, 2), bool)
    done[2, 0] = True
    scaler = RewardScaler(2, 0.9, clip=100.0)
    scaled = scaler(reward, done)
    ret, seen = np.zeros(2), []
    for t in range(6):  # the discounted return, reset after an episode end
        ret = 0.9 * ret + reward[t]
        seen.append(ret.copy())
        ret[done[t]] = 0.0
    np.testing.assert_allclose(scaled, reward / np.sqrt(np.var(seen) * 12 / (12 + 1e-4) + 1e-8), rtol=1e-3)


def test_nature_cnn_has_its_512_unit_layer():
    from gymnasium import spaces

    from fedarena.rl.networks import torso_for
    from fedarena.rl.spaces import observation_adapter

    torso = torso_for(observation_adapter(spaces.Box(0, 255, (84, 84, 4), np.uint8)), (64, 64))
    params = torso.init(np.random.default_rng(0))
    assert params["fc"]["w"].shape == (7 * 7 * 64, 512) and torso.out_size == 512
