"""n-step transitions from a vectorized stream against a brute-force per-episode computation."""

import numpy as np
import pytest

from fedarena.rl.nstep import NStepAccumulator


@pytest.mark.quick
@pytest.mark.parametrize("n", [1, 3, 5])
def test_nstep_matches_brute_force(n):
    rng = np.random.default_rng(n)
    N, T, gamma = 4, 60, 0.9
    acc = NStepAccumulator(n, gamma, N)
    rewards = rng.normal(size=(T, N))
    term = rng.random((T, N)) < 0.08
    trunc = (rng.random((T, N)) < 0.05) & ~term
    obs_id = np.arange(T * N, dtype=np.float64).reshape(T, N)  # obs_t of env i identifies (t, i)
    next_id = obs_id + 0.5  # the observation reached by step t
    got = {}
    for t in range(T):
        out = acc.push(obs_id[t], np.full(N, t), rewards[t], next_id[t], term[t], trunc[t])
        for o, a, r, no, d in zip(*(out.get(k, []) for k in ("obs", "action", "reward", "next_obs", "discount"))):
            assert o not in got
            got[o] = (r, no, d)
    expected = {}
    for i in range(N):
        for t in range(T):
            g, m = 0.0, 0
            ended = False
            while m < n and t + m < T:
                g += gamma**m * rewards[t + m, i]
                m += 1
                if term[t + m - 1, i] or trunc[t + m - 1, i]:
                    ended = True
                    break
            if m < n and not ended:
                continue  # window still open at the end of the stream: not emitted yet
            last = t + m - 1
            expected[obs_id[t, i]] = (g, next_id[last, i], 0.0 if term[last, i] else gamma**m)
    assert set(got) == set(expected)
    for k, (r, no, d) in expected.items():
        assert got[k][0] == pytest.approx(r) and got[k][1] == no and got[k][2] == pytest.approx(d)
