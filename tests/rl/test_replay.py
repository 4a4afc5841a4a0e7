"""Replay buffers: ring semantics, the vectorized sum-tree against brute force, PER sampling frequencies (chi-square)."""

import numpy as np
import pytest
from scipy import stats

from fedarena.rl.replay import PrioritizedReplayBuffer, ReplayBuffer, SegmentTree


@pytest.mark.quick
def test_ring_keeps_newest_items():
    buf = ReplayBuffer(8, seed=0)
    buf.add({"x": np.arange(5), "y": np.arange(5)[:, None] * np.ones((1, 3))})
    buf.add({"x": np.arange(5, 11), "y": np.arange(5, 11)[:, None] * np.ones((1, 3))})
    assert len(buf) == 8
    assert sorted(buf.gather(np.arange(8))["x"].tolist()) == list(range(3, 11))
    s = buf.sample(100)
    assert s["x"].shape == (100,) and s["y"].shape == (100, 3)
    np.testing.assert_array_equal(s["y"][:, 0], s["x"])
    assert set(s["x"].tolist()) <= set(range(3, 11))
    big = ReplayBuffer(4, seed=0)
    big.add({"x": np.arange(10)})
    assert sorted(big.gather(np.arange(4))["x"].tolist()) == [6, 7, 8, 9]


def test_ring_rejects_bad_batches():
    buf = ReplayBuffer(4)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(1)
    with pytest.raises(ValueError, match="same leading batch size"):
        buf.add({"x": np.zeros(3), "y": np.zeros(2)})
    buf.add({"x": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="item shape"):
        buf.add({"x": np.zeros((2, 4))})
    with pytest.raises(ValueError, match="fields"):
        buf.add({"z": np.zeros((2, 3))})


def test_ring_state_roundtrip():
    buf = ReplayBuffer(6, seed=1)
    buf.add({"x": np.arange(4.0)})
    other = ReplayBuffer(6, seed=99)
    other.load_state_dict(buf.state_dict())
    np.testing.assert_array_equal(buf.sample(10)["x"], other.sample(10)["x"])
    buf.add({"x": np.arange(3.0)})
    other.add({"x": np.arange(3.0)})
    np.testing.assert_array_equal(buf.gather(np.arange(6))["x"], other.gather(np.arange(6))["x"])


@pytest.mark.parametrize("capacity", [1, 7, 64, 1000])
def test_segment_tree_against_brute_force(capacity):
    rng = np.random.default_rng(capacity)
    tree, mins = SegmentTree(capacity, "sum"), SegmentTree(capacity, "min")
    leaves = np.zeros(capacity)
    written = np.zeros(capacity, dtype=bool)
    for _ in range(20):
        idx = rng.integers(0, capacity, size=min(capacity, 50))
        val = rng.random(idx.size)
        tree.update(idx, val)
        mins.update(idx, val)
        for i, v in zip(idx, val):  # last write wins, like the tree
            leaves[i] = v
            written[i] = True
        assert tree.root == pytest.approx(leaves.sum())
        assert mins.root == leaves[written].min()
        # every internal node is the sum of its children
        internal = np.arange(1, tree.size)
        np.testing.assert_allclose(tree.nodes[internal], tree.nodes[2 * internal] + tree.nodes[2 * internal + 1])
        targets = rng.random(200) * leaves.sum()
        expected = np.searchsorted(np.cumsum(leaves), targets, side="right")
        np.testing.assert_array_equal(tree.find_prefix_sum(targets), np.minimum(expected, capacity - 1))


@pytest.mark.parametrize("stratified", [False, True])
def test_prioritized_sampling_frequencies_chi_square(stratified):
    rng = np.random.default_rng(5)
    n = 100
    buf = PrioritizedReplayBuffer(128, alpha=0.7, epsilon=0.0, seed=6)
    buf.add({"id": np.arange(n)})
    prio = rng.random(n) * 3 + 0.01
    buf.update_priorities(np.arange(n), prio)
    counts = np.zeros(n)
    for _ in range(400):
        s = buf.sample(256, beta=0.5, stratified=stratified)
        np.testing.assert_array_equal(s["id"], s["indices"])
        counts += np.bincount(s["id"], minlength=n)
    p = prio**0.7 / np.sum(prio**0.7)
    _, pvalue = stats.chisquare(counts, counts.sum() * p)
    assert pvalue > 1e-3
    # a sampler that ignores priorities fails the same test
    _, pvalue_uniform = stats.chisquare(counts, np.full(n, counts.sum() / n))
    assert pvalue_uniform < 1e-12


@pytest.mark.quick
def test_importance_weights_brute_force():
    buf = PrioritizedReplayBuffer(50, alpha=0.6, epsilon=0.0, seed=0)
    buf.add({"x": np.arange(30.0)})
    prio = np.random.default_rng(1).random(30) + 0.1
    buf.update_priorities(np.arange(30), prio)
    s = buf.sample(64, beta=0.4)
    p = prio**0.6 / np.sum(prio**0.6)
    w = (30 * p) ** -0.4
    np.testing.assert_allclose(s["weights"], (w / w.max())[s["indices"]], rtol=1e-5)


def test_new_items_get_max_priority_and_bad_updates_rejected():
    buf = PrioritizedReplayBuffer(10, alpha=1.0, epsilon=0.0, seed=0)
    buf.add({"x": np.arange(4.0)})
    buf.update_priorities(np.array([0, 1]), np.array([5.0, 0.5]))
    buf.add({"x": np.array([9.0])})
    assert buf.sum_tree[4] == pytest.approx(5.0)
    with pytest.raises(ValueError, match="indices"):
        buf.update_priorities(np.array([7]), np.array([1.0]))
    with pytest.raises(ValueError, match="finite"):
        buf.update_priorities(np.array([1]), np.array([np.nan]))
    with pytest.raises(ValueError, match="shape"):
        buf.update_priorities(np.array([1, 2]), np.array([1.0]))


def test_prioritized_state_roundtrip():
    buf = PrioritizedReplayBuffer(16, seed=3)
    buf.add({"x": np.arange(12.0)})
    buf.update_priorities(np.arange(12), np.linspace(0.1, 2.0, 12))
    other = PrioritizedReplayBuffer(16, seed=4)
    other.load_state_dict(buf.state_dict())
    assert other.sum_tree.root == pytest.approx(buf.sum_tree.root)
    a, b = buf.sample(32), other.sample(32)
    np.testing.assert_array_equal(a["indices"], b["indices"])
    np.testing.assert_allclose(a["weights"], b["weights"])
