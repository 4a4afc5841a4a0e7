"""RSA-blind-signature PSI: exact intersections, transcript audit, malformed messages (1024-bit keys for speed,
one run at the 2048-bit default)."""

import hashlib
import random

import numpy as np
import pytest

from fedarena.federated.vertical import messages, psi
from fedarena.federated.vertical.channel import Link
from fedarena.federated.vertical.messages import ProtocolError
from fedarena.federated.vertical.rsa_blind import (
    CrtSigner,
    encode_id,
    full_domain_hash,
    generate_key,
    tag,
)


@pytest.fixture(scope="module")
def key():
    return generate_key(1024, allow_insecure_keys=True)


def _sets(rng, n_a, n_b, overlap):
    shared = [f"shared-{rng.random():.12f}-é漢{i}" for i in range(int(round(overlap * min(n_a, n_b))))]
    only_a = [f"a-{i}-{rng.random():.9f}" for i in range(n_a - len(shared))]
    only_b = [f"b-{i}-ß{rng.random():.9f}" for i in range(n_b - len(shared))]
    a, b = shared + only_a, shared + only_b
    a += rng.sample(a, min(5, len(a)))  # duplicates
    b += rng.sample(b, min(7, len(b)))
    rng.shuffle(a)
    rng.shuffle(b)
    return a, b


@pytest.mark.parametrize("overlap", [0.0, 0.25, 0.5, 1.0])
def test_intersection_is_exact_against_python_sets(key, overlap):
    rng = random.Random(int(overlap * 100))
    a, b = _sets(rng, 120, 90, overlap)
    ra, rb = psi.intersect(a, b, key=key, allow_insecure_keys=True, chunk_size=32, workers=1)
    assert set(ra.ids) == set(a) & set(b)
    assert ra.ids == rb.ids  # same agreed order on both sides
    assert len(ra.ids) == len(set(ra.ids))
    assert all(a[i] == x for i, x in zip(ra.indices, ra.ids))
    assert all(b[i] == x for i, x in zip(rb.indices, rb.ids))
    assert all(a.index(x) == i for i, x in zip(ra.indices, ra.ids))  # first occurrence


def test_empty_sets_and_str_bytes_distinct(key):
    ra, rb = psi.intersect([], ["x"], key=key, allow_insecure_keys=True, workers=1)
    assert ra.ids == rb.ids == []
    ra, rb = psi.intersect(["1", b"2", "3"], [b"1", "2", "3"], key=key, allow_insecure_keys=True, workers=1)
    assert ra.ids == rb.ids == ["3"]


def test_default_is_2048_bits_and_works():
    server = psi.PsiServer(["alice", "bob", "carol"], workers=1)
    try:
        assert server.public_key.bits == 2048
        client = psi.PsiClient(["bob", "dave", "carol"])
        ra, rb = psi.run_psi(server, client)
    finally:
        server.close()
    assert set(ra.ids) == {"bob", "carol"} and ra.ids == rb.ids


def test_worker_processes_give_same_result(key):
    rng = random.Random(7)
    a, b = _sets(rng, 150, 150, 0.4)
    ra, rb = psi.intersect(a, b, key=key, allow_insecure_keys=True, chunk_size=16, workers=2)
    assert set(ra.ids) == set(a) & set(b) and ra.ids == rb.ids


def test_crt_signature_matches_plain_rsa(key):
    crt, plain = CrtSigner(key, crt=True), CrtSigner(key, crt=False)
    n = key.public.n
    for x in [2, 3, n - 1, 123456789 ** 5 % n, full_domain_hash(b"sabc", key.public)]:
        s = crt.sign(x)
        assert s == plain.sign(x) == pow(x, key.d, n)
        assert pow(s, key.public.e, n) == x


def test_full_domain_hash_covers_zn(key):
    hs = [full_domain_hash(encode_id(f"id{i}"), key.public) for i in range(200)]
    assert all(0 <= h < key.public.n for h in hs)
    assert max(hs).bit_length() >= key.public.bits - 8  # spread over the whole domain, not short hashes
    assert full_domain_hash(encode_id("a"), key.public) == full_domain_hash(encode_id("a"), key.public)


