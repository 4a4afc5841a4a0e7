"""Hetero (vertically partitioned) logistic regression under Paillier encryption, with and without a coordinator.

Hardy et al., "Private federated learning on vertically partitioned data via entity resolution and
additively homomorphic encryption", arXiv:1711.10677 (2017), sec. 3-4, and the coordinated LR of FATE:
party A holds features x_A and labels y in {-1, +1}, party B holds features x_B, rows already aligned
by PSI. The log loss is replaced by its second-order Taylor expansion at u = 0,

    l(u, y) ~ log 2 - y u / 2 + u^2 / 8,      dl/du = u / 4 - y / 2 =: d,

so the gradient sum_i d_i x_i only needs additions and plaintext products of encrypted values.

Three parties (coordinator C holds the Paillier key):
  B -> A  [[u_B]], [[u_B^2]];   A: [[4d]] = [[u_B]] + (u_A - 2y), encrypted loss sum;   A -> B [[4d]];
  A, B: [[X^T 4d]] + random mask -> C;  C decrypts (packed: many masked values per decryption) and
  returns;  A, B remove their masks and update their own weights.
Two parties (Yang et al., "Parallel distributed logistic regression for vertical federated learning
without third-party coordinator", arXiv:1911.09824, 2019): each party holds its own key pair and plays
the coordinator for the other: A computes its gradient on [[u_B]] under B's key and B decrypts it
masked; B computes its gradient on [[u_A - 2y]] under A's key and A decrypts it masked. A single key
at A would let A decrypt B's intermediate results, so A "plays C" with its own key for B's values only.

Everything is exact integer arithmetic on fixed-point encodings (frac_bits for u, feature_frac_bits for
x), so the two- and three-party protocols compute identical gradients, equal to a plaintext Taylor LR
up to the fixed-point rounding. Masks are uniform with ``mask_bits`` of statistical hiding above the
bound of the masked value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from fedarena.federated.vertical import paillier as pl
from fedarena.federated.vertical.masking import (
    Decryptor,
    DecryptedMsg,
    Masker,
    MaskedMsg,
    PublicKeyMsg,
    public_key_message,
    read_public_key,
)
from fedarena.federated.vertical.messages import ProtocolError, message
from fedarena.federated.vertical.timing import PhaseTimer


@dataclass(frozen=True)
class HeteroLRConfig:
    epochs: int = 5
    batch_size: int = 64
    learning_rate: float = 0.1
    l2: float = 1e-3
    key_bits: int = pl.DEFAULT_KEY_BITS
    frac_bits: int = 32
    feature_frac_bits: int = 16
    value_bits: int = 100
    mask_bits: int = 40
    pack_decryption: bool = True
    pool_size: int = 0
    seed: int = 0
    allow_insecure_keys: bool = False
    """accept key_bits below 2048 (fast tests only)"""

    def __post_init__(self) -> None:
        pl.check_key_bits(self.key_bits, self.allow_insecure_keys, "hetero_lr.key_bits")
        checks = {
            "epochs": self.epochs >= 1, "batch_size": self.batch_size >= 1, "learning_rate": self.learning_rate > 0,
            "l2": self.l2 >= 0, "key_bits": self.key_bits >= 512 and self.key_bits % 8 == 0,
            "frac_bits": 8 <= self.frac_bits <= 64, "feature_frac_bits": 4 <= self.feature_frac_bits <= 32,
            "value_bits": self.frac_bits + self.feature_frac_bits + 8 <= self.value_bits <= self.key_bits // 2 - self.mask_bits - 4,
            "mask_bits": 20 <= self.mask_bits <= 128,
            "pool_size": self.pool_size >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"hetero_lr.{name}: invalid value {getattr(self, name)!r}")


# ----------------------------------------------------------------------------- messages


@message("vlr.batch")
@dataclass(frozen=True)
class BatchMsg:
    epoch: int
    batch: int
    indices: np.ndarray


@message("vlr.forward")
@dataclass(frozen=True)
class ForwardMsg:
    """B -> A: [[u_B]] and [[u_B^2]] for the batch rows."""

    count: int
    frac_bits: int
    u: bytes
    u2: bytes


@message("vlr.residual")
@dataclass(frozen=True)
class ResidualMsg:
    """A -> B: [[4 d]] (three parties) or [[u_A - 2 y]] under A's key (two parties)."""

    count: int
    frac_bits: int
    values: bytes


