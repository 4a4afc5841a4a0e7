"""Attacks on the vertical-FL cryptography (issue 17, findings 9 and 10): packing overflow, weak keys,
faulty CRT signatures, unlimited blind signing. Oracles: exact Python-int / Fraction arithmetic and
the gcd of a faulty RSA signature (Boneh, DeMillo, Lipton 1997)."""

from __future__ import annotations

import math
from fractions import Fraction

import gmpy2
import numpy as np
import pytest

from fedarena.federated.vertical import packing as K
from fedarena.federated.vertical import paillier as P
from fedarena.federated.vertical import psi
from fedarena.federated.vertical.messages import ProtocolError
from fedarena.federated.vertical.rsa_blind import CrtSigner, RsaPrivateKey, full_domain_hash, generate_key


def _keys(bits=1024):
    try:
        pk, sk = P.generate_keypair(bits, allow_insecure_keys=True)
    except TypeError:  # code without the switch
        pk, sk = P.generate_keypair(bits)
    return P.FastPublicKey(pk), P.FastPrivateKey(sk)


@pytest.fixture(scope="module")
def keys():
    return _keys()


@pytest.fixture(scope="module")
def rsa_key():
    try:
        return generate_key(1024, allow_insecure_keys=True)
    except TypeError:
        return generate_key(1024)


def _exact(v, f):
    return round(Fraction(v) * (1 << f))


def test_slot_packing_is_exact_where_int64_overflowed(keys):
    fpk, fsk = keys
    layout = K.make_layout(1024, 4096.0, 52, 4)
    packer = K.SlotPacker(fpk, layout)
    x = np.array([4000.0, -4096.0, 4095.999, 1e-9, -3333.25])
    got = packer.decrypt_ints(fsk, packer.encrypt(x))
    assert got == [_exact(v, 52) for v in x]  # was -2048 * 2^52 for 4000 (int64 wrap)
    # 60 fractional bits (past a float's 53-bit mantissa): still the exact rounding of the float value
    layout60 = K.make_layout(1024, 1.0, 60, 4)
    p60 = K.SlotPacker(fpk, layout60)
    y = np.array([2.0**-60 * 3, 0.7, -0.999999])
    assert p60.decrypt_ints(fsk, p60.encrypt(y)) == [_exact(v, 60) for v in y]


def test_values_outside_the_declared_bound_raise_packing_overflow(keys):
    fpk, fsk = keys
    packer = K.SlotPacker(fpk, K.make_layout(1024, 1.0, 8, 20))
    (a,) = packer.encrypt(np.array([0.5, -0.25]))
    with pytest.raises(K.PackingOverflow):
        packer.encrypt(np.array([1.5, 0.0]))
    scaled = packer.mul_fixed(a, 1.0, 4)  # now 12 fractional bits
    with pytest.raises(K.PackingOverflow):  # a plaintext of 3.0 declared as bounded by 1.0
        packer.add_plain(scaled, np.array([3.0, 0.0]), bound=1.0)
    ok = packer.add_plain(scaled, np.array([0.75, -1.0]), bound=1.0)
    np.testing.assert_array_equal(packer.decrypt(fsk, [ok]), [1.25, -1.25])


def test_cipher_vector_rmatmul_is_exact_for_large_fixed_point_entries(keys):
    fpk, fsk = keys
    a = np.array([1.0, -2.0, 3.0])
    v = fpk.encrypt(a, 0)
    for f in (40, 42, 50):
        x = np.array([[3e6 + 2, -1.5], [7.25, 2e6], [-1e6, 0.125]])
        got = [P.to_signed(m, int(fpk.n)) for m in fsk.decrypt_ints(v.rmatmul(x, f).cs)]
        want = [sum(int(ai) * _exact(x[i, j], f) for i, ai in enumerate(a)) for j in range(2)]
        assert got == want, f  # was -2097150 * 2^f for 3e6 + 2 at 42 bits
        np.testing.assert_array_equal(fsk.decrypt(v.rmatmul(x[:, :1], f)), [3e6 + 2 - 14.5 - 3e6])


