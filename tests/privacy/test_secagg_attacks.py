"""Attacks on secure aggregation through its public API (issue 17, findings 2, 3 and 11).

* A malicious server that tells some clients a target survived and others that it dropped, to collect both the
  shares of its mask seed ``b_u`` and of its mask key ``s_u^SK`` and strip every mask from its input. With
  ``t <= m / 2`` (the old default for even n) the attack recovers the input exactly; the thresholds are now
  refused, and at the default ``t = floor(m / 2) + 1`` the clients' consistency check catches the split.
* Weak parameters (t = 1, two clients, minority thresholds in SecAgg+) are refused with an error naming the field.
* A NaN input is refused by the client before anything is masked.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.privacy.secagg import (
    InsufficientSurvivorsError,
    ProtocolError,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    prg,
    quantize,
    secure_aggregate,
    shamir,
)
from fedarena.privacy.secagg.messages import SurvivorList, UnmaskRequest
from fedarena.privacy.secagg.protocol import agree

D = 8
SCALE = 2.0**10


def _inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    return {u: rng.uniform(-1, 1, D) for u in range(1, n + 1)}


def _through_masked_input(cfg, n, round_id=3):
    """Run stages 0-2 honestly; return the server, clients, inputs."""
    inputs = _inputs(n, seed=n)
    server = SecAggServer(cfg, round_id, inputs)
    clients = {u: SecAggClient(u, cfg, round_id) for u in inputs}
    for u in clients:
        server.receive(clients[u].advertise_keys())
    kb = server.close_stage()
    for u in clients:
        server.receive(clients[u].share_keys(kb[u]))
    sb = server.close_stage()
    for u in clients:
        server.receive(clients[u].masked_input(sb[u], inputs[u]))
    return server, clients, inputs


def _strip_masks(server, target, seed_shares, key_shares):
    """The attacker's last step: rebuild b_u and s_u^SK of ``target`` from the shares it got and unmask y_u."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    st, t, rnd = server.state, server.config.threshold, server.round_id
    if len(seed_shares) < t or len(key_shares) < t:
        return None
    holders = sorted(seed_shares)[:t]
    b_u = shamir.combine(np.array(holders), np.stack([seed_shares[h] for h in holders])).tobytes()
    holders = sorted(key_shares)[:t]
    sk = X25519PrivateKey.from_private_bytes(
        shamir.combine(np.array(holders), np.stack([key_shares[h] for h in holders])).tobytes())
    y = st.masked[target].copy()
    prg.add_into(y, b_u, negate=True)
    for v in st.neighbours[target].tolist():
        seed = agree(sk, st.keys[v][1], b"mask", rnd, target, v)
        prg.add_into(y, seed, negate=target < v)  # the target added +PRG when target < v: remove it
    return y