def test_transcripts_hold_no_non_shared_ids_or_hashes(key):
    rng = random.Random(3)
    a, b = _sets(rng, 60, 60, 0.5)
    link = Link(record=True)
    ra, _ = psi.intersect(a, b, key=key, allow_insecure_keys=True, chunk_size=16, workers=1, transfer=link.transfer)
    shared = set(ra.ids)
    to_a, to_b = link.received_by("A"), link.received_by("B")
    pub = key.public
    signer = CrtSigner(key)

    def forms(x):
        raw = encode_id(x)
        h = full_domain_hash(raw, pub)
        return [x.encode(), hashlib.sha256(x.encode()).digest(), hashlib.sha256(raw).digest(), h.to_bytes(pub.width, "big")]

    for x in set(b) - shared:  # B's private IDs never reach A, not even as tags
        for f in forms(x) + [tag(signer.sign(full_domain_hash(encode_id(x), pub)), pub)]:
            assert f not in to_a
    for x in set(a) - shared:  # A's private IDs reach B only as tags H'(H(a)^d), never in plain or hashed
        for f in forms(x):
            assert f not in to_b
    for x in shared:  # sanity: the audit can see things: the tag of a shared ID is in A's inbox
        assert tag(signer.sign(full_domain_hash(encode_id(x), pub)), pub) in to_a


# ----------------------------------------------------------------------------- malformed messages


def _started(key, a=("x", "y", "z"), b=("y", "z", "w"), chunk=2):
    server = psi.PsiServer(list(a), key=key, allow_insecure_keys=True, chunk_size=chunk, workers=1)
    client = psi.PsiClient(list(b), chunk_size=chunk, min_key_bits=1024)
    client.receive_hello(server.hello())
    server.receive_hello(client.hello())
    for m in server.tag_messages():
        client.receive_tags(m)
    return server, client


def test_client_refuses_bad_public_keys(key):
    server = psi.PsiServer(["x"], key=key, allow_insecure_keys=True, workers=1)
    hello = server.hello()
    with pytest.raises(ProtocolError, match="modulus_bits"):
        psi.PsiClient(["x"]).receive_hello(hello)  # default client wants >= 2048 bits
    c = psi.PsiClient(["x"], min_key_bits=1024)
    with pytest.raises(ProtocolError, match="server_hello.n"):
        c.receive_hello(psi.ServerHello(1024, hello.n[1:], hello.e, 1, 8))  # wrong modulus size
    with pytest.raises(ProtocolError, match="server_hello.n"):
        c.receive_hello(psi.ServerHello(1024, b"\x80" + bytes(126) + b"\x02", hello.e, 1, 8))  # even
    with pytest.raises(ProtocolError, match="server_hello.e"):
        c.receive_hello(psi.ServerHello(1024, hello.n, 4, 1, 8))


def test_server_rejects_out_of_range_values_and_bad_counts(key):
    server, client = _started(key)
    w, n = key.public.width, key.public.n
    with pytest.raises(ProtocolError, match=r"psi.blinded.values\[1\].*outside"):
        server.sign(psi.Blinded(0, 2, (5).to_bytes(w, "big") + n.to_bytes(w, "big"), False))
    server, client = _started(key)
    with pytest.raises(ProtocolError, match=r"psi.blinded.values\[0\]"):
        server.sign(psi.Blinded(0, 1, bytes(w), False))  # zero is not in Z_n^*
    server, client = _started(key)
    with pytest.raises(ProtocolError, match="psi.blinded.values.*need"):
        server.sign(psi.Blinded(0, 2, bytes(w), False))  # count says 2, bytes hold 1
    server, client = _started(key)
    with pytest.raises(ProtocolError, match="psi.blinded.count"):
        server.sign(psi.Blinded(0, 3, (7).to_bytes(w, "big") * 3, False))  # above the declared chunk size
    server, client = _started(key)
    with pytest.raises(ProtocolError, match="psi.blinded.index"):
        server.sign(psi.Blinded(1, 1, (7).to_bytes(w, "big"), False))
    server, client = _started(key)
    server.sign(psi.Blinded(0, 2, (7).to_bytes(w, "big") * 2, False))
    with pytest.raises(ProtocolError, match="psi.blinded.last"):
        server.sign(psi.Blinded(1, 0, b"", True))  # ends short of the declared 3 values


