"""A malicious scheduler with one colluding client (a Sybil it registered) against the runtime's SecAgg threshold.

The scheduler relays stages 0-2 faithfully (every client, the Sybil included, has a genuine identity key, so the
PKI does not stop it), then sends *split views*: group A is told the target survived (its members reveal their
shares of the target's mask seed ``b_u``), group B that the target dropped (they reveal shares of its mask key
``s_u^SK``). It forwards to each group only the survivor-list signatures made on that group's list, adds the
Sybil's signatures on both lists and the Sybil's shares of both secrets, and tries every split of the honest
clients. With ``t`` shares of both secrets it strips every mask from the target's masked input.

The counting bound (docs/security.md, section 8) says this works iff ``2 t <= m + n_C``: at the old default
``secagg_threshold = 0.5`` (7 clients: t = 4) one Sybil suffices; at the default 2/3 (t = 5) it must fail.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from fedarena.federated.protocol import RoundConfig
from fedarena.federated.secure_round import check_secure_config, colluders_tolerated, secagg_params, threshold
from fedarena.privacy.secagg import InsufficientSurvivorsError, ProtocolError, SecAggClient, SecAggServer, prg, shamir
from fedarena.privacy.secagg.messages import SurvivorList, UnmaskRequest
from fedarena.privacy.secagg.protocol import agree, survivor_transcript
from fedarena.privacy.secagg.quantization import quantize

N, TARGET, SYBIL, D, ROUND = 7, 1, 7, 6, 11


def _honest_stages(cfg, inputs):
    """Stages 0-2 relayed faithfully, every party (the Sybil too) with an identity key in the PKI."""
    raw = (Encoding.Raw, PublicFormat.Raw)
    keys = {u: Ed25519PrivateKey.generate() for u in inputs}
    directory = {u: k.public_key().public_bytes(*raw) for u, k in keys.items()}
    server = SecAggServer(cfg, ROUND, inputs)
    clients = {u: SecAggClient(u, cfg, ROUND, signing_key=keys[u], identities=directory) for u in inputs}
    for u in clients:
        server.receive(clients[u].advertise_keys())
    kb = server.close_stage()
    for u in clients:
        server.receive(clients[u].share_keys(kb[u]))
    sb = server.close_stage()
    for u in clients:
        server.receive(clients[u].masked_input(sb[u], inputs[u]))
    return server, clients, keys


def _combine(shares: dict[int, np.ndarray], t: int) -> bytes:
    holders = sorted(shares)[:t]
    return shamir.combine(np.array(holders), np.stack([shares[h] for h in holders])).tobytes()


def _split_view_attack(cfg, inputs, group_a: tuple[int, ...]):
    """One try of the malicious scheduler; returns the target's unmasked (quantized) input, or None."""
    server, clients, keys = _honest_stages(cfg, inputs)
    st, t = server.state, cfg.threshold
    everyone = tuple(sorted(st.masked))
    honest = [u for u in everyone if u != SYBIL]
    group_b = tuple(u for u in honest if u not in group_a)
    view = {u: everyone for u in group_a} | {u: tuple(v for v in everyone if v != TARGET) for u in group_b}
    sigs: dict[tuple[int, ...], dict[int, bytes]] = {}
    for u in honest:
        try:
            sigs.setdefault(view[u], {})[u] = clients[u].consistency(SurvivorList(ROUND, u, view[u])).signature
        except (ProtocolError, InsufficientSurvivorsError):
            pass
    for lst in set(view.values()):  # the Sybil signs both lists
        sigs.setdefault(lst, {})[SYBIL] = keys[SYBIL].sign(survivor_transcript(ROUND, lst))
    seed_share, key_share = clients[SYBIL].state.held_shares[TARGET]  # the Sybil holds a share of both secrets
    seeds, mask_keys = {SYBIL: seed_share}, {SYBIL: key_share}
    for u in honest:
        dropped = () if TARGET in view[u] else (TARGET,)
        try:
            reply = clients[u].unmask(UnmaskRequest(ROUND, u, view[u], dropped, dict(sigs[view[u]])))
        except (ProtocolError, InsufficientSurvivorsError):
            continue
        if TARGET in reply.seed_shares:
            seeds[u] = reply.seed_shares[TARGET]
        if TARGET in reply.key_shares:
            mask_keys[u] = reply.key_shares[TARGET]
    if len(seeds) < t or len(mask_keys) < t:
        return None
    sk = X25519PrivateKey.from_private_bytes(_combine(mask_keys, t))
    y = st.masked[TARGET].copy()
    prg.add_into(y, _combine(seeds, t), negate=True)
    for v in st.neighbours[TARGET].tolist():
        prg.add_into(y, agree(sk, st.keys[v][1], b"mask", ROUND, TARGET, v), negate=TARGET < v)
    return y


def _attack(cfg, inputs):
    """Every split of the honest clients other than the target into the two groups; the first that unmasks wins."""
    others = [u for u in inputs if u not in (TARGET, SYBIL)]
    for k in range(len(others) + 1):
        for rest in itertools.combinations(others, k):
            y = _split_view_attack(cfg, inputs, (TARGET, *rest))
            if y is not None:
                return y
    return None


@pytest.mark.parametrize("old_default", [False, True])
def test_split_views_and_one_sybil_of_seven_unmask_nothing_at_the_default_threshold(old_default):
    rc = RoundConfig(secagg=True, secagg_threshold=0.5) if old_default else RoundConfig(secagg=True)
    cfg = secagg_params(rc, N, D)
    assert cfg.consistency_check and cfg.threshold == (4 if old_default else 5)
    rng = np.random.default_rng(3)
    inputs = {u: rng.uniform(-1, 1, D) for u in range(1, N + 1)}
    y = _attack(cfg, inputs)
    if old_default:  # the test can fail: at t = 4 one Sybil gives the scheduler the target's exact input
        np.testing.assert_array_equal(y, quantize(inputs[TARGET], cfg.clip, cfg.scale, 32))
        assert colluders_tolerated(rc, N) == 0
    else:
        assert y is None
        assert colluders_tolerated(rc, N) == 2  # 2 t - m - 1 = 10 - 7 - 1


def test_secagg_colluders_sets_the_threshold_from_the_bound_and_refuses_impossible_counts():
    # 2 t > m + n_C: one Sybil of 7 needs t = 5 (the attack above fails at 5), which secagg_colluders = 1 gives
    # whatever secagg_threshold says; with m + n_C even the smallest such t resists one more colluder
    rc = RoundConfig(secagg=True, secagg_threshold=0.5, secagg_colluders=1)
    assert threshold(rc, N) == 5 and colluders_tolerated(rc, N) == 2
    assert threshold(RoundConfig(secagg=True, secagg_colluders=2), N) == 5
    assert threshold(RoundConfig(secagg=True, secagg_colluders=3), N) == 6
    assert [threshold(RoundConfig(secagg=True, secagg_colluders=k), 20) for k in (0, 1, 2, 19)] == [11, 11, 12, 20]
    check_secure_config(RoundConfig(secagg=True, secagg_colluders=6), N)  # t = m = 7 resists 6
    with pytest.raises(ValueError, match=r"^round\.secagg_colluders: 7 colluders among 7 share holders .* at most 6"):
        check_secure_config(RoundConfig(secagg=True, secagg_colluders=7), N)
    with pytest.raises(ValueError, match=r"^round\.secagg_colluders: must be an integer >= 0"):
        RoundConfig(secagg=True, secagg_colluders=-2)
