"""MAPPO (fedarena.marl.mappo): the loss against a numpy oracle, ValueNorm against its closed form, grouping
of heterogeneous agents, one training iteration, the CLI's one-line errors (exit 2) for networks that
cannot take the agents they are given and for unknown scenarios, and a run stopped by SIGTERM after a
checkpoint that resumes to exactly the uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedarena import engine
from fedarena.marl.mappo import MAPPO, MAPPOConfig, ValueNorm, agent_groups, agent_type
from fedarena.platform.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_value_norm_is_the_debiased_exponential_average():
    vn, beta = ValueNorm(beta=0.9), 0.9
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, 50) for _ in range(4)]
    for b in batches:
        vn.update(b)
    w = np.array([(1 - beta) * beta ** (len(batches) - 1 - i) for i in range(len(batches))]) / (1 - beta ** len(batches))
    mean = sum(wi * b.mean() for wi, b in zip(w, batches))
    var = sum(wi * np.square(b).mean() for wi, b in zip(w, batches)) - mean ** 2
    assert vn.stats()[0] == pytest.approx(mean, rel=1e-12)
    assert vn.stats()[1] == pytest.approx(np.sqrt(var), rel=1e-10)
    x = rng.normal(size=7)
    np.testing.assert_allclose(vn.denormalize(vn.normalize(x)), x, rtol=1e-12)


def test_agents_are_grouped_by_type_and_one_network_refuses_mixed_sizes():
    agents = ["leadadversary_0", "adversary_0", "adversary_1", "agent_0", "agent_1"]
    assert [agent_type(a) for a in agents] == ["leadadversary", "adversary", "adversary", "agent", "agent"]
    assert agent_groups(agents, [34, 34, 34, 28, 28], [20, 5, 5, 5, 5], "group") == [[0], [1, 2], [3, 4]]
    assert agent_groups(agents[:3], [1] * 3, [5] * 3, "all") == [[0, 1, 2]]
    assert agent_groups(agents[:2], [1, 1], [5, 5], "none") == [[0], [1]]
    with pytest.raises(ValueError, match=r"mappo.share: 'all' puts agents of different .*speaker_0: 3 obs / 3 actions"):
        agent_groups(["speaker_0", "listener_0"], [3, 11], [3, 5], "all")


def _numpy_loss(g, params, mb, c):
    """PPO's clipped objective + entropy bonus + clipped Huber value loss, written out in numpy."""
    def mlp(layers, x):
        for i, p in enumerate(layers):
            x = x @ np.asarray(p["w"], np.float64) + np.asarray(p["b"], np.float64)
            if i < len(layers) - 1:
                x = np.maximum(x, 0.0)
        return x

    z = mlp(params["actor"], mb["obs"])
    z = z - z.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    new = (logp * mb["action_onehot"]).sum(1)
    ent = -(np.exp(logp) * logp).sum(1).mean()
    ratio = np.exp(new - mb["log_prob"])
    adv = mb["advantage"]
    pg = -np.minimum(ratio * adv, np.clip(ratio, 1 - c.clip_coef, 1 + c.clip_coef) * adv).mean()
    v = mlp(params["critic"], mb["critic_in"])[:, 0]
    vc = mb["value"] + np.clip(v - mb["value"], -c.clip_coef, c.clip_coef)
    hub = lambda e: np.where(np.abs(e) <= c.huber_delta, 0.5 * e * e, c.huber_delta * (np.abs(e) - 0.5 * c.huber_delta))  # noqa: E731
    vl = np.maximum(hub(mb["target"] - v), hub(mb["target"] - vc)).mean()
    return pg - c.ent_coef * ent + c.vf_coef * vl


def test_loss_matches_a_numpy_oracle_and_its_gradient_finite_differences():
    cfg = MAPPOConfig(hidden=(8,), huber_delta=0.5)  # small delta: both Huber branches are used
    m = MAPPO("simple_speaker_listener", 4, cfg, seed=0)
    g = m.groups[1]  # the listener: 11 observations, 5 actions
    rng = np.random.default_rng(1)
    B = 32
    mb = {"obs": rng.normal(size=(B, 11)).astype(np.float32),
          "critic_in": rng.normal(size=(B, 14 + 2)).astype(np.float32),
          "action_onehot": np.eye(5, dtype=np.float32)[rng.integers(0, 5, B)],
          "log_prob": rng.normal(-1.6, 0.3, B).astype(np.float32),
          "advantage": rng.normal(size=B).astype(np.float32),
          "value": rng.normal(size=B).astype(np.float32), "target": rng.normal(0, 2, B).astype(np.float32)}
    mb64 = {k: v.astype(np.float64) for k, v in mb.items()}
    loss, _ = g.loss(g.params, mb)
    assert float(loss) == pytest.approx(_numpy_loss(g, g.params, mb64, cfg), rel=1e-4, abs=1e-5)
    (_, _), grads = engine.value_and_grad(g.loss, has_aux=True)(g.params, mb)
    p64 = engine.tree_map(lambda a: np.asarray(a, np.float64), g.params)
    for net, layer, key, idx in (("actor", 0, "w", (3, 2)), ("critic", 1, "b", (0,)), ("actor", 1, "b", (4,))):
        h = 1e-5
        up = engine.tree_map(np.copy, p64)
        up[net][layer][key][idx] += h
        down = engine.tree_map(np.copy, p64)
        down[net][layer][key][idx] -= h
        fd = (_numpy_loss(g, up, mb64, cfg) - _numpy_loss(g, down, mb64, cfg)) / (2 * h)
        assert float(np.asarray(grads[net][layer][key])[idx]) == pytest.approx(fd, rel=2e-3, abs=1e-5)


