"""VDN/QMIX TD targets against a numpy oracle (double Q-learning on and off, legal-action masks) and
reward standardisation against numpy's mean and std of the rewards seen."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.envs.pettingzoo_adapters import make_env
from fedarena.envs.pettingzoo_batch import ParallelEnvBatch
from fedarena.marl.value_decomposition import ValueDecomposition, ValueDecompositionConfig, ValueDecompositionTrainer


def _batch(rng, B=16, M=3, D=4, S=5, A=4):
    mask = rng.random((B, M, A)) < 0.6
    mask[..., 0] = True
    return {"obs": rng.standard_normal((B, M, D)).astype(np.float32),
            "state": rng.standard_normal((B, S)).astype(np.float32),
            "action": rng.integers(A, size=(B, M)),
            "reward": rng.standard_normal(B).astype(np.float32),
            "next_obs": rng.standard_normal((B, M, D)).astype(np.float32),
            "next_state": rng.standard_normal((B, S)).astype(np.float32),
            "next_mask": mask.astype(np.float32),
            "terminal": (rng.random(B) < 0.3).astype(np.float32)}


@pytest.mark.parametrize("double_q", [True, False])
def test_vdn_td_loss_matches_numpy(double_q):
    rng = np.random.default_rng(0)
    cfg = ValueDecompositionConfig(mixer="vdn", hidden=(8,), gamma=0.9, double_q=double_q)
    vd = ValueDecomposition(4, 5, 3, 4, cfg, seed=0)
    vd.target_params = engine.tree_map(lambda a: a + 0.3 * rng.standard_normal(a.shape).astype(a.dtype), vd.params)
    b = _batch(rng)
    q = lambda p, o: np.asarray(vd._q(p, o), dtype=np.float64)  # noqa: E731
    chosen = np.take_along_axis(q(vd.params, b["obs"]), b["action"][..., None], axis=2)[..., 0].sum(1)
    chooser = q(vd.params if double_q else vd.target_params, b["next_obs"])
    nxt = np.argmax(np.where(b["next_mask"] > 0, chooser, -np.inf), axis=2)
    next_tot = np.take_along_axis(q(vd.target_params, b["next_obs"]), nxt[..., None], axis=2)[..., 0].sum(1)
    target = b["reward"] + 0.9 * (1 - b["terminal"]) * next_tot
    loss, _ = vd.loss(vd.params, vd.target_params, b)
    np.testing.assert_allclose(float(loss), np.mean((chosen - target) ** 2), rtol=1e-4)


def test_double_q_changes_the_target_when_the_networks_differ():
    rng = np.random.default_rng(1)
    b = _batch(rng)
    losses = []
    for dq in (True, False):
        vd = ValueDecomposition(4, 5, 3, 4, ValueDecompositionConfig(mixer="qmix", hidden=(8,), double_q=dq), seed=0)
        vd.target_params = engine.tree_map(lambda a: a + 0.5 * np.random.default_rng(2).standard_normal(a.shape)
                                           .astype(a.dtype), vd.params)
        losses.append(float(vd.loss(vd.params, vd.target_params, b)[0]))
    assert abs(losses[0] - losses[1]) > 1e-6


def test_standardised_rewards_use_the_running_mean_and_std_of_all_team_rewards():
    env = ParallelEnvBatch(lambda: make_env("simple_spread_v3", api="parallel", max_cycles=5), 2, seed=0)
    cfg = ValueDecompositionConfig(mixer="vdn", hidden=(8,), batch_size=8, buffer_size=64, learning_starts=8,
                                   standardise_rewards=True)
    tr = ValueDecompositionTrainer(env, cfg, seed=0)
    seen, got = [], []
    real_update, real_add = tr.learner.update_many, tr.buffer.add

    def add(batch):
        seen.extend(np.asarray(batch["reward"], dtype=np.float64).tolist())
        return real_add(batch)

    def update(batches):
        got.extend((np.asarray(b["reward"], dtype=np.float64), np.array(seen)) for b in batches)
        return real_update(batches)

    tr.buffer.add, tr.learner.update_many = add, update
    for _ in range(12):
        tr.step()
    assert len(got) == 12 - 3
    raw = tr.buffer.state_dict()["data"]["reward"].astype(np.float64)
    for scaled, history in got:
        # every scaled reward is (r - mean) / std of the rewards seen up to that update, r one of the raw ones
        r = scaled * history.std() + history.mean()
        assert np.all(np.min(np.abs(r[:, None] - raw[None, :]), axis=1) < 1e-3 * max(1.0, history.std()))
    assert abs(np.mean(got[-1][0])) < 3.0 and not np.allclose(got[-1][0], raw[:8])


def test_update_many_equals_one_update_at_a_time_across_target_copies():
    # the updates between two target copies run as one compiled call: the same parameters, targets and
    # update count as calling update() once per batch (oracle: the one-at-a-time path)
    rng = np.random.default_rng(3)
    cfg = ValueDecompositionConfig(mixer="qmix", hidden=(8,), mixing_embed=4, hypernet_hidden=8, hypernet_layers=2,
                                   batch_size=6, buffer_size=6, target_update_every=2)
    batches = [{"obs": rng.normal(size=(6, 2, 3)), "next_obs": rng.normal(size=(6, 2, 3)),
                "state": rng.normal(size=(6, 6)), "next_state": rng.normal(size=(6, 6)),
                "action": rng.integers(0, 4, (6, 2)), "reward": rng.normal(size=6),
                "next_mask": np.ones((6, 2, 4)), "terminal": np.zeros(6)} for _ in range(5)]
    one, many = (ValueDecomposition(3, 6, 2, 4, cfg, seed=1) for _ in range(2))
    for b in batches:
        one.update(b)
    many.update_many(batches[:3])
    many.update_many(batches[3:])
    assert one.updates == many.updates == 5
    for a, b in zip(engine.tree_leaves(one.params) + engine.tree_leaves(one.target_params),
                    engine.tree_leaves(many.params) + engine.tree_leaves(many.target_params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # the target was copied after update 4, so it differs from the online parameters after update 5
    assert not np.allclose(engine.tree_leaves(many.params)[0], engine.tree_leaves(many.target_params)[0])


def test_update_every_runs_the_update_rounds_every_k_batched_steps():
    # oracle: counting by hand -- 4 copies, learning from 8 transitions on, one update every 3 batched steps
    env = ParallelEnvBatch(lambda: make_env("simple_spread_v3", api="parallel", max_cycles=5), 4, seed=0)
    cfg = ValueDecompositionConfig(mixer="vdn", hidden=(8,), batch_size=8, buffer_size=64, learning_starts=8,
                                   updates_per_step=2, update_every=3)
    tr = ValueDecompositionTrainer(env, cfg, seed=0)
    counts = []
    for _ in range(9):
        tr.step()
        counts.append(tr.learner.updates)
    # batched steps 3, 6, 9 update (the buffer holds >= 8 transitions from step 2 on), 2 updates each
    assert counts == [0, 0, 2, 2, 2, 4, 4, 4, 6]
    with pytest.raises(ValueError, match="update_every"):
        ValueDecompositionConfig(update_every=0)


def test_qmix_without_mixer_state_mixes_the_same_way_in_every_state():
    # QMIX-NS (mixer_state=False): Q_tot depends on the utilities only; with the state it depends on the state too
    rng = np.random.default_rng(5)
    q = rng.normal(size=(8, 3)).astype(np.float32)
    s1, s2 = (rng.normal(size=(8, 6)).astype(np.float32) for _ in range(2))
    for use_state in (True, False):
        cfg = ValueDecompositionConfig(mixer="qmix", hidden=(8,), mixing_embed=4, hypernet_hidden=8,
                                       hypernet_layers=2, mixer_state=use_state)
        vd = ValueDecomposition(4, 6, 3, 5, cfg, seed=2)
        a, b = (np.asarray(vd.mix(vd.params, q, s)) for s in (s1, s2))
        zero = np.asarray(vd.mix(vd.params, q, np.zeros_like(s1)))
        if use_state:
            assert not np.allclose(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-6)
            np.testing.assert_allclose(a, zero, rtol=1e-6)


def _nstep_trainer(n, num_envs=3, max_cycles=5):
    make = lambda: make_env("simple_spread_v3", api="parallel", max_cycles=max_cycles)  # noqa: E731
    env = ParallelEnvBatch(make, num_envs, seed=4)
    # no updates: the actions depend only on the exploration RNG, so every n sees the same transitions
    cfg = ValueDecompositionConfig(mixer="vdn", hidden=(8,), gamma=0.9, batch_size=8, buffer_size=512,
                                   learning_starts=10_000, n_step=n)
    return ValueDecompositionTrainer(env, cfg, seed=0)


@pytest.mark.parametrize("n", [2, 3])
def test_n_step_transitions_match_brute_force_returns(n):
    # oracle: the one-step transitions of the same run, with each copy's episode ends recorded; a transition's
    # n-step return sums gamma^i r over the next n steps of its copy or up to its episode's end (or the cut by
    # reset_episodes), and it bootstraps from the last of them with gamma^k (1 - terminal)
    one, many = _nstep_trainer(1), _nstep_trainer(n)
    ends, real_step = [], one.env.step

    def step(actions):
        st = real_step(actions)
        ends.append(st.episode_end.copy())
        return st

    one.env.step = step
    for k in range(13):
        if k == 8:  # a cut in mid-episode (8 is not a multiple of the episode length 5)
            one.reset_episodes()
            many.reset_episodes()
            ends[-1] = np.ones_like(ends[-1])
        one.step()
        many.step()
    many.reset_episodes()  # stores the open ones
    ends[-1] = np.ones_like(ends[-1])
    E, g = one.env.num_envs, 0.9
    d1, dn = one.buffer.gather(np.arange(len(one.buffer))), many.buffer.gather(np.arange(len(many.buffer)))
    assert len(many.buffer) == len(one.buffer) == 13 * E
    key = lambda d, i: d["obs"][i].tobytes() + d["action"][i].tobytes()  # noqa: E731
    stored = {key(dn, i): i for i in range(len(many.buffer))}
    for t in range(13):
        for c in range(E):
            steps = []
            for u in range(t, 13):
                steps.append(u * E + c)
                if len(steps) == n or ends[u][c]:
                    break
            i = stored[key(d1, t * E + c)]
            want = sum(g ** j * d1["reward"][s] for j, s in enumerate(steps))
            np.testing.assert_allclose(dn["reward"][i], want, rtol=1e-5)
            np.testing.assert_allclose(dn["discount"][i], g ** len(steps) * (1 - d1["terminal"][steps[-1]]), rtol=1e-6)
            np.testing.assert_allclose(dn["reward_weight"][i], sum(g ** j for j in range(len(steps))), rtol=1e-6)
            np.testing.assert_array_equal(dn["next_obs"][i], d1["next_obs"][steps[-1]])
            np.testing.assert_array_equal(dn["next_state"][i], d1["next_state"][steps[-1]])


def test_n_step_window_survives_a_checkpoint():
    # oracle: the uninterrupted trainer -- a copy loaded from its state mid-episode stores the same transitions
    a, b = _nstep_trainer(3), _nstep_trainer(3)
    for _ in range(7):
        a.step()
    b.load_state_dict(a.state_dict())
    b.obs, b.mask, b.state = a.obs, a.mask, a.state
    b.env, b.learner.rng = a.env, a.learner.rng  # the same episodes continue (not part of the state)
    for _ in range(4):
        b.step()
    c = _nstep_trainer(3)
    for _ in range(11):
        c.step()
    np.testing.assert_array_equal(b.buffer.gather(np.arange(len(b.buffer)))["reward"],
                                  c.buffer.gather(np.arange(len(c.buffer)))["reward"])


def test_n_step_loss_uses_the_stored_discount():
    # oracle: numpy TD error with the batch's own bootstrap discount in place of gamma (1 - terminal)
    rng = np.random.default_rng(5)
    vd = ValueDecomposition(4, 5, 3, 4, ValueDecompositionConfig(mixer="vdn", hidden=(8,), gamma=0.9), seed=0)
    b = dict(_batch(rng), discount=rng.random(16).astype(np.float32))
    q = lambda p, o: np.asarray(vd._q(p, o), dtype=np.float64)  # noqa: E731
    chosen = np.take_along_axis(q(vd.params, b["obs"]), b["action"][..., None], axis=2)[..., 0].sum(1)
    nq = q(vd.params, b["next_obs"])
    nxt = np.argmax(np.where(b["next_mask"] > 0, nq, -np.inf), axis=2)
    next_tot = np.take_along_axis(nq, nxt[..., None], axis=2)[..., 0].sum(1)
    loss, _ = vd.loss(vd.params, vd.target_params, b)
    np.testing.assert_allclose(float(loss), np.mean((chosen - b["reward"] - b["discount"] * next_tot) ** 2), rtol=1e-4)
