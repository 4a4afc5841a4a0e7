"""Hetero neural network (split learning) with an encrypted interactive layer; joint inference.

The hetero-NN of FATE (Zhang et al., "Additively homomorphic encryption based deep neural network for
asymmetrically collaborative machine learning", arXiv:2007.06849, 2020; Yang et al., *Federated
Learning*, 2019, sec. 5.3): each party runs a bottom model on its own features (here on
``fedarena.engine``); A (labels) runs the top model. Between them sits the interactive layer

    z = a_A W_A + a_B W_B + b,   h = relu(z),   logits = top(h),

whose weights W_B for B's side are held by A, while B's activations a_B only travel encrypted under
B's Paillier key:

forward   B -> A  [[a_B]];   A: [[a_B W_B]] (multi-exponentiation), + mask eps -> B decrypts -> A - eps
backward  A: dL/dz (engine autodiff);  [[dL/dW_B]] = [[a_B]]^T dL/dz + mask -> B decrypts -> A - mask;
          A -> B  dL/da_B = dL/dz W_B^T;  B back-propagates it through its bottom model (engine vjp).

What each side learns: B sees only masked values and dL/da_B (the usual split-learning gradient);
A sees a_B W_B (the interactive layer's input from B, as in FATE) but never a_B or x_B. Inference
runs the same forward exchange, so neither party's features leave it.
"""

from __future__ import annotations

from dataclasses import dataclass

import gmpy2
import numpy as np

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.federated.vertical import paillier as pl
from fedarena.federated.vertical.masking import (
    DecryptedMsg,
    Decryptor,
    Masker,
    MaskedMsg,
    PublicKeyMsg,
    public_key_message,
    read_public_key,
)
from fedarena.federated.vertical.messages import ProtocolError, message
from fedarena.federated.vertical.timing import PhaseTimer


