"""SignDS: sign-based dimension selection with the exponential mechanism EM-MDS (epsilon-LDP).

X. Jiang, X. Zhou, J. Grossklags, "SignDS-FL: Local Differentially Private Federated Learning with Sign-based
Dimension Selection", ACM TIST 13(5), 2022; as presented in the federated-learning chapter's SignDS section.

Client (``signds_report``):

1. draw a random sign ``s`` in {-1, +1} (independent of the data);
2. the top-k set ``S`` is the ``k`` dimensions with the largest ``s * update`` (largest values for s = +1,
   most negative for s = -1);
3. EM-MDS picks an output set ``J`` of ``h`` of the ``d`` dimensions. With ``nu = |J & S|`` and the utility
   ``u(S, J) = 1[nu >= nu_th]``, ``P(J | S) ~ exp(epsilon * u(S, J))``. Since the number of sets ``J`` with a
   given ``nu`` is ``omega_nu = C(k, nu) C(d - k, h - nu)`` (the same for every ``S`` of size ``k``), the
   normaliser does not depend on ``S`` and the mechanism is epsilon-LDP. Sampling: draw ``nu`` from
   ``P(nu = tau) = omega_tau e^{epsilon 1[tau >= nu_th]} / Z`` by inverse CDF, then ``nu`` dimensions uniformly
   from ``S`` and ``h - nu`` uniformly from its complement;
4. upload only ``J`` (``h`` indices) and ``s``.

The threshold is ``nu_th* = argmax_{nu_th} E[nu | nu_th]``. All combinatorics are in log space (``gammaln``), so
``d = 10^6`` works. Server (``signds_aggregate``): the update of every reported dimension is ``s`` times the
global learning rate, averaged over the clients (a sparse update).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from fedarena.privacy.secure_random import random_source

__all__ = [
    "SignDSConfig",
    "SignDSReport",
    "log_omega",
    "nu_probabilities",
    "expected_nu",
    "optimal_threshold",
    "sample_nu",
    "top_k_set",
    "select_dimensions",
    "signds_report",
    "signds_aggregate",
]


@dataclass(frozen=True)
class SignDSConfig:
    """SignDS parameters: model size ``d``, top-k size ``k``, output size ``h``, privacy ``epsilon``."""

    d: int
    k: int
    h: int
    epsilon: float

    def __post_init__(self) -> None:
        for name in ("d", "k", "h"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
        if self.k >= self.d:
            raise ValueError(f"k: top-k size must be < d={self.d}, got {self.k}")
        if self.h > self.d:
            raise ValueError(f"h: output size must be <= d={self.d}, got {self.h}")
        if self.d >= 2**32:
            raise ValueError(f"d: at most 2^32 - 1 dimensions (uint32 indices), got {self.d}")
        try:
            eps = float(self.epsilon)
        except (TypeError, ValueError):
            raise ValueError(f"epsilon: must be a number, got {self.epsilon!r}") from None
        if not math.isfinite(eps) or eps <= 0:
            raise ValueError(f"epsilon: must be a finite number > 0, got {self.epsilon!r}")

    @property
    def taus(self) -> np.ndarray:
        """Possible values of ``nu = |J & S|``: from ``max(0, h - (d - k))`` to ``min(k, h)``."""
        return np.arange(max(0, self.h - (self.d - self.k)), min(self.k, self.h) + 1)


def _log_comb(n: np.ndarray | int, r: np.ndarray | int) -> np.ndarray:
    n = np.asarray(n, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    return special.gammaln(n + 1) - special.gammaln(r + 1) - special.gammaln(n - r + 1)


def log_omega(cfg: SignDSConfig) -> np.ndarray:
    """``log omega_tau = log C(k, tau) + log C(d - k, h - tau)`` for ``tau`` in ``cfg.taus``."""
    t = cfg.taus
    return _log_comb(cfg.k, t) + _log_comb(cfg.d - cfg.k, cfg.h - t)


def _log_weights(cfg: SignDSConfig, threshold: int) -> np.ndarray:
    return log_omega(cfg) + float(cfg.epsilon) * (cfg.taus >= threshold)


def nu_probabilities(cfg: SignDSConfig, threshold: int) -> np.ndarray:
    """``P(nu = tau)`` for ``tau`` in ``cfg.taus`` under threshold ``nu_th = threshold``."""
    lw = _log_weights(cfg, threshold)
    return np.exp(lw - special.logsumexp(lw))


def expected_nu(cfg: SignDSConfig) -> np.ndarray:
    """``E[nu | nu_th]`` for every ``nu_th`` in ``cfg.taus`` (index i <-> threshold ``cfg.taus[i]``), in O(len(taus))
    through prefix/suffix log-sum-exps."""
    t = cfg.taus
    lo = log_omega(cfg)
    with np.errstate(divide="ignore"):
        lt = np.log(t.astype(np.float64)) + lo  # log(tau omega_tau); -inf at tau = 0
    eps = float(cfg.epsilon)
    neg_inf = np.array([-np.inf])
    # below[j] = logsumexp(lo[:j]), above[j] = logsumexp(lo[j:])
    below = np.concatenate([neg_inf, np.logaddexp.accumulate(lo)[:-1]])
    above = np.logaddexp.accumulate(lo[::-1])[::-1]
    below_t = np.concatenate([neg_inf, np.logaddexp.accumulate(lt)[:-1]])
    above_t = np.logaddexp.accumulate(lt[::-1])[::-1]
    log_num = np.logaddexp(below_t, eps + above_t)
    log_den = np.logaddexp(below, eps + above)
    return np.exp(log_num - log_den)


def optimal_threshold(cfg: SignDSConfig) -> int:
    """``nu_th* = argmax_{nu_th} E[nu | nu_th]`` (the smallest maximiser)."""
    return int(cfg.taus[int(np.argmax(expected_nu(cfg)))])


@functools.lru_cache(maxsize=32)
def _nu_cdf(cfg: SignDSConfig, threshold: int) -> np.ndarray:
    """CDF of nu (cached per config and threshold: clients of a round share it)."""
    cdf = np.cumsum(nu_probabilities(cfg, threshold))
    cdf.setflags(write=False)
    return cdf


def sample_nu(cfg: SignDSConfig, rng: np.random.Generator, size: int | None = None,
              threshold: int | None = None) -> np.ndarray | int:
    """Draw ``nu`` by inverse-CDF sampling of ``P(nu = tau)`` (threshold defaults to ``nu_th*``)."""
    cdf = _nu_cdf(cfg, optimal_threshold(cfg) if threshold is None else int(threshold))
    u = rng.random(size) * cdf[-1]
    idx = np.minimum(np.searchsorted(cdf, u, side="right"), len(cdf) - 1)
    out = cfg.taus[idx]
    return int(out) if size is None else out


@dataclass(frozen=True)
class SignDSReport:
    """What a client uploads: the ``h`` selected dimensions and the sign."""

    indices: np.ndarray  # uint32, sorted, distinct
    sign: int

    def to_bytes(self) -> bytes:
        """Wire format: 1 byte sign (0 -> -1, 1 -> +1) then ``h`` little-endian uint32 indices."""
        return bytes([1 if self.sign > 0 else 0]) + np.asarray(self.indices, dtype="<u4").tobytes()

    @property
    def upload_bytes(self) -> int:
        return 1 + 4 * len(self.indices)

    @classmethod
    def from_bytes(cls, data: bytes, cfg: SignDSConfig) -> "SignDSReport":
        """Parse and validate a report for ``cfg`` (length, sign byte, index range, distinctness)."""
        if len(data) != 1 + 4 * cfg.h:
            raise ValueError(f"signds report: expected {1 + 4 * cfg.h} bytes for h={cfg.h}, got {len(data)}")
        if data[0] not in (0, 1):
            raise ValueError(f"signds report: sign byte must be 0 or 1, got {data[0]}")
        idx = np.frombuffer(data, dtype="<u4", offset=1).astype(np.uint32)
        if idx.size and int(idx.max()) >= cfg.d:
            raise ValueError(f"signds report: index {int(idx.max())} out of range for d={cfg.d}")
        if np.unique(idx).size != idx.size:
            raise ValueError("signds report: indices must be distinct")
        return cls(np.sort(idx), 1 if data[0] == 1 else -1)


def top_k_set(update: np.ndarray, k: int, sign: int) -> np.ndarray:
    """Indices of the ``k`` largest entries of ``sign * update`` (sorted)."""
    v = sign * np.asarray(update, dtype=np.float64).ravel()
    return np.sort(np.argpartition(-v, k - 1)[:k])


def select_dimensions(cfg: SignDSConfig, topk: np.ndarray, rng: np.random.Generator,
                      threshold: int | None = None) -> np.ndarray:
    """EM-MDS: output set ``J`` (sorted uint32) of size ``h`` given the sorted top-k set."""
    nu = sample_nu(cfg, rng, threshold=threshold)
    inside = rng.choice(topk, size=nu, replace=False)
    # the c-th element (0-based) of the complement of sorted T is c + #{i : T_i - i <= c}
    c = rng.choice(cfg.d - cfg.k, size=cfg.h - nu, replace=False)
    outside = c + np.searchsorted(topk - np.arange(cfg.k), c, side="right")
    return np.sort(np.concatenate([inside, outside]).astype(np.uint32))


def signds_report(update: np.ndarray, cfg: SignDSConfig, rng: np.random.Generator | int | None) -> SignDSReport:
    """Run the SignDS client on a flat update of length ``d``; ``rng`` None draws from the OS CSPRNG
    (:func:`fedarena.privacy.secure_random.random_source`), a Generator or seed is for reproducible tests."""
    rng = random_source(rng)
    u = np.asarray(update).ravel()
    if u.size != cfg.d:
        raise ValueError(f"update: expected {cfg.d} entries, got {u.size}")
    sign = 1 if rng.random() < 0.5 else -1
    topk = top_k_set(u, cfg.k, sign)
    return SignDSReport(select_dimensions(cfg, topk, rng), sign)


def signds_aggregate(reports: list[SignDSReport], d: int, global_lr: float) -> np.ndarray:
    """Server: dense update ``global_lr / n * sum_i s_i 1[J_i]`` from the clients' reports."""
    if not reports:
        raise ValueError("reports: need at least one SignDS report")
    out = np.zeros(d, dtype=np.float64)
    for r in reports:
        np.add.at(out, np.asarray(r.indices, dtype=np.int64), float(r.sign))
    return out * (float(global_lr) / len(reports))
