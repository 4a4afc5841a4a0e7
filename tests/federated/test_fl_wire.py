"""Wire codec: exact round trips and strict rejection of malformed input."""

import struct

import msgpack
import numpy as np
import pytest

from fedarena.federated import wire
from fedarena.federated.wire import Limits, WireError


@pytest.mark.quick
def test_round_trip_preserves_values_dtypes_and_bytes():
    rng = np.random.default_rng(0)
    body = {
        "round": 3,
        "big": 2**63 + 5,
        "neg": -(2**63),
        "lr": 0.125,
        "name": "client-7",
        "nonce": b"\x00\xff" * 8,
        "flag": True,
        "none": None,
        "nested": {"a": [1, 2.5, "x", [np.arange(3, dtype=np.int64)]]},
        "w": rng.standard_normal((4, 5)).astype(np.float32),
        "d": rng.standard_normal(7),
        "h": np.array([1.5, -2.0], dtype=np.float16),
        "m": rng.integers(0, 2, size=(2, 3)).astype(bool),
        "u8": np.arange(256, dtype=np.uint8),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "scalar": np.array(4.0, dtype=np.float64),
        "fortran": np.asfortranarray(rng.standard_normal((3, 2))),
        "bigendian": np.arange(5, dtype=">i4"),
    }
    msg = wire.decode(wire.encode("update", body))
    assert msg.kind == "update"
    out = msg.body
    for key in ("round", "big", "neg", "lr", "name", "nonce", "flag", "none"):
        assert out[key] == body[key]
    for key in ("w", "d", "h", "m", "u8", "empty", "scalar", "fortran"):
        assert out[key].dtype == body[key].dtype
        assert out[key].shape == body[key].shape
        assert out[key].tobytes() == np.ascontiguousarray(body[key]).tobytes()
    assert out["bigendian"].dtype == np.dtype("<i4")
    np.testing.assert_array_equal(out["bigendian"], np.arange(5))
    np.testing.assert_array_equal(out["nested"]["a"][3][0], np.arange(3))
    out["w"][0, 0] = 99.0  # decoded arrays own writable memory


def test_array_layout_matches_documented_format():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    obj = msgpack.unpackb(wire.encode("k", {"a": arr}), raw=False)
    ext = obj["body"]["a"]
    assert isinstance(ext, msgpack.ExtType) and ext.code == wire.ARRAY_EXT_CODE
    (hlen,) = struct.unpack(">H", ext.data[:2])
    assert msgpack.unpackb(ext.data[2 : 2 + hlen]) == ["<f4", [2, 3]]
    assert ext.data[2 + hlen :] == arr.tobytes()


def _ext(dtype, shape, data):
    header = msgpack.packb([dtype, shape])
    return msgpack.ExtType(1, struct.pack(">H", len(header)) + header + data)


def _env(body, v=1, kind="update", **extra):
    d = {"v": v, "kind": kind, "body": body}
    d.update(extra)
    return msgpack.packb(d, use_bin_type=True)


@pytest.mark.parametrize(
    "data, field, reason",
    [
        (b"\xc1", "message", "not a valid msgpack"),
        (b"", "message", "not a valid msgpack"),
        (_env({}) + b"\x00", "message", "trailing bytes"),
        (msgpack.packb([1, 2]), "message", "envelope must be a map"),
        (_env({}, v=2), "v", "unsupported wire version 2"),
        (_env({}, v=True), "v", "unsupported wire version"),
        (_env({}, kind=""), "kind", "non-empty string"),
        (_env([]), "body", "must be a map"),
        (_env({}, extra=1), "message", "unknown envelope keys"),
        (_env({"a": _ext("|O", [1], b"x" * 8)}), "array.dtype", "allow-list"),
        (_env({"a": _ext(">f4", [1], b"x" * 4)}), "array.dtype", "allow-list"),
        (_env({"a": _ext("<f4", [3], b"x" * 8)}), "array.data", "needs 12"),
        (_env({"a": _ext("<f4", [-1], b"")}), "array.shape", "non-negative"),
        (_env({"a": _ext("<f4", [1.5], b"")}), "array.shape", "non-negative"),
        (_env({"a": _ext("<f4", [1] * 9, b"x" * 4)}), "array.shape", "at most 8"),
        (_env({"a": _ext("<f4", [2**40, 2**40], b"")}), "array.shape", "exceed the limit"),
        (_env({"a": _ext("|b1", [2], b"\x01\x07")}), "array.data", "other than 0 and 1"),
        (_env({"a": msgpack.ExtType(1, b"\xff\xff")}), "array", "runs past"),
        (_env({"a": msgpack.ExtType(1, b"\x00")}), "array", "shorter than"),
        (_env({"a": msgpack.ExtType(1, b"\x00\x01\xc1")}), "array.header", "not valid msgpack"),
        (_env({"a": msgpack.ExtType(1, b"\x00\x01\x01")}), "array.header", "must be [dtype, shape]"),
        (_env({"a": msgpack.ExtType(5, b"abc")}), "ext", "unknown msgpack extension type 5"),
        (_env({"a": msgpack.Timestamp(1, 0)}), "body.a", "not allowed"),
    ],
)
@pytest.mark.quick
def test_malformed_input_is_rejected_with_named_field(data, field, reason):
    with pytest.raises(WireError) as info:
        wire.decode(data)
    assert info.value.field == field
    assert reason in info.value.reason