def test_client_rejects_forged_signatures_and_counts(key):
    server, client = _started(key)
    chunks = list(client.blinded_messages())
    good = server.sign(chunks[0])
    vals = messages.blob_to_ints(good.values, key.public.width, good.count, "v")
    forged = psi.Signed(0, good.count, messages.ints_to_blob([vals[0], (vals[1] + 1) % key.public.n], key.public.width))
    with pytest.raises(ProtocolError, match=r"psi.signed.values\[1\].*not the signature"):
        client.receive_signed(forged)
    with pytest.raises(ProtocolError, match="psi.signed.count"):
        client.receive_signed(psi.Signed(0, 1, good.values[: key.public.width]))
    with pytest.raises(ProtocolError, match="psi.signed.index"):
        client.receive_signed(psi.Signed(9, good.count, good.values))


def test_server_rejects_bad_matches(key):
    server, client = _started(key)
    for c in client.blinded_messages():
        client.receive_signed(server.sign(c))
    good = client.matches_message()
    assert good.count == 2
    with pytest.raises(ProtocolError, match="not a tag that A sent"):
        server.receive_matches(psi.Matches(1, bytes(32)))
    t1, t2 = good.tags[:32], good.tags[32:]
    with pytest.raises(ProtocolError, match="strictly increasing"):
        server.receive_matches(psi.Matches(2, t2 + t1 if t1 < t2 else t1 + t2))
    with pytest.raises(ProtocolError, match="psi.matches.count"):
        server.receive_matches(psi.Matches(9, good.tags))
    assert set(server.receive_matches(good).ids) == {"y", "z"}


def test_tag_stream_checks_and_hostile_bytes(key):
    client = psi.PsiClient(["x"], min_key_bits=1024)
    server = psi.PsiServer(["x", "y"], key=key, allow_insecure_keys=True, workers=1)
    client.receive_hello(server.hello())
    with pytest.raises(ProtocolError, match="psi.server_tags.tags"):
        client.receive_tags(psi.ServerTags(0, 2, bytes(33), True))
    with pytest.raises(ProtocolError, match="psi.server_tags.last"):
        client.receive_tags(psi.ServerTags(0, 1, bytes(32), True))  # declared 2 tags
    for junk in [b"\x00\x01garbage", messages.encode(psi.Matches(0, b""))[:-3]]:
        with pytest.raises(ProtocolError):
            messages.decode(junk, psi.Signed)
    with pytest.raises(ProtocolError, match="kind"):
        messages.decode(messages.encode(psi.Matches(0, b"")), psi.Signed)


def test_psi_and_hetero_lr_messages_over_grpc(key):
    from fedarena.federated.vertical import hetero_lr as H
    from fedarena.federated.vertical.channel import GrpcLink

    link = GrpcLink()
    try:
        ra, rb = psi.intersect(["u1", "u2", "u3", "ü4"], ["ü4", "u2", "x"], key=key, allow_insecure_keys=True, chunk_size=2, workers=1,
                               transfer=link.transfer)
        assert ra.ids == rb.ids == ["u2", "ü4"]
        rng = np.random.default_rng(0)
        xa, xb, y = rng.normal(size=(20, 3)), rng.normal(size=(20, 2)), rng.integers(0, 2, 20)
        cfg = H.HeteroLRConfig(epochs=1, batch_size=10, key_bits=1024, allow_insecure_keys=True)
        over_grpc = H.HeteroLR(xa, y, xb, cfg, transfer=link.transfer)
        in_process = H.HeteroLR(xa, y, xb, cfg)
        assert over_grpc.train_epoch().loss == in_process.train_epoch().loss
        assert np.array_equal(over_grpc.b.state.theta, in_process.b.state.theta)
        assert link.stats.total_bytes > 0
    finally:
        link.close()
