"""Hostile checkpoint and parameter files: zip bombs (declared and understated sizes) are refused without
inflating past the limit (peak memory measured with tracemalloc), malformed trees behind a valid checksum
fall back to the older checkpoint, pickled or non-array entries are refused, and checkpoints and league
snapshots carry an HMAC-SHA256 (checked here against ``hmac`` itself) when ``FEDARENA_CHECKPOINT_KEY`` is set."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedarena import engine
from fedarena.marl.league.store import SnapshotError, SnapshotStore
from fedarena.npz import ArchiveError, read_npz
from fedarena.platform import checkpoint as ckpt
from fedarena.platform.runs import execute, read_metrics

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
KEY = "k" * 40


def _npy_header(shape: tuple, descr: str = "<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _bomb(inflated: int, declared: int | None = None, extra: dict | None = None) -> bytes:
    """A zip with one deflated ``.npy`` entry ``a`` of ``inflated`` bytes (a float32 vector's header, then
    zeros), streamed in 1 MiB pieces; ``declared`` rewrites the uncompressed size in both zip headers (a bomb
    that understates, or states, its size); the npy header always matches the declared size."""
    size = inflated if declared is None else declared
    header = _npy_header(((size - len(_npy_header((0,)))) // 4,))
    assert (size - len(header)) % 4 == 0
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, arr in (extra or {}).items():
            zf.writestr(f"{name}.npy", _npy_bytes(arr))
        with zf.open("a.npy", "w", force_zip64=inflated > 0xFFFF0000) as f:
            f.write(header)
            left, zeros = inflated - len(header), bytes(MiB)
            while left > 0:
                f.write(zeros[:min(left, MiB)])
                left -= MiB
    blob = bytearray(out.getvalue())
    if declared is not None:   # local header (offset 22) and central directory (offset 24) of entry a.npy
        local = blob.rfind(b"PK\x03\x04")
        central = blob.rfind(b"PK\x01\x02")
        struct.pack_into("<I", blob, local + 22, declared)
        struct.pack_into("<I", blob, central + 24, declared)
    return bytes(blob)


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _peak(fn) -> tuple[Exception, int]:
    """The exception ``fn`` raises and the peak of memory traced while it ran."""
    tracemalloc.start()
    try:
        fn()
    except Exception as exc:   # noqa: BLE001 - returned to the caller, which checks its type
        err = exc
    else:
        err = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert err is not None, "the hostile archive was accepted"
    return err, peak


def _forge_checkpoint(meta, arrays: dict | None = None) -> bytes:
    """A checkpoint file with a valid SHA-256 over whatever payload (written here, not by fedarena)."""
    buf = io.BytesIO()
    raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    np.savez(buf, __meta__=np.frombuffer(raw, dtype=np.uint8), **(arrays or {}))
    payload = buf.getvalue()
    return b"FDCK1\n" + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def test_bomb_that_declares_its_size_is_refused_before_inflating():
    blob = _bomb(64 * MiB)
    assert len(blob) < MiB and zipfile.ZipFile(io.BytesIO(blob)).infolist()[0].file_size == 64 * MiB
    err, peak = _peak(lambda: read_npz(blob, max_bytes=8 * MiB))
    assert isinstance(err, ArchiveError) and "more than the limit" in str(err)
    assert peak < MiB   # nothing inflated


def test_bomb_that_understates_its_size_stops_at_the_declared_size():
    # the entry declares 4 MiB (under the 8 MiB cap) and inflates to 64 MiB: the reader returns at most the
    # declared size, whose CRC-32 then fails
    blob = _bomb(64 * MiB, declared=4 * MiB)
    err, peak = _peak(lambda: read_npz(blob, max_bytes=8 * MiB))
    assert isinstance(err, ArchiveError) and "CRC" in str(err)
    assert peak < 2 * 8 * MiB


def test_npy_header_larger_than_its_entry_is_refused_before_allocating():
    header = _npy_header((1 << 30,))   # 4 GiB of float32 claimed by a 100-byte entry
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("a.npy", header + bytes(16))
    err, peak = _peak(lambda: read_npz(buf.getvalue()))
    assert isinstance(err, ArchiveError) and "header says shape (1073741824,)" in str(err)
    assert peak < MiB


def test_800_mb_bomb_is_refused_by_the_parameter_loader_at_its_default_limit(tmp_path):
    # the case: a small file declaring 800 MB; the default cap is max(256 MiB, 4 x file size)
    path = tmp_path / "params.npz"
    path.write_bytes(_bomb(MiB, declared=800_000_000))
    err, peak = _peak(lambda: engine.load_params(path))
    assert isinstance(err, engine.ParamsFileError) and "800000000 bytes decompressed" in str(err)
    assert peak < MiB


@pytest.mark.parametrize("entries, message", [
    ({"o.npy": _npy_bytes(np.zeros(2)).replace(b"'<f8'", b"'|O' ")}, "dtype object"),
    ({"r.npy": _npy_bytes(np.zeros(2, dtype=[("x", "<f4")]))}, "not a plain numeric"),
    ({"x.txt": b"hello"}, "not a .npy array"),
    ({"a.npy": b"\x93NUMPY\x09\x00junk"}, r"format version \(9, 0\)"),
    ({"a.npy": b"\x93NUMPY\x01\x00\x20\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}\n"},
     "malformed .npy header"),   # header length cuts the dict: numpy's parser raises a TokenError
    ({"a.npy": _npy_bytes(np.zeros(2)).replace(b"'<f8'", b"os.ab")}, "malformed .npy header"),
])
def test_entries_other_than_plain_arrays_are_refused(entries, message):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    with pytest.raises(ArchiveError, match=message):
        read_npz(buf.getvalue())


def test_read_npz_matches_np_load_on_ordinary_archives():
    arrays = {"x": np.arange(12.0).reshape(3, 4), "f": np.asfortranarray(np.arange(6).reshape(2, 3)),
              "s": np.array(["ab", "c"]), "e": np.zeros((0, 3), np.int8), "b": np.array(True), "c": np.ones(2, ">c16")}
    for save in (np.savez, np.savez_compressed):
        buf = io.BytesIO()
        save(buf, **arrays)
        ours = read_npz(buf.getvalue())
        with np.load(io.BytesIO(buf.getvalue()), allow_pickle=False) as ref:
            assert sorted(ours) == sorted(ref.files)
            for k in ref.files:
                assert ours[k].dtype == ref[k].dtype and ours[k].shape == ref[k].shape
                assert np.array_equal(ours[k], ref[k]) and ours[k].flags.f_contiguous == ref[k].flags.f_contiguous


@pytest.mark.parametrize("meta, reason", [
    ({"dict": {"step": {"value": 3}, "state": {"array": "a7"}}}, "array 'a7' at '/state' is not in the archive"),
    ({"dict": {"step": {"value": 3}, "state": {"pickle": "x"}}}, "malformed node 'pickle' at '/state'"),
    ({"dict": {"step": {"value": 3}, "state": {"dict": [1, 2]}}}, "malformed node 'dict' at '/state'"),
    ({"dict": {"step": {"value": 3}, "state": {"value": {"a": 1}}}}, "malformed node 'value'"),
    ({"list": [{"value": 1}], "dict": {}}, "malformed node at '/'"),
    (b"\xff not json", "unreadable payload"),
    ({"dict": {"step": {"value": 3}, "state": json.loads('{"list": [' * 100 + "]}" * 100)}}, "nested more than 64"),
    ({"dict": {"step": {"value": "3"}, "state": {"value": 0}}}, "step '3' is not a non-negative integer"),
])
def test_malformed_tree_behind_a_valid_checksum_is_a_checkpoint_error(tmp_path, meta, reason):
    path = tmp_path / "ckpt-000000003.fdck"
    path.write_bytes(_forge_checkpoint(meta))
    with pytest.raises(ckpt.CheckpointError, match=reason.replace("(", r"\(").replace("[", r"\[")):
        ckpt.load(path)


def test_bad_newest_checkpoints_fall_back_to_the_older_one_with_a_warning(tmp_path):
    ckpt.save(tmp_path, 1, {"w": np.ones(3)}, keep=5)
    ckpt.checkpoint_path(tmp_path, 2).write_bytes(_forge_checkpoint({"dict": {"step": {"value": 2}, "state": {"x": 0}}}))
    bomb = _bomb(MiB, declared=900_000_000)
    ckpt.checkpoint_path(tmp_path, 3).write_bytes(b"FDCK1\n" + hashlib.sha256(bomb).hexdigest().encode() + b"\n" + bomb)
    warnings: list[str] = []
    step, state = ckpt.load_newest_valid(tmp_path, warn=warnings.append)
    assert step == 1 and np.array_equal(state["w"], np.ones(3))
    assert len(warnings) == 2
    assert "ckpt-000000003.fdck" in warnings[0] and "more than the limit" in warnings[0]
    assert "ckpt-000000002.fdck" in warnings[1] and "malformed node 'x'" in warnings[1]


def test_resume_skips_a_malformed_newest_checkpoint_and_equals_the_uninterrupted_run(tmp_path):
    out = tmp_path / "run"
    overrides = ["iterations=40", "checkpoint.every=10", "checkpoint.keep=5", "algorithms=[fictitious_play]"]
    execute(ROOT / "experiments/quickstart.yaml", overrides, out=out, quiet=True, report=False)
    reference = [{k: v for k, v in r.items() if k != "wall_time"} for r in read_metrics(out)]
    # the case: a tree whose node lacks the key the loader looks up, behind a valid SHA-256
    newest = ckpt.checkpoint_path(out / "checkpoints", 40)
    newest.write_bytes(_forge_checkpoint({"dict": {"step": {"value": 40}, "state": {"dict": {"experiment": {}}}}}))
    status = json.loads((out / "status.json").read_text())
    (out / "status.json").write_text(json.dumps({**status, "state": "running"}))
    execute(None, [], resume=out, quiet=True, report=False)
    log = (out / "run.log").read_text()
    assert "skipping bad checkpoint" in log and "ckpt-000000040.fdck: unreadable payload: malformed node" in log
    assert "resumed from checkpoint at step 30" in log
    assert [{k: v for k, v in r.items() if k != "wall_time"} for r in read_metrics(out)] == reference


def test_checkpoint_hmac(tmp_path, monkeypatch):
    plain = ckpt.save(tmp_path / "plain", 1, {"w": np.arange(3)}, keep=2)
    monkeypatch.setenv(ckpt.KEY_ENV, KEY)
    path = ckpt.save(tmp_path, 5, {"w": np.arange(3)}, keep=2)
    blob = path.read_bytes()
    head, payload = blob.split(b"\n", 2)[1], blob.split(b"\n", 2)[2]
    assert head.decode() == "hmac-sha256:" + hmac.new(KEY.encode(), payload, hashlib.sha256).hexdigest()
    assert ckpt.load(path)[0] == 5
    with pytest.raises(ckpt.CheckpointError, match="has no HMAC"):   # a plain SHA-256 file is refused
        ckpt.load(plain)
    forged = tmp_path / "ckpt-000000006.fdck"   # a valid SHA-256 does not stand in for the MAC
    forged.write_bytes(_forge_checkpoint({"dict": {"step": {"value": 6}, "state": {"value": 0}}}))
    with pytest.raises(ckpt.CheckpointError, match="has no HMAC"):
        ckpt.load(forged)
    tampered = blob[:-1] + bytes([blob[-1] ^ 1])
    path.write_bytes(tampered)
    with pytest.raises(ckpt.CheckpointError, match="HMAC mismatch"):
        ckpt.load(path)
    path.write_bytes(blob)
    monkeypatch.setenv(ckpt.KEY_ENV, "x" * 40)
    with pytest.raises(ckpt.CheckpointError, match="HMAC mismatch"):
        ckpt.load(path)
    monkeypatch.delenv(ckpt.KEY_ENV)
    with pytest.raises(ckpt.CheckpointError, match="written with a key"):
        ckpt.load(path)
    monkeypatch.setenv(ckpt.KEY_ENV, "short")
    with pytest.raises(ckpt.CheckpointError, match="at least 32"):
        ckpt.load(path)


def test_snapshot_hmac(tmp_path, monkeypatch):
    params = {"w": np.arange(4, dtype=np.float32)}
    store = SnapshotStore(tmp_path)
    store.save("plain", 1, params)
    monkeypatch.setenv(ckpt.KEY_ENV, KEY)
    ref = store.save("main-0", 1, params, step=7)
    m = store.manifest("main-0-v0001")
    body = json.dumps({k: v for k, v in m.items() if k != "mac"}, sort_keys=True, separators=(",", ":")).encode()
    assert m["mac"] == "hmac-sha256:" + hmac.new(KEY.encode(), body, hashlib.sha256).hexdigest()
    assert np.array_equal(store.load(ref.name)["w"], params["w"])
    with pytest.raises(SnapshotError, match="no valid HMAC"):
        store.load("plain-v0001")
    # an attacker who swaps the parameters and rewrites the manifest's SHA-256 cannot rewrite its MAC
    snap = tmp_path / "main-0-v0001"
    for f in snap.iterdir():
        f.chmod(0o600)
    engine.save_params(snap / "params.npz", {"w": np.ones(4, dtype=np.float32)})
    digest = hashlib.sha256((snap / "params.npz").read_bytes()).hexdigest()
    (snap / "manifest.json").write_text(json.dumps({**m, "sha256": digest}))
    with pytest.raises(SnapshotError, match="no valid HMAC"):
        store.load(ref.name)
    monkeypatch.delenv(ckpt.KEY_ENV)
    assert np.array_equal(store.load(ref.name)["w"], np.ones(4))   # without the key, only the SHA-256 is checked


def test_snapshot_bomb_is_refused(tmp_path):
    store = SnapshotStore(tmp_path)
    store.save("main-0", 1, {"w": np.zeros(2)})
    snap = tmp_path / "main-0-v0001"
    for f in snap.iterdir():
        f.chmod(0o600)
    bomb = _bomb(MiB, declared=800_000_000)
    (snap / "params.npz").write_bytes(bomb)
    m = json.loads((snap / "manifest.json").read_text())
    (snap / "manifest.json").write_text(json.dumps({**m, "sha256": hashlib.sha256(bomb).hexdigest()}))
    with pytest.raises(SnapshotError, match="more than the limit"):
        store.load("main-0-v0001")


def test_resume_skips_a_well_formed_checkpoint_whose_content_the_kind_cannot_load(tmp_path):
    """A tree that reads cleanly (valid checksum, valid structure) but lacks what the experiment's state needs:
    the run loop's loader rejects it, and the resume falls back to the older checkpoint instead of failing."""
    out = tmp_path / "run"
    overrides = ["iterations=40", "checkpoint.every=10", "checkpoint.keep=5", "algorithms=[fictitious_play]"]
    execute(ROOT / "experiments/quickstart.yaml", overrides, out=out, quiet=True, report=False)
    reference = [{k: v for k, v in r.items() if k != "wall_time"} for r in read_metrics(out)]
    newest = ckpt.checkpoint_path(out / "checkpoints", 40)
    newest.unlink()
    ckpt.save(out / "checkpoints", 40, {"experiment": {"fictitious_play": {"not": "its state"}},
                                        "platform": {"elapsed": 1.0}}, keep=5)
    assert ckpt.load(newest)[0] == 40  # it reads cleanly: only its content is wrong
    status = json.loads((out / "status.json").read_text())
    (out / "status.json").write_text(json.dumps({**status, "state": "running"}))
    execute(None, [], resume=out, quiet=True, report=False)
    log = (out / "run.log").read_text()
    assert "ckpt-000000040.fdck: its content does not fit this run (KeyError" in log
    assert "resumed from checkpoint at step 30" in log
    assert [{k: v for k, v in r.items() if k != "wall_time"} for r in read_metrics(out)] == reference
    assert json.loads((out / "status.json").read_text())["state"] == "completed"
