"""BoardAgent / BoardLearner / play: masks are never violated, PPO's loss and gradients equal a PyTorch reference on a
fixed batch, GAE over turns equals a hand computation, state_dict round-trips, play's bookkeeping is right."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedarena import engine
from fedarena.envs.boardgames import BoardGameBatch
from fedarena.marl.league.agent import AgentConfig, BoardAgent, Trajectories, gae_over_turns, play
from fedarena.marl.league.players import random_player


@pytest.fixture(autouse=True)
def one_engine_thread():
    """Small batches: the engine's thread pool only adds synchronisation (slow on a loaded machine)."""
    before = engine.get_num_threads()
    engine.set_num_threads(1)
    yield
    engine.set_num_threads(before)


def _agent(game: str) -> tuple[BoardGameBatch, BoardAgent]:
    env = BoardGameBatch(game, 16)
    cfg = AgentConfig(network="cnn", hidden=(32,), channels=(8, 8)) if game == "connect_four" else AgentConfig(hidden=(32, 32))
    return env, BoardAgent(env.observation_shape, env.num_actions, cfg)


@pytest.mark.parametrize("game", ["tictactoe", "connect_four"])
def test_actions_are_always_legal_and_trajectories_consistent(game: str) -> None:
    env, agent = _agent(game)
    params = agent.init_params(0)
    # a policy head that strongly prefers illegal moves must still never pick them
    params["pi.b"] = np.linspace(50.0, -50.0, agent.num_actions).astype(np.float32)
    rng = np.random.default_rng(0)
    traj, results = play(agent, env, params, [random_player(), params], np.array([0.5, 0.5]), 40, rng)
    assert len(results) == 40 and traj.num_games == 40
    assert traj.mask[np.arange(len(traj)), traj.action].all()
    for greedy in (False, True):
        obs, mask, _ = env.reset()
        for _ in range(30):
            a = agent.act(params, obs, mask, rng, greedy=greedy)
            assert mask[np.arange(len(a)), a].all()
            obs, mask, *_ = env.step(a)
    # rewards only at a game's last move, equal to the reported results in order of play of each game
    assert set(np.unique(traj.reward[~traj.done])) <= {0.0}
    assert sorted(traj.reward[traj.done].tolist()) == sorted(r for _, r in results)
    # the stored log-probabilities are those of the masked policy at the stored observations
    logits, _ = agent.policy(params, traj.obs, traj.mask)
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(traj.log_prob, logp[np.arange(len(traj)), traj.action], rtol=1e-4, atol=1e-4)


def test_learner_seat_is_random_and_opponents_follow_probs() -> None:
    env, agent = _agent("tictactoe")
    params = agent.init_params(1)
    rng = np.random.default_rng(1)
    _, results = play(agent, env, params, [random_player(), random_player()], np.array([0.8, 0.2]), 400, rng,
                      collect=False)
    share = np.mean([k == 0 for k, _ in results])
    assert 0.72 < share < 0.88
    with pytest.raises(ValueError, match="opponent_probs"):
        play(agent, env, params, [random_player()], np.array([0.5, 0.5]), 4, rng)


def test_gae_over_turns_matches_hand_computation() -> None:
    reward = np.array([0, 0, 1, 0, -1], np.float32)
    value = np.array([0.1, 0.2, 0.3, 0.4, 0.5], np.float32)
    done = np.array([0, 0, 1, 0, 1], bool)
    g, lam = 0.9, 0.8
    adv, target = gae_over_turns(reward, value, done, g, lam)
    d2 = 1 - 0.3
    d1 = 0 + g * 0.3 - 0.2
    d0 = 0 + g * 0.2 - 0.1
    d4 = -1 - 0.5
    d3 = g * 0.5 - 0.4
    want = [d0 + g * lam * (d1 + g * lam * d2), d1 + g * lam * d2, d2, d3 + g * lam * d4, d4]
    np.testing.assert_allclose(adv, want, rtol=1e-6)
    np.testing.assert_allclose(target, np.array(want) + value, rtol=1e-6)


