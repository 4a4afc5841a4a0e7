"""PPO / DQN / IMPALA losses and gradients against the same formulas written in PyTorch (the engine's
optimizers have their own tests against torch.optim)."""

import numpy as np
import pytest
from gymnasium import spaces

from fedarena import engine
from fedarena.engine import tree_map
from fedarena.rl.dqn import DQN, DQNConfig
from fedarena.rl.impala import IMPALA, IMPALAConfig
from fedarena.rl.ppo import PPO, PPOConfig
from fedarena.rl.returns import discounted_returns

torch = pytest.importorskip("torch")
F = torch.nn.functional
OBS = spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = spaces.Discrete(2)


def _t(a):
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=True)


def _torch_tree(p):
    return tree_map(_t, p)


def _mlp(p, x, n_layers, act):
    for i in range(n_layers):
        x = act(x @ p[f"l{i}"]["w"] + p[f"l{i}"]["b"])
    return x


def _grads_close(ours, theirs_tree, rtol=2e-3, atol=2e-5):
    flat_o, _ = engine.tree_flatten(ours)
    flat_t, _ = engine.tree_flatten(theirs_tree)
    assert len(flat_o) == len(flat_t)
    for o, t in zip(flat_o, flat_t):
        np.testing.assert_allclose(np.asarray(o), t.grad.numpy(), rtol=rtol, atol=atol)


def _ppo_batch(rng, n=32):
    return {"obs": rng.normal(size=(n, 4)).astype(np.float32),
            "action": np.eye(2, dtype=np.float32)[rng.integers(2, size=n)],
            "log_prob": np.log(rng.uniform(0.3, 0.7, size=n)).astype(np.float32),
            "value": rng.normal(size=n).astype(np.float32),
            "advantage": rng.normal(size=n).astype(np.float32),
            "value_target": rng.normal(size=n).astype(np.float32)}


@pytest.mark.parametrize("clip_vloss", [True, False])
def test_ppo_loss_and_gradient_match_torch(clip_vloss):
    cfg = PPOConfig(num_envs=4, num_steps=8, ent_coef=0.01, clip_vloss=clip_vloss, clip_coef=0.1)
    agent = PPO(OBS, ACT, cfg, seed=1)
    rng = np.random.default_rng(2)
    params = tree_map(lambda a: a + rng.normal(scale=0.3, size=a.shape).astype(np.float32), agent.weights().params)
    mb = _ppo_batch(rng)
    (loss, aux), grads = engine.value_and_grad(agent.loss, has_aux=True)(params, mb)

    tp = _torch_tree(params)
    x = torch.tensor(mb["obs"], dtype=torch.float64)
    logits = _mlp(tp["pi"]["torso"], x, 2, torch.tanh) @ tp["pi"]["head"]["w"] + tp["pi"]["head"]["b"]
    value = (_mlp(tp["v"]["torso"], x, 2, torch.tanh) @ tp["v"]["head"]["w"] + tp["v"]["head"]["b"])[:, 0]
    logp_all = F.log_softmax(logits, -1)
    act = torch.tensor(mb["action"].argmax(1))
    newlogp = logp_all.gather(1, act[:, None])[:, 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    ratio = (newlogp - torch.tensor(mb["log_prob"], dtype=torch.float64)).exp()
    adv = torch.tensor(mb["advantage"], dtype=torch.float64)
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.9, 1.1)).mean()
    ret = torch.tensor(mb["value_target"], dtype=torch.float64)
    old_v = torch.tensor(mb["value"], dtype=torch.float64)
    if clip_vloss:
        vclip = old_v + (value - old_v).clamp(-0.1, 0.1)
        vloss = 0.5 * torch.max((value - ret) ** 2, (vclip - ret) ** 2).mean()
    else:
        vloss = 0.5 * ((value - ret) ** 2).mean()
    tloss = pg - 0.01 * entropy + 0.5 * vloss
    tloss.backward()
    assert float(loss) == pytest.approx(tloss.item(), rel=1e-4)
    assert float(aux["entropy"]) == pytest.approx(entropy.item(), rel=1e-4)
    _grads_close(grads, tp)


