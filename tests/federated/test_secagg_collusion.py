"""A malicious scheduler with one colluding client (a Sybil it registered) against the runtime's SecAgg threshold.

The scheduler relays stages 0-2 faithfully (every client, the Sybil included, has a genuine identity key, so the
PKI does not stop it), then sends *split views*: group A is told the target survived (its members reveal their
shares of the target's mask seed ``b_u``), group B that the target dropped (they reveal shares of its mask key
``s_u^SK``). It forwards to each group only the survivor-list signatures made on that group's list, adds the
Sybil's signatures on both lists and the Sybil's shares of both secrets, and tries every size of split of the
honest clients (shares are symmetric in their holders, so sizes are all that matter). With ``t`` shares of both
secrets it strips every mask from the target's masked input.

The counting bound (docs/security.md, section 8) says this works iff ``2 t <= m + n_C``: at the old default
``secagg_threshold = 0.5`` (7 clients: t = 4) one Sybil suffices; at the default 2/3 (t = 5) it must fail.
"""

from __future__ import annotations

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
    """Every size of the "target survived" group; the first split that unmasks wins. Shamir shares are symmetric in
    their holders, so which honest clients form a group does not matter, only how many (one split per size)."""
    others = [u for u in inputs if u not in (TARGET, SYBIL)]
    for k in range(len(others) + 1):
        y = _split_view_attack(cfg, inputs, (TARGET, *others[:k]))
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


def test_a_deployment_issues_each_client_an_identity_key_and_the_directory(tmp_path):
    import os

    from fedarena.federated.deployment import Deployment, DeploymentSpec, client_name
    from fedarena.federated.secure_round import load_identity
    from fedarena.federated.task import TaskSpec

    spec = DeploymentSpec(task=TaskSpec(dataset="synthetic", num_clients=3, hidden=(8,), trainer="numpy"))
    Deployment(tmp_path / "dep", spec)  # writes files only; starts no process
    folder = tmp_path / "dep" / "identity"
    raw = (Encoding.Raw, PublicFormat.Raw)
    ids = {client_name(i): load_identity(folder, client_name(i)) for i in range(3)}
    for cid, ident in ids.items():
        assert ident.directory == ids[client_name(0)].directory and set(ident.directory) == set(ids)
        assert ident.directory[cid] == ident.signing_key.public_key().public_bytes(*raw)
        assert os.stat(folder / f"{cid}.key").st_mode & 0o777 == 0o600
    Deployment(tmp_path / "dep", spec)  # a resumed deployment keeps its identities
    assert load_identity(folder, "client001").directory == ids["client001"].directory


def test_a_client_refuses_a_round_whose_threshold_is_below_its_floor(make_cluster):
    """A scheduler that lowers the threshold in the round config (0.5 instead of the deployment's 2/3) gets no
    secure messages from clients whose floor is 2/3: they sit the round out and it is abandoned."""
    import threading

    from fedarena.federated.client import ClientOptions, FLClient
    from fedarena.federated.scheduler import RoundPolicy

    from fedarena.federated.task import TaskSpec

    task = TaskSpec(dataset="synthetic", num_clients=6, hidden=(8,), trainer="numpy", synthetic_features=10,
                    synthetic_classes=3, synthetic_examples=300)
    weak = RoundConfig(epochs=1, batch_size=8, lr=0.1, secagg=True, secagg_threshold=0.5, secagg_stage_seconds=2.0)
    c = make_cluster(RoundPolicy(rounds=1, window_seconds=5, start_clients=6, round_config=weak), task=task)
    floor = ClientOptions(secagg_min_threshold=2 / 3)
    clients = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i], c.task.trainer, floor)
               for i in range(6)]
    threads = [threading.Thread(target=cl.run, daemon=True) for cl in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads)
    row = c.scheduler.history[0]
    assert row["outcome"] == "abandoned" and row["needed"] == 4  # t = floor(0.5 * 6) + 1; the floor asks for 5
    assert all(cl.stats.uploads_refused.get("secagg", 0) >= 1 for cl in clients)
