"""Feature squeezing (Xu et al. 2018) against a direct numpy computation of the squeezers and torch softmax scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedarena.engine import nn
from fedarena.robustness.feature_squeezing import (FeatureSqueezingDetector, Squeezer, bit_depth_reduce,
                                                   fit_threshold, median_smooth, squeezing_scores)


def _nearest_level(x, bits):
    levels = np.arange(2 ** bits) / (2 ** bits - 1)
    return levels[np.argmin(np.abs(x[..., None] - levels), axis=-1)]


def _median_brute_force(images, size):
    """Window offsets -(size // 2) .. size - 1 - size // 2, half-sample symmetric padding, upper median."""
    lo = size // 2
    hi = size - 1 - lo
    padded = np.pad(images, ((0, 0), (lo, hi), (lo, hi)), mode="symmetric")
    out = np.empty_like(images)
    n, h, w = images.shape
    for b in range(n):
        for i in range(h):
            for j in range(w):
                window = np.sort(padded[b, i:i + size, j:j + size].ravel())
                out[b, i, j] = window[size * size // 2]
    return out


def test_bit_depth_is_the_nearest_level():
    x = np.random.default_rng(0).random((5, 64))
    x[0, :3] = [0.0, 1.0, 0.7]  # the ends, and no value exactly halfway between two levels (rounding ties)
    for bits in (1, 2, 3, 5):
        np.testing.assert_allclose(bit_depth_reduce(x, bits), _nearest_level(x, bits), atol=1e-12)
    assert set(np.unique(bit_depth_reduce(x, 1))) <= {0.0, 1.0}


@pytest.mark.quick
@pytest.mark.parametrize("size", [2, 3])
def test_median_smoothing_equals_the_brute_force_window_median(size):
    x = np.random.default_rng(1).integers(0, 17, (4, 64)) / 16.0  # digits' grey levels, with ties
    ours = median_smooth(x, size, (8, 8))
    assert ours.shape == x.shape
    np.testing.assert_array_equal(ours.reshape(4, 8, 8), _median_brute_force(x.reshape(4, 8, 8), size))


@pytest.mark.quick
def test_scores_equal_torch_softmax_l1_and_the_threshold_keeps_the_false_positive_rate():
    model = nn.MLP([64, 16, 10], activation="relu")
    params = model.init(4, dtype=np.float64)
    net = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10)).double()
    with torch.no_grad():
        for layer, p in zip([net[0], net[2]], params):
            layer.weight.copy_(torch.from_numpy(p["w"].T.copy()))
            layer.bias.copy_(torch.from_numpy(p["b"]))
    x = np.random.default_rng(2).integers(0, 17, (30, 64)) / 16.0
    squeezers = [Squeezer("bit_depth", 2), Squeezer("median", 2)]
    ours = squeezing_scores(model.apply, params, x, squeezers, (8, 8))

    def probs(a):
        with torch.no_grad():
            return torch.softmax(net(torch.from_numpy(a)), dim=1).numpy()

    ref = np.stack([np.abs(probs(x) - probs(_nearest_level(x, 2))).sum(1),
                    np.abs(probs(x) - probs(_median_brute_force(x.reshape(30, 8, 8), 2).reshape(30, 64))).sum(1)], 1)
    np.testing.assert_allclose(ours, ref, atol=1e-10)

    det = FeatureSqueezingDetector.fit(model.apply, params, x, squeezers, (8, 8), false_positive_rate=0.1)
    joint = ref.max(axis=1)
    assert det.threshold == pytest.approx(fit_threshold(joint, 0.1))
    np.testing.assert_array_equal(det.detect(model.apply, params, x), joint > det.threshold)
    assert np.mean(joint > det.threshold) <= 0.1


def test_threshold_is_the_smallest_with_the_rate_by_brute_force():
    s = np.random.default_rng(3).exponential(size=57).round(2)  # ties
    for fpr in (0.0, 0.05, 0.1, 0.5):
        t = fit_threshold(s, fpr)
        ok = [c for c in np.unique(s) if np.mean(s > c) <= fpr]
        assert t == min(ok)
    with pytest.raises(ValueError, match="false_positive_rate"):
        fit_threshold(s, 1.0)
    with pytest.raises(ValueError, match="kind"):
        Squeezer("blur", 2)
    with pytest.raises(ValueError, match="param"):
        Squeezer("bit_depth", 0)
