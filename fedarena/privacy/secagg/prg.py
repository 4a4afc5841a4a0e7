"""Pseudorandom generator for SecAgg masks: AES-256 in counter mode, keystream read as little-endian uint32.

Bonawitz et al. (CCS 2017), Section 4: masks are ``PRG(seed)`` expanded to the model size. A 32-byte seed is the
AES-256 key; the keystream of ``4 d`` bytes (from ``cryptography``, AES-NI where available) is reinterpreted as
``d`` uint32 words with numpy, so expansion costs one C call and no Python loop. Arithmetic on masks is mod 2^32
(uint32 wrap-around); reducing mod 2^k afterwards is consistent for any k <= 32.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

SEED_BYTES = 32
_ZERO_IV = bytes(16)


def expand(seed: bytes, d: int) -> np.ndarray:
    """``d`` pseudorandom uint32 words from a 32-byte seed."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"seed: must be {SEED_BYTES} bytes, got {len(seed)}")
    enc = Cipher(algorithms.AES(seed), modes.CTR(_ZERO_IV)).encryptor()
    return np.frombuffer(enc.update(bytes(4 * d)), dtype="<u4")

def add_into(acc: np.ndarray, seed: bytes, negate: bool = False) -> None:
    """``acc += PRG(seed)`` (or ``-=``) in place, mod 2^32."""
    mask = expand(seed, acc.size)
    if negate:
        np.subtract(acc, mask, out=acc)
    else:
        np.add(acc, mask, out=acc)