def _split_attack(server, clients, target, forward_all_signatures=True):
    """Group A (the target and the lower half of the others) is told the target survived, group B that it dropped.

    Returns the seed and key shares of the target and the refusals collected from the honest clients, and group B."""
    st, rnd = server.state, server.round_id
    everyone = tuple(sorted(st.masked))
    others = [u for u in everyone if u != target]
    group_a = [target] + others[: len(others) // 2]
    group_b = others[len(others) // 2:]
    view = {u: everyone for u in group_a} | {u: tuple(v for v in everyone if v != target) for u in group_b}
    dropped = {u: () if u in group_a else (target,) for u in everyone}
    sigs: dict[int, bytes] = {}
    if server.config.consistency_check:
        for u in everyone:
            try:
                sigs[u] = clients[u].consistency(SurvivorList(rnd, u, view[u])).signature
            except (ProtocolError, InsufficientSurvivorsError):
                pass
    seed_shares, key_shares, refusals = {}, {}, {}
    for u in everyone:
        if forward_all_signatures:
            forwarded = sigs
        else:  # only the signatures made on the same view: they verify, but may be fewer than t
            forwarded = {v: s for v, s in sigs.items() if view[v] == view[u]}
        try:
            reply = clients[u].unmask(UnmaskRequest(rnd, u, view[u], dropped[u], dict(forwarded)))
        except (ProtocolError, InsufficientSurvivorsError) as e:
            refusals[u] = str(e)
            continue
        if target in reply.seed_shares:
            seed_shares[u] = reply.seed_shares[target]
        if target in reply.key_shares:
            key_shares[u] = reply.key_shares[target]
    return seed_shares, key_shares, refusals, group_b


@pytest.mark.parametrize("n,t", [(5, 2), (6, 3), (20, 10)])
def test_minority_thresholds_that_let_a_split_view_server_unmask_one_client_are_refused(n, t):
    # the configurations the review attacked (t <= n / 2: two disjoint groups of t holders exist, one told the
    # target survived, one told it dropped) are refused where the round is set up...
    with pytest.raises(ValueError, match=r"^threshold: .*not more than half"):
        SecAggServer(SecAggConfig(dimension=D, threshold=t, scale=SCALE), 0, range(1, n + 1))
    # ...and by each client, which a malicious server's own validation cannot bypass
    server = SecAggServer(SecAggConfig(dimension=D, threshold=n // 2 + 1, scale=SCALE), 0, range(1, n + 1))
    weak = SecAggConfig(dimension=D, threshold=t, scale=SCALE)
    clients = {u: SecAggClient(u, weak, 0) for u in range(1, n + 1)}
    for u in clients:
        server.receive(clients[u].advertise_keys())
    kb = server.close_stage()
    with pytest.raises(ProtocolError, match="not more than half of its .* share holders; refusing to share"):
        clients[1].share_keys(kb[1])


@pytest.mark.parametrize("n", [5, 6, 20])
@pytest.mark.parametrize("check,forward_all", [(True, True), (True, False), (False, True)])
def test_split_view_server_gets_no_input_at_default_thresholds(n, check, forward_all):
    t = n // 2 + 1  # the runtime's default, floor(0.5 n) + 1
    cfg = SecAggConfig(dimension=D, threshold=t, scale=SCALE, consistency_check=check)
    server, clients, inputs = _through_masked_input(cfg, n)
    seed_shares, key_shares, refusals, group_b = _split_attack(server, clients, target=1,
                                                               forward_all_signatures=forward_all)
    assert _strip_masks(server, 1, seed_shares, key_shares) is None
    assert min(len(seed_shares), len(key_shares)) < t  # one of the two secrets stays out of reach
    if check and forward_all:  # every client sees signatures of a list it did not sign, and reveals nothing
        assert set(refusals) == set(clients) and not seed_shares and not key_shares
        assert all("did not sign this survivor list" in r or "outside the survivor list" in r
                   for r in refusals.values())
    elif check:  # only same-view signatures: each group smaller than t refuses (the dropped-view group always is)
        group_a = set(clients) - set(group_b)
        short = (group_a if len(group_a) < t else set()) | set(group_b)
        assert set(refusals) == short and not key_shares
        assert all("signed the survivor list, threshold is" in r for r in refusals.values())
    else:  # without the check the t > n/2 rule alone leaves the dropped-view group short of t key shares
        assert not refusals and len(key_shares) == len(group_b) < t


def test_consistency_check_round_completes_honestly_and_survives_dropouts():
    cfg = SecAggConfig(dimension=D, threshold=4, scale=SCALE, consistency_check=True)
    inputs = _inputs(6)
    for drops in ({}, {"consistency_check": {2}}, {"masked_input": {3}, "unmask": {5}}):
        rep = secure_aggregate(inputs, cfg, dropouts=drops)
        gone = drops.get("masked_input", set())
        expect = sum(quantize(inputs[u], 1.0, SCALE, 32).astype(np.int64) for u in inputs if u not in gone)
        np.testing.assert_array_equal(rep.result.total, (expect % 2**32).astype(np.uint32))


def test_consistency_check_refuses_substituted_keys_and_an_altered_survivor_list():
    cfg = SecAggConfig(dimension=D, threshold=3, scale=SCALE, consistency_check=True)
    inputs = _inputs(4)
    server = SecAggServer(cfg, 1, inputs)
    clients = {u: SecAggClient(u, cfg, 1) for u in inputs}
    adv = {u: clients[u].advertise_keys() for u in clients}
    import dataclasses

    with pytest.raises(ProtocolError, match="key_signature"):  # unsigned keys are refused by the server
        server.receive(dataclasses.replace(adv[1], key_signature=b"\0" * 64))
    for u in clients:
        server.receive(adv[u])
    kb = server.close_stage()
    forged = dict(kb[1].keys)
    forged[2] = (adv[3].c_pk, adv[3].s_pk)  # the server swaps client 2's keys for others
    with pytest.raises(ProtocolError, match=r"signing\[2\].*does not verify"):
        clients[1].share_keys(dataclasses.replace(kb[1], keys=forged))
    for u in clients:
        server.receive(clients[u].share_keys(kb[u]))
    sb = server.close_stage()
    for u in clients:
        server.receive(clients[u].masked_input(sb[u], inputs[u]))
    sl = server.close_stage()
    assert set(sl) == {1, 2, 3, 4} and all(isinstance(m, SurvivorList) for m in sl.values())
    for u in clients:
        server.receive(clients[u].consistency(sl[u]))
    um = server.close_stage()
    altered = dataclasses.replace(um[1], survivors=(1, 2, 3), dropped=(4,))
    with pytest.raises(ProtocolError, match="differs from the survivor list this client signed"):
        clients[1].unmask(altered)
    assert clients[1].state.stage == 4  # nothing revealed; the genuine request still works
    for u in clients:
        server.receive(clients[u].unmask(um[u]))
    res = server.close_stage()
    expect = sum(quantize(inputs[u], 1.0, SCALE, 32).astype(np.int64) for u in inputs)
    np.testing.assert_array_equal(res.total, (expect % 2**32).astype(np.uint32))


def test_weak_parameters_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"^threshold: must be >= 2"):
        SecAggConfig(dimension=D, threshold=1)
    with pytest.raises(ValueError, match=r"^clients: secure aggregation needs at least 3 clients"):
        SecAggServer(SecAggConfig(dimension=D, threshold=2), 0, [1, 2])
    with pytest.raises(ValueError, match=r"^threshold: 3 is not more than half of the 7 share holders"):
        SecAggConfig(dimension=D, threshold=3, num_neighbours=6)
    SecAggServer(SecAggConfig(dimension=D, threshold=4, num_neighbours=6), 0, range(1, 21))  # t = 4 of 7: fine
    with pytest.raises(ValueError, match=r"^modulus_bits: 512 clients"):
        SecAggServer(SecAggConfig(dimension=D, threshold=300, scale=2.0**22), 0, range(1, 513))


def test_nan_input_is_refused_by_the_client_before_masking():
    cfg = SecAggConfig(dimension=D, threshold=3, scale=SCALE)
    inputs = _inputs(4)
    server = SecAggServer(cfg, 2, inputs)
    clients = {u: SecAggClient(u, cfg, 2) for u in inputs}
    for u in clients:
        server.receive(clients[u].advertise_keys())
    kb = server.close_stage()
    for u in clients:
        server.receive(clients[u].share_keys(kb[u]))
    sb = server.close_stage()
    bad = inputs[4].copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match=r"^input: client 4's entries \[3\] are not finite"):
        clients[4].masked_input(sb[4], bad)
    inf = inputs[4].copy()
    inf[0] = np.inf
    with pytest.raises(ValueError, match="not finite"):
        clients[4].masked_input(sb[4], inf)
    assert clients[4].state.stage == 2  # nothing was masked or sent; client 4 is a dropout of stage 2
    for u in (1, 2, 3):
        server.receive(clients[u].masked_input(sb[u], inputs[u]))
    um = server.close_stage()
    for u in um:
        server.receive(clients[u].unmask(um[u]))
    res = server.close_stage()
    assert res.survivors == (1, 2, 3)
    expect = sum(quantize(inputs[u], 1.0, SCALE, 32).astype(np.int64) for u in (1, 2, 3))
    np.testing.assert_array_equal(res.total, (expect % 2**32).astype(np.uint32))


def test_identity_keys_catch_a_server_that_replaces_keys_and_their_signatures():
    """A man-in-the-middle server swaps party 2's keys *and* signing key in party 1's key broadcast. Without a PKI the
    forged signature verifies (the documented limit); with identity keys the client refuses."""
    import dataclasses

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from fedarena.privacy.secagg.protocol import key_transcript

    raw = (Encoding.Raw, PublicFormat.Raw)
    cfg = SecAggConfig(dimension=D, threshold=3, scale=SCALE, consistency_check=True)
    sig_keys = {u: Ed25519PrivateKey.generate() for u in range(1, 5)}
    directory = {u: k.public_key().public_bytes(*raw) for u, k in sig_keys.items()}
    for pki in (False, True):
        server = SecAggServer(cfg, 5, range(1, 5))
        clients = {u: SecAggClient(u, cfg, 5, signing_key=sig_keys[u], identities=directory if pki else None)
                   for u in range(1, 5)}
        for u in clients:
            server.receive(clients[u].advertise_keys())
        kb = server.close_stage()
        c_pk, s_pk = (X25519PrivateKey.generate().public_key().public_bytes(*raw) for _ in range(2))
        mitm = Ed25519PrivateKey.generate()
        forged = dataclasses.replace(
            kb[1], keys=kb[1].keys | {2: (c_pk, s_pk)},
            signing=kb[1].signing | {2: (mitm.public_key().public_bytes(*raw),
                                               mitm.sign(key_transcript(5, 2, c_pk, s_pk)))})
        if pki:
            with pytest.raises(ProtocolError, match=r"signing\[2\] is not party 2's identity key"):
                clients[1].share_keys(forged)
        else:
            clients[1].share_keys(forged)  # accepted: without a PKI the server controls whose key is whose
    with pytest.raises(ValueError, match="identities: entry 1 is not this client's signing key"):
        SecAggClient(1, cfg, 5, signing_key=sig_keys[2], identities=directory)
