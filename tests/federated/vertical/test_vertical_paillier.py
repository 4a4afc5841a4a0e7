"""Accelerated and packed Paillier against phe (the oracle) and exact integer arithmetic."""

import secrets
import time

import numpy as np
import pytest

from fedarena.federated.vertical import paillier as P
from fedarena.federated.vertical import packing as K
from fedarena.federated.vertical.messages import ProtocolError


@pytest.fixture(scope="module")
def keys():
    pk, sk = P.generate_keypair(1024, allow_insecure_keys=True)
    return pk, sk, P.FastPublicKey(pk), P.FastPrivateKey(sk)


def test_crt_decryption_matches_phe(keys):
    pk, sk, fk, fs = keys
    for m in [0, 1, 12345, pk.n - 1, secrets.randbelow(pk.n)]:
        c = pk.raw_encrypt(m)
        assert fs.decrypt_int(c) == sk.raw_decrypt(c) == m


def test_fast_encryption_decrypts_with_phe(keys):
    pk, sk, fk, fs = keys
    x = np.array([1.5, -2.25, 0.0, 1e-3, -7.0])
    v = fk.encrypt(x, 24)
    assert [sk.decrypt(P.to_phe(v, i)) for i in range(len(x))] == pytest.approx(np.rint(x * 2**24) / 2**24, abs=0)
    back = P.from_phe(fk, [pk.encrypt(float(t), precision=2**-24).decrease_exponent_to(-6) for t in x])
    assert fs.decrypt(back) == pytest.approx(x, abs=2**-20)


def test_homomorphic_vector_ops_are_exact(keys):
    pk, sk, fk, fs = keys
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=6), rng.normal(size=6)
    X = rng.normal(size=(6, 3))
    va, vb = fk.encrypt(a, 20), fk.encrypt(b, 16)
    qa, qb = np.rint(a * 2**20).astype(np.int64), np.rint(b * 2**16).astype(np.int64)
    s = va + vb  # aligned to 20 fractional bits
    assert [P.to_signed(m, pk.n) for m in fs.decrypt_ints(s.cs)] == list(qa + qb * 16)
    qx = np.rint(X * 2**12).astype(np.int64)
    r = va.rmatmul(X, 12)
    assert r.frac_bits == 32
    assert [P.to_signed(m, pk.n) for m in fs.decrypt_ints(r.cs)] == [int(v) for v in qa.astype(object) @ qx.astype(object)]
    p = va.add_plain(b)
    assert fs.decrypt(p) == pytest.approx((qa + np.rint(b * 2**20)) / 2**20, abs=0)
    assert fs.decrypt(va.scale(-0.25, 4)) == pytest.approx(-4 * qa / 2**24, abs=0)


def test_pool_supplies_fresh_obfuscators(keys):
    pk, sk, fk, fs = keys
    pool = P.ObfuscationPool(pk.n, capacity=40, workers=0, background=False)
    pool.fill()
    assert len(pool) == 40
    vals = pool.take(50)  # 40 from the pool, 10 computed inline
    assert pool.hits == 40 and pool.misses == 10 and len(set(vals)) == 50
    n2 = pk.n * pk.n
    for r in vals[:5]:  # each is an n-th residue: it encrypts 0
        assert sk.raw_decrypt(r % n2) == 0
    fkp = P.FastPublicKey(pk, pool)
    pool.fill(10)
    v = fkp.encrypt(np.array([3.0, -1.0]), 8)
    assert fs.decrypt(v).tolist() == [3.0, -1.0]
    pool.close()


def test_background_refill_runs():
    pk, _ = P.generate_keypair(512, allow_insecure_keys=True)
    pool = P.ObfuscationPool(pk.n, capacity=16, batch=4, workers=0, background=True)
    try:
        for _ in range(600):  # liveness only: the refill thread fills the pool eventually
            if len(pool) == 16:
                break
            time.sleep(0.05)
        assert len(pool) == 16
        pool.take(12)
        for _ in range(600):
            if len(pool) == 16:
                break
            time.sleep(0.05)
        assert len(pool) == 16
    finally:
        pool.close()


def test_ciphertext_parsing_rejects_bad_values(keys):
    pk, sk, fk, fs = keys
    good = fk.encrypt(np.array([1.0]), 8)
    assert P.from_bytes(fk, good.to_bytes(), 1, 8, "g").cs == good.cs
    with pytest.raises(ProtocolError, match=r"c\[0\].*outside"):
        P.from_bytes(fk, int(fk.nsquare).to_bytes(fk.width, "big"), 1, 8, "c")
    with pytest.raises(ProtocolError, match=r"c\[0\].*unit"):
        P.from_bytes(fk, int(fk.n).to_bytes(fk.width, "big"), 1, 8, "c")
    with pytest.raises(ProtocolError, match="need"):
        P.from_bytes(fk, good.to_bytes() + b"\x00", 1, 8, "c")


# ----------------------------------------------------------------------------- packing


