"""GAE and V-trace against their defining sums (written as explicit double loops), and V-trace == n-step on-policy."""

import numpy as np
import pytest

from fedarena.rl.returns import discounted_returns, gae, vtrace


def _episode_data(rng, T=37, N=5, gamma=0.97):
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    bootstrap = rng.normal(size=N)
    ends = rng.random((T, N)) < 0.1
    discounts = np.where(ends, 0.0, gamma)
    return rewards, values, bootstrap, discounts


def _gae_by_definition(rewards, values, bootstrap, discounts, lam):
    """A_t = sum_l lam^l (prod_{j<l} discounts_{t+j}) delta_{t+l}  (Schulman et al. 2016, eq. 16)."""
    T, N = rewards.shape
    v_next = np.vstack([values[1:], bootstrap[None]])
    delta = rewards + discounts * v_next - values
    adv = np.zeros((T, N))
    for i in range(N):
        for t in range(T):
            weight = 1.0
            for l in range(T - t):
                adv[t, i] += weight * delta[t + l, i]
                weight *= lam * discounts[t + l, i]
    return adv


def _vtrace_by_definition(log_rhos, discounts, rewards, values, bootstrap, rho_bar, c_bar):
    """v_s = V(x_s) + sum_t (prod_{i=s}^{t-1} gamma_i c_i) rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))  (eq. 1)."""
    T, N = rewards.shape
    rho = np.minimum(rho_bar, np.exp(log_rhos))
    c = np.minimum(c_bar, np.exp(log_rhos))
    v_next = np.vstack([values[1:], bootstrap[None]])
    vs = values.copy()
    for i in range(N):
        for s in range(T):
            coef = 1.0
            for t in range(s, T):
                vs[s, i] += coef * rho[t, i] * (rewards[t, i] + discounts[t, i] * v_next[t, i] - values[t, i])
                coef *= discounts[t, i] * c[t, i]
    return vs


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
def test_gae_matches_definition(lam):
    r, v, b, d = _episode_data(np.random.default_rng(0))
    adv, targets = gae(r, v, b, d, lam)
    np.testing.assert_allclose(adv, _gae_by_definition(r, v, b, d, lam), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(targets, adv + v)


@pytest.mark.quick
def test_gae_lambda_one_is_monte_carlo_return_minus_value():
    r, v, b, d = _episode_data(np.random.default_rng(1))
    adv, targets = gae(r, v, b, d, 1.0)
    # independent: explicit sum of discounted rewards until the episode end, plus the bootstrap
    T, N = r.shape
    for i in range(N):
        for t in range(T):
            g, w = 0.0, 1.0
            for k in range(t, T):
                g += w * r[k, i]
                w *= d[k, i]
            g += w * b[i]
            assert targets[t, i] == pytest.approx(g, abs=1e-10)


@pytest.mark.quick
@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (2.0, 0.5), (0.7, 1.3)])
def test_vtrace_matches_definition(rho_bar, c_bar):
    rng = np.random.default_rng(2)
    r, v, b, d = _episode_data(rng)
    log_rhos = rng.normal(scale=0.7, size=r.shape)
    out = vtrace(log_rhos, d, r, v, b, clip_rho_threshold=rho_bar, clip_c_threshold=c_bar, clip_pg_rho_threshold=rho_bar)
    expected = _vtrace_by_definition(log_rhos, d, r, v, b, rho_bar, c_bar)
    np.testing.assert_allclose(out.vs, expected, rtol=1e-10, atol=1e-10)
    vs_next = np.vstack([expected[1:], b[None]])
    pg = np.minimum(rho_bar, np.exp(log_rhos)) * (r + d * vs_next - v)
    np.testing.assert_allclose(out.pg_advantages, pg, rtol=1e-10, atol=1e-10)


def test_vtrace_on_policy_equals_n_step_returns():
    r, v, b, d = _episode_data(np.random.default_rng(3))
    out = vtrace(np.zeros_like(r), d, r, v, b)
    np.testing.assert_allclose(out.vs, discounted_returns(r, d, b), rtol=1e-10, atol=1e-10)
    # and V-trace's on-policy target equals GAE(lambda=1)'s value target
    np.testing.assert_allclose(out.vs, gae(r, v, b, d, 1.0)[1], rtol=1e-10, atol=1e-10)


def test_shape_mismatch_is_reported():
    with pytest.raises(ValueError, match="discounts"):
        gae(np.zeros((3, 2)), np.zeros((3, 2)), np.zeros(2), np.zeros((2, 2)), 0.9)
    with pytest.raises(ValueError, match="log_rhos"):
        vtrace(np.zeros((3, 1)), np.zeros((3, 2)), np.zeros((3, 2)), np.zeros((3, 2)), np.zeros(2))


def test_rollout_buffer_gae_and_minibatches():
    from fedarena.rl.rollout import RolloutBuffer

    rng = np.random.default_rng(7)
    r, v, b, d = _episode_data(rng, T=16, N=3)
    buf = RolloutBuffer(16, 3)
    for t in range(16):
        buf.add(obs=rng.normal(size=(3, 4)), reward=r[t], value=v[t], discount=d[t], step=np.full(3, t))
    assert buf.full
    with pytest.raises(ValueError, match="full"):
        buf.add(reward=r[0], value=v[0], discount=d[0])
    buf.compute_advantages(b, 0.9)
    np.testing.assert_allclose(buf.data["advantage"], _gae_by_definition(r, v, b, d, 0.9), rtol=1e-5, atol=1e-5)
    seen = []
    for mb in buf.minibatches(10, np.random.default_rng(0)):
        assert mb["obs"].shape[1:] == (4,) and len(mb["step"]) <= 10
        seen += list(zip(mb["step"].tolist(), mb["advantage"].tolist()))
    assert len(seen) == 48 and sorted(s for s, _ in seen) == sorted(list(range(16)) * 3)
    with pytest.raises(ValueError, match="leading size"):
        RolloutBuffer(2, 3).add(reward=np.zeros(2))