def test_limits_apply_to_size_depth_and_kind():
    limits = Limits(max_message_bytes=1000, max_depth=3, max_elements=10)
    with pytest.raises(WireError, match="exceed the limit of 1000"):
        wire.encode("k", {"a": b"x" * 2000}, limits)
    big = wire.encode("k", {"a": b"x" * 2000})
    with pytest.raises(WireError, match="exceed the limit of 1000"):
        wire.decode(big, limits)
    deep = {"a": [[[[[1]]]]]}
    with pytest.raises(WireError, match="nesting deeper than 3"):
        wire.decode(wire.encode("k", deep), limits)
    with pytest.raises(WireError, match="nesting deeper than 3"):
        wire.encode("k", deep, limits)
    with pytest.raises(WireError, match="11 elements exceed"):
        wire.decode(wire.encode("k", {"a": np.zeros(11)}), limits)
    with pytest.raises(WireError, match="unknown message kind 'bogus'"):
        wire.decode(wire.encode("bogus", {}), kinds={"update"})
    # a hostile, extremely nested msgpack blob fails cleanly (no RecursionError escapes)
    hostile = b"\x81\xa1v\x01" + b"\x91" * 100000 + b"\xc0"
    with pytest.raises(WireError):
        wire.decode(hostile)


def test_encode_refuses_unsendable_values():
    with pytest.raises(WireError, match="body.x: type object cannot be sent"):
        wire.encode("k", {"x": object()})
    with pytest.raises(WireError, match="only bool, int, uint, float"):
        wire.encode("k", {"x": np.array(["a"])})
    with pytest.raises(WireError, match="body.x: dtype complex128"):
        wire.encode("k", {"x": np.zeros(2, dtype=complex)})
    with pytest.raises(WireError, match="not a string"):
        wire.encode("k", {"x": {1: 2}})
    with pytest.raises(WireError, match="does not fit 64 bits"):
        wire.encode("k", {"x": 2**64})


def test_field_helpers_name_the_field():
    body = {"round": 3, "flag": True, "lr": 1, "w": np.array([1.0, np.nan], dtype=np.float32)}
    assert wire.field(body, "round", int) == 3
    assert wire.field(body, "lr", float) == 1.0 and isinstance(wire.field(body, "lr", float), float)
    assert wire.field(body, "missing", int, default=7) == 7
    with pytest.raises(WireError, match=r"body.flag: expected int, got bool"):
        wire.field(body, "flag", int)
    with pytest.raises(WireError, match=r"body.missing: missing required field"):
        wire.field(body, "missing", int)
    with pytest.raises(WireError, match=r"body.w: contains NaN or Inf"):
        wire.array_field(body, "w", finite=True)
    with pytest.raises(WireError, match=r"body.w: expected shape \(3,\), got \(2,\)"):
        wire.array_field(body, "w", shape=(3,))
    with pytest.raises(WireError, match=r"body.w: expected dtype <f8, got <f4"):
        wire.array_field(body, "w", dtype="float64")


@pytest.mark.parametrize("size, chunk", [(0, 10), (1, 10), (10, 10), (11, 10), (12345, 1000)])
def test_frames_round_trip(size, chunk):
    data = bytes(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8))
    frames = list(wire.split_frames(data, chunk))
    assert len(frames) == max(1, -(-size // chunk))
    assert wire.join_frames(frames) == data


def test_frame_assembler_rejects_bad_streams():
    data = bytes(range(256)) * 10
    frames = list(wire.split_frames(data, 100))
    with pytest.raises(WireError, match="expected frame 1, got 2"):
        wire.join_frames([frames[0], frames[2]])
    with pytest.raises(WireError, match="ended after 2 of 26 frames"):
        wire.join_frames(frames[:2])
    with pytest.raises(WireError, match="frames after the last"):
        wire.join_frames(frames + [frames[-1]])
    with pytest.raises(WireError, match="total_bytes: 2560 bytes exceed"):
        wire.join_frames(frames, Limits(max_message_bytes=1000))
    with pytest.raises(WireError, match="26 frames outside"):
        wire.join_frames(frames, Limits(max_frames=10))
    liar = msgpack.packb([1, 0, 1, 3, b"abcdef"])
    with pytest.raises(WireError, match="more than the declared 3 bytes"):
        wire.join_frames([liar])
    short = msgpack.packb([1, 0, 1, 10, b"abc"])
    with pytest.raises(WireError, match="carried 3 bytes, declared 10"):
        wire.join_frames([short])
    with pytest.raises(WireError, match="frame.v"):
        wire.join_frames([msgpack.packb([9, 0, 1, 1, b"a"])])
    with pytest.raises(WireError, match="frame.index"):
        wire.join_frames([msgpack.packb([1, -1, 1, 1, b"a"])])
    with pytest.raises(WireError, match="frame.chunk"):
        wire.join_frames([msgpack.packb([1, 0, 1, 1, "a"])])
    with pytest.raises(WireError, match="changed in the middle"):
        wire.join_frames([frames[0], msgpack.packb([1, 1, 27, 2560, b"a"])])


def test_random_bytes_never_escape_as_other_exceptions():
    rng = np.random.default_rng(1)
    valid = wire.encode("update", {"w": np.ones((3, 3), np.float32), "round": 1, "s": "x"})
    for i in range(2000):
        if i % 2:
            data = bytes(rng.integers(0, 256, rng.integers(0, 64), dtype=np.uint8))
        else:
            buf = bytearray(valid)
            for _ in range(rng.integers(1, 4)):
                buf[rng.integers(len(buf))] = rng.integers(256)
            data = bytes(buf[: rng.integers(1, len(buf) + 1)])
        try:
            wire.decode(data)
        except WireError:
            pass
