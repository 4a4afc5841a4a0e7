"""``ppo.engine_backend``: one PPO update on the cupy backend (its generated CUDA kernels run on the
CPU emulation) equals the numpy backend's; a bad or unavailable backend is a one-line error naming
the field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedarena.engine.backends.cupy import CupyJitted, emulation, gpu_unavailable_reason
from fedarena.engine.core.pytree import tree_leaves

REPO = Path(__file__).resolve().parents[2]
needs_cxx = pytest.mark.skipif(emulation.host_compiler() is None, reason="no C++ compiler for the CUDA emulation")
_NO_GPU = gpu_unavailable_reason()
DEVICE_BACKENDS = ["cupy-emulated", pytest.param("cupy", marks=[
    pytest.mark.gpu, pytest.mark.skipif(_NO_GPU is not None, reason=f"no CUDA device: {_NO_GPU}")])]
"""The emulated device everywhere; the CUDA device with ``-m gpu`` where there is one."""


def _spaces():
    """gymnasium's spaces, which fedarena.rl builds on: each test imports fedarena.rl itself and skips
    where gymnasium is missing (a lent GPU image without its wheels: benchmarks/gpu_check.sh), so
    the module still collects there."""
    return pytest.importorskip("gymnasium.spaces")


def _rollout(t: int, n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((t, n, 3)).astype(np.float32),
        "action": rng.integers(0, 2, (t, n)),
        "log_prob": np.full((t, n), np.log(0.5), np.float32) + 0.05 * rng.standard_normal((t, n)).astype(np.float32),
        "value": rng.standard_normal((t, n)).astype(np.float32),
        "reward": rng.standard_normal((t, n)).astype(np.float32),
        "discount": np.where(rng.random((t, n)) < 0.2, 0.0, 0.99).astype(np.float32),
        "bootstrap_value": rng.standard_normal(n).astype(np.float32),
    }


@needs_cxx
@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_ppo_update_on_the_device_backend_equals_the_numpy_backend(backend):
    spaces = _spaces()
    from fedarena.rl.ppo import PPO, PPOConfig

    obs_space, act_space = spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(2)
    kw = dict(num_envs=2, num_steps=4, num_minibatches=2, update_epochs=1, hidden=(4,), ent_coef=0.01, anneal_lr=False,
              learning_rate=0.05)
    ref = PPO(obs_space, act_space, PPOConfig(**kw), seed=3)
    dev = PPO(obs_space, act_space, PPOConfig(**kw, engine_backend=backend), seed=3)
    before = [np.array(x) for x in tree_leaves(ref.learner.params)]
    rollout = _rollout(4, 2)
    m_ref, m_dev = ref.update(rollout), dev.update(rollout)
    assert isinstance(dev._step, CupyJitted) and dev._step.cache_size == 1
    assert [exe.host_steps for exe, _ in dev._step._cache.values()] == [[]]  # the whole step runs as device kernels
    p_ref, p_dev = tree_leaves(ref.learner.params), tree_leaves(dev.learner.params)
    assert all(type(x) is np.ndarray for x in p_dev)  # handed back to the host after the rollout
    assert max(float(np.abs(a - b).max()) for a, b in zip(p_ref, before)) > 1e-3  # the update moved the weights
    for a, b in zip(p_ref, p_dev):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    for k in m_ref:
        np.testing.assert_allclose(m_dev[k], m_ref[k], rtol=1e-5, atol=1e-5, err_msg=k)
    assert int(dev.learner.opt_state["count"]) == int(ref.learner.opt_state["count"]) == 2


def test_engine_backend_errors_name_the_field():
    _spaces()
    from fedarena.rl.ppo import PPOConfig

    with pytest.raises(ValueError, match=r"^ppo\.engine_backend: expected numpy, cupy or cupy-emulated, got 'torch'$"):
        PPOConfig(engine_backend="torch")
    if gpu_unavailable_reason() is not None:
        with pytest.raises(ValueError, match=r"^ppo\.engine_backend: cupy selected but "):
            PPOConfig(engine_backend="cupy")
    if emulation.host_compiler() is not None:
        with pytest.raises(ValueError, match=r"^ppo\.engine_backend: cupy-emulated runs one learner"):
            PPOConfig(engine_backend="cupy-emulated", learners=2, num_envs=2, num_steps=4, num_minibatches=1)
        from fedarena.rl.impala import IMPALAConfig

        with pytest.raises(ValueError, match=r"^impala\.engine_backend: cupy-emulated runs one learner without a "
                                             r"parameter server, got learners = 1, parameter_server = sync$"):
            IMPALAConfig(engine_backend="cupy-emulated", parameter_server="sync")
    from fedarena.rl.dqn import DQNConfig

    with pytest.raises(ValueError, match=r"^dqn\.engine_backend: expected numpy"):
        DQNConfig(engine_backend="")


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="a CUDA device is visible: cupy is available")
def test_fedarena_run_without_a_gpu_exits_2_with_one_line(tmp_path, capsys):
    _spaces()
    from fedarena.platform.cli import main

    rc = main(["run", str(REPO / "experiments" / "ppo_cartpole.yaml"),
               "--set", "ppo.engine_backend=cupy", "--out", str(tmp_path / "r")])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, lines
    assert "ppo.engine_backend: cupy selected but " in lines[0]


def _replay_batch(n: int, obs_dim: int, actions: int, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((n, obs_dim)).astype(np.float32),
            "action": np.eye(actions, dtype=np.float32)[rng.integers(0, actions, n)],
            "reward": rng.standard_normal(n).astype(np.float32),
            "discount": np.full(n, 0.97, np.float32),
            "next_obs": rng.standard_normal((n, obs_dim)).astype(np.float32),
            "weights": rng.uniform(0.5, 1.0, n).astype(np.float32),
            "indices": np.arange(n)}


@needs_cxx
@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_dqn_and_impala_updates_on_the_device_backend_equal_the_numpy_backend(backend):
    spaces = _spaces()
    from fedarena.rl.dqn import DQN, DQNConfig
    from fedarena.rl.impala import IMPALA, IMPALAConfig

    obs_space, act_space = spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(2)
    kw = dict(num_envs=2, batch_size=6, buffer_size=16, hidden=(4,), learning_rate=0.05, prioritized=False)
    agents = [DQN(obs_space, act_space, DQNConfig(**kw, engine_backend=b), seed=5) for b in ("numpy", backend)]
    batch = _replay_batch(6, 3, 2)
    for _ in range(2):
        m = [a.learner.update(dict(batch)) for a in agents]
    for a, b in zip(*(tree_leaves(a.learner.params) for a in agents)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    for k in m[0]:
        np.testing.assert_allclose(m[1][k], m[0][k], rtol=1e-5, atol=1e-5, err_msg=k)

    kw = dict(num_envs=2, unroll_length=3, hidden=(4,), learning_rate=0.05)
    learners = [IMPALA(obs_space, act_space, IMPALAConfig(**kw, engine_backend=b), seed=5)
                for b in ("numpy", backend)]
    r = _rollout(3, 2, seed=4)
    traj = dict(r, last_obs=np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32), version=0)
    m = [lr.update(dict(traj)) for lr in learners]
    for a, b in zip(*(tree_leaves(lr.learner.params) for lr in learners)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    for k in m[0]:
        np.testing.assert_allclose(m[1][k], m[0][k], rtol=1e-5, atol=1e-5, err_msg=k)
    for step in (agents[1]._step, learners[1]._step):
        assert [exe.host_steps for exe, _ in step._cache.values()] == [[]]