@message("vlr.scores")
@dataclass(frozen=True)
class ScoresMsg:
    """B -> A at inference: B's partial linear scores x_B theta_B for the requested rows."""

    scores: np.ndarray


# ----------------------------------------------------------------------------- parties


def _with_bias(x: np.ndarray) -> np.ndarray:
    return np.hstack([x, np.ones((x.shape[0], 1))])


@dataclass
class PartyState:
    theta: np.ndarray
    timer: PhaseTimer = field(default_factory=PhaseTimer)


class GuestA:
    """Party A: features and labels (y in {0, 1}); owns the intercept."""

    def __init__(self, x: np.ndarray, y: np.ndarray, cfg: HeteroLRConfig) -> None:
        x, y = np.asarray(x, np.float64), np.asarray(y)
        if x.ndim != 2 or y.shape != (x.shape[0],):
            raise ValueError(f"guest data: x must be (rows, features) and y (rows,), got {x.shape}, {y.shape}")
        if not set(np.unique(y).tolist()) <= {0, 1}:
            raise ValueError("guest data: y must hold 0/1 labels")
        self.x, self.y, self.cfg = _with_bias(x), y.astype(np.int64), cfg
        self.state = PartyState(np.zeros(self.x.shape[1]))
        self.peer_key: pl.FastPublicKey | None = None   # the key B's values are encrypted under
        self.own: Decryptor | None = None               # two-party: A's own key pair
        self.own_public: pl.FastPublicKey | None = None
        self.masker: Masker | None = None
        self._batch: np.ndarray | None = None
        self._u_a: np.ndarray | None = None

    @property
    def timer(self) -> PhaseTimer:
        return self.state.timer

    def set_peer_key(self, m: PublicKeyMsg) -> None:
        self.peer_key = read_public_key(m, min_bits=min(self.cfg.key_bits, 2048))
        self.masker = Masker(self.peer_key, self.cfg.value_bits, self.cfg.mask_bits, self.cfg.pack_decryption, self.timer)

    def make_own_key(self, key_bits: int) -> PublicKeyMsg:
        pk, sk = pl.generate_keypair(key_bits, allow_insecure_keys=self.cfg.allow_insecure_keys)
        self.own = Decryptor(sk, self.timer)
        self.own_public = pl.FastPublicKey(pk)
        return public_key_message(pk)

    def batch(self, epoch: int, b: int, idx: np.ndarray) -> BatchMsg:
        self._batch = np.asarray(idx, np.int64)
        return BatchMsg(epoch, b, self._batch)

    def receive_forward(self, m: ForwardMsg) -> tuple[pl.CipherVector, pl.CipherVector]:
        idx = self._batch
        if m.count != len(idx) or m.frac_bits != self.cfg.frac_bits:
            raise ProtocolError("vlr.forward.count", f"{m.count} rows at {m.frac_bits} bits, expected {len(idx)} at {self.cfg.frac_bits}")
        u_b = pl.from_bytes(self.peer_key, m.u, m.count, m.frac_bits, "vlr.forward.u")
        u2_b = pl.from_bytes(self.peer_key, m.u2, m.count, m.frac_bits, "vlr.forward.u2")
        with self.timer("compute"):
            self._u_a = self.x[idx] @ self.state.theta
        return u_b, u2_b

    def residual_and_loss(self, u_b: pl.CipherVector, u2_b: pl.CipherVector) -> tuple[pl.CipherVector, pl.CipherVector]:
        """[[4 d]] = [[u_B]] + (u_A - 2y) and [[8 sum(l - log 2)]] at 2 * frac_bits."""
        F = self.cfg.frac_bits
        ys = 2.0 * self.y[self._batch] - 1.0
        u_a = self._u_a
        with self.timer("crypto"):
            d4 = u_b.add_plain(u_a - 2.0 * ys)
            # sum_i  -4 y_i (u_A + u_B) + u_A^2 + 2 u_A u_B + u_B^2, every term at 2F fractional bits
            n = int(self.peer_key.n)
            cross = u_b.rmatmul((2.0 * u_a - 4.0 * ys)[:, None], F)  # sum (2 u_A - 4 y) u_B
            sq = u2_b.sum().scale(1.0, F)
            plain = pl.encode([float(np.sum(u_a * u_a - 4.0 * ys * u_a))], 2 * F, n)[0]
            total = pl.CipherVector(self.peer_key, [self.peer_key.add_int(self.peer_key.add(cross.cs[0], sq.cs[0]), plain)], 2 * F)
        return d4, total

    def gradient_cipher(self, d4: pl.CipherVector) -> pl.CipherVector:
        with self.timer("crypto"):
            return d4.rmatmul(self.x[self._batch], self.cfg.feature_frac_bits)

    def two_party_residual(self) -> ResidualMsg:
        """Two parties: [[u_A - 2y]] under A's own key (fast CRT obfuscation, A holds the key)."""
        ys = 2.0 * self.y[self._batch] - 1.0
        with self.timer("crypto"):
            v = pl.CipherVector(self.own_public, self.own.sk.encrypt_ints(pl.encode(self._u_a - 2.0 * ys, self.cfg.frac_bits, int(self.own_public.n))), self.cfg.frac_bits)
        return ResidualMsg(len(v), v.frac_bits, v.to_bytes())

    def apply_gradient(self, g_sum: np.ndarray) -> None:
        """g_sum = sum_i 4 d_i x_i (decoded); the step uses g = g_sum / (4 |S|) + l2 * theta (no l2 on the bias)."""
        with self.timer("compute"):
            reg = self.cfg.l2 * self.state.theta
            reg[-1] = 0.0
            self.state.theta = self.state.theta - self.cfg.learning_rate * (g_sum / (4.0 * len(self._batch)) + reg)

    def loss_from(self, t: float) -> float:
        return math.log(2.0) + t / (8.0 * len(self._batch))

    def scores(self, rows: np.ndarray, m: ScoresMsg) -> np.ndarray:
        s = np.asarray(m.scores)
        if s.shape != (len(rows),) or s.dtype != np.float64 or not np.all(np.isfinite(s)):
            raise ProtocolError("vlr.scores.scores", f"expected {len(rows)} finite float64 scores, got {s.dtype} {s.shape}")
        u = self.x[rows] @ self.state.theta + s
        return 1.0 / (1.0 + np.exp(-u))


