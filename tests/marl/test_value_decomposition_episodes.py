"""VDN/QMIX on an episode replay buffer with TD(lambda) targets: the loss against lambda-returns computed in a
plain Python loop as the lambda-weighted average of n-step returns (the forward view, Sutton & Barto eq. 12.2),
lambda = 0 against the one-step transition loss, and the stored episodes against the one-step buffer of the same
run."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.envs.pettingzoo_adapters import make_env
from fedarena.envs.pettingzoo_batch import ParallelEnvBatch
from fedarena.marl.value_decomposition import ValueDecomposition, ValueDecompositionConfig, ValueDecompositionTrainer

M, D, S, A = 3, 4, 5, 4


def _episodes(rng, B=5, T=6):
    """Random episodes of lengths T, T, 1, 3, 4 (zero padding after the end), the first and fourth terminal."""
    lengths = np.array([T, T, 1, 3, 4])[:B]
    filled = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    mask = rng.random((B, T, M, A)) < 0.6
    mask[..., 0] = True
    terminal = np.zeros((B, T), dtype=np.float32)
    terminal[0, lengths[0] - 1] = terminal[3, lengths[3] - 1] = 1.0
    return {"obs": rng.standard_normal((B, T, M, D)).astype(np.float32),
            "state": rng.standard_normal((B, T, S)).astype(np.float32),
            "action": rng.integers(A, size=(B, T, M)),
            "reward": rng.standard_normal((B, T)).astype(np.float32),
            "next_obs": rng.standard_normal((B, T, M, D)).astype(np.float32),
            "next_state": rng.standard_normal((B, T, S)).astype(np.float32),
            "next_mask": mask.astype(np.float32), "terminal": terminal, "filled": filled}


def _learner(mixer, lam, gamma=0.9, seed=0):
    cfg = ValueDecompositionConfig(mixer=mixer, hidden=(8,), mixing_embed=4, hypernet_hidden=8, hypernet_layers=2,
                                   gamma=gamma, buffer="episode", td_lambda=lam)
    vd = ValueDecomposition(D, S, M, A, cfg, seed=seed)
    noise = np.random.default_rng(seed + 7)
    vd.target_params = engine.tree_map(lambda a: a + 0.3 * noise.standard_normal(a.shape).astype(a.dtype), vd.params)
    return vd


def _mixed(vd, params, q, state):
    return np.asarray(vd.mix(params, q.astype(np.float32), state), dtype=np.float64)


@pytest.mark.parametrize("mixer", ["qmix", "vdn"])
def test_td_lambda_loss_matches_forward_view_lambda_returns(mixer):
    # oracle: for step t of an episode of length L, G_t = (1 - lam) sum_{n=1}^{L-t-1} lam^(n-1) G_t^(n)
    # + lam^(L-t-1) G_t^(L-t), G_t^(n) = sum_{i<n} gamma^i r_{t+i} + gamma^(n-1) d_{t+n-1} V_{t+n-1}, where V_k is the
    # target's mixed value after step k at the online network's greedy legal action and d_k = gamma (1 - terminal_k)
    lam, g = 0.6, 0.9
    vd = _learner(mixer, lam, g)
    b = _episodes(np.random.default_rng(1))
    B, T = b["reward"].shape
    q = lambda p, o: np.asarray(vd._q(p, o.astype(np.float32)), dtype=np.float64)  # noqa: E731
    targets, values = np.zeros((B, T)), np.zeros((B, T))
    for i in range(B):
        L = int(b["filled"][i].sum())
        chooser = q(vd.params, b["next_obs"][i])
        best = np.argmax(np.where(b["next_mask"][i] > 0, chooser, -np.inf), axis=2)
        V = _mixed(vd, vd.target_params, np.take_along_axis(q(vd.target_params, b["next_obs"][i]), best[..., None],
                                                             axis=2)[..., 0], b["next_state"][i])
        d = g * (1.0 - b["terminal"][i].astype(np.float64))
        r = b["reward"][i].astype(np.float64)
        for t in range(L):
            def n_step(n):
                return sum(g ** k * r[t + k] for k in range(n)) + g ** (n - 1) * d[t + n - 1] * V[t + n - 1]
            targets[i, t] = (1 - lam) * sum(lam ** (n - 1) * n_step(n) for n in range(1, L - t)) \
                + lam ** (L - t - 1) * n_step(L - t)
        chosen = np.take_along_axis(q(vd.params, b["obs"][i]), b["action"][i][..., None], axis=2)[..., 0]
        values[i] = _mixed(vd, vd.params, chosen, b["state"][i])
    want = np.sum(b["filled"] * (values - targets) ** 2) / b["filled"].sum()
    loss, aux = vd.episode_loss(vd.params, vd.target_params, b)
    np.testing.assert_allclose(float(loss), want, rtol=1e-4)
    np.testing.assert_allclose(float(aux["target"]), np.sum(b["filled"] * targets) / b["filled"].sum(), rtol=1e-4,
                               atol=1e-5)
    # the compiled update reports the same loss (before its step)
    assert vd.update(b)["loss"] == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("mixer", ["qmix", "vdn"])
def test_td_lambda_zero_is_the_one_step_loss_on_the_filled_transitions(mixer):
    # oracle: the transition loss (tested against numpy in test_value_decomposition_targets) on every filled step
    vd = _learner(mixer, 0.0, seed=3)
    b = _episodes(np.random.default_rng(2))
    keep = b["filled"].reshape(-1) > 0
    flat = {k: v.reshape((-1,) + v.shape[2:])[keep] for k, v in b.items() if k != "filled"}
    want, _ = vd.loss(vd.params, vd.target_params, flat)
    got, _ = vd.episode_loss(vd.params, vd.target_params, b)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    # and lambda > 0 differs from it (the targets look further ahead)
    lam = _learner(mixer, 0.6, seed=3)
    assert abs(float(lam.episode_loss(lam.params, lam.target_params, b)[0]) - float(want)) > 1e-4


def _trainer(buffer, num_envs=3, max_cycles=5, **kw):
    make = lambda: make_env("simple_spread_v3", api="parallel", max_cycles=max_cycles)  # noqa: E731
    env = ParallelEnvBatch(make, num_envs, seed=4)
    # no updates unless asked: the actions depend only on the exploration RNG, so both buffers see the same run
    cfg = ValueDecompositionConfig(**{"mixer": "qmix", "hidden": (8,), "mixing_embed": 4, "hypernet_hidden": 8,
                                      "batch_size": 4, "buffer_size": 512, "learning_starts": 10_000,
                                      "buffer": buffer, **kw})
    return ValueDecompositionTrainer(env, cfg, seed=0, episode_limit=max_cycles if buffer == "episode" else None)


def _run(trainer, steps=13, cut=8):
    for k in range(steps):
        if k == cut:  # a cut in mid-episode (8 is not a multiple of the episode length 5)
            trainer.reset_episodes()
        trainer.step()
    trainer.reset_episodes()  # stores the running episodes


def test_episode_buffer_holds_the_runs_transitions_episode_by_episode():
    # oracle: the one-step buffer of the same run; copy c's transitions are its rows t * E + c, and its episodes
    # end where the environment ended them or a reset cut them (after steps 5 and 8 and at the end, 13)
    one, ep = _trainer("transition"), _trainer("episode")
    _run(one)
    _run(ep)
    E = one.env.num_envs
    d1, de = one.buffer.gather(np.arange(len(one.buffer))), ep.buffer.gather(np.arange(len(ep.buffer)))
    assert len(ep.buffer) == 3 * E and de["filled"].shape == (3 * E, 5)
    lengths = sorted(de["filled"].sum(axis=1).astype(int).tolist())
    assert lengths == sorted([5, 3, 5] * E)
    starts = {0: 5, 5: 3, 8: 5}
    # a reset with the same seed starts the same states (steps 0 and 8): the first actions tell them apart
    key = lambda obs, action: obs.tobytes() + action.tobytes()  # noqa: E731
    want = {key(d1["obs"][t * E + c], d1["action"][t * E + c]): (t, c) for t in starts for c in range(E)}
    assert len(want) == 3 * E
    for i in range(len(ep.buffer)):
        t0, c = want[key(de["obs"][i, 0], de["action"][i, 0])]
        L = starts[t0]
        assert de["filled"][i].sum() == L
        for f in ("obs", "state", "action", "reward", "next_obs", "next_state", "next_mask", "terminal"):
            rows = [(t0 + k) * E + c for k in range(L)]
            np.testing.assert_array_equal(de[f][i, :L], d1[f][rows].astype(de[f].dtype))
            assert not np.any(de[f][i, L:])  # zero padding


def test_episode_buffer_steps_survive_a_checkpoint():
    # oracle: the uninterrupted trainer -- a copy loaded from its state mid-episode stores the same episodes
    a, b = _trainer("episode"), _trainer("episode")
    for _ in range(7):
        a.step()
    b.load_state_dict(a.state_dict())
    b.obs, b.mask, b.state = a.obs, a.mask, a.state
    b.env, b.learner.rng = a.env, a.learner.rng  # the same episodes continue (not part of the state)
    for _ in range(3):
        b.step()
    c = _trainer("episode")
    for _ in range(10):
        c.step()
    assert len(b.buffer) == len(c.buffer) == 2 * 3
    for f, v in c.buffer.gather(np.arange(len(c.buffer))).items():
        np.testing.assert_array_equal(b.buffer.gather(np.arange(len(b.buffer)))[f], v)


def test_episode_trainer_updates_on_sampled_episodes():
    # learning starts with 4 stored episodes (the first 5-step episodes of 3 copies end at step 5, the next at 10):
    # one update per batched step from step 10 on, each on 4 whole episodes
    tr = _trainer("episode", learning_starts=4, td_lambda=0.6, standardise_rewards=True)
    counts = []
    for _ in range(12):
        tr.step()
        counts.append(tr.learner.updates)
    assert counts == [0] * 9 + [1, 2, 3]
    assert np.isfinite(tr.last_metrics["loss"]) and tr.last_metrics["loss"] > 0


def test_episode_options_refuse_bad_combinations():
    with pytest.raises(ValueError, match="td_lambda: 0.6 needs buffer: episode"):
        ValueDecompositionConfig(td_lambda=0.6)
    with pytest.raises(ValueError, match="n_step: 3 needs buffer: transition"):
        ValueDecompositionConfig(buffer="episode", n_step=3)
    with pytest.raises(ValueError, match="buffer: invalid value 'episodes'"):
        ValueDecompositionConfig(buffer="episodes")
    with pytest.raises(ValueError, match="td_lambda: invalid value 1.5"):
        ValueDecompositionConfig(buffer="episode", td_lambda=1.5)
    with pytest.raises(ValueError, match="episode_limit"):
        _trainer("episode").__class__(_trainer("transition").env, ValueDecompositionConfig(buffer="episode"))


def test_cooperative_config_refuses_the_episode_buffer_without_an_episode_length():
    from fedarena.marl.cooperative_experiments import CooperativeConfig

    with pytest.raises(ValueError, match="value_decomposition.buffer: episode pads every episode to max_cycles"):
        CooperativeConfig(env_id="two_step_v0", max_cycles=None, algorithms=["qmix"],
                          value_decomposition=ValueDecompositionConfig(buffer="episode"))
    CooperativeConfig(env_id="two_step_v0", max_cycles=None, algorithms=["qmix"])  # transitions need none
