"""Reddi et al. 2021's models in the federated simulation (:mod:`fedarena.federated.models`): one FedAvg round
of a small instance of each, all clients' local SGD batched by the simulation, equals a PyTorch loop over the
same clients (the same minibatches from :func:`~fedarena.federated.simulation.batch_plan`, the same SGD, the
same per-example / per-token loss, the example-weighted mean) to 1e-4; and ``model.arch`` selects them in a
fedsim config."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fedarena.federated import simulation as sim  # noqa: E402
from fedarena.federated import strategy as st  # noqa: E402
from fedarena.federated.config import ModelConfig  # noqa: E402
from fedarena.federated.models import BatchedZooModel  # noqa: E402

_TWINS = pathlib.Path(__file__).parents[1] / "engine" / "torch_twins.py"  # shared with the engine's zoo tests
_spec = importlib.util.spec_from_file_location("torch_twins", _TWINS)
twins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(twins)

CASES = {
    "resnet18_gn": (3 * 12 * 12, 5, dict(image=(3, 12, 12), widths=(4, 4, 8, 8)), twins.TorchResNetGN),
    "resnet8_gn": (3 * 8 * 8, 5, dict(image=(3, 8, 8), widths=(4, 6, 8)), twins.TorchResNetGN),
    "cnn_emnist": (10 * 10, 6, dict(widths=(3, 4), hidden=6), twins.TorchEmnistCNN),
    "char_lstm": (7, 11, dict(embed_dim=3, hidden=5), twins.TorchRecurrentLM),
    "word_lstm": (6, 13, dict(embed_dim=4, hidden=6), twins.TorchRecurrentLM),
    "transformer": (7, 9, dict(embed_dim=8, num_heads=2, hidden=12), twins.TorchTransformerLM),
}


def _data(model: BatchedZooModel, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if model.sequence:
        x = rng.integers(1, model.num_classes, (n, model.num_features))
        x[rng.random(x.shape) < 0.15] = 0  # pads, which the loss leaves out
        x[0, 1:] = 0  # a sequence with no target but pads: it contributes zero loss
        return x.astype(np.float32), x[:, -1].astype(np.int64)
    return rng.standard_normal((n, model.num_features)).astype(np.float32), rng.integers(0, model.num_classes, n)


def _torch_loss(model: BatchedZooModel, twin, xb: np.ndarray, yb: np.ndarray):
    if model.sequence:
        tokens = torch.tensor(xb.astype(np.int64))
        logits = twin(tokens[:, :-1])
        target = tokens[:, 1:]
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                               reduction="none").reshape(target.shape)
        keep = (target != 0).double()
        return ((ce * keep).sum(1) / keep.sum(1).clamp(min=1.0)).mean()
    logits = twin(torch.tensor(xb, dtype=torch.float64).reshape(-1, *model.image))
    return torch.nn.functional.cross_entropy(logits, torch.tensor(yb))


def _torch_fedavg_round(model, cls, p0, x, y, parts, chosen, fit, seed):
    """The round in PyTorch (float64): every chosen client's SGD from the global model on its minibatches, then
    the example-weighted mean of the clients' models; returned as the twin's state_dict."""
    twin = cls(model.module).double()
    with torch.no_grad():
        twin.load(model._tree(p0), np.float64)
    start = {k: v.clone() for k, v in twin.state_dict().items()}
    acc, total = {k: torch.zeros_like(v) for k, v in start.items()}, 0
    for cid in chosen:
        i = int(cid[1:])
        twin.load_state_dict(start)
        batches, _ = sim.batch_plan(len(parts[i]), fit, np.random.default_rng([seed, 1, sim.client_key(cid)]))
        for row in batches:
            idx = parts[i][row[row >= 0]]
            twin.zero_grad()
            _torch_loss(model, twin, x[idx], y[idx]).backward()
            with torch.no_grad():
                for p in twin.parameters():
                    p -= fit.lr * p.grad
        n = len(parts[i])
        total += n
        for k, v in twin.state_dict().items():
            acc[k] += n * (v - start[k])
    return {k: start[k] + acc[k] / total for k in start}


@pytest.mark.parametrize("arch", list(CASES))
def test_one_fedavg_round_matches_pytorch(arch):
    features, classes, options, cls = CASES[arch]
    model = BatchedZooModel(arch, features, classes, **options)
    rng = np.random.default_rng(0)
    sizes = [5, 7, 4]
    x, y = _data(model, sum(sizes), rng)
    parts = np.split(rng.permutation(sum(sizes)), np.cumsum(sizes)[:-1])
    fit = st.FitConfig(epochs=1, batch_size=3, lr=0.2)
    s = sim.Simulation(model, st.FedAvg(fit, clients_per_round=3), x, y, parts, ["c0", "c1", "c2"], classes, seed=3,
                       eval_clients=False)
    p0 = model.init_params(3)
    state, rec = s.round(s.init_state(p0))
    want = _torch_fedavg_round(model, cls, p0, x, y, parts, rec.selected, fit, 3)
    got_twin = cls(model.module).double()
    with torch.no_grad():
        got_twin.load(model._tree(state.params), np.float64)
    got = got_twin.state_dict()
    for k in want:
        np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-4, atol=1e-4 * float(want[k].abs().max()),
                                   err_msg=f"{arch}: {k}")
    # the round moved the model (the comparison is not of two unchanged copies)
    start = cls(model.module).double()
    with torch.no_grad():
        start.load(model._tree(p0), np.float64)
    assert max(float((want[k] - start.state_dict()[k]).abs().max()) for k in want) > 1e-3


@pytest.mark.parametrize("arch", list(CASES))
def test_arch_is_selectable_from_the_config(arch):
    features, classes, options, _ = CASES[arch]
    cfg = ModelConfig(arch=arch, image_shape=list(options.get("image", ())), widths=list(options.get("widths", ())),
                      embed_dim=options.get("embed_dim", 0), units=options.get("hidden", 0),
                      num_heads=options.get("num_heads", 0))
    model = cfg.build(features, classes)
    assert isinstance(model, BatchedZooModel) and model.arch == arch
    rebuilt = sim.batched_model(model.spec)  # how a Ray actor rebuilds it
    p = model.init_params(0)
    assert sorted(rebuilt.init_params(0)) == sorted(p)


def test_paper_sizes_from_the_config():
    assert sum(v.size for v in ModelConfig(arch="cnn_emnist").build(784, 62).init_params(0).values()) == 1_206_590
    so = ModelConfig(arch="word_lstm").build(21, 10_004)
    assert so.init_params(0)["embedding.table"].shape == (10_004, 96)
    assert so.init_params(0)["lstm.0.w_hh"].shape == (670, 4 * 670)


@pytest.mark.parametrize("cfg, features, msg", [
    (dict(arch="resnet9"), 10, "arch: expected"),
    (dict(arch="cnn_emnist", image_shape=[1, 9, 9]), 81, "model.image_shape: cnn_emnist"),
    (dict(arch="resnet8_gn", image_shape=[3, 8, 8]), 100, "model.image_shape"),
    (dict(arch="transformer", embed_dim=10, num_heads=4), 8, "model.num_heads"),
    (dict(arch="char_lstm"), 1, "T \\+ 1 >= 2"),
    (dict(arch="resnet8_gn", widths=[3, 4, 6], image_shape=[1, 8, 8]), 64, "model.widths"),
])
def test_bad_model_config_names_the_field(cfg, features, msg):
    with pytest.raises(ValueError, match=msg):
        ModelConfig(**cfg).build(features, 5)


def test_language_model_scores_the_last_non_pad_token():
    """Evaluation logits of a sequence are the model's prediction of its last non-pad id (sequences padded at the
    end, as the readers emit them), checked against the full (batch, T, vocab) logits."""
    model = BatchedZooModel("char_lstm", 9, 7, embed_dim=3, hidden=4)
    rng = np.random.default_rng(5)
    x = rng.integers(1, 7, (4, 9))
    lengths = [9, 5, 2, 7]  # non-pad ids per sequence
    for i, n in enumerate(lengths):
        x[i, n:] = 0
    p = model.init_params(1)
    full = np.asarray(model.module.apply(model._tree(p), x[:, :-1].astype(np.int32)), np.float64)
    got = model.logits(p, x.astype(np.float32))
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(got[i], full[i, n - 2], rtol=1e-5, atol=1e-6)
    from fedarena.federated.models import next_token_examples

    ctx, nxt = next_token_examples(x)
    np.testing.assert_array_equal(ctx, x[:, :-1])
    np.testing.assert_array_equal(nxt, [x[i, n - 1] for i, n in enumerate(lengths)])


def test_tag_lr_round_matches_pytorch():
    """Stack Overflow tag prediction (tag_lr): one FedAvg round equals PyTorch's linear layer with
    BCE-with-logits averaged over the tags, on the same minibatches."""
    words, tags = 12, 5
    model = ModelConfig(arch="tag_lr").build(words + tags, tags)
    rng = np.random.default_rng(2)
    n = 14
    bag = rng.random((n, words)) / words
    multi = (rng.random((n, tags)) < 0.3).astype(np.float64)
    x = np.concatenate([bag, multi], 1).astype(np.float32)
    y = multi.argmax(1)
    parts = np.split(rng.permutation(n), [5, 9])
    fit = st.FitConfig(epochs=2, batch_size=3, lr=0.5)
    s = sim.Simulation(model, st.FedAvg(fit, clients_per_round=3), x, y, parts, ["c0", "c1", "c2"], tags, seed=4,
                       eval_clients=False)
    p0 = {k: rng.normal(0, 0.1, v.shape).astype(np.float32) for k, v in model.init_params(0).items()}
    state, rec = s.round(s.init_state(p0))
    w0, b0 = torch.tensor(p0["w"], dtype=torch.float64), torch.tensor(p0["b"], dtype=torch.float64)
    acc_w, acc_b, total = torch.zeros_like(w0), torch.zeros_like(b0), 0
    for cid in rec.selected:
        i = int(cid[1:])
        w, b = w0.clone().requires_grad_(), b0.clone().requires_grad_()
        batches, _ = sim.batch_plan(len(parts[i]), fit, np.random.default_rng([4, 1, sim.client_key(cid)]))
        for row in batches:
            idx = parts[i][row[row >= 0]]
            xb = torch.tensor(x[idx], dtype=torch.float64)
            z = xb[:, :words] @ w + b
            loss = torch.nn.functional.binary_cross_entropy_with_logits(z, xb[:, words:], reduction="none")
            loss = loss.mean(1).mean()
            gw, gb = torch.autograd.grad(loss, (w, b))
            with torch.no_grad():
                w -= fit.lr * gw
                b -= fit.lr * gb
        total += len(parts[i])
        acc_w += len(parts[i]) * (w.detach() - w0)
        acc_b += len(parts[i]) * (b.detach() - b0)
    np.testing.assert_allclose(state.params["w"], (w0 + acc_w / total).numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state.params["b"], (b0 + acc_b / total).numpy(), rtol=1e-4, atol=1e-6)
    assert float((acc_b / total).abs().max()) > 1e-3  # the round moved the model
