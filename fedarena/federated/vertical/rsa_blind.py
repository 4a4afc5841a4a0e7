"""RSA blind signatures for private set intersection: keys, full-domain hash, CRT signing, worker pool.

The arithmetic of the RSA-blind-signature PSI (De Cristofaro & Tsudik, "Practical Private Set
Intersection Protocols with Linear Complexity", FC 2010; the protocol of Yang et al., *Federated
Learning*, 2019, sec. 5.2):

* ``H``: a full-domain hash of an ID into Z_n (SHAKE-256 stretched 128 bits past |n|, then reduced,
  so the bias is below 2^-128), bound to the modulus;
* signing ``x -> x^d mod n`` with the Chinese remainder theorem (two half-size exponentiations and
  Garner recombination, Menezes et al., *Handbook of Applied Cryptography*, 14.75), or without it
  for comparison. Every CRT signature is checked (``s^e = x mod n``) before it leaves the signer: a
  single faulty half-exponentiation would otherwise hand the peer a factor of n as
  ``gcd(s^e - x, n)`` (Boneh, DeMillo, Lipton, "On the importance of checking cryptographic
  protocols for faults", Eurocrypt 1997); a failed check raises :class:`SignatureFault`;
* ``H'``: SHA-256 of the fixed-width signature, the tag that is compared;
* a process pool that runs the private-key work on all cores (keys reach the workers through the
  pool's initializer on this machine; nothing from a peer is ever unpickled).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import multiprocessing as mp
import os
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import gmpy2
from cryptography.hazmat.primitives.asymmetric import rsa

DEFAULT_KEY_BITS = 2048
MIN_KEY_BITS = 2048
"""smallest modulus accepted without ``allow_insecure_keys`` (112-bit security, NIST SP 800-57 Part 1)"""
ALLOWED_KEY_BITS = (1024, 2048, 3072, 4096)
PUBLIC_EXPONENT = 65537
TAG_BYTES = 32
_FDH_DOMAIN = b"fedarena/psi/fdh/v1|"
_TAG_DOMAIN = b"fedarena/psi/tag/v1|"


@dataclass(frozen=True)
class RsaPublicKey:
    n: int
    e: int

    @property
    def bits(self) -> int:
        return self.n.bit_length()

    @property
    def width(self) -> int:
        """Bytes of one element of Z_n on the wire."""
        return (self.n.bit_length() + 7) // 8


@dataclass(frozen=True)
class RsaPrivateKey:
    public: RsaPublicKey
    d: int
    p: int
    q: int
    dp: int
    dq: int
    q_inv: int  # q^-1 mod p


class SignatureFault(RuntimeError):
    """A CRT signature failed its check s^e = x mod n; it was not released (it could reveal a factor of n)."""


def check_key_bits(bits: int, allow_insecure_keys: bool = False, field: str = "key_bits") -> None:
    """Refuse a modulus below :data:`MIN_KEY_BITS` unless ``allow_insecure_keys`` (a switch for fast tests)."""
    if bits < MIN_KEY_BITS and not allow_insecure_keys:
        raise ValueError(f"{field}: {bits}-bit RSA keys are refused (need >= {MIN_KEY_BITS}; allow_insecure_keys=True "
                         "is for tests only)")


def generate_key(bits: int = DEFAULT_KEY_BITS, *, allow_insecure_keys: bool = False) -> RsaPrivateKey:
    """A fresh RSA key (``cryptography``'s generator, e = 65537); 2048 bits unless asked otherwise."""
    if bits not in ALLOWED_KEY_BITS:
        raise ValueError(f"key_bits: {bits} not one of {ALLOWED_KEY_BITS}")
    check_key_bits(bits, allow_insecure_keys)
    k = rsa.generate_private_key(public_exponent=PUBLIC_EXPONENT, key_size=bits)
    pn = k.private_numbers()
    pub = RsaPublicKey(n=pn.public_numbers.n, e=pn.public_numbers.e)
    return RsaPrivateKey(pub, pn.d, pn.p, pn.q, pn.dmp1, pn.dmq1, pn.iqmp)


def encode_id(x: str | bytes) -> bytes:
    """Canonical bytes of an ID: a type tag, then UTF-8 for ``str`` (no normalisation: like ``set``)."""
    if isinstance(x, str):
        return b"s" + x.encode("utf-8", "surrogatepass")
    if isinstance(x, (bytes, bytearray)):
        return b"b" + bytes(x)
    raise TypeError(f"ids: an ID must be str or bytes, got {type(x).__name__}")


def full_domain_hash(id_bytes: bytes, pub: RsaPublicKey) -> int:
    """H(id) in Z_n: SHAKE-256 over the modulus and the ID, |n| + 128 bits, reduced mod n."""
    out = (pub.n.bit_length() + 128 + 7) // 8
    h = hashlib.shake_256(_FDH_DOMAIN + pub.n.to_bytes(pub.width, "big") + id_bytes).digest(out)
    return int.from_bytes(h, "big") % pub.n


def tag(signature: int, pub: RsaPublicKey) -> bytes:
    """H'(K): SHA-256 of the fixed-width signature."""
    return hashlib.sha256(_TAG_DOMAIN + int(signature).to_bytes(pub.width, "big")).digest()


class CrtSigner:
    """``x -> x^d mod n`` with gmpy2, by CRT (default) or by one full exponentiation."""

    def __init__(self, key: RsaPrivateKey, crt: bool = True) -> None:
        self.key = key
        self.crt = crt
        self._n = gmpy2.mpz(key.public.n)
        self._d = gmpy2.mpz(key.d)
        self._p, self._q = gmpy2.mpz(key.p), gmpy2.mpz(key.q)
        self._dp, self._dq, self._qi = gmpy2.mpz(key.dp), gmpy2.mpz(key.dq), gmpy2.mpz(key.q_inv)
        self._e = gmpy2.mpz(key.public.e)

    def sign(self, x: int) -> int:
        if not self.crt:
            return int(gmpy2.powmod(x, self._d, self._n))
        x = gmpy2.mpz(x)
        sp = gmpy2.powmod(x % self._p, self._dp, self._p)
        sq = gmpy2.powmod(x % self._q, self._dq, self._q)
        h = (self._qi * (sp - sq)) % self._p
        s = sq + h * self._q
        if gmpy2.powmod(s, self._e, self._n) != x % self._n:  # e = 65537: 17 multiplications, ~1% of the signing
            raise SignatureFault("CRT signature failed its s^e = x mod n check; not released")
        return int(s)

    def sign_many(self, xs: Sequence[int]) -> list[int]:
        return [self.sign(x) for x in xs]

    def tags_for_ids(self, id_bytes: Sequence[bytes]) -> bytes:
        """Concatenated tags t_j = H'(H(a_j)^d) of the server's own IDs."""
        pub = self.key.public
        return b"".join(tag(self.sign(full_domain_hash(b, pub)), pub) for b in id_bytes)


# ----------------------------------------------------------------------------- process pool

_WORKER: CrtSigner | None = None


def _init_worker(key: RsaPrivateKey, crt: bool) -> None:
    global _WORKER
    _WORKER = CrtSigner(key, crt)


def _work_sign(xs: list[int]) -> list[int]:
    assert _WORKER is not None
    return _WORKER.sign_many(xs)


def _work_tags(id_bytes: list[bytes]) -> bytes:
    assert _WORKER is not None
    return _WORKER.tags_for_ids(id_bytes)


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


class SigningPool:
    """Runs signing jobs on ``workers`` processes (inline when ``workers == 1``), results in order.

    ``map_*`` keep at most ``2 * workers`` chunks in flight, so a stream of any length needs memory
    for a bounded number of chunks only.
    """

    def __init__(self, key: RsaPrivateKey, workers: int | None = None, crt: bool = True) -> None:
        self.workers = default_workers() if workers is None else int(workers)
        if self.workers < 1:
            raise ValueError(f"workers: must be >= 1, got {workers}")
        self._local = CrtSigner(key, crt)
        self._pool: cf.ProcessPoolExecutor | None = None
        if self.workers > 1:
            self._pool = cf.ProcessPoolExecutor(
                self.workers, mp_context=mp.get_context("spawn"), initializer=_init_worker, initargs=(key, crt)
            )

    def _map(self, fn_local, fn_remote, chunks: Iterable) -> Iterator:
        if self._pool is None:
            for c in chunks:
                yield fn_local(c)
            return
        pending: list[cf.Future] = []
        for c in chunks:
            pending.append(self._pool.submit(fn_remote, c))
            if len(pending) >= 2 * self.workers:
                yield pending.pop(0).result()
        for f in pending:
            yield f.result()

    def map_sign(self, chunks: Iterable[list[int]]) -> Iterator[list[int]]:
        return self._map(self._local.sign_many, _work_sign, chunks)

    def map_tags(self, chunks: Iterable[list[bytes]]) -> Iterator[bytes]:
        return self._map(self._local.tags_for_ids, _work_tags, chunks)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> "SigningPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