class HostB:
    """Party B: features only."""

    def __init__(self, x: np.ndarray, cfg: HeteroLRConfig) -> None:
        x = np.asarray(x, np.float64)
        if x.ndim != 2:
            raise ValueError(f"host data: x must be (rows, features), got {x.shape}")
        self.x, self.cfg = x, cfg
        self.state = PartyState(np.zeros(x.shape[1]))
        self.enc_key: pl.FastPublicKey | None = None  # three parties: C's key; two parties: own key
        self.own: Decryptor | None = None
        self.peer_key: pl.FastPublicKey | None = None  # two parties: A's key
        self.masker: Masker | None = None
        self.pool: pl.ObfuscationPool | None = None
        self._batch: np.ndarray | None = None
        self._u_b: np.ndarray | None = None

    @property
    def timer(self) -> PhaseTimer:
        return self.state.timer

    def set_coordinator_key(self, m: PublicKeyMsg) -> None:
        self.enc_key = read_public_key(m, min_bits=min(self.cfg.key_bits, 2048))
        if self.cfg.pool_size:  # B encrypts under C's key: precompute obfuscators on a background process
            self.pool = pl.ObfuscationPool(int(self.enc_key.n), capacity=self.cfg.pool_size, workers=1)
            self.enc_key = pl.FastPublicKey(self.enc_key.phe, self.pool)
        self.masker = Masker(self.enc_key, self.cfg.value_bits, self.cfg.mask_bits, self.cfg.pack_decryption, self.timer)

    def make_own_key(self, key_bits: int) -> PublicKeyMsg:
        pk, sk = pl.generate_keypair(key_bits, allow_insecure_keys=self.cfg.allow_insecure_keys)
        self.own = Decryptor(sk, self.timer)
        self.enc_key = pl.FastPublicKey(pk)
        return public_key_message(pk)

    def set_peer_key(self, m: PublicKeyMsg) -> None:
        self.peer_key = read_public_key(m, min_bits=min(self.cfg.key_bits, 2048))
        self.masker = Masker(self.peer_key, self.cfg.value_bits, self.cfg.mask_bits, self.cfg.pack_decryption, self.timer)

    def receive_batch(self, m: BatchMsg) -> None:
        idx = np.asarray(m.indices)
        if idx.dtype.kind != "i" or idx.ndim != 1 or len(idx) == 0 or idx.min() < 0 or idx.max() >= len(self.x):
            raise ProtocolError("vlr.batch.indices", f"must be a non-empty 1-d int array of rows in 0..{len(self.x) - 1}")
        if len(np.unique(idx)) != len(idx) or len(idx) > self.cfg.batch_size:
            raise ProtocolError("vlr.batch.indices", "repeated rows or more rows than the batch size")
        self._batch = idx.astype(np.int64)

    def forward(self) -> ForwardMsg:
        with self.timer("compute"):
            self._u_b = self.x[self._batch] @ self.state.theta
        F, n = self.cfg.frac_bits, int(self.enc_key.n)
        with self.timer("crypto"):
            ms = pl.encode(self._u_b, F, n) + pl.encode(self._u_b ** 2, F, n)
            cs = self.own.sk.encrypt_ints(ms) if self.own is not None else self.enc_key.encrypt_ints(ms)
        k = len(self._batch)
        w = self.enc_key.width
        return ForwardMsg(k, F, b"".join(int(c).to_bytes(w, "big") for c in cs[:k]), b"".join(int(c).to_bytes(w, "big") for c in cs[k:]))

    def receive_residual(self, m: ResidualMsg, key: pl.FastPublicKey) -> pl.CipherVector:
        if m.count != len(self._batch) or m.frac_bits != self.cfg.frac_bits:
            raise ProtocolError("vlr.residual.count", f"{m.count} rows at {m.frac_bits} bits, expected {len(self._batch)} at {self.cfg.frac_bits}")
        return pl.from_bytes(key, m.values, m.count, m.frac_bits, "vlr.residual.values")

    def gradient_cipher(self, d4: pl.CipherVector, add_own_u: bool) -> pl.CipherVector:
        with self.timer("crypto"):
            if add_own_u:  # two parties: [[u_A - 2y]] + u_B = [[4 d]]
                d4 = d4.add_plain(self._u_b)
            return d4.rmatmul(self.x[self._batch], self.cfg.feature_frac_bits)

    def apply_gradient(self, g_sum: np.ndarray) -> None:
        with self.timer("compute"):
            self.state.theta = self.state.theta - self.cfg.learning_rate * (g_sum / (4.0 * len(self._batch)) + self.cfg.l2 * self.state.theta)

    def scores(self, rows: np.ndarray) -> ScoresMsg:
        return ScoresMsg(self.x[np.asarray(rows, np.int64)] @ self.state.theta)


