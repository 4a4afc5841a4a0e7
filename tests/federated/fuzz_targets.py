"""Coverage-guided fuzz targets for the wire decoders (atheris / libFuzzer), and their crash-replay entry.

Run one target for a bounded time (what ``test_fuzz_decoders.py`` does in CI)::

    python tests/federated/fuzz_targets.py TARGET -max_total_time=3 [-artifact_prefix=DIR/] CORPUS_DIR [SEED_DIR]

TARGET is ``fl_wire`` (envelopes, frame streams, round configs, the node authenticator's request check), ``secagg`` (SecAgg stage messages) or
``vertical`` (vertical-FL envelopes, their dataclasses, the PSI hello checks and the Paillier ciphertext
parser). Each target feeds the bytes to the decoder and accepts only the decoder's own refusal
(``WireError`` / ``MalformedMessage`` / ``ProtocolError``); any other exception is a crash, which
libFuzzer saves as ``crash-<sha1>``. Copy such a file to ``fuzz_regressions/<TARGET>/`` next to this
file: ``test_fuzz_decoders.py`` replays every file there through the same target on each run.

Only this module's ``_load`` imports fedarena, so that under atheris the decoders are imported (and
instrumented for coverage) inside ``atheris.instrument_imports``.
"""

from __future__ import annotations

import sys

_M: dict = {}

INSTRUMENTED = ("fedarena.federated.wire", "fedarena.federated.protocol", "fedarena.federated.auth", "fedarena.privacy.secagg.messages",
                "fedarena.federated.vertical.messages", "fedarena.federated.vertical.psi",
                "fedarena.federated.vertical.paillier")


def _load() -> dict:
    if not _M:
        import phe

        from fedarena.federated import auth, protocol, wire
        from fedarena.federated.vertical import hetero_lr, messages, paillier, psi, split_nn  # noqa: F401 (kinds)
        from fedarena.privacy.secagg import messages as secagg_messages

        # a fixed, tiny public key: only the ciphertext parser's range and unit checks are exercised
        p, q = 1000000007, 998244353
        _M.update(wire=wire, protocol=protocol, auth=auth.NodeAuthenticator(b"k" * 32),
                  client=auth.Identity("client", "a"), vm=messages, psi=psi, paillier=paillier, sam=secagg_messages,
                  key=paillier.FastPublicKey(phe.PaillierPublicKey(p * q)),
                  limits=wire.Limits(max_message_bytes=1 << 16, max_elements=1 << 12, max_frames=64, max_depth=8))
    return _M


def fl_wire(data: bytes) -> None:
    m = _load()
    wire, limits = m["wire"], m["limits"]
    try:
        msg = wire.decode(data, limits)
        m["auth"].admit(m["client"], msg.kind, msg.body)  # the stream check on the decoded request
        m["auth"].admit(m["auth"].identify({}), msg.kind, msg.body)
        if msg.kind and isinstance(msg.body.get("config"), dict):
            m["protocol"].RoundConfig.from_body(msg.body["config"])
        for name, value in msg.body.items():
            if isinstance(value, dict):
                m["protocol"].RoundConfig.from_body(value, where=f"body.{name}")
    except wire.WireError:
        pass
    try:  # the same bytes as a frame stream (frames separated by 0xFF 0xFE)
        wire.join_frames(data.split(b"\xff\xfe"), limits)
    except wire.WireError:
        pass


def secagg(data: bytes) -> None:
    sam = _load()["sam"]
    try:
        msg = sam.decode(data)
    except sam.MalformedMessage:
        return
    again = sam.decode(sam.encode(msg))  # whatever decodes must re-encode to an equal message
    assert type(again) is type(msg) and sam.encode(again) == sam.encode(msg)


def vertical(data: bytes) -> None:
    m = _load()
    vm, psi, paillier = m["vm"], m["psi"], m["paillier"]
    try:
        msg = vm.decode(data)
    except vm.ProtocolError:
        msg = None
    if isinstance(msg, psi.ServerHello):
        try:
            psi.PsiClient(["x"]).receive_hello(msg)
        except vm.ProtocolError:
            pass
    if isinstance(msg, psi.Blinded):
        server = _psi_server(m)
        try:
            server.sign(msg)
        except vm.ProtocolError:
            pass
    if len(data) >= 2:  # the Paillier ciphertext-blob parser: count and frac_bits from the first bytes
        try:
            paillier.from_bytes(m["key"], data[2:], data[0] % 8, data[1] * 3 - 100, "fuzz")
        except vm.ProtocolError:
            pass


def _psi_server(m):
    if "psi_server" not in m:
        psi = m["psi"]
        from fedarena.federated.vertical.rsa_blind import generate_key

        server = psi.PsiServer(["a", "b"], key=generate_key(1024, allow_insecure_keys=True), workers=1,
                               allow_insecure_keys=True)
        server.receive_hello(psi.ClientHello(4, 4))
        m["psi_server"] = server
    server = m["psi_server"]
    server._next_blinded, server._blinded_total = 0, 0  # every input starts a fresh stream
    return server


TARGETS = {"fl_wire": fl_wire, "secagg": secagg, "vertical": vertical}


def main(argv: list[str]) -> None:
    import atheris

    target = TARGETS[argv[1]]
    with atheris.instrument_imports(include=list(INSTRUMENTED)):
        _load()
    atheris.Setup([argv[0], *argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
