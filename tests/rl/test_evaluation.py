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


def _sde_net(dim=2, hidden=(8,), log_std_init=-0.3):
    from gymnasium import spaces

    from fedarena.rl.distributions import DiagGaussian
    from fedarena.rl.networks import ActorCritic, torso_for
    from fedarena.rl.spaces import observation_adapter

    adapter = observation_adapter(spaces.Box(-1, 1, (3,), np.float32))
    dist = DiagGaussian(dim, (-2.0,) * dim, (2.0,) * dim)
    net = ActorCritic(torso_for(adapter, hidden), dist, log_std_init=log_std_init, sde=True)
    params = net.init(np.random.default_rng(0))
    rng = np.random.default_rng(5)
    params["pi"]["sde_log_std"] = (params["pi"]["sde_log_std"]
                                   + rng.normal(scale=0.4, size=params["pi"]["sde_log_std"].shape)).astype(np.float32)
    return net, dist, params


def test_gsde_log_prob_entropy_and_gradients_match_torch():
    """gSDE (Raffin et al. 2022): a ~ N(mu(s), sum_i phi_i(s)^2 sigma_ij^2 + 1e-6), phi's gradient stopped in the
    variance; log-likelihood, entropy and their gradients against the same formula in PyTorch."""
    from fedarena import engine
    from fedarena.engine import ops

    net, dist, params = _sde_net()
    x = np.random.default_rng(1).standard_normal((6, 3)).astype(np.float32)
    a = np.random.default_rng(2).standard_normal((6, 2)).astype(np.float32)

    def objective(p):
        mean, log_std = net.policy(p, x)
        return ops.sum(dist.log_prob(mean, log_std, a)) + 0.7 * ops.sum(dist.entropy(mean, log_std))

    value, grads = engine.value_and_grad(objective)(params)
    tp = {k: torch.tensor(np.asarray(v), dtype=torch.float64, requires_grad=True)
          for k, v in (("w0", params["pi"]["torso"]["l0"]["w"]), ("b0", params["pi"]["torso"]["l0"]["b"]),
                       ("hw", params["pi"]["head"]["w"]), ("hb", params["pi"]["head"]["b"]),
                       ("ls", params["pi"]["sde_log_std"]))}
    phi = torch.tanh(torch.tensor(x, dtype=torch.float64) @ tp["w0"] + tp["b0"])
    mean = phi @ tp["hw"] + tp["hb"]
    std = torch.sqrt(phi.detach() ** 2 @ torch.exp(tp["ls"]) ** 2 + 1e-6)
    normal = torch.distributions.Normal(mean, std)
    ref = normal.log_prob(torch.tensor(a, dtype=torch.float64)).sum() + 0.7 * normal.entropy().sum()
    ref.backward()
    assert float(value) == pytest.approx(ref.item(), rel=1e-5)
    for ours, key in ((grads["pi"]["torso"]["l0"]["w"], "w0"), (grads["pi"]["torso"]["l0"]["b"], "b0"),
                      (grads["pi"]["head"]["w"], "hw"), (grads["pi"]["head"]["b"], "hb"),
                      (grads["pi"]["sde_log_std"], "ls")):
        np.testing.assert_allclose(np.asarray(ours), tp[key].grad.numpy(), rtol=2e-3, atol=2e-5)


def test_gsde_policy_holds_its_noise_matrix_and_samples_the_stated_distribution():
    from fedarena import engine
    from fedarena.rl.workers import SDEPolicy, Weights

    net, dist, params = _sde_net(dim=1, hidden=(4,))

    def forward(p, x):
        dist_inputs, phi = net.policy_and_features(p, x)
        return dist_inputs, net.value(p, x), phi, net.sde_std(p)

    forward = engine.jit(forward)
    policy = SDEPolicy(forward, dist, Weights(0, params), sde_sample_freq=4, seed=3)
    x = np.random.default_rng(4).standard_normal((3, 3)).astype(np.float32)
    policy.reset_noise(3)
    first, again = policy(x), policy(x)
    np.testing.assert_array_equal(first["action"], again["action"])  # E held until the next reset
    (mean, log_std), _, _, _ = forward(params, x)
    policy.reset_noise(3)
    assert not np.allclose(policy(x)["action"], first["action"])
    # over many resets, one state's action is N(mean, exp(log_std)^2) and log_prob is that density
    row = np.repeat(x[:1], 4000, axis=0)
    policy.reset_noise(4000)
    out = policy(row)
    m, s = float(np.asarray(mean)[0, 0]), float(np.exp(np.asarray(log_std)[0, 0]))
    assert np.mean(out["action"][:, 0]) == pytest.approx(m, abs=4 * s / np.sqrt(4000))
    assert np.std(out["action"][:, 0]) == pytest.approx(s, rel=0.05)
    ref = torch.distributions.Normal(m, s).log_prob(torch.tensor(out["action"][:5, 0])).numpy()
    np.testing.assert_allclose(out["log_prob"][:5], ref, rtol=1e-4, atol=1e-4)


def test_ppo_gsde_smoke_run_resamples_every_sde_sample_freq_steps_and_evaluate_replays(tmp_path, capsys):
    from fedarena.rl import workers

    resets = []
    original = workers.SDEPolicy.reset_noise

    def spy(self, batch):
        resets.append(batch)
        original(self, batch)

    cfg = dict(PPO, env_id="Pendulum-v1", total_steps=256, eval={"every": 0, "episodes": 2},
               checkpoint={"every": 0, "keep": 1},
               ppo=dict(PPO["ppo"], use_sde=True, sde_sample_freq=4, log_std_init=-1.0, anneal_lr=False))
    out = tmp_path / "pend"
    workers.SDEPolicy.reset_noise, saved = spy, workers.SDEPolicy.reset_noise
    try:
        execute(cfg, out=out, quiet=True, report=False)
    finally:
        workers.SDEPolicy.reset_noise = saved
    assert resets == [4] * 16  # 2 rollouts x 32 steps / 4, on 4 environments
    rows = read_metrics(out)
    assert all(np.isfinite(r["loss"]) for r in rows) and rows[-1]["approx_kl"] > 0
    from fedarena import engine

    exported = engine.load_params(out / "policies" / "final" / "params.npz")
    assert exported["pi"]["sde_log_std"].shape == (16, 1)
    assert float(_evaluate(capsys, out)["mean_return"]) == pytest.approx(rows[-1]["eval_return"], abs=1e-9)
