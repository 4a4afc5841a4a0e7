"""Upload stages: clipping, top-k and 8-bit encoders against brute force, and strict server-side decoding."""

import numpy as np
import pytest

from fedarena.federated.stages import Clip, GaussianLDP, decode_update, encode_update, global_norm
from fedarena.federated.wire import WireError, decode, encode

SHAPES = {"w": (4, 5), "b": (5,)}


def _delta(seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def _through_wire(payload):
    return decode(encode("upload", {"update": payload})).body["update"]


def test_clip_scales_to_the_bound_and_leaves_small_updates():
    d = _delta()
    n = global_norm(d)
    out = Clip(n / 2)(d, np.random.default_rng(0))
    assert global_norm(out) == pytest.approx(n / 2, rel=1e-6)
    for k in d:  # same direction
        np.testing.assert_allclose(out[k], d[k] / 2, rtol=1e-6)
    same = Clip(2 * n)(d, np.random.default_rng(0))
    for k in d:
        np.testing.assert_array_equal(same[k], d[k])


def test_dense_round_trip_is_exact():
    d = _delta()
    got = decode_update("dense", _through_wire(encode_update(d, "dense", np.random.default_rng(0))), SHAPES)
    for k in d:
        np.testing.assert_array_equal(got[k], d[k])


def test_topk_keeps_exactly_the_largest_magnitudes():
    d = _delta(1)
    payload = _through_wire(encode_update(d, "topk", np.random.default_rng(0), topk_fraction=0.25))
    got = decode_update("topk", payload, SHAPES)
    for k, v in d.items():
        flat = v.ravel()
        k_keep = int(np.ceil(0.25 * flat.size))
        keep = set(np.argsort(-np.abs(flat))[:k_keep].tolist())  # brute force
        expect = np.array([flat[i] if i in keep else 0.0 for i in range(flat.size)]).reshape(v.shape)
        np.testing.assert_array_equal(got[k], expect)


@pytest.mark.quick
def test_q8_is_unbiased_and_within_one_step():
    d = _delta(2)
    rng = np.random.default_rng(5)
    draws = [decode_update("q8", _through_wire(encode_update(d, "q8", rng)), SHAPES) for _ in range(400)]
    for k, v in d.items():
        step = (v.max() - v.min()) / 255.0
        for g in draws[:5]:
            assert np.abs(g[k] - v).max() <= step * (1 + 1e-6)
        mean = np.mean([g[k] for g in draws], axis=0)
        # std of the mean of 400 draws of an error bounded by one step is <= step / 40
        assert np.abs(mean - v).max() < step / 8


def test_ldp_stage_clips_and_adds_calibrated_noise():
    from fedarena.privacy.ldp import GaussianMechanism

    d = _delta(3)
    stage = GaussianLDP(epsilon=2.0, delta=1e-5, clip_norm=0.5)
    sigma = GaussianMechanism(epsilon=2.0, delta=1e-5, clip_norm=0.5).sigma
    outs = [stage(d, np.random.default_rng(i)) for i in range(200)]
    noise = np.concatenate([np.concatenate([o[k].ravel() for k in sorted(o)]) for o in outs])
    clipped = Clip(0.5)(d, None)
    mean_signal = np.concatenate([clipped[k].ravel() for k in sorted(clipped)])
    resid = noise.reshape(200, -1) - mean_signal
    assert resid.std() == pytest.approx(sigma, rel=0.05)
    assert set(outs[0]) == set(d) and all(outs[0][k].shape == d[k].shape for k in d)


@pytest.mark.parametrize(
    "encoding, payload, field, reason",
    [
        ("gzip", {}, "body.encoding", "unknown encoding"),
        ("dense", [], "body.update", "expected a map"),
        ("dense", {"w": np.zeros((4, 5), np.float32)}, "body.update", "missing ['b']"),
        ("dense", {"w": np.zeros((4, 5), np.float32), "b": np.zeros(5, np.float32), "x": np.zeros(1, np.float32)},
         "body.update", "unexpected ['x']"),
        ("dense", {"w": np.zeros((5, 4), np.float32), "b": np.zeros(5, np.float32)}, "body.update.w", "expected shape"),
        ("dense", {"w": np.zeros((4, 5), np.float64), "b": np.zeros(5, np.float32)}, "body.update.w", "expected dtype"),
        ("dense", {"w": np.full((4, 5), np.nan, np.float32), "b": np.zeros(5, np.float32)}, "body.update.w", "NaN"),
        ("dense", {"w": np.zeros((4, 5), np.float32), "b": np.array([np.inf] * 5, np.float32)}, "body.update.b", "NaN or Inf"),
        ("dense", {"w": "zeros", "b": np.zeros(5, np.float32)}, "body.update.w", "expected an array"),
        ("topk", {"w": {"indices": np.array([20], np.uint32), "values": np.ones(1, np.float32)},
                  "b": {"indices": np.zeros(0, np.uint32), "values": np.zeros(0, np.float32)}},
         "body.update.w.indices", "out of range"),
        ("topk", {"w": {"indices": np.array([3, 3], np.uint32), "values": np.ones(2, np.float32)},
                  "b": {"indices": np.zeros(0, np.uint32), "values": np.zeros(0, np.float32)}},
         "body.update.w.indices", "strictly increasing"),
        ("topk", {"w": {"indices": np.array([3], np.uint32), "values": np.ones(2, np.float32)},
                  "b": {"indices": np.zeros(0, np.uint32), "values": np.zeros(0, np.float32)}},
         "body.update.w", "equal-length"),
        ("topk", {"w": {"indices": np.array([3], np.int64), "values": np.ones(1, np.float32)},
                  "b": {"indices": np.zeros(0, np.uint32), "values": np.zeros(0, np.float32)}},
         "body.update.w.indices", "expected dtype"),
        ("topk", {"w": {"indices": np.arange(21, dtype=np.uint32), "values": np.ones(21, np.float32)},
                  "b": {"indices": np.zeros(0, np.uint32), "values": np.zeros(0, np.float32)}},
         "body.update.w.indices", "21 entries for a tensor of 20"),
        ("topk", {"w": {"indices": np.zeros(0, np.uint32)}, "b": {}}, "body.update.w", "exactly 'indices' and 'values'"),
        ("q8", {"w": {"q": np.zeros((4, 5), np.uint8), "lo": 0.0, "scale": -1.0},
                "b": {"q": np.zeros(5, np.uint8), "lo": 0.0, "scale": 1.0}}, "body.update.w.scale", "must be >= 0"),
        ("q8", {"w": {"q": np.zeros((4, 5), np.uint8), "lo": float("nan"), "scale": 1.0},
                "b": {"q": np.zeros(5, np.uint8), "lo": 0.0, "scale": 1.0}}, "body.update.w.lo", "finite"),
        ("q8", {"w": {"q": np.zeros((4, 5), np.uint8), "lo": "0", "scale": 1.0},
                "b": {"q": np.zeros(5, np.uint8), "lo": 0.0, "scale": 1.0}}, "body.update.w.lo", "expected a number"),
        ("q8", {"w": {"q": np.zeros((4, 5), np.uint8), "lo": 0.0, "scale": 1e308},
                "b": {"q": np.full(5, 255, np.uint8), "lo": 1e308, "scale": 1e308}}, "body.update.b", "not finite"),
    ],
)
def test_decode_rejects_malformed_payloads(encoding, payload, field, reason):
    with pytest.raises(WireError) as info:
        decode_update(encoding, payload, SHAPES)
    assert info.value.field == field
    assert reason in info.value.reason
