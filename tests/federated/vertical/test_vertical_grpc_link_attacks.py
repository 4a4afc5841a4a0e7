"""Attacks on the vertical-FL gRPC link (issue 17, finding 8): intruders, floods, replays, other sessions.

Real gRPC on loopback. The intruder knows the parties' addresses and the message format but holds
no party token; on the unauthenticated link its hello was consumed in place of party A's and the
inbox took 201 unsolicited messages.
"""

from __future__ import annotations

import pytest

from fedarena.federated import wire
from fedarena.federated.transport import Peer, RemoteError
from fedarena.federated.vertical import psi
from fedarena.federated.vertical.channel import GrpcLink


def _hello(set_size):
    return psi.ClientHello(set_size=set_size, chunk_size=16)


def test_intruder_messages_are_refused_and_never_stand_in_for_a_party():
    link = GrpcLink(("A", "B"))
    try:
        intruder = Peer(link._peers["B"].address)
        refused = 0
        for i in range(201):  # unsolicited messages, as many as filled the old inbox
            try:
                intruder.call("psi.client_hello", {"set_size": 999, "chunk_size": 1})
            except RemoteError as e:
                assert e.code == "unauthenticated"
                refused += 1
        intruder.close()
        assert refused == 201
        got = link.transfer("A", "B", _hello(3), psi.ClientHello)  # the genuine party's message arrives intact
        assert got == _hello(3)
    finally:
        link.close()


def test_link_refuses_other_sessions_replays_forgeries_and_bounds_the_inbox():
    from fedarena.federated import auth

    secret = auth.new_secret()
    link = GrpcLink(("A", "B"), secret=secret, session="s1", inbox_size=5)
    other = GrpcLink(("A", "B"), secret=secret, session="s2")
    try:
        address = link._peers["B"].address
        data = wire.encode(*__import__("fedarena.federated.vertical.messages", fromlist=["x"]).body_of(_hello(7)))
        frames = list(wire.split_frames(data))
        peer = Peer(address)

        def raw(token_session, seq, mac_session="s1", body=data):
            creds = auth.Credentials("party", "A", auth.party_token(secret, token_session, "A"))
            mac = auth.message_mac(secret, mac_session, "A", "B", seq, body)
            return wire.decode(peer.exchange_frames(list(wire.split_frames(body)), 10, creds,
                                                    ((auth.SEQ_KEY, str(seq)), (auth.MAC_KEY, mac)))).body

        # a token of session s2 is no good in session s1 (same deployment secret)
        r = raw("s2", 0, "s2")
        assert (r["code"], r["field"]) == ("unauthenticated", "metadata.fedarena-token")
        # a MAC over other bytes (altered message) or of another session is refused before decoding
        r = raw("s1", 0, "s2")
        assert (r["code"], r["field"]) == ("unauthenticated", "metadata.fedarena-mac")
        assert link.pending("B", "A") == 0
        # a genuine message, then its replay
        assert link.send("A", "B", _hello(7)) == sum(len(f) for f in frames)
        r = raw("s1", 0)
        assert (r["code"], r["field"]) == ("replay", "metadata.fedarena-seq")
        assert link.pending("B", "A") == 1
        # even a genuine party cannot overfill the inbox: 5 messages wait, the 6th is refused
        for _ in range(4):
            link.send("A", "B", _hello(7))
        with pytest.raises(RemoteError) as info:
            link.send("A", "B", _hello(8))
        assert (info.value.code, info.value.field) == ("unavailable", "inbox")
        assert link.pending("B", "A") == 5
        for _ in range(5):
            assert link._inbox["B"]["A"].get_nowait().body["set_size"] == 7
        # the refused message was not counted: the next send goes through in order
        assert link.transfer("A", "B", _hello(9), psi.ClientHello) == _hello(9)
        peer.close()
    finally:
        link.close()
        other.close()
