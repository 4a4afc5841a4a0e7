"""In-process federated simulation: many clients' local training as one batched engine program.

The round loop (McMahan et al. 2017, Algorithm 1) runs the same :class:`~fedarena.federated.strategy.Strategy`
hooks, upload stages and codecs as the gRPC runtime, with no network:

1. availability (a per-client probability per round) decides the candidates; the strategy selects;
2. the broadcast (optionally compressed, :mod:`fedarena.federated.compression`) gives the clients' model;
3. local training of all selected clients runs through one ``engine.jit(engine.vmap(step))``: client
   parameters are stacked along a leading client axis, every client's minibatches are drawn exactly
   as :class:`~fedarena.federated.engine_trainer.EngineMLPTrainer` draws them (same generator
   ``(seed, round, client id)``, same permutations), and clients with different numbers of examples
   are handled by *grouping* (clients sorted by step count, groups whose step counts differ by at most
   25 %) and *padding with masks* inside a group (a padded example has mask 0; a padded step updates
   nothing). A round of 1,000 clients is a few dozen calls of one compiled step;
4. heterogeneity: per-client speed (steps per simulated second, log-normal) against the round window
   -- stragglers are dropped, or keep the steps they finished when ``partial_work`` (FedProx's
   "variable amounts of work", Li et al. 2020); or a fixed fraction of each round's clients made
   stragglers (``straggler_fraction``, FedProx's Sec. 5.1 protocol); dropout probabilities before training, after training
   and during upload; sign-flip (``-s Delta``) or scaling (``s Delta``) adversaries;
5. the upload stages (clip, local DP, ...), the encoder and the server-side decoder, with exact bytes;
6. ``strategy.aggregate``; the global test set and every client's held-out data are evaluated.

Under device budgets (``devices``, :meth:`Simulation.device_round`) each client has a device profile
(:mod:`fedarena.federated.devices`) and trains the widest width-scaled sub-model its memory and time hold
(HeteroFL or FedRolex, :mod:`fedarena.federated.hetero`), one set of stacks per width level; the server averages
each coordinate over the clients that held it.

Backends: ``vmap`` (default; its math-library threads set by ``threads``) and ``ray`` (each round's clients
spread over Ray actors balanced by work, :mod:`fedarena.federated.ray_backend`). Both train at most
``max_stacked_clients`` clients in one stack; a client's arithmetic does not depend on which clients share its
stack except for float32 rounding: the engine's compiler rewrites large enough sums (``sums_as_matmul``,
``unroll_small_reductions``: at least 4,096 elements, counted over the whole stack) into another summation
order, so stacks of different sizes can round differently (measured: at most 3e-8 in the parameters of a
1.1M-parameter MLP after a round; bit for bit while the stacks stay below those sizes). Personalization: optional local
fine-tuning of the final model on each client's training data, with held-out accuracy before and after.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Literal, Protocol, Sequence, runtime_checkable

import numpy as np

from fedarena import engine
from fedarena.engine import nn, ops
from fedarena.engine.backend_selection import backend_jit, check_engine_backend, to_host
from fedarena.federated.strategy import ClientUpdate, FitConfig, Params, PartialAggregate, RoundState, Strategy
from fedarena.federated.trainer import mlp_init
from fedarena.privacy.secure_random import SecureRandom


def client_key(client_id: str) -> int:
    """The integer a client mixes into its training generator (as :class:`~fedarena.federated.client.FLClient`)."""
    return int.from_bytes(client_id.encode()[:8], "little")


# ----------------------------------------------------------------------------- batched local training


def batch_plan(n: int, cfg: FitConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The minibatches a client trains on, as an ``(S, B)`` matrix of local example positions (-1 pads a
    short last batch of an epoch), and the epoch of each row.

    Epoch after epoch ``rng.permutation(n)`` cut into batches of ``cfg.batch_size`` (the last may be
    smaller); ``cfg.local_steps > 0`` takes exactly that many batches."""
    B = cfg.batch_size
    per = math.ceil(n / B)
    epochs = math.ceil(cfg.local_steps / per) if cfg.local_steps else cfg.epochs
    rows = np.full((epochs, per * B), -1, np.int64)
    for e in range(epochs):
        rows[e, :n] = rng.permutation(n)
    mat = rows.reshape(epochs * per, B)
    ep = np.repeat(np.arange(epochs), per)
    if cfg.local_steps:
        mat, ep = mat[: cfg.local_steps], ep[: cfg.local_steps]
    return mat, ep


def group_by_steps(steps: Sequence[int], ratio: float = 1.25, max_group: int = 1024) -> list[list[int]]:
    """Positions grouped so that within a group the largest step count is <= ``ratio`` x the smallest (+1)."""
    order = np.argsort(np.asarray(steps), kind="stable")
    groups: list[list[int]] = []
    for i in order:
        s = steps[i]
        if groups and len(groups[-1]) < max_group and s <= max(steps[groups[-1][0]] * ratio, steps[groups[-1][0]] + 1):
            groups[-1].append(int(i))
        else:
            groups.append([int(i)])
    return groups


def stacked_groups(steps: Sequence[int], max_stacked: int = 0) -> list[list[int]]:
    """The positions with at least one step, grouped by step count (:func:`group_by_steps`) into groups of at
    most ``max_stacked`` clients (0 = 1024): the chunks one batched training call stacks."""
    groups = group_by_steps(steps, max_group=max_stacked or 1024)
    return [g for g in ([j for j in g if steps[j] > 0] for g in groups) if g]


EVAL_CHUNK = 256
"""examples per call of a model's compiled forward pass in evaluation (:meth:`BatchedModel.logits`): a compiled
program keeps its buffers, sized by its batch, for its next call, and a convolutional model's activations are
large (Reddi et al. 2021's EMNIST CNN at 8 and 16 channels keeps about 0.25 MiB per 28x28 image: 1,043 MiB for
one call of 4,096 images, 66 MiB at 256)"""
EVAL_READ = 8192
"""examples :func:`per_client_accuracy` gathers from ``x`` at a time (a lazily read population reads them then)"""


@dataclass(frozen=True)
class GroupPlan:
    """The padded training program of one group of G clients with at most S steps of batch B."""

    index: np.ndarray  # (G, S, B) int64: global example index (0 where padded); G rounded up to a power of 2
    mask: np.ndarray  # (G, S, B) float32: 1 for a real example
    valid: np.ndarray  # (G, S) float32: 1 for a step the client takes
    last_epoch: np.ndarray  # (G, S) float32: 1 for a step of the client's last epoch (for the reported loss)
    clients: int  # the real clients (the first ``clients`` rows; the rest is padding)


def make_group_plan(plans: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], allowed: Sequence[int],
                    batch_size: int, max_rows: int = 0) -> GroupPlan:
    """``plans[g] = (client's global indices, its batch matrix, epochs)`` (:func:`batch_plan`);
    ``allowed[g]`` caps its steps. The group is padded to a power of two clients (few compiled shapes), but
    to no more than ``max_rows`` when that is > 0, and to at least two: the compiled step of a one-row stack
    rounds differently from larger stacks, so a lone client (a small chunk, a Ray actor's odd one out) would
    not match the same client trained beside others."""
    G = 1 << max(1, len(plans) - 1).bit_length()
    if max_rows > 0:
        G = max(len(plans), 2, min(G, max_rows))
    S = max(min(len(b), a) for (_, b, _), a in zip(plans, allowed))
    index = np.zeros((G, S, batch_size), np.int64)
    mask = np.zeros((G, S, batch_size), np.float32)
    valid = np.zeros((G, S), np.float32)
    last = np.zeros((G, S), np.float32)
    for g, ((glob, mat, epochs), a) in enumerate(zip(plans, allowed)):
        k = min(len(mat), a)
        if k == 0:
            continue
        m = mat[:k]
        real = m >= 0
        index[g, :k] = np.where(real, glob[np.maximum(m, 0)], 0)
        mask[g, :k] = real
        valid[g, :k] = 1.0
        last[g, :k] = epochs[:k] == epochs[k - 1]
    return GroupPlan(index, mask, valid, last, len(plans))