def test_packed_sums_and_scalar_products_are_exact(keys):
    pk, sk, fk, fs = keys
    layout = K.make_layout(1024, value_bound=2.0, frac_bits=16, headroom_bits=12)
    assert layout.slots * layout.slot_bits <= 1022 and layout.slots >= 20
    packer = K.SlotPacker(fk, layout)
    rng = np.random.default_rng(1)
    xs = [rng.uniform(-2, 2, 45) for _ in range(3)]
    qs = [np.rint(x * 2**16).astype(np.int64) for x in xs]
    enc = [packer.encrypt(x) for x in xs]
    assert len(enc[0]) == 2  # 45 values in two plaintexts
    total = [packer.sum([e[j] for e in enc]) for j in range(2)]
    assert packer.decrypt_ints(fs, total) == [int(v) for v in qs[0] + qs[1] + qs[2]]
    for k in (5, -7, 0):
        prod = [packer.mul_scalar(c, k) for c in enc[0]]
        assert packer.decrypt_ints(fs, prod) == [int(v) for v in k * qs[0]]
    # a combination: 3 x0 - 2 x1 + plain x2
    comb = [packer.add_plain(packer.add(packer.mul_scalar(a, 3), packer.mul_scalar(b, -2)), xs[2][j * layout.slots:(j + 1) * layout.slots])
            for j, (a, b) in enumerate(zip(enc[0], enc[1]))]
    assert packer.decrypt_ints(fs, comb) == [int(v) for v in 3 * qs[0] - 2 * qs[1] + qs[2]]
    assert packer.decrypt(fs, comb) == pytest.approx((3 * qs[0] - 2 * qs[1] + qs[2]) / 2**16, abs=0)
    fixed = [packer.mul_fixed(c, -0.5, 4) for c in enc[0]]
    assert packer.decrypt(fs, fixed) == pytest.approx(-0.5 * qs[0] / 2**16, abs=0)


def test_packed_overflow_is_refused_before_it_happens(keys):
    pk, sk, fk, fs = keys
    layout = K.make_layout(1024, value_bound=1.0, frac_bits=8, headroom_bits=3)
    packer = K.SlotPacker(fk, layout)
    x = np.full(layout.slots, 1.0)  # every slot at its maximum
    fresh = packer.encrypt(x)[0]
    fresh_bound = 2 * layout.offset
    max_terms = ((1 << layout.slot_bits) - 1) // fresh_bound  # the closed-form limit
    acc, terms = fresh, 1
    while True:
        try:
            acc = packer.add(acc, fresh)
        except K.PackingOverflow:
            break
        terms += 1
        assert packer.decrypt(fs, [acc]).tolist() == [float(terms)] * layout.slots  # still exact
    assert terms == max_terms
    with pytest.raises(K.PackingOverflow, match="mul_scalar"):
        packer.mul_scalar(fresh, max_terms + 1)
    with pytest.raises(K.PackingOverflow, match="exceeds the layout bound"):
        packer.encrypt(np.array([1.5]))
    with pytest.raises(ValueError, match="does not fit"):
        K.make_layout(1024, value_bound=2.0**1000, frac_bits=30, headroom_bits=8)


def test_pack_ciphertexts_for_one_decryption(keys):
    pk, sk, fk, fs = keys
    vals = [secrets.randbelow(1 << 60) for _ in range(40)]
    cs = fk.encrypt_ints(vals)
    packed = K.pack_ciphertexts(fk, cs, 61)
    assert len(packed) == -(-40 // ((1024 - 2) // 61))
    assert K.unpack_ints(fs.decrypt_ints(packed), 61, 40, 1024) == vals


def test_default_key_is_2048_bits_and_packs():
    pk, sk = P.generate_keypair()
    assert pk.n.bit_length() == 2048
    fk, fs = P.FastPublicKey(pk), P.FastPrivateKey(sk)
    layout = K.make_layout(2048, value_bound=8.0, frac_bits=24, headroom_bits=10)
    packer = K.SlotPacker(fk, layout)
    x = np.linspace(-8, 8, 70)
    enc = packer.encrypt(x)
    assert len(enc) == -(-70 // layout.slots)
    assert packer.decrypt(fs, enc) == pytest.approx(np.rint(x * 2**24) / 2**24, abs=0)
    c = fk.encrypt_ints([42])[0]
    assert fs.decrypt_int(c) == sk.raw_decrypt(int(c)) == 42


def test_key_holder_crt_encryption_is_valid_paillier(keys):
    pk, sk, fk, fs = keys
    obf = fs.obfuscators(20)
    assert len(set(obf)) == 20
    assert all(sk.raw_decrypt(int(r)) == 0 for r in obf)  # n-th residues: encryptions of 0
    ms = [0, 1, pk.n - 1, 987654321]
    assert [sk.raw_decrypt(int(c)) for c in fs.encrypt_ints(ms)] == ms


def test_multi_exp_matches_separate_exponentiations(keys):
    import gmpy2
    import random

    pk, sk, fk, fs = keys
    rnd = random.Random(5)
    cs = fk.encrypt_ints([rnd.randrange(1000) for _ in range(60)])
    inv = [gmpy2.invert(c, fk.nsquare) for c in cs]
    for bits in (3, 20, 45):
        es = [rnd.randint(-(2**bits), 2**bits) for _ in cs]
        es[3] = 0
        ref = gmpy2.mpz(1)
        for c, e in zip(cs, es):
            ref = ref * gmpy2.powmod(c, e, fk.nsquare) % fk.nsquare
        assert P.multi_exp(cs, inv, es, fk.nsquare) == ref
