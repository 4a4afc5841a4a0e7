"""Shamir t-of-n secret sharing of byte strings, vectorized with numpy.

A. Shamir, "How to share a secret", CACM 22(11), 1979. Each byte of the secret is shared independently with its
own random polynomial of degree ``t - 1`` over the prime field F_p, p = 65521 (the largest prime below 2^16);
holder ``x`` (a client id in 1..p-1) gets the polynomial values at ``x``. Any ``t`` shares give every byte back by
Lagrange interpolation at 0; fewer than ``t`` reveal nothing about any byte (each limb is a separate perfect
scheme with independent randomness). Because p < 2^16, shares and coefficients fit in float64 matrix products
exactly (products < 2^32, sums of up to 2^20 terms < 2^52), so sharing is one Vandermonde matmul and
reconstruction one Lagrange-coefficient matmul. Polynomial coefficients come from ``os.urandom``.
"""

from __future__ import annotations

import os

import numpy as np

PRIME = 65521
SHARE_DTYPE = np.dtype("<u2")


class ShamirError(ValueError):
    """Invalid sharing parameters or inconsistent shares."""


def _uniform_field(count: int) -> np.ndarray:
    """``count`` uniform elements of F_p from os.urandom (rejection sampling on 16-bit words)."""
    out = np.empty(0, dtype=np.int64)
    while out.size < count:
        need = count - out.size
        words = np.frombuffer(os.urandom(2 * (need + need // 1000 + 8)), dtype="<u2").astype(np.int64)
        out = np.concatenate([out, words[words < PRIME][:need]])
    return out


def _check_holders(holders: np.ndarray) -> np.ndarray:
    x = np.asarray(holders, dtype=np.int64)
    if x.ndim != 1 or x.size == 0:
        raise ShamirError("holders: need a non-empty 1-d list of holder ids")
    if x.min() < 1 or x.max() >= PRIME:
        raise ShamirError(f"holders: ids must lie in 1..{PRIME - 1}")
    if np.unique(x).size != x.size:
        raise ShamirError("holders: ids must be distinct")
    return x


def vandermonde(holders: np.ndarray, threshold: int) -> np.ndarray:
    """``V[i, j] = x_i^j mod p`` (float64, exact) for holder ids ``x`` and powers ``0..threshold-1``."""
    x = _check_holders(holders)
    block = max(1, min(threshold, int(np.sqrt(threshold)) + 1))
    head = np.empty((x.size, block), dtype=np.int64)  # x^0 .. x^(block-1)
    head[:, 0] = 1
    for j in range(1, block):
        head[:, j] = (head[:, j - 1] * x) % PRIME
    step = (head[:, -1] * x) % PRIME  # x^block
    v = np.empty((x.size, -(-threshold // block) * block), dtype=np.int64)
    scale = np.ones(x.size, dtype=np.int64)
    for a in range(v.shape[1] // block):
        v[:, a * block:(a + 1) * block] = (head * scale[:, None]) % PRIME
        scale = (scale * step) % PRIME
    return v[:, :threshold].astype(np.float64)


def split(secret: bytes, holders: np.ndarray, threshold: int, vander: np.ndarray | None = None) -> np.ndarray:
    """Shares of ``secret`` for each holder id: array (len(holders), len(secret)) of uint16.

    ``vander`` may pass a precomputed :func:`vandermonde` for the same holders and threshold."""
    x = _check_holders(holders)
    if not (1 <= threshold <= x.size):
        raise ShamirError(f"threshold: must lie in 1..{x.size} (number of holders), got {threshold}")
    if not secret:
        raise ShamirError("secret: must be non-empty bytes")
    limbs = np.frombuffer(secret, dtype=np.uint8).astype(np.float64)
    coeffs = np.empty((threshold, limbs.size), dtype=np.float64)
    coeffs[0] = limbs
    if threshold > 1:
        coeffs[1:] = _uniform_field((threshold - 1) * limbs.size).reshape(threshold - 1, limbs.size)
    v = vandermonde(x, threshold) if vander is None else vander
    return np.fmod(v @ coeffs, PRIME).astype(SHARE_DTYPE)


def _mod_pow(base: np.ndarray, exponent: int) -> np.ndarray:
    result = np.ones_like(base)
    b = base % PRIME
    e = exponent
    while e:
        if e & 1:
            result = (result * b) % PRIME
        b = (b * b) % PRIME
        e >>= 1
    return result


def lagrange_at_zero(holders: np.ndarray) -> np.ndarray:
    """Lagrange coefficients ``l_i = prod_{j != i} x_j / (x_j - x_i) mod p`` for interpolation at 0."""
    x = _check_holders(holders)
    m = x.size
    diff = (x[None, :] - x[:, None]) % PRIME  # diff[i, j] = x_j - x_i
    np.fill_diagonal(diff, 1)
    num = np.ones(m, dtype=np.int64)
    den = np.ones(m, dtype=np.int64)
    xs = np.broadcast_to(x, (m, m)).copy()
    np.fill_diagonal(xs, 1)
    for j in range(m):
        num = (num * xs[:, j]) % PRIME
        den = (den * diff[:, j]) % PRIME
    return (num * _mod_pow(den, PRIME - 2)) % PRIME


def combine(holders: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Reconstruct from the shares of ``len(holders)`` holders.

    ``shares`` has shape (holders, ...) (several secrets may be combined at once when their holders agree);
    returns the limbs (uint8) with the trailing shape. Raises :class:`ShamirError` when a reconstructed limb is not
    a byte (shares were inconsistent or too few)."""
    lam = lagrange_at_zero(holders).astype(np.float64)
    s = np.asarray(shares)
    if s.shape[0] != lam.size:
        raise ShamirError(f"shares: expected {lam.size} rows (one per holder), got {s.shape[0]}")
    if s.size and int(s.max()) >= PRIME:
        raise ShamirError(f"shares: values must be < {PRIME}")
    flat = s.reshape(lam.size, -1).astype(np.float64)
    # lam < 2^16 and shares < 2^16: each product < 2^32; exact in float64 while holders < 2^20
    out = np.fmod(lam @ flat, PRIME).astype(np.int64).reshape(s.shape[1:])
    if out.size and int(out.max()) > 255:
        raise ShamirError("shares: inconsistent shares (reconstructed value is not a byte)")
    return out.astype(np.uint8)