class BatchedModel:
    """Local SGD of many clients' copies of one model, batched by ``engine.vmap`` (see module doc).

    Parameters are flat ``{name: array}`` float32 dicts (the runtime's wire format); a subclass says how they
    map to the pytree its ``forward(tree, x)`` takes (``_tree``/``_flat``). The objective is the mean
    cross-entropy of the batch's real examples, plus FedProx's ``mu/2 ||w - w_global||^2``; SCAFFOLD's
    correction ``c - c_i`` is added to every gradient. ``spec`` rebuilds the model elsewhere (Ray actors)."""

    spec: tuple
    engine_backend: str = "numpy"
    """where the compiled steps run (:meth:`use_engine_backend`)"""

    def forward(self, tree: Any, x: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _tree(self, params: Params) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _flat(self, tree: Any) -> Params:  # pragma: no cover - abstract
        raise NotImplementedError

    def example_losses(self, tree: Any, x: Any, y_onehot: Any) -> Any:
        """Each example's cross-entropy of ``forward(tree, x)`` against ``y_onehot`` (a sequence model of
        :mod:`fedarena.federated.models` overrides it with its per-token loss)."""
        logits = self.forward(tree, x)
        return ops.logsumexp(logits, axis=1) - ops.sum(logits * y_onehot, axis=1)

    def _compile(self) -> None:
        forward, example_losses = self.forward, self.example_losses

        def loss_fn(w, x, y, m):
            ce = example_losses(w, x, y)
            return ops.sum(ce * m) / ops.maximum(ops.sum(m), 1.0)

        def step(w, anchor, corr, x, y, m, valid, lr, mu):
            ce, g = engine.value_and_grad(loss_fn)(w, x, y, m)
            new = engine.tree_map(lambda p, gp, a, c: p - (lr * valid) * (gp + mu * (p - a) + c), w, g, anchor, corr)
            return new, ce

        def step_plain(w, x, y, m, valid, lr):
            ce, g = engine.value_and_grad(loss_fn)(w, x, y, m)
            return engine.tree_map(lambda p, gp: p - (lr * valid) * gp, w, g), ce

        backend = self.engine_backend
        # the stack's size and step count change with the clients a round trains: a few programs by design
        self._step = backend_jit(engine.vmap(step, in_axes=(0, None, 0, 0, 0, 0, 0, None, None)), backend,
                                 shape_varies=True)
        self._step_plain = backend_jit(engine.vmap(step_plain, in_axes=(0, 0, 0, 0, 0, None)), backend,
                                       shape_varies=True)
        self._forward = backend_jit(forward, backend, shape_varies=True)

    def use_engine_backend(self, backend: str) -> None:
        """Compile the batched local step and the forward pass for ``backend`` (numpy, cupy or cupy-emulated,
        :mod:`fedarena.engine.backend_selection`). On a device backend the clients' stacked parameters
        stay on the device across a group's steps; each step copies its minibatch in and its losses out."""
        check_engine_backend(backend, "engine_backend")
        if backend != self.engine_backend:
            self.engine_backend = backend
            self._compile()

    def train_group(self, params: Params, plan: GroupPlan, x: np.ndarray, y_onehot: np.ndarray, cfg: FitConfig,
                    corrections: list[Params] | None = None) -> tuple[Params, np.ndarray]:
        """Train the clients of ``plan`` from ``params``; returns their parameters stacked along a leading
        client axis (``plan.clients`` rows) and their last-epoch mean losses."""
        G, S = plan.valid.shape
        anchor = self._tree(params)
        w = self._tree({k: np.repeat(np.asarray(v, np.float32)[None], G, axis=0) for k, v in params.items()})
        lr, mu = np.float32(cfg.lr), np.float32(cfg.prox_mu)
        plain = corrections is None and cfg.prox_mu == 0
        if not plain:
            corr = self._tree({k: np.zeros((G, *np.shape(v)), np.float32) for k, v in params.items()}
                              if corrections is None else
                              {k: self._pad_rows(np.stack([c[k] for c in corrections]).astype(np.float32), G)
                               for k in params})
        loss_sum = np.zeros(G)
        for s in range(S):
            idx = plan.index[:, s]
            xb, yb, mb, vb = x[idx], y_onehot[idx], plan.mask[:, s], plan.valid[:, s]
            if plain:
                w, ce = self._step_plain(w, xb, yb, mb, vb, lr)
            else:
                w, ce = self._step(w, anchor, corr, xb, yb, mb, vb, lr, mu)
            loss_sum += np.asarray(to_host(ce), np.float64) * plan.last_epoch[:, s]
        losses = loss_sum / np.maximum(plan.last_epoch.sum(1), 1.0)
        out = {k: np.asarray(v)[: plan.clients] for k, v in to_host(self._flat(w)).items()}
        return out, losses[: plan.clients]

    @staticmethod
    def _pad_rows(a: np.ndarray, rows: int) -> np.ndarray:
        """``a`` with zero rows appended up to ``rows`` (the padded clients of a group)."""
        return a if len(a) == rows else np.concatenate([a, np.zeros((rows - len(a), *a.shape[1:]), a.dtype)])

    def logits(self, params: Params, x: np.ndarray, chunk: int = EVAL_CHUNK) -> np.ndarray:
        """Forward pass for evaluation: the compiled forward over chunks of at most ``chunk`` examples, a shorter
        chunk padded with zero rows up to the next power of two, so the activations held at once are one
        chunk's whatever ``len(x)``, and at most ``log2(chunk) + 1`` programs are compiled (each keeps its
        buffers, sized by its batch, for its next call); float64 logits."""
        if not len(x):
            return np.zeros((0, 0))
        return np.concatenate(list(self.run_chunks(self._forward, params, x, chunk, np.float64)))

    def run_chunks(self, program: Callable[[Any, Any], Any], params: Params, x: np.ndarray, chunk: int,
                   dtype: Any) -> Iterator[np.ndarray]:
        """``program(tree, rows)`` (a compiled forward of this model) over ``x`` in chunks of at most ``chunk``
        rows, a shorter chunk padded with zero rows up to the next power of two (at least 2); yields each
        chunk's output for its real rows as ``dtype`` (how :meth:`logits` bounds evaluation memory)."""
        tree = self._tree(params)
        for i in range(0, len(x), chunk):
            xb = np.asarray(x[i: i + chunk], np.float32)
            n = len(xb)
            rows = min(chunk, max(2, 1 << (n - 1).bit_length()))
            if rows > n:
                xb = np.concatenate([xb, np.zeros((rows - n, *xb.shape[1:]), np.float32)])
            yield np.asarray(to_host(program(tree, xb)), dtype)[:n]


class BatchedMLP(BatchedModel):
    """A ReLU MLP ``sizes`` (McMahan et al. 2017's 2NN is ``(784, 200, 200, 10)``), parameters
    ``{"l{i}.w": (in, out), "l{i}.b": (out,)}``."""

    hidden_scale: float = 1.0
    """every hidden layer's ReLU output is multiplied by this in :meth:`logits` (1: the plain MLP)"""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        self.depth = len(self.sizes) - 1
        self.spec = ("mlp", self.sizes)
        self._mlp = nn.MLP(list(self.sizes), activation="relu")
        self._compile()

    def forward(self, tree, x):
        return self._mlp.apply(tree, x)

    def init_params(self, seed: int) -> Params:
        return mlp_init(self.sizes, seed)

    def _tree(self, params: Params) -> list[dict[str, np.ndarray]]:
        return [{"w": np.asarray(params[f"l{i}.w"], np.float32), "b": np.asarray(params[f"l{i}.b"], np.float32)}
                for i in range(self.depth)]

    def _flat(self, tree) -> Params:
        return {f"l{i}.{k}": tree[i][k] for i in range(self.depth) for k in ("w", "b")}

    def logits(self, params: Params, x: np.ndarray, chunk: int = 4096) -> np.ndarray:
        """Forward pass for evaluation (float32 matmuls, float64 logits)."""
        h = np.asarray(x, np.float32)
        for i in range(self.depth):
            h = h @ np.asarray(params[f"l{i}.w"], np.float32) + np.asarray(params[f"l{i}.b"], np.float32)
            if i < self.depth - 1:
                h = np.maximum(h, 0.0)
                if self.hidden_scale != 1.0:
                    h = h * np.float32(self.hidden_scale)
        return h.astype(np.float64)


class BatchedCNN(BatchedModel):
    """McMahan et al. 2017's CNN: two 5x5 convolutions (``channels``, 32 and 64 in the paper; padding 2, so
    28x28 stays 28x28) each followed by ReLU and 2x2 max pooling, a ``hidden``-unit ReLU layer (512) and a
    softmax output; on 28x28 MNIST that is the paper's 1,663,370 parameters. Inputs are flattened
    ``image`` = (channels, height, width) pixels (height and width divisible by 4). Parameters:
    ``conv1.w`` (OIHW), ``conv1.b``, ``conv2.w``, ``conv2.b``, ``fc.w`` (in, out), ``fc.b``, ``out.w``, ``out.b``;
    initialisation is PyTorch's default (LeCun uniform), as :class:`fedarena.engine.nn.Conv2d`."""

    NAMES = ("conv1.w", "conv1.b", "conv2.w", "conv2.b", "fc.w", "fc.b", "out.w", "out.b")

    def __init__(self, image: Sequence[int], num_classes: int, channels: Sequence[int] = (32, 64),
                 hidden: int = 512) -> None:
        c, h, w = (int(v) for v in image)
        if h % 4 or w % 4:
            raise ValueError(f"model.image: height and width must be divisible by 4 (two 2x2 poolings), got {h}x{w}")
        if len(channels) != 2 or min(channels) < 1 or hidden < 1:
            raise ValueError(f"model.channels/hidden: two positive channel counts and hidden >= 1, got "
                             f"{list(channels)}, {hidden}")
        self.image, self.num_classes = (c, h, w), int(num_classes)
        self.channels, self.hidden = tuple(int(v) for v in channels), int(hidden)
        self.spec = ("cnn", self.image, self.num_classes, self.channels, self.hidden)
        self.flat_features = self.channels[1] * (h // 4) * (w // 4)
        self._layers = (nn.Conv2d(c, self.channels[0], 5, padding=2), nn.Conv2d(self.channels[0], self.channels[1], 5,
                        padding=2), nn.Linear(self.flat_features, self.hidden), nn.Linear(self.hidden, num_classes))
        self._compile()

    def forward(self, tree, x):
        c, h, w = self.image
        z = ops.reshape(x, (ops.shape(x)[0], c, h, w))
        for conv, name in zip(self._layers[:2], ("conv1", "conv2")):
            z = ops.max_pool2d(ops.maximum(conv.apply(tree[name], z), 0.0), 2, None, 0)
        z = ops.reshape(z, (ops.shape(z)[0], self.flat_features))
        z = ops.maximum(self._layers[2].apply(tree["fc"], z), 0.0)
        return self._layers[3].apply(tree["out"], z)

    def init_params(self, seed: int) -> Params:
        rng = np.random.default_rng(seed)
        out: Params = {}
        for layer, name in zip(self._layers, ("conv1", "conv2", "fc", "out")):
            for k, v in layer.init(rng).items():
                out[f"{name}.{k}"] = np.asarray(v, np.float32)
        return out

    def _tree(self, params: Params) -> dict[str, dict[str, np.ndarray]]:
        return {n: {"w": np.asarray(params[f"{n}.w"], np.float32), "b": np.asarray(params[f"{n}.b"], np.float32)}
                for n in ("conv1", "conv2", "fc", "out")}

    def _flat(self, tree) -> Params:
        return {f"{n}.{k}": tree[n][k] for n in ("conv1", "conv2", "fc", "out") for k in ("w", "b")}


def batched_model(spec: tuple) -> BatchedModel:
    """The model of ``BatchedModel.spec`` (how a Ray actor rebuilds the driver's model)."""
    if spec[0] == "mlp":
        return BatchedMLP(spec[1])
    if spec[0] == "cnn":
        return BatchedCNN(*spec[1:])
    if spec[0] == "zoo":
        from fedarena.federated.models import BatchedZooModel  # it subclasses BatchedModel (a cycle at import)

        return BatchedZooModel.from_spec(spec)
    raise ValueError(f"model: unknown spec {spec[0]!r}")


def evaluate_params(model: BatchedModel, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``params`` on ``(x, y)``."""
    if len(y) == 0:
        return float("nan"), float("nan")
    z = model.logits(params, x)
    z = z - z.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean()), float((logp.argmax(1) == y).mean())


def per_client_accuracy(model: BatchedModel, params: Params, x: np.ndarray, y: np.ndarray,
                        index: Sequence[np.ndarray]) -> np.ndarray:
    """Accuracy of ``params`` on each client's examples ``index[i]`` (NaN for a client without any)."""
    sizes = np.array([len(i) for i in index])
    if sizes.sum() == 0:
        return np.full(len(index), np.nan)
    allidx = np.concatenate([np.asarray(i, np.int64) for i in index])
    owner = np.repeat(np.arange(len(index)), sizes)
    correct = np.empty(len(allidx))
    for s in range(0, len(allidx), EVAL_READ):  # examples read from a lazy source a slice at a time
        part = allidx[s: s + EVAL_READ]
        correct[s: s + len(part)] = model.logits(params, x[part]).argmax(1) == y[part]
    hits = np.bincount(owner, weights=correct, minlength=len(index))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(sizes > 0, hits / np.maximum(sizes, 1), np.nan)


class _OneHot:
    """One-hot labels formed on lookup (``onehot[idx]``), for data sets too large for an (N, classes) matrix."""

    def __init__(self, y: np.ndarray, num_classes: int) -> None:
        self.y, self.eye = y, np.eye(num_classes, dtype=np.float32)

    def __getitem__(self, idx) -> np.ndarray:
        return self.eye[self.y[idx]]


class LocalDeltas(Mapping):
    """``{client id: float32 delta w_local - params}`` formed on lookup (in float64, then rounded to float32, as
    the runtime client forms it) from the clients' local parameters, so that deltas are not held beside them."""

    def __init__(self, local: dict[str, Params], params: Params) -> None:
        self.local, self.params = local, params

    def __getitem__(self, cid: str) -> Params:
        return {k: (v.astype(np.float64) - self.params[k].astype(np.float64)).astype(np.float32)
                for k, v in self.local[cid].items()}

    def __iter__(self):
        return iter(self.local)

    def __len__(self) -> int:
        return len(self.local)


# ----------------------------------------------------------------------------- heterogeneity and failures


@dataclass(frozen=True)
class Heterogeneity:
    """Client heterogeneity and failures (all draws from the simulation's seeded generators)."""

    availability: float = 1.0
    """probability that a client is reachable in a round (candidates for selection)"""
    speed_mean: float = 0.0
    """mean local steps per simulated second (log-normal over clients); 0 = no time model"""
    speed_sigma: float = 0.0
    """sigma of log(speed) over clients"""
    window_s: float = 0.0
    """round window in simulated seconds; a client whose steps take longer is a straggler (0 = no window)"""
    partial_work: bool = False
    """keep a straggler's finished steps (FedProx) instead of dropping it"""
    straggler_fraction: float = 0.0
    """fraction of each round's training clients made stragglers (FedProx's systems heterogeneity, Li et al.
    2020, Sec. 5.1): a straggler finishes ``e ~ U{1..E-1}`` of its E epochs (with ``local_steps``: ``U{1..K-1}``
    of its K steps); dropped, or with ``partial_work`` its finished steps are kept"""
    drop_before_training: float = 0.0
    drop_after_training: float = 0.0
    drop_upload: float = 0.0
    adversary_fraction: float = 0.0
    """fraction of clients (fixed for the run) that corrupt their uploads"""
    adversary: Literal["sign_flip", "scale"] = "sign_flip"
    adversary_scale: float = 4.0
    """sign_flip uploads ``-s Delta``, scale uploads ``s Delta``"""

    def __post_init__(self) -> None:
        for name in ("availability", "straggler_fraction", "drop_before_training", "drop_after_training", "drop_upload",
                     "adversary_fraction"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise ValueError(f"heterogeneity.{name}: must lie in [0, 1], got {v}")
        if self.availability <= 0:
            raise ValueError("heterogeneity.availability: must be > 0")
        if self.speed_mean < 0 or self.speed_sigma < 0 or self.window_s < 0:
            raise ValueError("heterogeneity.speed_mean/speed_sigma/window_s: must be >= 0")
        if self.window_s > 0 and self.speed_mean == 0:
            raise ValueError("heterogeneity.speed_mean: a round window needs client speeds (speed_mean > 0)")
        if self.adversary not in ("sign_flip", "scale"):
            raise ValueError(f"heterogeneity.adversary: unknown '{self.adversary}' (sign_flip or scale)")


# ----------------------------------------------------------------------------- the simulation


UploadFn = Callable[[str, Params, np.random.Generator], tuple[Params, int]]
"""``upload(client_id, delta, rng) -> (decoded delta as the server sees it, bytes uploaded)``."""


def dense_upload(client_id: str, delta: Params, rng: np.random.Generator) -> tuple[Params, int]:
    """The runtime's default upload: float32 arrays (4 bytes an entry), decoded to float64."""
    out = {k: np.asarray(v, np.float32).astype(np.float64) for k, v in delta.items()}
    return out, sum(4 * v.size for v in delta.values())


@runtime_checkable
class Upload(Protocol):
    """What the simulation calls on its upload: the call itself (:data:`UploadFn`), ``begin_round`` with the model
    the clients trained from, ``pop_download_bytes`` (download bytes the upload's prediction added this round),
    ``private`` (it gets the privacy randomness, not the codec's) and ``equal_weight`` (every report weighs 1)."""

    private: bool
    equal_weight: bool

    def __call__(self, client_id: str, delta: Params, rng: np.random.Generator) -> tuple[Params, int]: ...

    def begin_round(self, rnd: int, params: Params) -> None: ...

    def pop_download_bytes(self) -> int: ...


@dataclass(frozen=True)
class FunctionUpload:
    """A plain :data:`UploadFn` as an :class:`Upload` (no round state, no download bytes, not private)."""

    fn: UploadFn
    private = False
    equal_weight = False

    def __call__(self, client_id: str, delta: Params, rng: np.random.Generator) -> tuple[Params, int]:
        return self.fn(client_id, delta, rng)

    def begin_round(self, rnd: int, params: Params) -> None:
        return None

    def pop_download_bytes(self) -> int:
        return 0


def as_upload(upload: Any) -> Upload:
    """``upload`` itself when it has every hook of :class:`Upload`, else a :class:`FunctionUpload` around it."""
    return upload if isinstance(upload, Upload) else FunctionUpload(upload)


class UpdateDivergence:
    """The divergence of a round's client updates, ``mean_i ||Delta_i - mean||^2 / ||mean||^2`` (unweighted), from
    running sums over the updates as they arrive: Welford's update of the mean and of the sum of squared deviations
    (``M <- M + (x - M) / k``, ``S <- S + (x - M_old) . (x - M_new)``, exact in exact arithmetic and free of the
    cancellation of ``sum ||x||^2 - n ||mean||^2``), so no ``(n, d)`` matrix is formed."""

    def __init__(self) -> None:
        self.k = 0
        self.mean: np.ndarray | None = None
        self.sq = 0.0

    def add(self, delta: Params) -> None:
        x = np.concatenate([np.asarray(delta[k], np.float64).ravel() for k in sorted(delta)])
        self.k += 1
        if self.mean is None:
            self.mean = x
            return
        dev_old = x - self.mean
        self.mean += dev_old / self.k
        x -= self.mean  # x is a fresh copy: reuse it for the new deviation
        self.sq += float(dev_old @ x)

    def value(self) -> float:
        """The divergence (nan before two updates)."""
        if self.k < 2 or self.mean is None:
            return float("nan")
        return self.sq / self.k / max(float(self.mean @ self.mean), 1e-30)


@dataclass
class RoundRecord:
    """Metrics of one simulated round."""

    round: int
    metrics: dict[str, float]
    selected: list[str]
    reporting: list[str]


@dataclass
class Simulation:
    """Clients ``client_ids[i]`` with training indices ``train[i]`` into ``(x, y)``; see the module docstring."""

    model: BatchedModel
    strategy: Strategy
    x: np.ndarray
    y: np.ndarray
    train: list[np.ndarray]
    client_ids: list[str]
    num_classes: int
    seed: int = 0
    held_out: list[np.ndarray] | None = None
    test: tuple[np.ndarray, np.ndarray] | None = None
    heterogeneity: Heterogeneity = field(default_factory=Heterogeneity)
    upload_stages: list[Any] = field(default_factory=list)
    upload: UploadFn = dense_upload
    download: Any = None
    """a :class:`fedarena.federated.compression.Broadcast` (compressed model broadcast) or None"""
    backend: Literal["vmap", "ray"] = "vmap"
    engine_backend: str = "numpy"
    """where the vmapped local step runs: numpy, cupy (a CUDA GPU) or cupy-emulated (the cupy backend's kernels on
    the CPU, a testing aid); vmap backend only. Strategies aggregate in numpy on the host"""
    ray_groups_per_task: int = 1
    """chunk size of the ray backend: stacked groups per Ray task (0 = a worker's whole share of a round in one
    task); the tasks of one actor run in turn and their results come back as each finishes"""
    ray_workers: int = 0
    """Ray actors of the ray backend (0 = one per cluster CPU, at most 8)"""
    threads: int = 0
    """math-library (BLAS/OpenMP) threads of the in-process backend's local training and evaluation, set with
    threadpoolctl around them (0 = leave the libraries' own setting); Ray actors always use one thread each"""
    max_stacked_clients: int = 0
    """at most this many clients' model copies stacked in one batched training call (0 = up to 1024): a round
    is trained in chunks of this many clients, so the training's working memory is bounded by it instead of by
    the clients per round; the chunking changes a client's result by float32 rounding at most (module doc)"""
    privacy_seed: int = -1
    """seed of the privacy randomness (upload stages, SignDS; the codecs' rounding follows ``seed``); -1 = every
    draw from the OS CSPRNG (:class:`SecureRandom`); a seed is for reproducible tests only"""
    eval_clients: bool = True
    eval_every: int = 1
    """evaluate the global model every this many rounds (and after the last round of :meth:`run`)"""
    client_trainer: Any = None
    """local training by another trainer instead of the batched MLP: an object with ``train(params, client_ids,
    round, fit) -> {client id: result}`` whose results have ``params``, ``loss``, ``num_examples`` and ``steps``
    (e.g. :class:`fedarena.federated.flower.ClientAppTrainer`, a Flower ClientApp); its ``num_examples`` weigh
    the updates. Evaluation still uses ``model``, so the trainer must train that architecture."""
    devices: Any = None
    """a :class:`fedarena.federated.devices.DeviceFleet`: every client's device profile; a round then runs
    :meth:`device_round` (each client trains the widest level of ``widths`` its budget holds)"""
    widths: Any = None
    """with ``devices``: the :class:`fedarena.federated.hetero.WidthLevels` the clients may train (an MLP only)"""
    token_masks: Mapping[str, Sequence[int]] | None = None
    """a language model's every-token test accuracies: ``{metric name: target ids left out}``
    (:func:`fedarena.federated.datasets.token_accuracy_masks`); each evaluation adds the fraction of the test
    sequences' predicted positions whose target is not left out that the model predicts right
    (:meth:`fedarena.federated.models.BatchedZooModel.token_accuracies`)"""

    def __post_init__(self) -> None:
        if len(self.train) != len(self.client_ids):
            raise ValueError("client_ids: one id per client needed")
        if len(set(self.client_ids)) != len(self.client_ids):
            raise ValueError("client_ids: must be unique")
        for i, p in enumerate(self.train):
            if len(p) == 0:
                raise ValueError(f"partition: client {self.client_ids[i]} has no training examples")
        self.upload = as_upload(self.upload)
        k = self.strategy.clients_per_round
        if k > len(self.client_ids):
            raise ValueError(f"clients_per_round: {k} exceeds the {len(self.client_ids)} clients")
        self._streamed = hasattr(self.x, "prepare")  # a ClientSource: clients read from disk per round
        if self._streamed:
            if self.backend == "ray":
                raise ValueError("backend: a data set read per client from data.path trains with backend vmap "
                                 "(the ray backend ships the whole feature matrix to its actors)")
        else:
            self.x = np.ascontiguousarray(self.x, np.float32)
        self.y = np.asarray(self.y, np.int64)
        self._onehot = _OneHot(self.y, self.num_classes) if self._streamed else \
            np.eye(self.num_classes, dtype=np.float32)[self.y]
        het = self.heterogeneity
        rng = np.random.default_rng([self.seed, 101])
        n = len(self.client_ids)
        self.speeds = (het.speed_mean * np.exp(het.speed_sigma * rng.standard_normal(n) - het.speed_sigma ** 2 / 2)
                       if het.speed_mean > 0 else np.full(n, np.inf))
        n_adv = int(round(het.adversary_fraction * n))
        self.adversaries = frozenset(self.client_ids[i] for i in rng.choice(n, n_adv, replace=False)) if n_adv else \
            frozenset()
        self._pos = {c: i for i, c in enumerate(self.client_ids)}
        self.client_control: dict[str, Params] = {}
        self.bytes_up_total = 0
        self.bytes_down_total = 0
        self._remote = None
        self._reported_examples: dict[str, int] = {}
        if self.client_trainer is not None and (het.window_s > 0 or het.straggler_fraction > 0):
            raise ValueError("heterogeneity.window_s/straggler_fraction: the time model caps the batched trainer's "
                             "steps; a client_trainer trains as it trains")
        if self.engine_backend != "numpy":
            if self.backend != "vmap":
                raise ValueError(f"engine_backend: {self.engine_backend} runs with backend vmap (the ray backend "
                                 "rebuilds its models from a spec), got backend ray")
            self.model.use_engine_backend(self.engine_backend)
        if self.threads < 0:
            raise ValueError(f"threads: must be >= 0 (0 = the math libraries' default), got {self.threads}")
        if self.max_stacked_clients < 0:
            raise ValueError(f"max_stacked_clients: must be >= 0 (0 = up to 1024), got {self.max_stacked_clients}")
        if self.ray_groups_per_task < 0:
            raise ValueError(f"ray_groups_per_task: must be >= 0, got {self.ray_groups_per_task}")
        self.device_records: list[dict[str, Any]] = []
        """one row per client trained under ``devices`` (:meth:`device_round`), taken by :meth:`pop_device_records`"""
        if self.devices is not None:
            self._init_devices()
        self._threadpools = None
        self.final_round = -1  # the round after which :meth:`run` evaluates in any case (set by run)

    # ------------------------------------------------------------------ training

    def _plans(self, selected: Sequence[str], rnd: int, cfg: FitConfig, stragglers: bool = True):
        plans, allowed = [], []
        het = self.heterogeneity
        slow: set[str] = set()
        srng = np.random.default_rng([self.seed, rnd, 11])
        if self._streamed:  # start reading (and mapping) the clients of this round on the pipeline's threads
            self.x.prepare(rnd, [self._pos[c] for c in selected])
        if stragglers and het.straggler_fraction > 0 and selected:
            k = int(round(het.straggler_fraction * len(selected)))
            slow = set(srng.choice(sorted(selected), size=k, replace=False).tolist()) if k else set()
        for cid in selected:
            i = self._pos[cid]
            rng = np.random.default_rng([self.seed, rnd, client_key(cid)])
            batches, epochs = batch_plan(len(self.train[i]), cfg, rng)
            cap = len(batches)
            if het.window_s > 0:
                cap = min(cap, int(math.floor(het.window_s * self.speeds[i])))
            if cid in slow:
                if cfg.local_steps:
                    done = int(srng.integers(1, cfg.local_steps)) if cfg.local_steps > 1 else 0
                else:
                    per = math.ceil(len(self.train[i]) / cfg.batch_size)
                    done = int(srng.integers(1, cfg.epochs)) * per if cfg.epochs > 1 else 0
                cap = min(cap, done)
            plans.append((self.train[i], batches, epochs))
            allowed.append(cap)
        return plans, allowed

    def _train(self, params: Params, selected: Sequence[str], rnd: int, cfg: FitConfig,
               corrections: dict[str, Params] | None, stragglers: bool = True
               ) -> tuple[dict[str, Params], Mapping[str, Params], dict[str, float], dict[str, int]]:
        """Local parameters, float32 deltas ``w_local - params`` (as the runtime client forms them), losses, steps.

        The clients are trained chunk by chunk (at most ``max_stacked_clients`` stacked at once); each chunk's
        stack is cut into per-client rows as soon as it is trained, and a client's delta is formed when it is
        looked up (:class:`LocalDeltas`), so a round holds one model copy per client, not two."""
        if self.client_trainer is not None:
            return self._train_external(params, selected, rnd, cfg, corrections)
        plans, allowed = self._plans(selected, rnd, cfg, stragglers)
        steps = [min(len(p[1]), a) for p, a in zip(plans, allowed)]
        corr = None if corrections is None else [corrections[c] for c in selected]
        local, losses = {}, {}
        with self.math_threads():
            for g, stack, ls in self._run_jobs(params, selected, plans, allowed, steps, corr, cfg, rnd):
                for r, j in enumerate(g):
                    local[selected[j]] = {k: v[r] for k, v in stack.items()}
                    losses[selected[j]] = float(ls[r])
        return local, LocalDeltas(local, params), losses, {selected[j]: steps[j] for j in range(len(selected))}

    def math_threads(self) -> Any:
        """A context in which the math libraries use ``threads`` threads (threadpoolctl); a no-op for 0."""
        if self.threads == 0:
            return contextlib.nullcontext()
        if self._threadpools is None:
            from threadpoolctl import ThreadpoolController

            self._threadpools = ThreadpoolController()
        return self._threadpools.limit(limits=self.threads)

    def _train_external(self, params, selected, rnd, cfg, corrections):
        if corrections is not None:
            raise ValueError("client_trainer: SCAFFOLD's corrections need the batched trainer")
        results = self.client_trainer.train(params, list(selected), rnd, cfg)
        local, deltas, losses, steps = {}, {}, {}, {}
        for c in selected:
            r = results[c]
            local[c] = {k: np.asarray(r.params[k], np.float32) for k in params}
            deltas[c] = {k: (local[c][k].astype(np.float64) - params[k].astype(np.float64)).astype(np.float32)
                         for k in params}
            losses[c], steps[c] = float(r.loss), int(r.steps)
            self._reported_examples[c] = int(r.num_examples)
        return local, deltas, losses, steps

    def _run_jobs(self, params, selected, plans, allowed, steps, corrections, cfg, rnd
                  ) -> Iterator[tuple[list[int], Params, np.ndarray]]:
        """``(positions in selected, stacked local parameters, losses)`` chunk by chunk."""
        if self.backend == "ray":
            from fedarena.federated import ray_backend

            if self._remote is None:
                self._remote = ray_backend.RayTrainer(self.model.spec, self.x, self._onehot, self.train,
                                                      self.ray_workers)
            yield from self._remote.run(params, [self._pos[c] for c in selected], plans, allowed, steps, corrections,
                                        cfg, rnd, self.max_stacked_clients, self.ray_groups_per_task)
            return
        for g in stacked_groups(steps, self.max_stacked_clients):
            plan = make_group_plan([plans[j] for j in g], [allowed[j] for j in g], cfg.batch_size,
                                   self.max_stacked_clients)
            corr = None if corrections is None else [corrections[j] for j in g]
            stack, ls = self.model.train_group(params, plan, self.x, self._onehot, cfg, corr)
            yield g, stack, ls

    def ray_nodes(self) -> list[str]:
        """Node id of every Ray actor of the ray backend (empty before the first round or with vmap)."""
        return self._remote.nodes() if self._remote is not None else []

    # ------------------------------------------------------------------ rounds

    def init_state(self, params: Params | None = None) -> RoundState:
        params = params if params is not None else self.model.init_params(self.seed)
        if self.devices is not None and self.widths.rates[0] < 1:
            params = self._narrow_global_init(params)
        return self.strategy.init_state(params)

    def _narrow_global_init(self, params: Params) -> Params:
        """A global model narrower than ``model`` (``widths.rates[0] < 1``, e.g. every client at the smallest
        width) starts as a model of that width would (its own fan-ins, :func:`mlp_init`), in the leading units;
        the units beyond it are never trained nor evaluated."""
        from fedarena.federated.hetero import submodel_index

        index = submodel_index(self.model.sizes, self.widths.rates[0], "heterofl", 1)
        fresh = self._level_models[0].init_params(self.seed)
        out = {k: np.array(v, np.float32, copy=True) for k, v in params.items()}
        for i in range(len(index) - 1):
            out[f"l{i}.w"][np.ix_(index[i], index[i + 1])] = fresh[f"l{i}.w"]
            out[f"l{i}.b"][index[i + 1]] = fresh[f"l{i}.b"]
        return out

    def round(self, state: RoundState) -> tuple[RoundState, RoundRecord]:
        """Run round ``state.round``; returns the next state and the round's record."""
        if self.devices is not None:
            return self.device_round(state)
        rnd = state.round
        het = self.heterogeneity
        t0 = time.perf_counter()
        frng = np.random.default_rng([self.seed, rnd, 7])  # failure injection of this round
        if het.availability < 1:
            avail = frng.random(len(self.client_ids)) < het.availability
            cands = [c for c, a in zip(self.client_ids, avail) if a]
        else:
            cands = list(self.client_ids)
        selected = self.strategy.select(rnd, cands, self.seed)
        cfg = self.strategy.configure(rnd, state)
        m: dict[str, float] = {"selected": len(selected), "available": len(cands)}
        # download
        if self.download is not None:
            client_params, down = self.download.broadcast(state.params, len(selected))
        else:
            client_params, down = state.params, sum(4 * v.size for v in state.params.values()) * len(selected)
        training = [c for c in selected if not (het.drop_before_training and frng.random() < het.drop_before_training)]
        self.upload.begin_round(rnd, client_params)
        corrections = {c: self.strategy.client_correction(state, self.client_control.get(c)) for c in training}
        if all(v is None for v in corrections.values()):
            corrections = None
        local, deltas, losses, steps = (self._train(client_params, training, rnd, cfg, corrections) if training
                                        else ({}, {}, {}, {}))
        timed = het.window_s > 0 or het.straggler_fraction > 0
        m["stragglers"] = sum(1 for c in training if steps.get(c, 0) == 0 or
                              (timed and self._full_steps(c, rnd, cfg) > steps[c]))
        # a linear strategy (FedAvg, FedProx) aggregates the weighted running sum (aggregate_partial): no decoded
        # update outlives its client's turn; every other strategy (robust rules, wrappers that need each update)
        # gets the list of updates
        running = PartialAggregate() if self._sums_suffice() else None
        divergence = UpdateDivergence()
        updates, bytes_up, reporting, losses_kept = [], 0, [], []
        prng = self._privacy_rng(rnd)
        for c in training:
            if c not in local:
                continue  # a straggler dropped at the deadline (no finished step)
            if timed and not het.partial_work and steps[c] < self._full_steps(c, rnd, cfg):
                continue
            if het.drop_after_training and frng.random() < het.drop_after_training:
                continue
            delta = deltas[c]
            if c in self.adversaries:
                s = -het.adversary_scale if het.adversary == "sign_flip" else het.adversary_scale
                delta = {k: (v * s).astype(np.float32) for k, v in delta.items()}
            sent = self._upload_client(c, rnd, delta, prng, frng)
            if sent is None:
                continue
            decoded, nbytes = sent
            bytes_up += nbytes
            control_delta = None
            kept = self.strategy.client_control_update(state, self.client_control.get(c), local[c], client_params,
                                                       steps[c], cfg)
            if kept is not None:
                self.client_control[c], control_delta = kept
            n = 1 if self.upload.equal_weight else self._reported_examples.get(c, len(self.train[self._pos[c]]))
            divergence.add(decoded)
            reporting.append(c)
            losses_kept.append(losses[c])
            if running is not None and control_delta is None:
                running.add(c, decoded, self.strategy.weight(n), losses[c])
            else:
                updates.append(ClientUpdate(c, decoded, n, losses[c], control_delta))
            del decoded
        down += self.upload.pop_download_bytes()
        if running is not None and running.clients and not updates:
            new_state = self.strategy.aggregate_partial(state, running)
        else:
            new_state = self.strategy.aggregate(state, updates, len(self.client_ids))
        m.update(reporting=len(reporting), bytes_up=bytes_up, bytes_down=down,
                 train_loss=float(np.mean(losses_kept)) if losses_kept else float("nan"))
        if len(reporting) > 1:
            m["update_divergence"] = divergence.value()
        self.bytes_up_total += bytes_up
        self.bytes_down_total += down
        m["train_seconds"] = time.perf_counter() - t0
        if rnd % self.eval_every == 0 or rnd == self.final_round:
            m.update(self.evaluate(new_state, rnd))
        return new_state, RoundRecord(rnd, m, list(selected), reporting)

    def _privacy_rng(self, rnd: int) -> Any:
        """Round ``rnd``'s privacy randomness (upload stages, SignDS): the OS CSPRNG, or ``(privacy_seed, rnd)``."""
        return SecureRandom() if self.privacy_seed < 0 else np.random.default_rng([self.privacy_seed, rnd])

    def _upload_client(self, c: str, rnd: int, delta: Params, prng: Any,
                       frng: np.random.Generator) -> tuple[Params, int] | None:
        """Client ``c``'s trained ``delta`` through the upload stages (``prng``), the ``drop_upload`` draw
        (``frng``; None: the upload was lost) and the upload codec: the decoded update and its bytes."""
        for stage in self.upload_stages:
            delta = stage(delta, prng)
        het = self.heterogeneity
        if het.drop_upload and frng.random() < het.drop_upload:
            return None
        # compression's stochastic rounding needs no secrecy (and 2M draws from os.urandom cost ~0.5 s): it is
        # drawn from (seed, round, client key), as the runtime's client and Flower's UploadMod draw it; a private
        # upload (SignDS) gets the privacy randomness
        crng = np.random.default_rng([self.seed, rnd, client_key(c), 13])
        return self.upload(c, delta, prng if self.upload.private else crng)

    def _sums_suffice(self) -> bool:
        """Whether the strategy's aggregate is its ``aggregate_partial`` of the weighted sum: a linear strategy that
        no wrapper changes (DP-FedAvg clips each update, SecAgg masks each one, an attack or a defence needs each
        one, so a wrapped strategy gets the list)."""
        from fedarena.federated.wrappers import StrategyWrapper

        return bool(getattr(self.strategy, "linear", False)) and not isinstance(self.strategy, StrategyWrapper)

    def _full_steps(self, cid: str, rnd: int, cfg: FitConfig) -> int:
        n = len(self.train[self._pos[cid]])
        return cfg.local_steps if cfg.local_steps else cfg.epochs * math.ceil(n / cfg.batch_size)

    def evaluate(self, state: RoundState, rnd: int) -> dict[str, float]:
        if self.devices is not None:
            return self._evaluate_levels(state, rnd)
        out: dict[str, float] = {}
        with self.math_threads():
            if self.test is not None and len(self.test[1]):
                out["test_loss"], out["test_acc"] = evaluate_params(self.model, state.params, *self.test)
                if self.token_masks:
                    out.update(self.model.token_accuracies(state.params, self.test[0], self.token_masks))
            if self.eval_clients and self.held_out is not None:
                accs = per_client_accuracy(self.model, state.params, self.x, self.y, self.held_out)
                out.update(self.strategy.evaluate(rnd, accs[~np.isnan(accs)]))
        return out

    def run(self, rounds: int, state: RoundState | None = None,
            on_round: Callable[[RoundState, RoundRecord], None] | None = None) -> tuple[RoundState, list[RoundRecord]]:
        state = state if state is not None else self.init_state()
        records = []
        self.final_round = state.round + rounds - 1
        for _ in range(rounds):
            state, rec = self.round(state)
            records.append(rec)
            if on_round is not None:
                on_round(state, rec)
        return state, records

    def iter_rounds(self, rounds: int, state: RoundState | None = None) -> Iterator[tuple[RoundState, RoundRecord]]:
        state = state if state is not None else self.init_state()
        for _ in range(rounds):
            state, rec = self.round(state)
            yield state, rec

    # ------------------------------------------------------------------ device budgets and sub-models

    def _init_devices(self) -> None:
        from fedarena.federated.hetero import ScaledMLP

        if self.widths is None:
            raise ValueError("widths: device profiles need the width levels the clients may train")
        if getattr(self.model, "spec", ("",))[0] != "mlp":
            raise ValueError("model.arch: width-scaled sub-models (devices) are defined for the MLP")
        if self.backend != "vmap" or self.client_trainer is not None:
            raise ValueError("devices: clients under device budgets train with the vmap backend's batched trainer")
        if len(self.devices.profiles) != len(self.client_ids):
            raise ValueError(f"devices: {len(self.devices.profiles)} profiles for {len(self.client_ids)} clients")
        het = self.heterogeneity
        if het.window_s > 0 or het.straggler_fraction > 0 or het.adversary_fraction > 0:
            raise ValueError("heterogeneity.window_s/straggler_fraction/adversary_fraction: the device profiles time "
                             "the clients and sub-model updates are averaged per coordinate; leave these at 0")
        self._level_models = []
        for rate, sizes in zip(self.widths.rates, self.devices.level_sizes):
            model = ScaledMLP(sizes, rate / self.widths.rates[0], self.widths.scaler)
            if self.engine_backend != "numpy":
                model.use_engine_backend(self.engine_backend)
            self._level_models.append(model)
        self._int8 = None
        if self.devices.int8_tiers is not None:
            from fedarena.federated.int8_clients import Int8Download, calibration_sample

            self._int8 = Int8Download(calibration_sample(self.x, self.train, self.seed, self.devices.int8_calibration))

    def device_round(self, state: RoundState) -> tuple[RoundState, RoundRecord]:
        """A round under device budgets (:mod:`fedarena.federated.devices`, :mod:`fedarena.federated.hetero`):
        the available clients are those whose window is open (and, with ``heterogeneity.availability < 1``, that
        draw reachable); each selected client trains the widest level whose memory and time fit its budget (none
        fits: it sits the round out, counted in ``unfit``), each level's clients as their own stacks from the
        level's sub-model of the global model; the updates go through the upload stages and the upload, and the
        server hands their per-coordinate mean to the strategy's server step (``aggregate_partial`` with weight 1).
        A client of ``devices.int8_tiers`` receives its level as an int8 file instead and trains it
        quantization-aware, alone (:mod:`fedarena.federated.int8_clients`; priced by ``qat_training_cost``).
        Each trained client's cost and budget are appended to ``device_records``."""
        from fedarena.federated.hetero import CoordinateMean, extract, submodel_index

        rnd = state.round
        het, fleet, widths = self.heterogeneity, self.devices, self.widths
        t0 = time.perf_counter()
        frng = np.random.default_rng([self.seed, rnd, 7])
        avail = np.array([fleet.available(i, rnd) for i in range(len(self.client_ids))], bool)
        if het.availability < 1:
            avail &= frng.random(len(self.client_ids)) < het.availability
        cands = [c for c, a in zip(self.client_ids, avail) if a]
        selected = self.strategy.select(rnd, cands, self.seed)
        cfg = self.strategy.configure(rnd, state)
        m: dict[str, float] = {"selected": len(selected), "available": len(cands)}
        by_level: dict[int, list[str]] = {}
        costs: dict[str, Any] = {}
        unfit = 0
        int8 = self._int8_files(state.params, rnd) if any(fleet.receives_int8(self._pos[c]) for c in selected) else None
        for c in selected:
            if het.drop_before_training and frng.random() < het.drop_before_training:
                continue
            down = [len(b) for b in int8] if int8 is not None and fleet.receives_int8(self._pos[c]) else None
            got = fleet.assign(self._pos[c], rnd, cfg.batch_size, self._full_steps(c, rnd, cfg), cfg.prox_mu > 0, down)
            if got is None:
                unfit += 1
                continue
            by_level.setdefault(got[0], []).append(c)
            costs[c] = got[1]
        prng = self._privacy_rng(rnd)
        mean = CoordinateMean(state.params)
        bytes_up = bytes_down = 0
        reporting: list[str] = []
        losses_kept: list[float] = []
        rows: list[dict[str, Any]] = []
        self.upload.begin_round(rnd, state.params)

        def report(c: str, k: int, delta: Params, loss: float, index: Any) -> None:
            nonlocal bytes_up, bytes_down
            bytes_down += int(costs[c].bytes_down)
            row = self._device_row(c, rnd, k, costs[c])
            rows.append(row)
            if het.drop_after_training and frng.random() < het.drop_after_training:
                return
            sent = self._upload_client(c, rnd, delta, prng, frng)
            if sent is None:
                return
            decoded, nbytes = sent
            row["reported"], row["bytes_up"] = 1, nbytes
            bytes_up += nbytes
            mean.add(decoded, index)
            reporting.append(c)
            losses_kept.append(loss)

        with self.math_threads():
            for k in sorted(by_level):
                index = submodel_index(self.model.sizes, widths.rates[k], widths.kind, rnd)
                sub = extract(state.params, index)
                level = self._level_models[k]
                clients = [c for c in by_level[k] if not fleet.receives_int8(self._pos[c])]
                plans, allowed = self._plans(clients, rnd, cfg, stragglers=False)
                steps = [min(len(p[1]), a) for p, a in zip(plans, allowed)]
                for g in stacked_groups(steps, self.max_stacked_clients):
                    plan = make_group_plan([plans[j] for j in g], [allowed[j] for j in g], cfg.batch_size,
                                           self.max_stacked_clients)
                    stack, ls = level.train_group(sub, plan, self.x, self._onehot, cfg)
                    for r, j in enumerate(g):
                        delta = {n: (stack[n][r].astype(np.float64) - sub[n].astype(np.float64)).astype(np.float32)
                                 for n in sub}
                        report(clients[j], k, delta, float(ls[r]), index)
                q_clients = [c for c in by_level[k] if fleet.receives_int8(self._pos[c])]
                q_plans, q_allowed = self._plans(q_clients, rnd, cfg, stragglers=False)
                for c, (glob, mat, epochs), a in zip(q_clients, q_plans, q_allowed):
                    n_steps = min(len(mat), a)
                    if n_steps == 0:
                        continue
                    batches = [glob[row[row >= 0]] for row in mat[:n_steps]]
                    last = epochs[:n_steps] == epochs[n_steps - 1]
                    start, trained, loss = self._int8.train(int8[k], level.sizes, level.scale, batches, last,
                                                            self.x, self.y, cfg.lr)
                    delta = {n: (trained[n].astype(np.float64) - start[n].astype(np.float64)).astype(np.float32)
                             for n in sub}
                    report(c, k, delta, loss, index)
        if reporting:
            total = PartialAggregate(mean.mean(), 1.0, list(reporting), float(np.mean(losses_kept)))
            new_state = self.strategy.aggregate_partial(state, total)
        else:
            new_state = replace(state, round=state.round + 1)
        self.device_records.extend(rows)
        m.update(reporting=len(reporting), bytes_up=bytes_up, bytes_down=bytes_down, unfit=unfit,
                 train_loss=float(np.mean(losses_kept)) if losses_kept else float("nan"))
        for k in range(len(widths.rates)):
            m[f"level{k}_clients"] = len(by_level.get(k, ()))
        if fleet.int8_tiers is not None:
            m["int8_clients"] = sum(r["int8"] for r in rows)
        if rows:
            m["device_seconds_max"] = max(r["seconds"] for r in rows)
            m["device_seconds_mean"] = float(np.mean([r["seconds"] for r in rows]))
            m["device_memory_max_mb"] = max(r["memory_bytes"] for r in rows) / 1e6
            m["device_gflops"] = sum(r["flops"] for r in rows) / 1e9
            m["over_budget"] = sum(1 for r in rows if r["memory_bytes"] > r["memory_budget"]
                                   or r["seconds"] > r["time_budget"])
        self.bytes_up_total += bytes_up
        self.bytes_down_total += bytes_down
        m["train_seconds"] = time.perf_counter() - t0
        if rnd % self.eval_every == 0 or rnd == self.final_round:
            m.update(self.evaluate(new_state, rnd))
        return new_state, RoundRecord(rnd, m, list(selected), reporting)

    def _device_row(self, cid: str, rnd: int, level: int, cost: Any) -> dict[str, Any]:
        """A trained client's record: its device, level, cost and budgets (``reported``/``bytes_up`` set on upload)."""
        i = self._pos[cid]
        prof = self.devices.profiles[i]
        return {"round": rnd, "client": cid, "tier": prof.tier, "level": level, "width": self.widths.rates[level],
                "int8": int(self.devices.receives_int8(i)), "memory_bytes": cost.memory_bytes,
                "memory_budget": prof.memory_bytes, "seconds": cost.seconds,
                "time_budget": self.devices.time_budget(i, rnd), "flops": cost.flops, "bytes_down": cost.bytes_down, "bytes_up": 0, "reported": 0}

    def _int8_files(self, params: Params, rnd: int) -> list[bytes]:
        """Every level's sub-model of ``params`` in round ``rnd`` as the int8 file an int8 client downloads."""
        from fedarena.federated.hetero import extract, submodel_index

        return [self._int8.quantize(extract(params, submodel_index(self.model.sizes, rate, self.widths.kind, rnd)),
                                    level.sizes, level.scale)
                for rate, level in zip(self.widths.rates, self._level_models)]

    def pop_device_records(self) -> list[dict[str, Any]]:
        """The device records since the last call."""
        out, self.device_records = self.device_records, []
        return out

    def _evaluate_levels(self, state: RoundState, rnd: int) -> dict[str, float]:
        """The global model is the widest level (its leading units): ``test_loss``/``test_acc`` and the per-client
        accuracies are its; ``test_acc_level{k}`` is level ``k``'s leading-unit sub-model (with its scaler); with int8
        clients, ``test_acc_int8`` is the global model's int8 model (as the server would send it) run in int8."""
        from fedarena.federated.hetero import extract, submodel_index

        out: dict[str, float] = {}
        with self.math_threads():
            for k, rate in enumerate(self.widths.rates):
                sub = extract(state.params, submodel_index(self.model.sizes, rate, "heterofl", rnd))
                model = self._level_models[k]
                if self.test is not None and len(self.test[1]):
                    loss, acc = evaluate_params(model, sub, *self.test)
                    out[f"test_acc_level{k}"] = acc
                    if k == 0:
                        out["test_loss"], out["test_acc"] = loss, acc
                        if self._int8 is not None:
                            out["test_acc_int8"] = self._int8.accuracy(sub, model.sizes, model.scale, *self.test)
                if k == 0 and self.eval_clients and self.held_out is not None:
                    accs = per_client_accuracy(model, sub, self.x, self.y, self.held_out)
                    out.update(self.strategy.evaluate(rnd, accs[~np.isnan(accs)]))
        return out

    # ------------------------------------------------------------------ personalization

    def personalize(self, params: Params, cfg: FitConfig, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
        """Fine-tune ``params`` locally on every client's training data (``cfg``); per-client held-out
        accuracy before and after (NaN where a client has no held-out data)."""
        if self.held_out is None:
            raise ValueError("held_out: personalization needs per-client held-out data")
        before = per_client_accuracy(self.model, params, self.x, self.y, self.held_out)
        after = np.full(len(self.client_ids), np.nan)
        for s in range(0, len(self.client_ids), chunk):
            ids = self.client_ids[s: s + chunk]
            local, _, _, _ = self._train(params, ids, 0, cfg, None, stragglers=False)
            for c in ids:
                i = self._pos[c]
                after[i] = per_client_accuracy(self.model, local[c], self.x, self.y, [self.held_out[i]])[0]
        return before, after


def replace_fit(strategy: Any, **kw) -> Any:
    """A copy of a dataclass strategy whose ``fit`` config has ``kw`` replaced."""
    return replace(strategy, fit=replace(strategy.fit, **kw))