def test_one_iteration_on_speaker_listener_trains_both_groups():
    m = MAPPO("simple_speaker_listener", 4, MAPPOConfig(hidden=(16,), update_epochs=2), seed=0)
    assert [[m.env.agents[i] for i in g] for g in m.group_members] == [["speaker_0"], ["listener_0"]]
    before = engine.tree_map(np.copy, [g.params for g in m.groups])
    returns, metrics = m.iteration()
    assert len(returns) == 4 and m.env_steps == 100 and m.episodes == 4  # 4 copies x one 25-step episode
    assert np.all(returns < 0) and np.isfinite(metrics["loss"])
    after = [g.params for g in m.groups]
    for b, a in zip(before, after):
        assert any(not np.allclose(x, y) for x, y in zip(engine.tree_leaves(b), engine.tree_leaves(a)))
    assert all(g.value_norm.debias > 0 for g in m.groups)


def _run(tmp_path, config, *sets):
    return main(["run", str(ROOT / config), *sets, "--out", str(tmp_path / "r"), "--quiet", "--no-report"])


def test_shared_network_over_heterogeneous_agents_is_a_one_line_config_error(tmp_path, capsys):
    assert _run(tmp_path, "experiments/simple_spread_qmix.yaml", "--set", "env_id=mpe2.simple_speaker_listener_v4") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "qmix, vdn, ippo share one network over all agents" in err
    assert _run(tmp_path, "experiments/simple_speaker_listener_mappo.yaml", "--set", "mappo.share=all") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mappo.share: 'all' puts agents of different" in err


def test_unknown_scenario_is_a_one_line_error_with_did_you_mean(tmp_path, capsys):
    assert _run(tmp_path, "experiments/simple_spread_mappo.yaml", "--set", "env_id=mpe2.simple_speaker_listner_v4") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did you mean 'simple_speaker_listener'?" in err


def test_mappo_run_end_to_end_with_the_random_listener_baseline(tmp_path):
    from fedarena.platform.runs import execute

    summary = execute("experiments/simple_speaker_listener_mappo.yaml",
                      ["learner_seeds=[0]", "num_envs=4", "env_steps=200", "steps_per_round=100", "eval_episodes=4",
                       "workers=1", "mappo.hidden=[16]", "mappo.update_epochs=1"],
                      out=str(tmp_path / "run"), quiet=True)
    assert summary["mappo/episodes"] == 8
    assert np.isfinite(summary["mappo/greedy_return_mean"])
    assert np.isfinite(summary["mappo/greedy_return_with_random_listener_0_mean"])


def test_mappo_interrupted_after_a_checkpoint_resumes_to_the_uninterrupted_run(tmp_path):
    # speaker-listener: two agent types, so two actors, two critics, two ValueNorms and their Adam states
    from fedarena.platform import checkpoint as ckpt
    from fedarena.platform.runs import execute, read_metrics

    overrides = ["learner_seeds=[0]", "num_envs=4", "env_steps=2000", "steps_per_round=100", "eval_every=2",
                 "eval_episodes=4", "workers=1", "mappo.hidden=[16]", "mappo.update_epochs=2",
                 "checkpoint.every=100", "checkpoint.keep=2"]
    config = "experiments/simple_speaker_listener_mappo.yaml"
    stopped = tmp_path / "stopped"
    args = [sys.executable, "-m", "fedarena", "run", config, "--out", str(stopped), "--quiet", "--no-report"]
    for o in overrides:
        args += ["--set", o]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        deadline = time.monotonic() + 300
        while not ckpt.list_checkpoints(stopped / "checkpoints"):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else "ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    assert json.loads((stopped / "status.json").read_text())["state"] == "interrupted"
    cut = read_metrics(stopped)[-1]["step"]
    assert 100 <= cut < 2000  # stopped part-way, at a round with its checkpoint

    execute(None, [], resume=stopped, quiet=True, report=False)
    execute(ROOT / config, overrides, out=tmp_path / "straight", quiet=True, report=False)
    drop = lambda rows: [{k: v for k, v in r.items() if not k.endswith(("wall_time", "cpu_time"))} for r in rows]  # noqa: E731
    assert drop(read_metrics(stopped)) == drop(read_metrics(tmp_path / "straight"))
    (s1, a), (s2, b) = (ckpt.load_newest_valid(d / "checkpoints") for d in (stopped, tmp_path / "straight"))
    assert s1 == s2 == 2000

    def leaves(tree, path=""):
        if isinstance(tree, dict):
            for k in sorted(tree):
                if k not in ("wall", "cpu"):
                    yield from leaves(tree[k], f"{path}/{k}")
        elif isinstance(tree, (list, tuple)):
            for i, v in enumerate(tree):
                yield from leaves(v, f"{path}/{i}")
        else:
            yield path, tree

    la, lb = dict(leaves(a["experiment"])), dict(leaves(b["experiment"]))
    assert la.keys() == lb.keys() and len(la) > 20
    for k in la:
        np.testing.assert_array_equal(np.asarray(la[k]), np.asarray(lb[k]), err_msg=k)