class Coordinator:
    """Party C: creates the key pair, decrypts masked values, learns nothing else."""

    def __init__(self, cfg: HeteroLRConfig) -> None:
        self.timer = PhaseTimer()
        pk, sk = pl.generate_keypair(cfg.key_bits, allow_insecure_keys=cfg.allow_insecure_keys)
        self.public = pk
        self.decryptor = Decryptor(sk, self.timer)

    def public_key(self) -> PublicKeyMsg:
        return public_key_message(self.public)


# ----------------------------------------------------------------------------- drivers

Transfer = Callable[[str, str, object, type], object]


@dataclass
class EpochReport:
    epoch: int
    loss: float
    seconds: dict
    bytes: int


def _batches(n_rows: int, cfg: HeteroLRConfig, epoch: int) -> list[np.ndarray]:
    perm = np.random.default_rng([cfg.seed, epoch]).permutation(n_rows)  # public batch order, not secret
    return [perm[i : i + cfg.batch_size] for i in range(0, n_rows, cfg.batch_size)]


class HeteroLR:
    """Runs A, B (and C) over a transfer function; ``coordinator=False`` gives the two-party protocol."""

    def __init__(self, x_a: np.ndarray, y: np.ndarray, x_b: np.ndarray, cfg: HeteroLRConfig,
                 coordinator: bool = True, transfer: Transfer | None = None) -> None:
        from fedarena.federated.vertical.channel import Link

        if len(x_a) != len(x_b):
            raise ValueError(f"aligned rows differ: A has {len(x_a)}, B has {len(x_b)} (run PSI first)")
        self.cfg = cfg
        self.link = Link() if transfer is None else None
        self.transfer = transfer or self.link.transfer
        self.a, self.b = GuestA(x_a, y, cfg), HostB(x_b, cfg)
        self.c = Coordinator(cfg) if coordinator else None
        t = self.transfer
        if self.c is not None:
            self.a.set_peer_key(t("C", "A", self.c.public_key(), PublicKeyMsg))
            self.b.set_coordinator_key(t("C", "B", self.c.public_key(), PublicKeyMsg))
        else:
            self.b.set_peer_key(t("A", "B", self.a.make_own_key(cfg.key_bits), PublicKeyMsg))
            self.a.set_peer_key(t("B", "A", self.b.make_own_key(cfg.key_bits), PublicKeyMsg))
        self.epoch = 0

    @property
    def parties(self) -> list:
        return [p for p in (self.a, self.b, self.c) if p is not None]

    def step(self, epoch: int, b: int, idx: np.ndarray) -> float:
        a, bb, c, t = self.a, self.b, self.c, self.transfer
        bb.receive_batch(t("A", "B", a.batch(epoch, b, idx), BatchMsg))
        u_b, u2_b = a.receive_forward(t("B", "A", bb.forward(), ForwardMsg))
        d4, loss_t = a.residual_and_loss(u_b, u2_b)
        g_a = a.gradient_cipher(d4)
        F2 = 2 * self.cfg.frac_bits
        # A's gradient and its loss term go to the key holder of B's values: C, or B itself
        mask_a, r_a = a.masker.mask(pl.CipherVector(a.peer_key, g_a.cs + [loss_t.cs[0]], g_a.frac_bits))
        holder_a, dec_a = ("C", c.decryptor) if c is not None else ("B", bb.own)
        reply_a = t(holder_a, "A", dec_a.decrypt(t("A", holder_a, mask_a, MaskedMsg)), DecryptedMsg)
        if c is not None:
            d4_b = bb.receive_residual(t("A", "B", ResidualMsg(len(d4), d4.frac_bits, d4.to_bytes()), ResidualMsg), bb.enc_key)
            g_b = bb.gradient_cipher(d4_b, add_own_u=False)
            holder_b, dec_b = "C", c.decryptor
        else:
            d_ab = bb.receive_residual(t("A", "B", a.two_party_residual(), ResidualMsg), bb.peer_key)
            g_b = bb.gradient_cipher(d_ab, add_own_u=True)
            holder_b, dec_b = "A", a.own
        mask_b, r_b = bb.masker.mask(g_b)
        reply_b = t(holder_b, "B", dec_b.decrypt(t("B", holder_b, mask_b, MaskedMsg)), DecryptedMsg)
        # unmask: gradient entries at frac_bits + feature_frac_bits, the loss term at 2 * frac_bits
        vals_a = a.masker.unmask(reply_a, r_a, 0)
        frac_g = self.cfg.frac_bits + self.cfg.feature_frac_bits
        g_sum_a = np.ldexp(vals_a[:-1], -frac_g)
        loss = a.loss_from(float(np.ldexp(vals_a[-1], -F2)))
        a.apply_gradient(g_sum_a)
        bb.apply_gradient(bb.masker.unmask(reply_b, r_b, frac_g))
        return loss

    def train_epoch(self) -> EpochReport:
        self.epoch += 1
        for p in self.parties:
            p.timer.take()
        if self.link:
            self.link.reset_stats()
        losses, sizes = [], []
        for b, idx in enumerate(_batches(len(self.a.x), self.cfg, self.epoch)):
            losses.append(self.step(self.epoch, b, idx))
            sizes.append(len(idx))
        secs: dict[str, float] = {"crypto": 0.0, "compute": 0.0}
        for p in self.parties:
            for k, v in p.timer.take().items():
                secs[k] = secs.get(k, 0.0) + v
        secs["comm"] = self.link.stats.seconds if self.link else 0.0
        nbytes = self.link.stats.total_bytes if self.link else 0
        return EpochReport(self.epoch, float(np.average(losses, weights=sizes)), secs, nbytes)

    def close(self) -> None:
        if self.b.pool is not None:
            self.b.pool.close()
            self.b.pool = None

    def predict(self, rows_a: np.ndarray, rows_b: np.ndarray | None = None) -> np.ndarray:
        """Joint inference: B sends only its partial scores x_B theta_B; A adds its own and the sigmoid."""
        rows_b = rows_a if rows_b is None else rows_b
        m = self.transfer("B", "A", self.b.scores(rows_b), ScoresMsg)
        return self.a.scores(np.asarray(rows_a, np.int64), m)
