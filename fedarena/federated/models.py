"""The benchmark models of Reddi et al. 2021 ("Adaptive Federated Optimization") in the federated simulation:
:mod:`fedarena.engine.models` behind the simulation's batched local SGD
(:class:`~fedarena.federated.simulation.BatchedModel`), so many clients train them in one
``engine.jit(engine.vmap(step))``, selected by ``model.arch`` in a fedsim config.

Architectures (``ARCHS``): ``resnet18_gn`` (ResNet-18 with 2-group group norm, CIFAR-100), ``resnet8_gn`` (its
small CPU counterpart), ``cnn_emnist`` (the EMNIST CNN), ``char_lstm`` (Shakespeare), ``word_lstm``
(StackOverflow next-word prediction), ``transformer`` (a small causal transformer encoder) and ``tag_lr``
(Stack Overflow tag prediction: multi-label logistic regression, Reddi et al.'s "Stack Overflow LR").

Data layout. Image models read an example as its flattened ``image`` = (channels, height, width) pixels. The
language models read an example as ``T + 1`` token ids (stored as float32, exact below 2^24): the model reads
the first ``T`` and predicts every next token; the local objective is each sequence's mean cross-entropy over
its target tokens that are not the pad id 0 (TFF's pad id), averaged over the batch's sequences as the image
models average their examples. The simulation holds one label per example, so for the language models ``y``
is the sequence's last non-pad token and ``num_classes`` the vocabulary size: evaluation (``logits``, the
simulation's ``test_acc``) scores the prediction of that token (the position before it; a sequence is
left-aligned, pads only at its end). The authors' code for Reddi et al.'s language-model rows scores the accuracy
over every predicted token: :meth:`BatchedZooModel.token_accuracies` counts every position whose target is not one of a
data set's left-out ids (the simulation's ``test_token_acc``; the rules per data set are
:func:`fedarena.federated.datasets.token_accuracy_masks`, after TFF's masked accuracy). Every sequence reader of
:mod:`fedarena.federated.datasets` emits this layout (Shakespeare: 81 character ids; Stack Overflow: 21 word
ids); :func:`next_token_examples` derives the (context, next id) pairs of a model that predicts one token from a
window.

``tag_lr`` reads an example as the bag of words followed by the multi-hot tag vector
(:mod:`fedarena.federated.datasets.stackoverflow`): logits = bag @ W + b over the ``num_classes`` tags, the
local objective each example's mean sigmoid cross-entropy over the tags (Keras' binary cross-entropy, as TFF's
baseline); evaluation scores the softmax of the same logits against the example's label (its most frequent
tag).

Parameters travel as the flat ``{dotted name: float32 array}`` dict of the runtime's wire format
(``layer1.0.conv1.w``, ``lstm.1.w_hh``, ...). The simulation's local step carries no random keys, so the
EMNIST CNN trains there without its dropout layers (the engine model applies them when given a key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Iterator

import numpy as np

from fedarena.engine import models as zoo
from fedarena.engine import ops
from fedarena.engine.backend_selection import backend_jit
from fedarena.federated.config import ZOO_ARCHS as ARCHS
from fedarena.federated.simulation import EVAL_CHUNK, EVAL_READ, BatchedModel
from fedarena.federated.strategy import Params

SEQUENCE_ARCHS = ("char_lstm", "word_lstm", "transformer")
PAD = 0
"""the pad token id, left out of the language models' loss"""
EVAL_TOKEN_LOGITS = 1 << 22
"""logits (sequences x positions x vocabulary) of one chunk of :meth:`BatchedZooModel.token_predictions`"""


