"""Coverage-guided fuzzing (atheris, libFuzzer) of the wire decoders for a few seconds each, plus crash replay.

Each target of ``fuzz_targets.py`` runs in its own process for ``FUZZ_SECONDS`` from a seed corpus of valid
messages; the decoders may refuse an input only with their own error type. Inputs that once crashed a decoder
live in ``fuzz_regressions/<target>/`` and are replayed on every run (without atheris).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
FUZZ_SECONDS = int(os.environ.get("FEDARENA_FUZZ_SECONDS", "3"))
sys.path.insert(0, str(HERE))
import fuzz_targets  # noqa: E402


def _seeds(target: str) -> list[bytes]:
    from fedarena.federated import wire
    from fedarena.federated.protocol import RoundConfig

    if target == "fl_wire":
        body = {"client_id": "a", "token": "t" * 64, "round": 3, "model_version": 2, "num_examples": 10,
                "nonce": os.urandom(16), "encoding": "dense", "train_loss": 0.5, "config": RoundConfig().to_body(),
                "update": {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float64)},
                "flags": [True, None, -1, 2**63, "x"], "mask": np.array([True, False])}
        data = wire.encode("upload", body)
        return [data, b"\xff\xfe".join(wire.split_frames(data, 64)), wire.encode("ping", {})]
    if target == "secagg":
        from fedarena.privacy.secagg import messages as sam

        k = bytes(range(32))
        msgs = [sam.AdvertiseKeys(1, 2, k, k[::-1]), sam.KeyBroadcast(1, 2, k, (1, 2, 3), {1: (k, k), 3: (k, k)}),
                sam.ShareKeys(1, 2, {3: b"abc", 4: b""}), sam.ShareBroadcast(1, 2, {1: b"xyz"}),
                sam.MaskedInput(1, 2, np.arange(5, dtype=np.uint32)), sam.UnmaskRequest(1, 2, (1, 2), (3,)),
                sam.UnmaskShares(1, 2, {1: np.arange(32, dtype=np.uint16)}, {3: np.ones(32, np.uint16)})]
        return [sam.encode(m) for m in msgs]
    from fedarena.federated.vertical import messages as vm, psi

    msgs = [psi.ServerHello(1024, b"\x80" + bytes(126) + b"\x01", 65537, 3, 4), psi.ClientHello(3, 4),
            psi.ServerTags(0, 1, bytes(32), True), psi.Blinded(0, 1, bytes(127) + b"\x05", True),
            psi.Signed(0, 1, bytes(128)), psi.Matches(1, bytes(32))]
    return [vm.encode(m) for m in msgs] + [b"\x02\x40" + (12345).to_bytes(16, "big") * 2]


@pytest.mark.parametrize("target", sorted(fuzz_targets.TARGETS))
def test_fuzz_decoder_finds_no_crash(target, tmp_path):
    pytest.importorskip("atheris")
    seeds, corpus, artifacts = tmp_path / "seeds", tmp_path / "corpus", tmp_path / "artifacts"
    for d in (seeds, corpus, artifacts):
        d.mkdir()
    for i, s in enumerate(_seeds(target)):
        (seeds / f"seed{i}").write_bytes(s)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(HERE / "fuzz_targets.py"), target, f"-max_total_time={FUZZ_SECONDS}",
                           "-rss_limit_mb=2048", "-timeout=10", f"-artifact_prefix={artifacts}/", str(corpus),
                           str(seeds)], capture_output=True, text=True, env=env, timeout=120 + FUZZ_SECONDS)
    crashes = sorted(artifacts.iterdir())
    tail = proc.stderr[-3000:]
    assert proc.returncode == 0 and not crashes, (
        f"{target}: fuzzer found a crash (rc {proc.returncode}); copy {crashes} into "
        f"{HERE / 'fuzz_regressions' / target}/ and fix the decoder\n{tail}")
    runs = [line for line in proc.stderr.splitlines() if line.startswith("Done ")]
    assert runs, tail  # libFuzzer's summary: "Done N runs in S second(s)"
    assert int(runs[-1].split()[1]) > 100, runs[-1]
    assert "cov:" in proc.stderr  # coverage feedback was on (instrumented decoders)


@pytest.mark.parametrize("target", sorted(fuzz_targets.TARGETS))
def test_fuzz_regressions_replay(target):
    folder = HERE / "fuzz_regressions" / target
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    for p in files + [None]:
        fuzz_targets.TARGETS[target](p.read_bytes() if p else b"")  # the decoder's own error is fine; a crash raises