@pytest.mark.parametrize("double,dueling", [(True, True), (False, False), (True, False)])
def test_dqn_loss_and_gradient_match_torch(double, dueling):
    cfg = DQNConfig(num_envs=2, double=double, dueling=dueling, hidden=(16, 16), buffer_size=100, batch_size=8)
    agent = DQN(OBS, ACT, cfg, seed=3)
    rng = np.random.default_rng(4)
    params = agent.weights().params
    target = tree_map(lambda a: a + rng.normal(scale=0.2, size=a.shape).astype(np.float32), params)
    n = 16
    batch = {"obs": rng.normal(size=(n, 4)).astype(np.float32),
             "action": np.eye(2, dtype=np.float32)[rng.integers(2, size=n)],
             "reward": rng.normal(size=n).astype(np.float32) * 3,
             "discount": np.where(rng.random(n) < 0.2, 0.0, 0.99**3).astype(np.float32),
             "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
             "weights": rng.uniform(0.2, 1.0, size=n).astype(np.float32)}
    (loss, aux), grads = engine.value_and_grad(agent.loss, has_aux=True)(params, target, batch)

    def q(p, x):
        h = _mlp(p["torso"], x, 2, torch.relu)
        if dueling:
            a = h @ p["advantage"]["w"] + p["advantage"]["b"]
            return h @ p["value"]["w"] + p["value"]["b"] + a - a.mean(-1, keepdim=True)
        return h @ p["q"]["w"] + p["q"]["b"]

    tp = _torch_tree(params)
    tt = tree_map(lambda a: torch.tensor(a, dtype=torch.float64), target)
    x, nx = (torch.tensor(batch[k], dtype=torch.float64) for k in ("obs", "next_obs"))
    act = torch.tensor(batch["action"].argmax(1))
    q_taken = q(tp, x).gather(1, act[:, None])[:, 0]
    with torch.no_grad():
        if double:
            best = q(tp, nx).argmax(1)
            nv = q(tt, nx).gather(1, best[:, None])[:, 0]
        else:
            nv = q(tt, nx).max(1).values
        y = torch.tensor(batch["reward"], dtype=torch.float64) + torch.tensor(batch["discount"], dtype=torch.float64) * nv
    w = torch.tensor(batch["weights"], dtype=torch.float64)
    tloss = (w * F.huber_loss(q_taken, y, reduction="none", delta=1.0)).mean()
    tloss.backward()
    assert float(loss) == pytest.approx(tloss.item(), rel=1e-4)
    np.testing.assert_allclose(aux["td_error"], (q_taken - y).detach().numpy(), rtol=1e-3, atol=1e-4)
    _grads_close(grads, tp)


def test_impala_on_policy_targets_are_n_step_returns():
    """Trajectories from the learner's own weights have log rho = 0, so V-trace targets are n-step returns."""
    from fedarena.envs.vector import make_vector_env
    from fedarena.rl.workers import Actor, LocalPolicy

    cfg = IMPALAConfig(num_envs=3, unroll_length=20)
    agent = IMPALA(OBS, ACT, cfg, seed=5)
    env = make_vector_env("CartPole-v1", 3, seed=0)
    actor = Actor(env, agent.adapter, agent.dist, LocalPolicy(agent.forward, agent.dist, agent.weights(), seed=6),
                  cfg.gamma, seed=0)
    traj = actor.rollout(20)
    batch = agent.vtrace_batch(agent.weights().params, traj)
    assert float(batch["mean_rho"]) == pytest.approx(1.0, abs=1e-5)
    expected = discounted_returns(traj["reward"], traj["discount"], traj["bootstrap_value"]).reshape(-1)
    np.testing.assert_allclose(batch["vs"], expected, rtol=1e-4, atol=1e-4)
    # one update changes the weights and bumps the version; stale trajectories beyond the lag are dropped
    assert agent.update(traj) is not None and agent.learner.version == 1
    traj["version"] = -cfg.max_policy_lag - 5
    assert agent.update(traj) is None and agent.dropped_stale == 1


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="ppo.num_minibatches"):
        PPOConfig(num_envs=3, num_steps=5, num_minibatches=2)
    with pytest.raises(ValueError, match="dqn.tau"):
        DQNConfig(tau=0.0)
    with pytest.raises(ValueError, match="impala.max_policy_lag"):
        IMPALAConfig(max_policy_lag=-1)
    with pytest.raises(ValueError, match="action_space"):
        DQN(OBS, spaces.Box(-1, 1, (2,)), DQNConfig())