def _torch_loss(agent: BoardAgent, params: dict, mb: dict) -> tuple[torch.Tensor, dict]:
    c = agent.config
    tp = {k: torch.tensor(np.asarray(v, np.float64), requires_grad=True) for k, v in params.items()}
    x = torch.tensor(mb["obs"], dtype=torch.float64)
    if c.network == "mlp":
        h = x.reshape(len(x), -1)
        for i in range(len(c.hidden)):
            h = torch.relu(h @ tp[f"torso.{i}.w"] + tp[f"torso.{i}.b"])
    else:
        h = x.permute(0, 3, 1, 2)
        for i in range(len(c.channels)):
            h = torch.relu(torch.nn.functional.conv2d(h, tp[f"conv.{i}.w"], tp[f"conv.{i}.b"], padding=1))
        h = torch.relu(h.reshape(len(x), -1) @ tp["dense.w"] + tp["dense.b"])
    mask = torch.tensor(mb["mask"], dtype=torch.float64)
    logits = h @ tp["pi.w"] + tp["pi.b"] + (1 - mask) * -1e9
    value = (h @ tp["v.w"] + tp["v.b"]).reshape(-1)
    w = torch.tensor(mb["weight"], dtype=torch.float64)
    mean = lambda t: (t * w).sum() / w.sum()  # noqa: E731
    dist = torch.distributions.Categorical(logits=logits)
    act = torch.tensor(mb["action"].argmax(1))
    ratio = torch.exp(dist.log_prob(act) - torch.tensor(mb["log_prob"], dtype=torch.float64))
    adv = torch.tensor(mb["advantage"], dtype=torch.float64)
    pg = mean(torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - c.clip_coef, 1 + c.clip_coef)))
    vl = 0.5 * mean((value - torch.tensor(mb["value_target"], dtype=torch.float64)) ** 2)
    loss = pg - c.ent_coef * mean(dist.entropy()) + c.vf_coef * vl
    loss.backward()
    return loss, {k: t.grad.numpy() for k, t in tp.items()}


@pytest.mark.parametrize("game", ["tictactoe", "connect_four"])
def test_ppo_loss_and_gradients_match_torch(game: str) -> None:
    env, agent = _agent(game)
    params = agent.init_params(3)
    params["pi.w"] = params["pi.w"] * 100.0  # a policy far from uniform: ratios get clipped
    rng = np.random.default_rng(3)
    traj, _ = play(agent, env, agent.init_params(4), [random_player()], np.ones(1), 8, rng)
    learner = agent.learner(params, 0)
    adv, targets = gae_over_turns(traj.reward, traj.value, traj.done, 1.0, 0.95)
    data = dict(traj.arrays(), advantage=adv, value_target=targets)
    n = min(len(traj), 40)
    weight = np.ones(n)
    weight[-5:] = 0.0  # padding rows must not count
    mb = learner.minibatch(data, np.arange(n), weight)
    (loss, aux), grads = engine.value_and_grad(learner.loss, has_aux=True)(learner.params, mb)
    t_loss, t_grads = _torch_loss(agent, learner.params, mb)
    assert float(aux["clipfrac"]) > 0.0
    np.testing.assert_allclose(float(loss), t_loss.item(), rtol=1e-4, atol=1e-6)
    for k in params:
        np.testing.assert_allclose(np.asarray(grads[k]), t_grads[k], rtol=2e-3, atol=2e-5, err_msg=k)


def test_update_learns_and_state_dict_resumes_exactly() -> None:
    env, agent = _agent("tictactoe")
    rng = np.random.default_rng(5)
    params = agent.init_params(5)
    traj, _ = play(agent, env, params, [random_player()], np.ones(1), 64, rng)
    a = agent.learner(params, 7)
    a.update(traj)
    saved = a.state_dict()
    assert all(isinstance(v, np.ndarray) for v in saved.values())
    b = agent.learner(agent.init_params(9), 0)
    b.load_state_dict(saved)
    ma, mb = a.update(traj), b.update(traj)
    assert ma == mb
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    assert a.updates == b.updates == 2
    with pytest.raises(ValueError, match="state_dict: 'params/pi.w' has shape"):
        bad = dict(saved, **{"params/pi.w": np.zeros((3, 3), np.float32)})
        b.load_state_dict(bad)


def test_trajectories_concatenate_and_empty_update_error() -> None:
    env, agent = _agent("tictactoe")
    rng = np.random.default_rng(6)
    p = agent.init_params(0)
    t1, _ = play(agent, env, p, [random_player()], np.ones(1), 5, rng)
    t2, _ = play(agent, env, p, [random_player()], np.ones(1), 7, rng)
    t = Trajectories.concatenate([t1, t2])
    assert len(t) == len(t1) + len(t2) and t.num_games == 12
    empty = Trajectories(*(np.zeros((0,) + a.shape[1:], a.dtype) for a in t.arrays().values()))
    with pytest.raises(ValueError, match="empty batch"):
        agent.learner(p, 0).update(empty)
