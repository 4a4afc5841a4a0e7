"""VDN/QMIX, independent PPO and self-play: mixing-network properties, the QMIX paper's two-step game,
masked PPO against a numpy oracle, and the experiment kinds end to end on tiny budgets."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.envs.pettingzoo_adapters import make_env
from fedarena.envs.pettingzoo_batch import ParallelEnvBatch, random_policy
from fedarena.envs.pettingzoo_two_step import TwoStepGame
from fedarena.marl.independent import ILLEGAL_LOGIT, IndependentPPO, masked_ppo, sample_actions
from fedarena.marl.selfplay import SelfPlayConfig, SelfPlayPPO, SnapshotPool
from fedarena.marl.value_decomposition import ValueDecomposition, ValueDecompositionConfig, ValueDecompositionTrainer
from fedarena.rl.ppo import PPOConfig


def test_qmix_mixing_is_monotonic_and_vdn_is_the_sum():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((6, 3)).astype(np.float32)
    s = rng.standard_normal((6, 5)).astype(np.float32)
    vdn = ValueDecomposition(4, 5, 3, 2, ValueDecompositionConfig(mixer="vdn"), seed=0)
    np.testing.assert_allclose(np.asarray(vdn.mix(vdn.params, q, s)), q.sum(axis=1), rtol=1e-6)
    qmix = ValueDecomposition(4, 5, 3, 2, ValueDecompositionConfig(mixer="qmix", mixing_embed=8), seed=1)
    grad = engine.grad(lambda qq: engine.ops.sum(qmix.mix(qmix.params, qq, s)))(q)
    assert (np.asarray(grad) >= 0).all() and (np.asarray(grad) > 0).any()
    # and the joint value is a non-linear function of q (not a sum): mixed second differences differ
    e = np.zeros_like(q)
    e[:, 0] = 1.0
    f = lambda x: np.asarray(qmix.mix(qmix.params, x, s))  # noqa: E731
    assert not np.allclose(f(q + e) - f(q), f(q + 3 * e) - f(q + 2 * e), atol=1e-4)


def _two_step(mixer: str, seed: int) -> float:
    env = ParallelEnvBatch(TwoStepGame, 8, seed=seed)
    cfg = ValueDecompositionConfig(mixer=mixer, epsilon_start=1.0, epsilon_finish=1.0, epsilon_anneal_steps=1,
                                   target_update_every=100, learning_starts=64, buffer_size=2000)
    tr = ValueDecompositionTrainer(env, cfg, seed=seed)
    for _ in range(1200):
        tr.step()
    obs, mask, _ = env.reset()
    st = env.step(tr.learner.act(obs, mask, 0.0))
    st = env.step(tr.learner.act(st.obs, st.action_mask, 0.0))
    assert st.episode_end.all()
    return float(st.episode_return[0, 0])


def test_qmix_finds_the_optimal_two_step_return_and_vdn_settles_at_7():
    # Rashid et al. (2018), sec. 6.1: QMIX's greedy policy earns 8, VDN's 7 (5 seeds: experiments/two_step_qmix.yaml)
    assert _two_step("qmix", seed=0) == 8.0
    assert _two_step("vdn", seed=0) == 7.0


def test_masked_ppo_samples_legal_actions_with_the_masked_log_probabilities():
    ppo = masked_ppo(5, 4, PPOConfig(num_envs=2, num_steps=2, num_minibatches=1), seed=0)
    rng = np.random.default_rng(0)
    mask = rng.random((500, 4)) < 0.5
    mask[np.arange(500), rng.integers(4, size=500)] = True
    x = np.concatenate([rng.standard_normal((500, 5)), mask], axis=1).astype(np.float32)
    actions, logp, _ = sample_actions(ppo, x, rng)
    assert mask[np.arange(500), actions].all()
    (raw,) = ppo.net.base.policy(ppo.learner.params, x)  # unmasked logits: numpy oracle for the masked softmax
    raw = np.asarray(raw, dtype=np.float64)
    z = np.where(mask, raw, -np.inf)
    ref = z - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)) - z.max(1, keepdims=True)
    np.testing.assert_allclose(logp, ref[np.arange(500), actions], atol=1e-5)
    (masked,) = ppo.net.policy(ppo.learner.params, x)
    assert np.all(np.asarray(masked)[~mask] < ILLEGAL_LOGIT / 2)


@pytest.mark.parametrize("shared", [True, False])
def test_independent_ppo_updates_on_simple_spread(shared):
    env = ParallelEnvBatch(lambda: make_env("simple_spread_v3", api="parallel", max_cycles=5), 2, seed=0)
    ip = IndependentPPO(env, PPOConfig(num_steps=10, num_minibatches=2, update_epochs=1), shared=shared, seed=0)
    before = engine.tree_map(np.copy, [p.learner.params for p in ip.learners])
    returns, metrics = ip.iteration()
    assert len(ip.learners) == (1 if shared else 3) and len(returns) == 4  # 2 copies x 2 finished episodes
    assert np.isfinite(metrics["loss"]) and ip.env_steps == 20
    moved = [not np.allclose(a, b) for a, b in zip(engine.tree_leaves(before),
                                                   engine.tree_leaves([p.learner.params for p in ip.learners]))]
    assert any(moved)
    assert ip.greedy_actions(ip.obs, ip.mask).shape == (2, 3)


@pytest.mark.parametrize("shared", [True, False])
def test_independent_ppo_anneals_the_learning_rate_over_the_environment_step_budget(shared):
    # 2 copies x 10 steps = 20 environment steps per rollout; a budget of 200 steps is 10 rollouts, each of
    # 2 minibatches x 1 epoch, so the rate reaches 0 after 20 minibatch updates whatever the sharing
    env = ParallelEnvBatch(lambda: make_env("simple_spread_v3", api="parallel", max_cycles=5), 2, seed=0)
    cfg = PPOConfig(num_steps=10, num_minibatches=2, update_epochs=1, anneal_lr=True, learning_rate=1e-3)
    ip = IndependentPPO(env, cfg, shared=shared, seed=0, total_steps=200)
    for p in ip.learners:
        assert p.total_updates == 200 // 20 * 2
        assert p.learning_rate(10) == pytest.approx(5e-4)


@pytest.mark.parametrize("bootstrap", [True, False])
def test_independent_ppo_truncation_bootstraps_from_the_final_value_or_ends_the_return(bootstrap):
    # oracle: the env's own rewards, plus gamma V(final observation) on the truncated last step when bootstrapping
    env = ParallelEnvBatch(lambda: make_env("simple_spread_v3", api="parallel", max_cycles=5), 2, seed=0)
    ip = IndependentPPO(env, PPOConfig(num_steps=5, num_minibatches=1, update_epochs=1, gamma=0.9), shared=True,
                        seed=0, bootstrap_truncated=bootstrap)
    seen, rewards = {}, []
    real_step = env.step

    def step(actions):
        st = real_step(actions)
        rewards.append(st.reward.reshape(-1).copy())
        if st.truncated.any():
            x = ip._inputs(st.final_obs, np.ones_like(st.action_mask))[0]
            seen["final_value"] = np.asarray(ip.learners[0].forward(ip.learners[0].learner.params, x)[1], np.float64)
        return st
    env.step = step
    ip.learners[0].update = lambda rollout: seen.setdefault("rollout", rollout) and {}
    ip.iteration()
    got, raw = seen["rollout"]["reward"], np.stack(rewards)
    np.testing.assert_allclose(got[:4], raw[:4])
    expected = raw[4] + (0.9 * seen["final_value"] if bootstrap else 0.0)
    np.testing.assert_allclose(got[4], expected, rtol=1e-5, atol=1e-6)
    assert np.all(seen["rollout"]["discount"][4] == 0.0)


def test_snapshot_pool_keeps_the_newest_frozen_copies():
    pool = SnapshotPool(2)
    params = {"w": np.zeros(3, np.float32)}
    for u in range(3):
        params["w"][:] = u
        pool.add(params, u)
    assert [s.id for s in pool.snapshots] == ["snapshot-1", "snapshot-2"]
    assert pool.snapshots[0].params["w"][0] == 1.0
    with pytest.raises(ValueError):
        pool.snapshots[0].params["w"][0] = 5.0


def test_selfplay_ppo_on_tictactoe_learns_from_its_own_moves_and_grows_the_pool():
    sp = SelfPlayPPO(lambda: make_env("tictactoe_v3"), 4, PPOConfig(num_steps=8, num_minibatches=2, update_epochs=1),
                     SelfPlayConfig(latest_prob=0.5, snapshot_every=1, pool_size=3), seed=0)
    for _ in range(2):
        returns, metrics = sp.iteration()
    assert len(sp.pool) == 3 and sp.env_steps == 64 and np.isfinite(metrics["loss"])
    assert set(np.unique(returns)) <= {-1.0, 0.0, 1.0}
    rates = sp.evaluate(lambda: make_env("tictactoe_v3"), random_policy(0), 20, seed=1)
    assert abs(rates["win"] + rates["draw"] + rates["loss"] - 1.0) < 1e-12


def test_experiment_kinds_run_end_to_end(tmp_path):
    from fedarena.platform.runs import execute

    summary = execute("experiments/two_step_qmix.yaml",
                      ["learner_seeds=[0]", "algorithms=[qmix]", "env_steps=400", "steps_per_round=200", "eval_episodes=8"],
                      out=str(tmp_path / "coop"), quiet=True)
    assert summary["qmix/greedy_return_per_seed"][0] in (0.0, 1.0, 7.0, 8.0)
    assert (tmp_path / "coop" / "report" / "returns.png").exists()
    summary = execute("experiments/tictactoe_selfplay.yaml",
                      ["updates=1", "num_envs=2", "games_per_update=4", "agent.update_epochs=1", "agent.hidden=[16]",
                       "eval_episodes=4"],
                      out=str(tmp_path / "sp"), quiet=True)
    assert (tmp_path / "sp" / "report" / "selfplay.png").exists()
    assert 0.0 <= summary["vs_random/win"] <= 1.0 and summary["updates"] == 1