def test_keys_below_2048_bits_are_refused_unless_explicitly_allowed():
    from fedarena.federated.vertical.hetero_lr import HeteroLRConfig
    from fedarena.federated.vertical.split_nn import SplitNNConfig

    with pytest.raises(ValueError, match="hetero_lr.key_bits: 512-bit keys are refused"):
        HeteroLRConfig(key_bits=512, value_bits=200)
    with pytest.raises(ValueError, match="split_nn.key_bits: 1024-bit keys are refused"):
        SplitNNConfig(key_bits=1024)
    with pytest.raises(ValueError, match="key_bits: 1024-bit keys are refused"):
        P.generate_keypair(1024)
    with pytest.raises(ValueError, match="key_bits: 1024-bit RSA keys are refused"):
        psi.intersect(["a"], ["a"], key_bits=1024, workers=1)
    weak = generate_key(1024, allow_insecure_keys=True)
    with pytest.raises(ValueError, match="1024-bit RSA keys are refused"):
        psi.intersect(["a"], ["a"], key=weak, workers=1)
    ra, rb = psi.intersect(["a", "b"], ["b"], key=weak, workers=1, allow_insecure_keys=True)
    assert ra.ids == rb.ids == ["b"]
    assert HeteroLRConfig(key_bits=512, value_bits=200, allow_insecure_keys=True).key_bits == 512
    from fedarena.platform.registry import get_kind  # the experiment configs refuse them too

    with pytest.raises(ValueError, match="psi_key_bits"):
        get_kind("vfl_lr").config(psi_key_bits=1024)


def test_a_faulty_crt_signature_is_not_released(rsa_key):
    k = rsa_key
    faulty = RsaPrivateKey(k.public, k.d, k.p, k.q, k.dp ^ 1, k.dq, k.q_inv)  # a fault in the mod-p half
    x = full_domain_hash(b"sid", k.public)
    try:
        s = CrtSigner(faulty).sign(x)
    except Exception as e:  # noqa: BLE001 - checked below
        from fedarena.federated.vertical.rsa_blind import SignatureFault

        assert isinstance(e, SignatureFault)
        s = None
    if s is not None:  # what the peer would learn: gcd(s^e - x, n) is the secret factor q
        n = k.public.n
        g = math.gcd(int(gmpy2.powmod(s, k.public.e, n)) - x, n)
        assert g in (1, n), "the faulty signature reveals a factor of n"
    # fault-free signatures still verify, at the same values as the plain exponentiation
    assert CrtSigner(k).sign(x) == CrtSigner(k, crt=False).sign(x)


def test_psi_server_caps_how_many_values_one_client_has_signed(rsa_key):
    server = psi.PsiServer(["a", "b"], key=rsa_key, workers=1, **_insecure())
    try:
        with pytest.raises(ProtocolError) as info:  # a client that wants A to sign 2^31 values
            server.receive_hello(psi.ClientHello(set_size=2**31, chunk_size=16))
        assert info.value.field == "psi.client_hello.set_size"
    finally:
        server.close()
    ledger = psi.SigningLedger(max_signatures=40)
    first = psi.PsiServer(["a", "b"], key=rsa_key, workers=1, ledger=ledger, client="bob", allow_insecure_keys=True)
    client = psi.PsiClient([f"id{i}" for i in range(30)], chunk_size=8, min_key_bits=1024)
    try:
        psi.run_psi(first, client)
    finally:
        first.close()
    assert ledger.signed == {"bob": 30}
    again = psi.PsiServer(["a"], key=rsa_key, workers=1, ledger=ledger, client="bob", allow_insecure_keys=True)
    try:  # a new session does not reset bob's allowance
        with pytest.raises(ProtocolError, match="set_size"):
            again.receive_hello(psi.ClientHello(set_size=11, chunk_size=8))
        again.receive_hello(psi.ClientHello(set_size=10, chunk_size=8))
    finally:
        again.close()


def _insecure():
    import inspect

    return {"allow_insecure_keys": True} if "allow_insecure_keys" in inspect.signature(psi.PsiServer).parameters else {}
