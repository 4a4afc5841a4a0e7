"""Building blocks of secure aggregation checked against independent oracles: Shamir vs. exact rational Lagrange
interpolation, the AES-CTR PRG vs. AES-ECB on explicit counter blocks, neighbour graphs, wire round trips,
quantization capacity."""

import itertools
import os
from fractions import Fraction

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedarena.privacy.secagg import MalformedMessage, decode, dequantize, encode, quantize
from fedarena.privacy.secagg import messages as m
from fedarena.privacy.secagg import neighbours, prg, shamir
from fedarena.privacy.secagg.quantization import check_capacity


@pytest.mark.quick
def test_shamir_any_t_shares_reconstruct_fewer_do_not():
    secret = os.urandom(32)
    holders = np.array([3, 7, 8, 20, 31, 65520])
    shares = shamir.split(secret, holders, 3)
    for subset in itertools.combinations(range(6), 3):
        idx = list(subset)
        assert shamir.combine(holders[idx], shares[idx]).tobytes() == secret
    with pytest.raises(shamir.ShamirError, match="inconsistent"):
        shamir.combine(holders[:2], shares[:2])  # 2 < t shares: values are not bytes (w.p. 1 - (256/p)^32)


def test_shamir_lagrange_matches_exact_rational_interpolation():
    p = shamir.PRIME
    x = [2, 5, 11, 400, 65000]
    lam = shamir.lagrange_at_zero(np.array(x))
    for i, xi in enumerate(x):
        frac = Fraction(1)
        for j, xj in enumerate(x):
            if j != i:
                frac *= Fraction(xj, xj - xi)
        assert int(lam[i]) == frac.numerator * pow(frac.denominator, -1, p) % p


def test_shamir_share_values_match_polynomial_evaluation():
    secret = bytes(range(10, 42))
    holders = np.arange(1, 9)
    shares = shamir.split(secret, holders, 4)
    holders = [int(h) for h in holders]
    # rebuild every coefficient from 4 shares with exact arithmetic; the constant term is the secret byte and
    # all 8 shares lie on the same cubic
    p = shamir.PRIME
    for limb in range(0, 32, 7):
        ys = [int(s) for s in shares[:, limb]]
        for k in range(4, 8):
            # Lagrange-evaluate the cubic through the first 4 points at holder k, compare with its share
            val = 0
            for i in range(4):
                num = den = 1
                for j in range(4):
                    if j != i:
                        num = num * (holders[k] - holders[j]) % p
                        den = den * (holders[i] - holders[j]) % p
                val = (val + ys[i] * num * pow(den, -1, p)) % p
            assert val == ys[k]
    with pytest.raises(shamir.ShamirError, match="threshold"):
        shamir.split(secret, np.array(holders), 9)
    with pytest.raises(shamir.ShamirError, match="distinct"):
        shamir.split(secret, np.array([1, 1, 2]), 2)


@pytest.mark.quick
def test_prg_is_aes_ctr_keystream():
    seed = os.urandom(32)
    d = 1000
    ecb = Cipher(algorithms.AES(seed), modes.ECB()).encryptor()
    blocks = b"".join(ecb.update(i.to_bytes(16, "big")) for i in range(d * 4 // 16))
    np.testing.assert_array_equal(prg.expand(seed, d), np.frombuffer(blocks, "<u4"))
    acc = np.zeros(d, np.uint32)
    prg.add_into(acc, seed)
    prg.add_into(acc, seed, negate=True)
    assert not acc.any()
    with pytest.raises(ValueError, match="seed"):
        prg.expand(b"short", 4)


def test_neighbour_graph_regular_symmetric_consistent():
    members = np.arange(1, 41) * 3
    seed = os.urandom(32)
    table = neighbours.neighbour_table(seed, members, 6)
    for u, nb in table.items():
        assert len(nb) == 6 and u not in nb
        for v in nb:
            assert u in table[int(v)]
        np.testing.assert_array_equal(neighbours.neighbours_of(u, seed, members, 6), nb)
    full = neighbours.neighbour_table(seed, members[:5], 8)
    assert all(len(v) == 4 for v in full.values())
    other = neighbours.neighbour_table(os.urandom(32), members, 6)
    assert any(not np.array_equal(other[u], table[u]) for u in table)


def test_messages_round_trip():
    k = os.urandom(32)
    msgs = [
        m.AdvertiseKeys(3, 1, k, k[::-1]),
        m.KeyBroadcast(3, 2, k, (1, 2, 5), {1: (k, k), 5: (k, k[::-1])}),
        m.ShareKeys(3, 1, {2: b"abc", 5: b""}),
        m.ShareBroadcast(3, 2, {1: b"xyz"}),
        m.MaskedInput(3, 1, np.arange(7, dtype=np.uint32)),
        m.UnmaskRequest(3, 2, (1, 2), (5,)),
        m.UnmaskShares(3, 1, {1: np.arange(32, dtype=np.uint16)}, {5: np.ones(32, np.uint16)}),
    ]
    for msg in msgs:
        back = decode(encode(msg))
        assert type(back) is type(msg)
        for f in msg.__dataclass_fields__:
            a, b = getattr(msg, f), getattr(back, f)
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b)
            elif isinstance(a, dict) and a and isinstance(next(iter(a.values())), np.ndarray):
                assert a.keys() == b.keys() and all(np.array_equal(a[i], b[i]) for i in a)
            else:
                assert a == b, f
    data = encode(m.ShareKeys(3, 1, {2: b"abc"}))
    with pytest.raises(MalformedMessage, match="ShareKeys.ciphertexts"):
        decode(data[:-2])
    dup = encode(m.ShareKeys(3, 1, {2: b"a"}))
    h = m.HEADER.size
    dup = dup[:h] + (2).to_bytes(4, "little") + dup[h + 4:] + dup[h + 4:]
    with pytest.raises(MalformedMessage, match="twice"):
        decode(dup)


def test_quantization_round_trip_and_capacity():
    x = np.array([-2.0, -0.5, 0.0, 0.25, 3.0])
    q = quantize(x, 1.0, 100.0, 12)
    assert q.dtype == np.uint32 and int(q.max()) < 2**12
    np.testing.assert_allclose(dequantize(q, 100.0, 12), [-1.0, -0.5, 0.0, 0.25, 1.0])
    check_capacity(20, 1.0, 100.0, 12)  # 20 * 100 = 2000 < 2048
    with pytest.raises(ValueError, match="modulus_bits"):
        check_capacity(21, 1.0, 100.0, 12)
