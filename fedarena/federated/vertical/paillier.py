"""Paillier encryption accelerated on top of ``phe``: obfuscation pools, CRT decryption, fixed-point vectors.

Paillier (Eurocrypt 1999) with g = n + 1, as in ``phe``: E(m) = (1 + m n) r^n mod n^2. The costly part
of an encryption is the obfuscator r^n mod n^2, which does not depend on m, so an
:class:`ObfuscationPool` precomputes them on background processes and an encryption is then one
multiplication (the pool is the "precomputed randomness" trick of FATE's ``fate_paillier``).
Decryption uses the Chinese remainder theorem (Paillier 1999, sec. 7): two exponentiations modulo
p^2 and q^2 with half-size exponents, then Garner recombination.

Keys are ``phe`` keys (``phe.generate_paillier_keypair``, randomness from ``random.SystemRandom``);
ciphertexts here are plain integers so vectors of them can be processed without per-object overhead,
and :func:`to_phe` / :func:`from_phe` convert to ``phe.EncryptedNumber`` and back.

Fixed point: a real x is the integer round(x * 2^f) mod n, negatives as n - |.|; a
:class:`CipherVector` carries its ``frac_bits`` f, which add up under plaintext scaling.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
from fractions import Fraction
import multiprocessing as mp
import secrets
import threading
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import gmpy2
import numpy as np
import phe

DEFAULT_KEY_BITS = 2048
MIN_KEY_BITS = 2048
"""smallest modulus accepted without ``allow_insecure_keys`` (NIST SP 800-57 Part 1: 2048-bit RSA-type moduli
give 112-bit security; Paillier's security rests on factoring the same kind of modulus)"""


def check_key_bits(bits: int, allow_insecure_keys: bool = False, field: str = "key_bits") -> None:
    """Refuse a modulus below :data:`MIN_KEY_BITS` unless ``allow_insecure_keys`` (a switch for fast tests)."""
    if bits < MIN_KEY_BITS and not allow_insecure_keys:
        raise ValueError(f"{field}: {bits}-bit keys are refused (need >= {MIN_KEY_BITS}; allow_insecure_keys=True "
                         "is for tests only)")


def generate_keypair(bits: int = DEFAULT_KEY_BITS, *, allow_insecure_keys: bool = False
                     ) -> tuple[phe.PaillierPublicKey, phe.PaillierPrivateKey]:
    """A ``phe`` key pair; 2048-bit modulus unless asked otherwise (below 2048 only with ``allow_insecure_keys``)."""
    if bits < 512 or bits % 8:
        raise ValueError(f"key_bits: {bits} must be a multiple of 8 and >= 512")
    check_key_bits(bits, allow_insecure_keys)
    return phe.generate_paillier_keypair(n_length=bits)


def _random_unit(n: int) -> int:
    while True:
        r = secrets.randbelow(n - 1) + 1
        if gmpy2.gcd(r, n) == 1:
            return r


def obfuscators(n: int, count: int) -> list[int]:
    """``count`` fresh values r^n mod n^2 (r uniform in Z_n^*)."""
    nn, nsq = gmpy2.mpz(n), gmpy2.mpz(n) * n
    return [int(gmpy2.powmod(_random_unit(n), nn, nsq)) for _ in range(count)]


class ObfuscationPool:
    """A store of r^n mod n^2 values, refilled in the background when it runs below ``low``.

    ``workers`` processes compute batches (0 = a background thread in this process). ``take`` never
    blocks on the pool: when it is empty it computes the missing values inline (counted in
    ``misses``), so a caller always gets fresh, never reused, randomness.
    """

    def __init__(self, n: int, capacity: int = 4096, low: int | None = None, batch: int = 64,
                 workers: int = 1, background: bool = True) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: must be >= 1, got {capacity}")
        self.n, self.capacity, self.batch = int(n), int(capacity), int(batch)
        self.low = capacity // 2 if low is None else int(low)
        self._values: deque[int] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.hits = 0
        self.misses = 0
        self._exec: cf.Executor | None = None
        if workers > 0:
            self._exec = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
        self._workers = max(1, workers)
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._refill_loop, name="obfuscation-pool", daemon=True)
            self._thread.start()
            self._wake.set()

    def __len__(self) -> int:
        return len(self._values)

    def _compute(self, count: int) -> list[int]:
        if self._exec is None:
            return obfuscators(self.n, count)
        futs = [self._exec.submit(obfuscators, self.n, self.batch) for _ in range(max(1, count // self.batch))]
        return [v for f in futs for v in f.result()]

    def fill(self, count: int | None = None) -> None:
        """Synchronously top the pool up to ``count`` values (default: capacity)."""
        target = self.capacity if count is None else min(int(count), self.capacity)
        while len(self._values) < target:
            need = target - len(self._values)
            vals = self._compute(min(need, self.batch * self._workers)) if self._exec else obfuscators(self.n, min(need, self.batch))
            with self._lock:
                self._values.extend(vals[: self.capacity - len(self._values)])

    def _refill_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            while not self._stop.is_set() and len(self._values) < self.capacity:
                try:
                    vals = self._compute(self.batch * self._workers)
                except RuntimeError:  # executor shut down while closing
                    return
                with self._lock:
                    self._values.extend(vals[: self.capacity - len(self._values)])

    def take(self, count: int) -> list[int]:
        with self._lock:
            k = min(count, len(self._values))
            out = [self._values.popleft() for _ in range(k)]
        self.hits += k
        if k < count:
            self.misses += count - k
            out.extend(obfuscators(self.n, count - k))
        if len(self._values) < self.low:
            self._wake.set()
        return out

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._exec is not None:
            self._exec.shutdown(wait=True, cancel_futures=True)
            self._exec = None

    def __enter__(self) -> "ObfuscationPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class FastPublicKey:
    """Raw Paillier arithmetic on integer ciphertexts for one ``phe`` public key."""

    def __init__(self, public_key: phe.PaillierPublicKey, pool: ObfuscationPool | None = None) -> None:
        self.phe = public_key
        self.n = gmpy2.mpz(public_key.n)
        self.nsquare = self.n * self.n
        self.pool = pool
        self.bits = int(public_key.n).bit_length()
        self.width = (int(self.nsquare).bit_length() + 7) // 8  # bytes of one ciphertext

    def obfuscators(self, count: int) -> list[int]:
        return self.pool.take(count) if self.pool is not None else obfuscators(int(self.n), count)

    def encrypt_ints(self, ms: Sequence[int]) -> list:
        """E(m) for integers already reduced mod n (encode negatives first)."""
        n, nsq = self.n, self.nsquare
        rs = self.obfuscators(len(ms))
        return [((1 + gmpy2.mpz(m) * n) * r) % nsq for m, r in zip(ms, rs)]

    def encrypt(self, x: np.ndarray | Sequence[float], frac_bits: int) -> "CipherVector":
        return CipherVector(self, self.encrypt_ints(encode(x, frac_bits, int(self.n))), frac_bits)

    def add(self, c1, c2):
        return (c1 * c2) % self.nsquare

    def add_int(self, c, m: int):
        """E(a) -> E(a + m) without fresh randomness (the result is as random as ``c``)."""
        return (c * (1 + (gmpy2.mpz(m) % self.n) * self.n)) % self.nsquare

    def mul_int(self, c, k: int):
        """E(a) -> E(k a) for any integer k (negative k through the inverse ciphertext)."""
        k = int(k)
        if k < 0:
            return gmpy2.powmod(gmpy2.invert(c, self.nsquare), -k, self.nsquare)
        return gmpy2.powmod(c, k, self.nsquare)

    def rerandomize(self, cs: Sequence) -> list:
        rs = self.obfuscators(len(cs))
        return [(c * r) % self.nsquare for c, r in zip(cs, rs)]


class FastPrivateKey:
    """CRT decryption (Paillier 1999, sec. 7) from the primes of a ``phe`` private key."""

    def __init__(self, private_key: phe.PaillierPrivateKey) -> None:
        self.phe = private_key
        p, q = gmpy2.mpz(private_key.p), gmpy2.mpz(private_key.q)
        self.n = p * q
        self.p, self.q = p, q
        self.psq, self.qsq = p * p, q * q
        self.q_inv = gmpy2.invert(q, p)
        g = self.n + 1
        self.hp = gmpy2.invert((gmpy2.powmod(g, p - 1, self.psq) - 1) // p, p)
        self.hq = gmpy2.invert((gmpy2.powmod(g, q - 1, self.qsq) - 1) // q, q)
        self.public = FastPublicKey(private_key.public_key)
        self._psq_inv = gmpy2.invert(self.psq, self.qsq)

    def obfuscators(self, count: int) -> list:
        """Uniform n-th residues mod n^2, computed by the key holder through CRT.

        Modulo p^2 the n-th residues form the cyclic subgroup of order p - 1, and s -> s^p maps
        Z_{p^2}^* uniformly onto it (p is prime to p - 1), so s_p^p mod p^2 and s_q^q mod q^2 for
        uniform s_p, s_q, combined by CRT, are distributed exactly as r^n mod n^2 for uniform r:
        two half-length exponents modulo half-length moduli instead of one |n|-bit exponent mod n^2.
        """
        out = []
        p, q, psq, qsq = self.p, self.q, self.psq, self.qsq
        for _ in range(count):
            sp = gmpy2.mpz(_random_unit(int(psq)))
            sq = gmpy2.mpz(_random_unit(int(qsq)))
            a = gmpy2.powmod(sp, p, psq)
            b = gmpy2.powmod(sq, q, qsq)
            out.append(a + ((b - a) * self._psq_inv % qsq) * psq)
        return out

    def encrypt_ints(self, ms: Sequence[int]) -> list:
        """Encryption by the key holder (same ciphertext distribution, CRT obfuscators)."""
        n, nsq = self.n, self.public.nsquare
        return [((1 + gmpy2.mpz(m) * n) * r) % nsq for m, r in zip(ms, self.obfuscators(len(ms)))]

    def decrypt_int(self, c) -> int:
        """The plaintext in [0, n)."""
        c = gmpy2.mpz(c)
        mp_ = ((gmpy2.powmod(c % self.psq, self.p - 1, self.psq) - 1) // self.p * self.hp) % self.p
        mq = ((gmpy2.powmod(c % self.qsq, self.q - 1, self.qsq) - 1) // self.q * self.hq) % self.q
        return int(mq + ((mp_ - mq) * self.q_inv % self.p) * self.q)

    def decrypt_ints(self, cs: Sequence) -> list[int]:
        return [self.decrypt_int(c) for c in cs]

    def decrypt(self, v: "CipherVector") -> np.ndarray:
        return decode(self.decrypt_ints(v.cs), v.frac_bits, int(self.n))


def fixed_point(v: float, frac_bits: int) -> int:
    """round(v * 2^frac_bits) as an exact Python int (ties to even, like ``np.rint``), for any frac_bits >= 0.

    Scaling a float by a power of two is exact (``math.ldexp``); only when that overflows the float
    range is the product formed as an exact fraction. No int64 (or float) overflow can occur.
    """
    try:
        return round(math.ldexp(v, frac_bits))
    except OverflowError:
        return round(Fraction(v) * (1 << frac_bits))


def fixed_point_ints(x: np.ndarray | Sequence[float], frac_bits: int, field: str = "values") -> list[int]:
    """:func:`fixed_point` of every element; refuses NaN and Inf (naming ``field``)."""
    if frac_bits < 0:
        raise ValueError(f"frac_bits: must be >= 0, got {frac_bits}")
    arr = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{field}: NaN or Inf cannot be encoded")
    return [fixed_point(v, frac_bits) for v in arr.tolist()]


def encode(x: np.ndarray | Sequence[float], frac_bits: int, n: int) -> list[int]:
    """Fixed-point integers round(x * 2^f) mod n; refuses NaN/Inf and values that do not fit n/3."""
    arr = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(arr)):
        raise ValueError("values: NaN or Inf cannot be encrypted")
    limit = n // 3
    out = []
    for v, m in zip(arr.tolist(), fixed_point_ints(arr, frac_bits)):
        if abs(m) > limit:
            raise OverflowError(f"values: {v} at {frac_bits} fractional bits does not fit the key's plaintext space")
        out.append(m % n)
    return out


def to_signed(m: int, n: int) -> int:
    """Plaintext in [0, n) -> signed integer in (-n/2, n/2]."""
    return m - n if m > n // 2 else m


def decode(ms: Sequence[int], frac_bits: int, n: int) -> np.ndarray:
    return np.array([to_signed(int(m), n) / 2.0**frac_bits if frac_bits < 1000 else 0.0 for m in ms], dtype=np.float64)


@dataclass
class CipherVector:
    """A vector of Paillier ciphertexts of fixed-point numbers with ``frac_bits`` fractional bits."""

    key: FastPublicKey
    cs: list
    frac_bits: int

    def __len__(self) -> int:
        return len(self.cs)

    def _align(self, other: "CipherVector") -> tuple[list, list, int]:
        if len(other) != len(self):
            raise ValueError(f"length mismatch: {len(self)} vs {len(other)}")
        a, b, f = self.cs, other.cs, max(self.frac_bits, other.frac_bits)
        if self.frac_bits < f:
            a = [self.key.mul_int(c, 1 << (f - self.frac_bits)) for c in a]
        if other.frac_bits < f:
            b = [self.key.mul_int(c, 1 << (f - other.frac_bits)) for c in b]
        return a, b, f

    def __add__(self, other: "CipherVector") -> "CipherVector":
        a, b, f = self._align(other)
        nsq = self.key.nsquare
        return CipherVector(self.key, [(x * y) % nsq for x, y in zip(a, b)], f)

    def add_plain(self, x: np.ndarray) -> "CipherVector":
        """E(a) + x elementwise, x encoded at this vector's precision."""
        ms = encode(x, self.frac_bits, int(self.key.n))
        if len(ms) != len(self):
            raise ValueError(f"length mismatch: {len(self)} vs {len(ms)}")
        return CipherVector(self.key, [self.key.add_int(c, m) for c, m in zip(self.cs, ms)], self.frac_bits)

    def scale(self, k: float, frac_bits: int) -> "CipherVector":
        """E(a) * k with k encoded at ``frac_bits``; precision becomes ``self.frac_bits + frac_bits``."""
        (m,) = fixed_point_ints([k], frac_bits, "k")
        return CipherVector(self.key, [self.key.mul_int(c, m) for c in self.cs], self.frac_bits + frac_bits)

    def mul_plain(self, x: np.ndarray, frac_bits: int) -> "CipherVector":
        """Elementwise E(a_i) * x_i."""
        xs = fixed_point_ints(x, frac_bits, "x")
        if len(xs) != len(self):
            raise ValueError(f"length mismatch: {len(self)} vs {len(xs)}")
        return CipherVector(self.key, [self.key.mul_int(c, m) for c, m in zip(self.cs, xs)], self.frac_bits + frac_bits)

    def rmatmul(self, x: np.ndarray, frac_bits: int) -> "CipherVector":
        """E(x^T a) for a plaintext matrix x of shape (len(self), k): k encrypted inner products.

        Each E(a_i) and its inverse are exponentiated by |x_ij| (gmpy2), so negative entries cost
        no more than positive ones. The fixed-point entries round(x_ij 2^f) are exact Python ints
        (:func:`fixed_point`), whatever their size.
        """
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] != len(self):
            raise ValueError(f"x: expected shape ({len(self)}, k), got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("x: NaN or Inf")
        k = x.shape[1]
        flat = fixed_point_ints(x, frac_bits, "x")
        cols = [flat[j::k] for j in range(k)]
        nsq = self.key.nsquare
        inv = [gmpy2.invert(c, nsq) for c in self.cs] if any(v < 0 for v in flat) else self.cs
        out = [multi_exp(self.cs, inv, col, nsq) for col in cols]
        return CipherVector(self.key, out, self.frac_bits + frac_bits)

    def sum(self) -> "CipherVector":
        nsq = self.key.nsquare
        acc = gmpy2.mpz(1)
        for c in self.cs:
            acc = acc * c % nsq
        return CipherVector(self.key, [acc], self.frac_bits)

    def to_bytes(self) -> bytes:
        w = self.key.width
        return b"".join(int(c).to_bytes(w, "big") for c in self.cs)


def multi_exp(bases: Sequence, inverses: Sequence, exps: Sequence[int], mod) -> object:
    """prod_i bases_i^exps_i mod ``mod`` for signed exponents (negative ones use ``inverses``).

    Bucket method (Pippenger 1976; see Bernstein et al., "Faster batch forgery identification",
    INDOCRYPT 2012, sec. 4): per window of c exponent bits, each base goes into the bucket of its
    digit (one multiplication), and the buckets are combined with 2 * 2^c multiplications; about
    k (1 + log2(e)/c) multiplications instead of k full exponentiations.
    """
    terms = [(b if e > 0 else ib, abs(int(e))) for b, ib, e in zip(bases, inverses, exps) if e]
    if not terms:
        return gmpy2.mpz(1)
    if len(terms) < 8:
        acc = gmpy2.mpz(1)
        for b, e in terms:
            acc = acc * gmpy2.powmod(b, e, mod) % mod
        return acc
    top = max(e for _, e in terms).bit_length()
    c = max(2, min(10, int(math.log2(len(terms))) - 2))
    mask = (1 << c) - 1
    acc = gmpy2.mpz(1)
    for shift in range(((top + c - 1) // c - 1) * c, -1, -c):
        if acc != 1:
            for _ in range(c):
                acc = acc * acc % mod
        buckets: list = [None] * (mask + 1)
        for b, e in terms:
            dgt = (e >> shift) & mask
            if dgt:
                cur = buckets[dgt]
                buckets[dgt] = b if cur is None else cur * b % mod
        running = total = None
        for dgt in range(mask, 0, -1):  # sum_d d * bucket_d as running products
            bk = buckets[dgt]
            if bk is not None:
                running = bk if running is None else running * bk % mod
            if running is not None:
                total = running if total is None else total * running % mod
        if total is not None:
            acc = acc * total % mod
    return acc


def from_bytes(key: FastPublicKey, blob: bytes, count: int, frac_bits: int, field: str) -> CipherVector:
    """Parse ``count`` ciphertexts; each must be a unit of Z_{n^2} (in range and coprime to n)."""
    from fedarena.federated.vertical.messages import ProtocolError, blob_to_ints

    if not 0 <= frac_bits <= 512:
        raise ProtocolError(f"{field}.frac_bits", f"{frac_bits} outside 0..512")
    cs = blob_to_ints(blob, key.width, count, field)
    nsq, n = key.nsquare, key.n
    out = []
    for i, c in enumerate(cs):
        if not 0 < c < nsq:
            raise ProtocolError(f"{field}[{i}]", "ciphertext outside Z_{n^2}")
        c = gmpy2.mpz(c)
        if gmpy2.gcd(c, n) != 1:
            raise ProtocolError(f"{field}[{i}]", "ciphertext is not a unit mod n^2")
        out.append(c)
    return CipherVector(key, out, frac_bits)


def to_phe(v: CipherVector, index: int) -> phe.EncryptedNumber:
    """One element as a ``phe.EncryptedNumber`` (phe's exponent is base-16: only for frac_bits % 4 == 0)."""
    if v.frac_bits % 4:
        raise ValueError(f"frac_bits {v.frac_bits} is not a multiple of 4 (phe uses base 16)")
    return phe.EncryptedNumber(v.key.phe, int(v.cs[index]), -v.frac_bits // 4)


def from_phe(key: FastPublicKey, xs: Sequence[phe.EncryptedNumber]) -> CipherVector:
    exps = {x.exponent for x in xs}
    if len(exps) != 1:
        raise ValueError("from_phe: all numbers need the same exponent (call decrease_exponent_to)")
    e = exps.pop()
    if e > 0:
        raise ValueError("from_phe: positive exponents are not fixed-point here")
    return CipherVector(key, [gmpy2.mpz(x.ciphertext(be_secure=False)) for x in xs], -4 * e)