@dataclass(frozen=True)
class SplitNNConfig:
    epochs: int = 3
    batch_size: int = 64
    optimizer: str = "adam"
    learning_rate: float = 0.01
    bottom_hidden: int = 32
    bottom_out_a: int = 8
    bottom_out_b: int = 4
    interactive_out: int = 16
    top_hidden: int = 32
    num_classes: int = 10
    key_bits: int = pl.DEFAULT_KEY_BITS
    act_frac_bits: int = 20
    weight_frac_bits: int = 16
    grad_frac_bits: int = 24
    value_bits: int = 100
    mask_bits: int = 40
    pack_decryption: bool = True
    seed: int = 0
    allow_insecure_keys: bool = False
    """accept key_bits below 2048 (fast tests only)"""

    def __post_init__(self) -> None:
        pl.check_key_bits(self.key_bits, self.allow_insecure_keys, "split_nn.key_bits")
        for name in ("epochs", "batch_size", "bottom_hidden", "bottom_out_a", "bottom_out_b", "interactive_out", "num_classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"split_nn.{name}: must be >= 1, got {getattr(self, name)}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"split_nn.optimizer: 'adam' or 'sgd', got {self.optimizer!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"split_nn.learning_rate: must be positive, got {self.learning_rate}")
        if self.act_frac_bits + max(self.weight_frac_bits, self.grad_frac_bits) + 24 > self.value_bits:
            raise ValueError(f"split_nn.value_bits: {self.value_bits} too small for the fixed-point precisions")


@message("vnn.batch")
@dataclass(frozen=True)
class BatchMsg:
    train: bool
    indices: np.ndarray


@message("vnn.activations")
@dataclass(frozen=True)
class ActivationsMsg:
    """B -> A: [[a_B]] row-major, ``rows`` x ``dims`` ciphertexts."""

    rows: int
    dims: int
    frac_bits: int
    values: bytes


@message("vnn.backward")
@dataclass(frozen=True)
class BackwardMsg:
    """A -> B: dL/da_B for the batch rows."""

    grad: np.ndarray


def _optimizer(cfg: SplitNNConfig):
    return optim.adam(cfg.learning_rate) if cfg.optimizer == "adam" else optim.sgd(cfg.learning_rate, momentum=0.0)


def _check_rows(idx: np.ndarray, n: int, limit: int, field: str) -> np.ndarray:
    idx = np.asarray(idx)
    if idx.dtype.kind != "i" or idx.ndim != 1 or len(idx) == 0 or idx.min() < 0 or idx.max() >= n:
        raise ProtocolError(field, f"must be a non-empty 1-d int array of rows in 0..{n - 1}")
    if len(idx) > limit or len(np.unique(idx)) != len(idx):
        raise ProtocolError(field, f"repeated rows or more than {limit} rows")
    return idx.astype(np.int64)


def encrypted_matmul(rows: list[list], key: pl.FastPublicKey, w: np.ndarray, frac_bits: int) -> list[list]:
    """[[a]] W for a batch: rows of ciphertexts (each ``w.shape[0]`` long) times a plaintext matrix.

    W is shared by all rows, so per row each ciphertext's squarings c^(2^t) (and those of its
    inverse, for negative weights) are computed once and every output multiplies the ones its
    weight's bits select: about h * bits squarings plus h * bits / 2 multiplications per output,
    instead of a full exponentiation per (input, output) pair.
    """
    q = np.rint(np.asarray(w, np.float64) * (1 << frac_bits)).astype(np.int64)
    h, k = q.shape
    nsq = key.nsquare
    bits = int(np.abs(q).max()).bit_length() if q.size else 0
    pos_bits = [[[t for t in range(bits) if (int(q[i, j]) >> t) & 1] if q[i, j] > 0 else [] for j in range(k)] for i in range(h)]
    neg_bits = [[[t for t in range(bits) if (-int(q[i, j]) >> t) & 1] if q[i, j] < 0 else [] for j in range(k)] for i in range(h)]
    any_neg = [any(q[i] < 0) for i in range(h)]
    any_pos = [any(q[i] > 0) for i in range(h)]

    def table(c):
        out = [c]
        for _ in range(bits - 1):
            c = c * c % nsq
            out.append(c)
        return out

    result = []
    for cs in rows:
        if len(cs) != h:
            raise ValueError(f"encrypted_matmul: row of {len(cs)} ciphertexts for a {h}-row matrix")
        tp = [table(c) if any_pos[i] else None for i, c in enumerate(cs)]
        tn = [table(gmpy2.invert(c, nsq)) if any_neg[i] else None for i, c in enumerate(cs)]
        row = []
        for j in range(k):
            acc = gmpy2.mpz(1)
            for i in range(h):
                for t in pos_bits[i][j]:
                    acc = acc * tp[i][t] % nsq
                for t in neg_bits[i][j]:
                    acc = acc * tn[i][t] % nsq
            row.append(acc)
        result.append(row)
    return result


class SplitHostB:
    """Party B: bottom model on its features, its own Paillier key pair."""

    def __init__(self, x: np.ndarray, cfg: SplitNNConfig) -> None:
        x = np.asarray(x, np.float64)
        if x.ndim != 2:
            raise ValueError(f"host data: x must be (rows, features), got {x.shape}")
        self.x, self.cfg = x, cfg
        self.timer = PhaseTimer()
        self.bottom = nn.MLP([x.shape[1], cfg.bottom_hidden, cfg.bottom_out_b], activation="relu", output_activation="tanh")
        self.params = self.bottom.init(np.random.default_rng([cfg.seed, 2]), dtype=np.float64)
        self.opt = _optimizer(cfg)
        self.opt_state = self.opt.init(self.params)
        pk, sk = pl.generate_keypair(cfg.key_bits, allow_insecure_keys=cfg.allow_insecure_keys)
        self.decryptor = Decryptor(sk, self.timer)
        self.public = pk
        self._batch: np.ndarray | None = None
        self._train = False
        self._vjp = None
        self._update = engine.jit(lambda g, s, p: self.opt.update(g, s, p))

    def public_key(self) -> PublicKeyMsg:
        return public_key_message(self.public)

    def receive_batch(self, m: BatchMsg) -> None:
        self._batch = _check_rows(m.indices, len(self.x), max(self.cfg.batch_size, 4096), "vnn.batch.indices")
        self._train = bool(m.train)

    def forward(self) -> ActivationsMsg:
        x = self.x[self._batch]
        with self.timer("compute"):
            if self._train:
                a, self._vjp = engine.vjp(lambda p: self.bottom.apply(p, x), self.params)
            else:
                a = self.bottom.apply(self.params, x)
        a = np.asarray(a, np.float64)
        key = self.decryptor.sk
        n = int(key.n)
        with self.timer("crypto"):
            cs = key.encrypt_ints(pl.encode(a.ravel(), self.cfg.act_frac_bits, n))
        w = key.public.width
        return ActivationsMsg(a.shape[0], a.shape[1], self.cfg.act_frac_bits, b"".join(int(c).to_bytes(w, "big") for c in cs))

    def backward(self, m: BackwardMsg) -> None:
        if self._vjp is None or self._batch is None:
            raise ProtocolError("vnn.backward", "no training forward pass to back-propagate")
        g = np.asarray(m.grad)
        want = (len(self._batch), self.cfg.bottom_out_b)
        if g.dtype != np.float64 or g.shape != want or not np.all(np.isfinite(g)):
            raise ProtocolError("vnn.backward.grad", f"expected finite float64 {want}, got {g.dtype} {g.shape}")
        with self.timer("compute"):
            (grads,) = self._vjp(g)
            self.params, self.opt_state = self._update(grads, self.opt_state, self.params)
        self._vjp = None


class SplitGuestA:
    """Party A: labels, bottom model, interactive layer (W_A, W_B, b) and top model."""

    def __init__(self, x: np.ndarray, y: np.ndarray, cfg: SplitNNConfig) -> None:
        x, y = np.asarray(x, np.float64), np.asarray(y)
        if x.ndim != 2 or y.shape != (x.shape[0],) or y.dtype.kind not in "iu":
            raise ValueError(f"guest data: x (rows, features) and integer y (rows,), got {x.shape}, {y.shape} {y.dtype}")
        if y.min() < 0 or y.max() >= cfg.num_classes:
            raise ValueError(f"guest data: labels must be in 0..{cfg.num_classes - 1}")
        self.x, self.y, self.cfg = x, y.astype(np.int64), cfg
        self.timer = PhaseTimer()
        rng = np.random.default_rng([cfg.seed, 1])
        self.bottom = nn.MLP([x.shape[1], cfg.bottom_hidden, cfg.bottom_out_a], activation="relu", output_activation="tanh")
        self.top = nn.MLP([cfg.interactive_out, cfg.top_hidden, cfg.num_classes], activation="relu") if cfg.top_hidden \
            else nn.Linear(cfg.interactive_out, cfg.num_classes)
        k = cfg.interactive_out
        bound_a = 1.0 / np.sqrt(cfg.bottom_out_a + cfg.bottom_out_b)
        self.params = {
            "bottom": self.bottom.init(rng, dtype=np.float64),
            "w_a": rng.uniform(-bound_a, bound_a, (cfg.bottom_out_a, k)),
            "bias": np.zeros(k),
            "top": self.top.init(rng, dtype=np.float64),
        }
        self.w_b = rng.uniform(-bound_a, bound_a, (cfg.bottom_out_b, k))
        self.opt = _optimizer(cfg)
        self.opt_state = self.opt.init(self.params)
        self.opt_b = _optimizer(cfg)
        self.opt_b_state = self.opt_b.init({"w_b": self.w_b})

        def loss_fn(p, xa, z_b, y):
            z = ops.matmul(self.bottom.apply(p["bottom"], xa), p["w_a"]) + z_b + p["bias"]
            return ops.cross_entropy(self.top.apply(p["top"], ops.relu(z)), y)

        def logits_fn(p, xa, z_b):
            z = ops.matmul(self.bottom.apply(p["bottom"], xa), p["w_a"]) + z_b + p["bias"]
            return self.top.apply(p["top"], ops.relu(z))

        self._value_and_grad = engine.jit(engine.value_and_grad(loss_fn, argnums=(0, 2)))
        self._logits = engine.jit(logits_fn)
        self._update = engine.jit(lambda g, s, p: self.opt.update(g, s, p))
        self._update_b = engine.jit(lambda g, s, p: self.opt_b.update(g, s, p))
        self.peer: pl.FastPublicKey | None = None
        self.masker: Masker | None = None
        self._batch: np.ndarray | None = None
        self._a_b: list[list] | None = None
        self._mask: list[int] | None = None

    def set_peer_key(self, m: PublicKeyMsg) -> None:
        self.peer = read_public_key(m, min_bits=min(self.cfg.key_bits, 2048))
        self.masker = Masker(self.peer, self.cfg.value_bits, self.cfg.mask_bits, self.cfg.pack_decryption, self.timer)

    def batch(self, idx: np.ndarray, train: bool) -> BatchMsg:
        self._batch = np.asarray(idx, np.int64)
        return BatchMsg(bool(train), self._batch)

    def interactive_forward(self, m: ActivationsMsg) -> MaskedMsg:
        """[[a_B]] -> masked [[a_B W_B]] for B to decrypt."""
        rows, dims = len(self._batch), self.cfg.bottom_out_b
        if (m.rows, m.dims, m.frac_bits) != (rows, dims, self.cfg.act_frac_bits):
            raise ProtocolError("vnn.activations", f"{m.rows}x{m.dims} at {m.frac_bits} bits, expected {rows}x{dims} at {self.cfg.act_frac_bits}")
        cv = pl.from_bytes(self.peer, m.values, rows * dims, m.frac_bits, "vnn.activations.values")
        self._a_b = [cv.cs[i * dims : (i + 1) * dims] for i in range(rows)]
        with self.timer("crypto"):
            z = encrypted_matmul(self._a_b, self.peer, self.w_b, self.cfg.weight_frac_bits)
        masked, self._mask = self.masker.mask(pl.CipherVector(self.peer, [c for r in z for c in r], 0))
        return masked

    def _z_b(self, reply: DecryptedMsg) -> np.ndarray:
        frac = self.cfg.act_frac_bits + self.cfg.weight_frac_bits
        return self.masker.unmask(reply, self._mask, frac).reshape(len(self._batch), self.cfg.interactive_out)

    def train_step(self, reply: DecryptedMsg) -> tuple[float, MaskedMsg, np.ndarray]:
        """Top/bottom update at A; returns the loss, masked [[dL/dW_B]] and dL/dz for the next steps."""
        z_b = self._z_b(reply)
        xa, y = self.x[self._batch], self.y[self._batch]
        with self.timer("compute"):
            loss, (grads, dz) = self._value_and_grad(self.params, xa, z_b, y)
            self.params, self.opt_state = self._update(grads, self.opt_state, self.params)
        dz = np.asarray(dz, np.float64)
        with self.timer("crypto"):
            q = np.rint(dz * (1 << self.cfg.grad_frac_bits)).astype(np.int64)
            nsq = self.peer.nsquare
            cols = list(zip(*self._a_b))  # per B-dimension, the batch's ciphertexts
            inv = [[gmpy2.invert(c, nsq) for c in col] for col in cols]
            gw = [pl.multi_exp(cols[k], inv[k], q[:, j].tolist(), nsq) for k in range(len(cols)) for j in range(q.shape[1])]
        masked, self._mask = self.masker.mask(pl.CipherVector(self.peer, gw, 0))
        return float(loss), masked, dz

    def finish_step(self, reply: DecryptedMsg, dz: np.ndarray) -> BackwardMsg:
        """Unmask dL/dW_B, send dL/da_B = dL/dz W_B^T (with the W_B used in the forward pass), update W_B."""
        frac = self.cfg.act_frac_bits + self.cfg.grad_frac_bits
        g_wb = self.masker.unmask(reply, self._mask, frac).reshape(self.w_b.shape)
        with self.timer("compute"):
            back = dz @ self.w_b.T
            new, self.opt_b_state = self._update_b({"w_b": g_wb}, self.opt_b_state, {"w_b": self.w_b})
            self.w_b = np.asarray(new["w_b"])
        self._a_b = None
        return BackwardMsg(back)

    def predict_logits(self, reply: DecryptedMsg) -> np.ndarray:
        z_b = self._z_b(reply)
        with self.timer("compute"):
            return np.asarray(self._logits(self.params, self.x[self._batch], z_b))


@dataclass
class SplitEpochReport:
    epoch: int
    loss: float
    seconds: dict
    bytes: int


class SplitNN:
    """A and B over a transfer function (in-process :class:`.channel.Link` by default)."""

    def __init__(self, x_a: np.ndarray, y: np.ndarray, x_b: np.ndarray, cfg: SplitNNConfig, transfer=None) -> None:
        from fedarena.federated.vertical.channel import Link

        if len(x_a) != len(x_b):
            raise ValueError(f"aligned rows differ: A has {len(x_a)}, B has {len(x_b)} (run PSI first)")
        self.cfg = cfg
        self.link = Link() if transfer is None else None
        self.transfer = transfer or self.link.transfer
        self.a, self.b = SplitGuestA(x_a, y, cfg), SplitHostB(x_b, cfg)
        self.a.set_peer_key(self.transfer("B", "A", self.b.public_key(), PublicKeyMsg))
        self.epoch = 0

    def step(self, idx: np.ndarray) -> float:
        a, b, t = self.a, self.b, self.transfer
        b.receive_batch(t("A", "B", a.batch(idx, True), BatchMsg))
        masked = a.interactive_forward(t("B", "A", b.forward(), ActivationsMsg))
        reply = t("B", "A", b.decryptor.decrypt(t("A", "B", masked, MaskedMsg)), DecryptedMsg)
        loss, masked_g, dz = a.train_step(reply)
        reply_g = t("B", "A", b.decryptor.decrypt(t("A", "B", masked_g, MaskedMsg)), DecryptedMsg)
        b.backward(t("A", "B", a.finish_step(reply_g, dz), BackwardMsg))
        return loss

    def train_epoch(self) -> SplitEpochReport:
        self.epoch += 1
        self.a.timer.take(), self.b.timer.take()
        if self.link:
            self.link.reset_stats()
        perm = np.random.default_rng([self.cfg.seed, self.epoch]).permutation(len(self.a.x))
        losses, sizes = [], []
        for s in range(0, len(perm), self.cfg.batch_size):
            idx = perm[s : s + self.cfg.batch_size]
            losses.append(self.step(idx))
            sizes.append(len(idx))
        secs: dict[str, float] = {"crypto": 0.0, "compute": 0.0}
        for p in (self.a, self.b):
            for k, v in p.timer.take().items():
                secs[k] = secs.get(k, 0.0) + v
        secs["comm"] = self.link.stats.seconds if self.link else 0.0
        return SplitEpochReport(self.epoch, float(np.average(losses, weights=sizes)), secs, self.link.stats.total_bytes if self.link else 0)

    def predict(self, rows: np.ndarray) -> np.ndarray:
        """Joint inference: class probabilities for aligned rows; features never leave their party."""
        a, b, t = self.a, self.b, self.transfer
        out = []
        rows = np.asarray(rows, np.int64)
        for s in range(0, len(rows), self.cfg.batch_size):
            idx = rows[s : s + self.cfg.batch_size]
            b.receive_batch(t("A", "B", a.batch(idx, False), BatchMsg))
            masked = a.interactive_forward(t("B", "A", b.forward(), ActivationsMsg))
            reply = t("B", "A", b.decryptor.decrypt(t("A", "B", masked, MaskedMsg)), DecryptedMsg)
            logits = a.predict_logits(reply)
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            out.append(e / e.sum(axis=1, keepdims=True))
        return np.concatenate(out) if out else np.zeros((0, self.cfg.num_classes))