def next_token_examples(seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (context, next id) form of ``T + 1``-id sequences: every sequence's first ``T`` ids and its last
    non-pad id (the language models' label), for a model that predicts one token from a window."""
    seqs = np.asarray(seqs)
    last = np.maximum((seqs != PAD).sum(1) - 1, 0)
    return seqs[:, :-1], seqs[np.arange(len(seqs)), last]


class TagLR:
    """Multi-label logistic regression over a bag of words (``init``/``apply`` as the engine models):
    ``apply(params, bag)`` -> tag logits ``bag @ w + b``; parameters start at zero (the objective is convex, so
no random start is needed)."""

    def __init__(self, num_words: int, num_tags: int) -> None:
        self.num_words, self.num_tags = num_words, num_tags

    def init(self, seed: Any = 0, dtype: Any = np.float32) -> dict:
        return {"w": np.zeros((self.num_words, self.num_tags), dtype), "b": np.zeros(self.num_tags, dtype)}

    def apply(self, params: dict, bag: Any) -> Any:
        return ops.add(ops.matmul(bag, params["w"]), params["b"])


def _named_leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted name, leaf) of a pytree of dicts and lists, in its order (parameter-free ``None`` skipped)."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _named_leaves(v, f"{prefix}{k}.")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _named_leaves(v, f"{prefix}{i}.")
    elif tree is not None:
        yield prefix[:-1], tree


def _rebuild(template: Any, flat: Params, prefix: str = "") -> Any:
    """``template``'s structure with the leaf named ``name`` taken from ``flat[name]``."""
    if isinstance(template, dict):
        return {k: _rebuild(v, flat, f"{prefix}{k}.") for k, v in template.items()}
    if isinstance(template, (list, tuple)):
        return [_rebuild(v, flat, f"{prefix}{i}.") for i, v in enumerate(template)]
    return None if template is None else flat[prefix[:-1]]


def build_module(arch: str, num_features: int, num_classes: int, image: tuple = (), widths: tuple = (),
                 embed_dim: int = 0, hidden: int = 0, num_layers: int = 0, num_heads: int = 0,
                 groups: int = 2) -> Any:
    """The engine model of ``arch`` for examples of ``num_features`` values and ``num_classes`` classes (the
    vocabulary size for a language model); a 0 / empty option means the paper's value (module docstrings of
    :mod:`fedarena.engine.models`). Errors name the ``model.`` field."""
    if arch not in ARCHS:
        raise ValueError(f"model.arch: unknown {arch!r}; known: {', '.join(ARCHS)}")
    if arch == "tag_lr":
        if num_features <= num_classes:
            raise ValueError(f"model.arch: tag_lr reads a bag of words followed by {num_classes} tag targets, the "
                             f"data has {num_features} features")
        return TagLR(num_features - num_classes, num_classes)
    if arch in SEQUENCE_ARCHS:
        if num_features < 2:
            raise ValueError(f"model.arch: {arch} reads sequences of T + 1 >= 2 token ids, the data has {num_features} "
                             "features")
        if arch == "char_lstm":
            return zoo.RecurrentLM(num_classes, embed_dim or 8, hidden or 256, num_layers or 2)
        if arch == "word_lstm":
            return zoo.RecurrentLM(num_classes, embed_dim or 96, hidden or 670, num_layers or 1, embed_dim or 96)
        d = embed_dim or 64
        heads = num_heads or 4
        if d % heads:
            raise ValueError(f"model.num_heads: {heads} heads do not divide the width embed_dim={d}")
        return zoo.TransformerLM(num_classes, d, heads, hidden or 2 * d, num_layers or 2, num_features - 1)
    c, h, w = image or (1, *([int(round(num_features ** 0.5))] * 2))
    if c * h * w != num_features:
        raise ValueError(f"model.image_shape: {[c, h, w] if image else 'a square one-channel image'} has {c * h * w} "
                         f"pixels, the data has {num_features} features")
    if arch == "cnn_emnist":
        if (h - 4) % 2 or (w - 4) % 2 or h < 6 or w < 6:
            raise ValueError(f"model.image_shape: cnn_emnist needs height and width >= 6 with even height - 4 and "
                             f"width - 4, got {h}x{w}")
        return zoo.EmnistCNN(num_classes, (c, h, w), tuple(widths) or (32, 64), hidden or 128)
    if groups < 1 or any(v < 1 or v % groups for v in widths):
        raise ValueError(f"model.widths: every stage width must be a multiple of groups={groups}, got {list(widths)}")
    if arch == "resnet18_gn":
        return zoo.ResNetGN(num_classes, (2, 2, 2, 2), tuple(widths) or (64, 128, 256, 512), c, groups, "imagenet")
    return zoo.ResNetGN(num_classes, (1,) * len(widths or (16, 32, 64)), tuple(widths) or (16, 32, 64), c, groups,
                        "cifar")


class BatchedZooModel(BatchedModel):
    """Local SGD of many clients' copies of one :mod:`fedarena.engine.models` model (see module doc)."""

    def __init__(self, arch: str, num_features: int, num_classes: int, **options: Any) -> None:
        self.arch, self.num_features, self.num_classes = arch, int(num_features), int(num_classes)
        self.options = {k: (tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in options.items()}
        self.spec = ("zoo", arch, self.num_features, self.num_classes, tuple(sorted(self.options.items())))
        self.module = build_module(arch, self.num_features, self.num_classes, **self.options)
        self.sequence = arch in SEQUENCE_ARCHS
        self.tags = arch == "tag_lr"
        image = self.options.get("image") or (1, *([int(round(self.num_features ** 0.5))] * 2))
        self.image = None if self.sequence or self.tags else tuple(int(v) for v in image)
        self.template = self.module.init(0, np.float32)
        self._compile()

    @classmethod
    def from_spec(cls, spec: tuple) -> "BatchedZooModel":
        _, arch, f, c, options = spec
        return cls(arch, f, c, **dict(options))

    # -------------------------------------------------------------- parameters

    def init_params(self, seed: int) -> Params:
        return {k: np.asarray(v, np.float32) for k, v in _named_leaves(self.module.init(np.random.default_rng(seed)))}

    def _tree(self, params: Params) -> Any:
        return _rebuild(self.template, {k: np.asarray(params[k], np.float32) for k, _ in _named_leaves(self.template)})

    def _flat(self, tree: Any) -> Params:
        return dict(_named_leaves(tree))

    # -------------------------------------------------------------- forward and loss

    def _tokens(self, x: Any) -> Any:
        return ops.astype(x, np.int32)

    def sequence_logits(self, tree: Any, x: Any) -> Any:
        """(batch, T, vocab) logits of a language model on the first ``T`` tokens of each example."""
        return self.module.apply(tree, self._tokens(x)[:, :-1])

    def forward(self, tree: Any, x: Any) -> Any:
        """Class logits of an image model; a language model's logits at the position predicting its last non-pad
        token; tag_lr's tag logits."""
        if self.tags:
            return self.module.apply(tree, x[:, : self.num_features - self.num_classes])
        if self.sequence:
            logits = self.sequence_logits(tree, x)
            T = self.num_features - 1
            at = ops.sum(ops.astype(ops.not_equal(self._tokens(x), PAD), np.int32), axis=1) - 2
            pick = ops.one_hot(ops.maximum(at, 0), T)
            return ops.sum(logits * ops.reshape(pick, (ops.shape(pick)[0], T, 1)), axis=1)
        return self.module.apply(tree, ops.reshape(x, (ops.shape(x)[0], *self.image)))

    def example_losses(self, tree: Any, x: Any, y_onehot: Any) -> Any:
        if self.tags:
            z = self.forward(tree, x)
            t = x[:, self.num_features - self.num_classes:]
            # sigmoid cross-entropy from logits: softplus(z) - t z, averaged over the tags
            return ops.mean(ops.softplus(z) - t * z, axis=1)
        if not self.sequence:
            return super().example_losses(tree, x, y_onehot)
        logits = self.sequence_logits(tree, x)
        target = self._tokens(x)[:, 1:]
        ce = ops.logsumexp(logits, axis=-1) - ops.sum(logits * ops.one_hot(target, self.num_classes), axis=-1)
        keep = ops.astype(ops.not_equal(target, PAD), np.float32)
        return ops.sum(ce * keep, axis=1) / ops.maximum(ops.sum(keep, axis=1), 1.0)

    # -------------------------------------------------------------- every-token evaluation

    def _compile(self) -> None:
        super()._compile()
        if self.sequence:
            sequence_logits = self.sequence_logits
            self._predict = backend_jit(lambda tree, x: ops.argmax(sequence_logits(tree, x), axis=-1),
                                        self.engine_backend, shape_varies=True)

    def token_predictions(self, params: Params, x: np.ndarray) -> np.ndarray:
        """(n, T) int64: a language model's most likely id at every position of each of the ``n`` sequences of
        ``x`` (position t predicts id t + 1). The compiled forward runs on chunks of at most
        ``EVAL_TOKEN_LOGITS / (T * vocabulary)`` sequences (a power of two, at most ``EVAL_CHUNK``), so the
        logits held at once stay bounded: 16 Stack Overflow sentences (20 x 10,004 logits each) a chunk."""
        if not self.sequence:
            raise ValueError(f"model.arch: {self.arch} is not a language model; every-token accuracy needs one")
        T = self.num_features - 1
        rows = max(2, min(EVAL_CHUNK, 1 << max(0, (EVAL_TOKEN_LOGITS // (T * self.num_classes)).bit_length() - 1)))
        if not len(x):
            return np.zeros((0, T), np.int64)
        return np.concatenate(list(self.run_chunks(self._predict, params, x, rows, np.int64)))

    def token_accuracies(self, params: Params, x: np.ndarray, masks: Mapping[str, Sequence[int]]
                         ) -> dict[str, float]:
        """Every-token accuracy of a language model on the sequences ``x``, one value per ``masks`` entry
        ``{name: ids left out}``: the fraction of the positions whose target id (the sequence's next id) is not
        one of the left-out ids at which the most likely id is the target (as TFF's masked accuracy of Reddi et
        al.'s experiments; the pad id should always be left out). NaN when no position counts. ``x`` is read
        ``EVAL_READ`` sequences at a time."""
        hits = {k: 0 for k in masks}
        counted = {k: 0 for k in masks}
        for s in range(0, len(x), EVAL_READ):
            seqs = np.asarray(x[s: s + EVAL_READ], np.float32).astype(np.int64)
            target = seqs[:, 1:]
            right = self.token_predictions(params, seqs) == target
            for k, left_out in masks.items():
                keep = ~np.isin(target, np.asarray(list(left_out), np.int64))
                hits[k] += int(np.count_nonzero(right & keep))
                counted[k] += int(np.count_nonzero(keep))
        return {k: hits[k] / counted[k] if counted[k] else float("nan") for k in masks}
