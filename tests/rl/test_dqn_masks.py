"""DQN's action masks and its ``loss: huber|mse`` against a hand computation of the targets in numpy."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from fedarena.engine import tree_map
from fedarena.rl.dqn import DQN, DQNConfig

OBS = spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)
ACTIONS = spaces.Discrete(4)


def _agent(**kw) -> DQN:
    cfg = DQNConfig(num_envs=3, hidden=(8,), buffer_size=64, batch_size=4, **kw)
    return DQN(OBS, ACTIONS, cfg, seed=0)


def _random_params(agent: DQN, seed: int):
    """Parameters with O(1) Q values that differ between actions (an initialised head is near zero)."""
    rng = np.random.default_rng(seed)
    return tree_map(lambda p: (np.asarray(p) + rng.normal(size=np.shape(p))).astype(np.float32), agent.learner.params)


def _batch(rng: np.random.Generator, n: int = 6) -> dict[str, np.ndarray]:
    legal = rng.random((n, 4)) < 0.5
    legal[np.arange(n), rng.integers(0, 4, n)] = True
    return {"obs": rng.normal(size=(n, 3)).astype(np.float32),
            "action": np.eye(4, dtype=np.float32)[rng.integers(0, 4, n)],
            "reward": rng.normal(size=n).astype(np.float32) * 3,
            "discount": np.array([0.9, 0.0, 0.81, 0.9, 0.9, 0.729], np.float32)[:n],
            "next_obs": rng.normal(size=(n, 3)).astype(np.float32),
            "weights": rng.uniform(0.2, 1.0, n).astype(np.float32),
            "next_legal": legal}


def _expected(agent: DQN, params, target_params, b, masked: bool) -> tuple[float, np.ndarray]:
    """The loss and TD errors computed in numpy from the network's Q values."""
    q = np.asarray(agent.q_values(params, b["obs"]), np.float64)
    q_next_online = np.asarray(agent.q_values(params, b["next_obs"]), np.float64)
    q_next_target = np.asarray(agent.q_values(target_params, b["next_obs"]), np.float64)
    legal = b["next_legal"] if masked else np.ones_like(b["next_legal"])
    rows = np.arange(len(q))
    if agent.config.double:
        best = np.argmax(np.where(legal, q_next_online, -np.inf), axis=1)
        nxt = q_next_target[rows, best]
    else:
        nxt = np.where(legal, q_next_target, -np.inf).max(axis=1)
    y = b["reward"] + b["discount"] * nxt
    td = q[rows, b["action"].argmax(axis=1)] - y
    if agent.config.loss == "mse":
        per = td ** 2
    else:
        d = agent.config.huber_delta
        per = np.where(np.abs(td) <= d, 0.5 * td ** 2, d * (np.abs(td) - 0.5 * d))
    return float(np.mean(b["weights"] * per)), td


@pytest.mark.parametrize("double", [True, False])
@pytest.mark.parametrize("loss", ["huber", "mse"])
@pytest.mark.parametrize("masked", [True, False])
def test_loss_and_targets_match_a_hand_computation(double, loss, masked):
    agent = _agent(double=double, loss=loss, dueling=True, huber_delta=0.7)
    params, target_params = _random_params(agent, 4), _random_params(agent, 5)
    b = _batch(np.random.default_rng(1))
    feed = dict(b) if masked else {k: v for k, v in b.items() if k != "next_legal"}
    value, aux = agent.loss(params, target_params, feed)
    want, td = _expected(agent, params, target_params, b, masked)
    assert float(value) == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(np.asarray(aux["td_error"]), td, rtol=1e-5, atol=1e-5)
    # the case is informative: masking changes some targets
    other, _ = _expected(agent, params, target_params, b, not masked)
    assert abs(other - want) > 1e-4


def test_masked_train_step_moves_q_toward_the_masked_target():
    agent = _agent(double=False, loss="mse", dueling=False, prioritized=False, learning_rate=1e-2, max_grad_norm=1e9)
    b = _batch(np.random.default_rng(2))
    target_params = _random_params(agent, 3)
    agent.target_params = target_params
    before, _ = _expected(agent, agent.learner.params, target_params, b, True)
    for _ in range(50):
        agent.learner.update(dict(b, indices=np.arange(len(b["obs"]))))
    after, _ = _expected(agent, agent.learner.params, target_params, b, True)
    assert after < 0.5 * before


def test_act_respects_the_mask():
    agent = _agent()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 3)).astype(np.float32)
    legal = rng.random((500, 4)) < 0.5
    legal[np.arange(500), rng.integers(0, 4, 500)] = True
    q = np.asarray(agent.q_values(agent.learner.params, x))
    greedy = agent.act(x, 0.0, legal=legal)
    np.testing.assert_array_equal(greedy, np.argmax(np.where(legal, q, -np.inf), axis=1))
    assert (np.argmax(q, axis=1) != greedy).any()  # the mask matters for some rows
    explore = np.stack([agent.act(x, 1.0, legal=legal) for _ in range(20)])
    assert legal[np.arange(500)[None, :], explore].all()
    # uniform over the legal actions: each legal action of a row with k legal actions has frequency 1/k
    counts = np.zeros((500, 4))
    for a in explore:
        counts[np.arange(500), a] += 1
    k = legal.sum(axis=1, keepdims=True)
    freq = counts.sum(axis=0) / (legal / k).sum(axis=0) / 20
    np.testing.assert_allclose(freq, 1.0, atol=0.08)
    with pytest.raises(ValueError, match="legal: rows \\[0\\] have no legal action"):
        agent.act(x[:2], 0.0, legal=np.array([[False] * 4, [True] * 4]))


def test_observe_stores_the_mask_of_each_n_step_transitions_next_state():
    agent = _agent(n_step=2, gamma=0.5)
    masks = []
    for t in range(5):
        x = np.full((3, 3), t, np.float32)
        nx = np.stack([np.full(3, 10 * (t + 1) + i, np.float32) for i in range(3)])  # s' names (step, env)
        m = np.random.default_rng(t).random((3, 4)) < 0.5
        m[:, t % 4] = True
        masks.append(m)
        term = np.array([t == 2, False, False])
        agent.observe(x, np.zeros(3, int), np.ones(3), nx, term, np.zeros(3, bool), next_legal=m)
    data = {k: v[:len(agent.replay)] for k, v in agent.replay._data.items()}
    assert len(agent.replay) >= 8
    for nobs, nl, disc in zip(data["next_obs"], data["next_legal"], data["discount"]):
        step, env = divmod(int(nobs[0]), 10)
        if disc == 0.0:  # terminated: the bootstrap is unused and the mask is all legal
            assert nl.all()
        else:
            np.testing.assert_array_equal(nl, masks[step - 1][env])


def test_loss_field_is_validated():
    with pytest.raises(ValueError, match=r"dqn.loss: invalid value 'l1' \(expected one of huber, mse\)"):
        DQNConfig(loss="l1")
    assert DQNConfig().loss == "huber"
