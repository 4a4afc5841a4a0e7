"""The TensorBoard event writer: CRC-32C test vector, and events decoded by TensorBoard's own protobuf schema."""

from __future__ import annotations

import pytest

from fedarena.platform import tensorboard as tb


def test_crc32c_known_vector():
    # RFC 3720, appendix B.4 check value of CRC-32C over the ASCII digits
    assert tb.crc32c(b"123456789") == 0xE3069283
    assert tb.crc32c(b"") == 0


def test_events_decode_with_tensorboard_schema(tmp_path):
    event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
    w = tb.EventWriter(tmp_path)
    w.add_scalars(1, {"loss": 0.5, "acc": 0.25})
    w.add_scalars(300, {"loss": 0.125})
    w.close()
    records = list(tb.read_records(w.path))
    events = [event_pb2.Event.FromString(r) for r in records]
    assert events[0].file_version == "brain.Event:2"
    assert [(e.step, [(v.tag, v.simple_value) for v in e.summary.value]) for e in events[1:]] == [
        (1, [("loss", 0.5), ("acc", 0.25)]), (300, [("loss", 0.125)])]
    assert [tb.event_step(r) for r in records] == [0, 1, 300]


def test_truncate_drops_later_steps_and_torn_tail(tmp_path):
    w = tb.EventWriter(tmp_path)
    for step in range(1, 6):
        w.add_scalars(step, {"x": float(step)})
    w.close()
    with open(w.path, "ab") as f:
        f.write(b"\x10\x00\x00")  # torn record from a crash
    tb.truncate_events(tmp_path, 3)
    assert [tb.event_step(r) for r in tb.read_records(w.path)] == [0, 1, 2, 3]
