"""Neighbour graphs for secure aggregation: the complete graph (SecAgg) or a random k-regular graph (SecAgg+).

J. Bell, K. Bonawitz, A. Gascon, T. Lepoint, M. Raykova, "Secure Single-Server Aggregation with (Poly)Logarithmic
Overhead", CCS 2020, Section 3: clients mask and share secrets only with their neighbours in a random k-regular
graph; the construction used there is a Harary graph H(k, n) (each node joined to the k/2 nearest nodes on each
side of a ring) over a random permutation of the clients. The permutation is derived from a public 32-byte seed
chosen by the server with ``os.urandom`` (AES-CTR keystream, sorted), so every party computes the same graph.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def permutation(seed: bytes, members: np.ndarray) -> np.ndarray:
    """The ring order of ``members`` (sorted client ids) under ``seed``."""
    members = np.asarray(members, dtype=np.int64)
    enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    keys = np.frombuffer(enc.update(bytes(8 * members.size)), dtype="<u8")
    return members[np.argsort(keys, kind="stable")]


def neighbours_of(client: int, seed: bytes, members: np.ndarray, degree: int | None) -> np.ndarray:
    """Sorted neighbours of ``client`` (excluding itself). ``degree=None`` or ``degree >= n - 1``: everyone."""
    members = np.asarray(members, dtype=np.int64)
    n = members.size
    if degree is None or degree >= n - 1:
        return members[members != client]
    ring = permutation(seed, members)
    pos = int(np.flatnonzero(ring == client)[0])
    half = degree // 2
    offsets = np.concatenate([np.arange(1, half + 1), -np.arange(1, half + 1)])
    return np.sort(ring[(pos + offsets) % n])


def neighbour_table(seed: bytes, members: np.ndarray, degree: int | None) -> dict[int, np.ndarray]:
    """Neighbours of every member (the server's view)."""
    members = np.asarray(members, dtype=np.int64)
    n = members.size
    if degree is None or degree >= n - 1:
        return {int(u): members[members != u] for u in members}
    ring = permutation(seed, members)
    half = degree // 2
    offsets = np.concatenate([np.arange(1, half + 1), -np.arange(1, half + 1)])
    idx = (np.arange(n)[:, None] + offsets[None, :]) % n
    nb = np.sort(ring[idx], axis=1)
    return {int(ring[i]): nb[i] for i in range(n)}
