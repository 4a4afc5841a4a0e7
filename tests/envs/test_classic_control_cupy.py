"""The cupy (GPU) build of the batched classic-control environments agrees with the numpy build."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
try:
    cp.zeros(1).sum()
except Exception as exc:  # cupy installed but no usable device
    pytest.skip(f"no CUDA device: {exc}", allow_module_level=True)
pytest.importorskip("gymnasium")  # the environments' spaces (a lent GPU image has it only as carried wheels)

from fedarena.envs.classic_control import BatchedClassicControl, acrobot_step, cartpole_step  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("step,scale", [(cartpole_step, 0.2), (acrobot_step, 3.0)])
def test_cupy_step_matches_numpy(step, scale):
    rng = np.random.default_rng(0)
    states = rng.uniform(-scale, scale, size=(4096, 4))
    actions = rng.integers(2, size=4096)
    ns, r, t = step(states, actions, np)
    ns_gpu, r_gpu, t_gpu = step(cp.asarray(states), cp.asarray(actions), cp)
    np.testing.assert_allclose(cp.asnumpy(ns_gpu), ns, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(cp.asnumpy(r_gpu), r)
    assert (cp.asnumpy(t_gpu) != t).sum() <= 1  # a state exactly on the threshold may round differently


@pytest.mark.gpu
def test_cupy_env_runs_and_autoresets():
    env = BatchedClassicControl("CartPole-v1", 10_000, seed=0, xp=cp)
    obs = env.reset()
    assert isinstance(obs, cp.ndarray) and obs.shape == (10_000, 4)
    done = 0
    for _ in range(60):
        out = env.step(cp.ones(10_000, dtype=cp.int64))  # always push right: every pole falls within 60 steps
        done += int(out.terminated.sum())
    assert done >= 10_000
    assert float(cp.abs(env.state[:, 2]).max()) < 0.25
