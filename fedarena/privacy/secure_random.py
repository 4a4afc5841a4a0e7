"""Randomness for privacy mechanisms from the operating system's CSPRNG (``os.urandom`` / ``secrets``).

A DP guarantee holds only if the noise and the sampling are unknown to the adversary; a numpy Generator,
however it is seeded, is a deterministic function of a seed someone may learn or guess (the DP-SGD review
recomputed a run's batches from a YAML's ``seed: 0``). :class:`SecureRandom` offers the few numpy Generator
methods the mechanisms use (``random``, ``normal``, ``standard_normal``, ``laplace``, ``choice`` without
replacement), every draw from fresh kernel entropy; :func:`random_source` is the rule each mechanism applies to
its ``rng`` argument: ``None`` means secure, an explicit seed or Generator means a reproducible test.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

import numpy as np

_TWO_53 = 9007199254740992.0


def _shape(size: Any) -> tuple[int, ...]:
    if size is None:
        return ()
    return tuple(int(s) for s in size) if isinstance(size, (tuple, list)) else (int(size),)


class SecureRandom:
    """Uniforms, Gaussians, Laplace draws and samples without replacement from ``os.urandom`` / ``secrets``
    (cryptographically secure, not reproducible). Method names and signatures follow numpy's Generator."""

    def random(self, size: Any = None) -> Any:
        """Uniform floats ``k / 2^53`` on [0, 1), ``k`` from 53 random bits."""
        shape = _shape(size)
        n = int(np.prod(shape)) if shape else 1
        bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
        out = bits.astype(np.float64) * (1.0 / _TWO_53)
        return out.reshape(shape) if shape else float(out[0])

    def standard_normal(self, size: Any = None) -> Any:
        """Box-Muller: for independent uniforms ``u1, u2`` and ``r = sqrt(-2 ln(1 - u1))`` (``1 - u1`` lies in
        (0, 1]), ``r cos(2 pi u2)`` and ``r sin(2 pi u2)`` are two independent standard normals; both are used,
        so ``n`` draws take ``ceil(n / 2)`` pairs of uniforms."""
        shape = _shape(size)
        n = int(np.prod(shape)) if shape else 1
        pairs = (n + 1) // 2
        u1, u2 = self.random(pairs), self.random(pairs)
        r = np.sqrt(-2.0 * np.log1p(-u1))
        angle = 2.0 * np.pi * u2
        z = np.concatenate([r * np.cos(angle), r * np.sin(angle)])[:n]
        return z.reshape(shape) if shape else float(z[0])

    def normal(self, loc: float = 0.0, scale: float = 1.0, size: Any = None) -> Any:
        return loc + scale * self.standard_normal(size)

    def laplace(self, loc: float = 0.0, scale: float = 1.0, size: Any = None) -> Any:
        """Inverse CDF: ``loc - scale sign(u) ln(1 - 2|u|)`` for ``u`` uniform on [-1/2, 1/2)."""
        u = np.asarray(self.random(size)) - 0.5
        out = loc - scale * np.sign(u) * np.log1p(-2.0 * np.abs(u))
        return out if np.ndim(out) else float(out)

    def choice(self, a: Any, size: int, replace: bool = False) -> np.ndarray:
        """``size`` distinct elements of ``a`` (an array, or ``range(a)`` for an int), uniformly, in random order
        (Floyd's algorithm then a Fisher-Yates shuffle, every index from ``secrets.randbelow``)."""
        if replace:
            raise ValueError("choice: only sampling without replacement is offered")
        pool = np.arange(a) if np.ndim(a) == 0 else np.asarray(a)
        n, m = len(pool), int(size)
        if not 0 <= m <= n:
            raise ValueError(f"choice: cannot take {m} distinct elements of {n}")
        chosen: list[int] = []
        seen: set[int] = set()
        for j in range(n - m, n):  # Floyd: a uniform m-subset of range(n)
            t = secrets.randbelow(j + 1)
            pick = j if t in seen else t
            seen.add(pick)
            chosen.append(pick)
        for i in range(m - 1, 0, -1):  # uniform order
            k = secrets.randbelow(i + 1)
            chosen[i], chosen[k] = chosen[k], chosen[i]
        return pool[np.asarray(chosen, dtype=np.int64)]


def random_source(rng: Any) -> Any:
    """The draws a mechanism uses: ``None`` -> :class:`SecureRandom`; a SecureRandom or numpy Generator as
    given; anything else is a seed for ``numpy.random.default_rng`` (reproducible tests only)."""
    if rng is None:
        return SecureRandom()
    if isinstance(rng, (SecureRandom, np.random.Generator)):
        return rng
    return np.random.default_rng(rng)
