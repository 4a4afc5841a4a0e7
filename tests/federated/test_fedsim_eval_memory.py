"""Evaluation memory of the batched simulation: a model's compiled forward keeps buffers sized by the batch it
last ran, so :func:`~fedarena.federated.simulation.per_client_accuracy` over a whole held-out population must
call it on bounded chunks (the scaled-down Reddi et al. 2021 EMNIST sweep peaked at 11.4 GB before it did).
Memory is counted with tracemalloc (numpy's allocations are traced), accuracies are checked against PyTorch."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from fedarena.federated import simulation as sim


def _model():
    model = sim.BatchedCNN((1, 28, 28), 10, channels=(4, 8), hidden=16)
    return model, model.init_params(0)


def _torch_logits(model, params, x):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    p = {k: torch.tensor(v, dtype=torch.float64) for k, v in params.items()}
    z = torch.tensor(x, dtype=torch.float64).reshape(-1, 1, 28, 28)
    z = F.max_pool2d(F.relu(F.conv2d(z, p["conv1.w"], p["conv1.b"], padding=2)), 2)
    z = F.max_pool2d(F.relu(F.conv2d(z, p["conv2.w"], p["conv2.b"], padding=2)), 2)
    z = F.relu(z.reshape(z.shape[0], -1) @ p["fc.w"] + p["fc.b"])
    return (z @ p["out.w"] + p["out.b"]).numpy()


def _clients(n: int, seed: int):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 40, n // 20 + 1)
    cuts = np.minimum(np.concatenate([[0], np.cumsum(sizes)]), n)
    return [np.arange(a, b) for a, b in zip(cuts[:-1], cuts[1:])] + ([np.arange(cuts[-1], n)] if cuts[-1] < n else [])


def test_logits_of_padded_chunks_equal_pytorch_and_stay_within_the_chunk():
    model, params = _model()
    x = np.random.default_rng(0).random((300 + 37, 784), dtype=np.float32)
    seen = []
    forward = model._forward
    model._forward = lambda tree, xb: (seen.append(len(xb)), forward(tree, xb))[1]
    z = model.logits(params, x)
    np.testing.assert_allclose(z, _torch_logits(model, params, x), rtol=1e-5, atol=1e-6)
    assert z.shape == (len(x), 10)
    assert seen == [sim.EVAL_CHUNK, 128]  # 81 left: padded to the next power of two
    seen.clear()
    assert model.logits(params, x[:1]).shape == (1, 10) and seen == [2]


def test_per_client_accuracy_equals_pytorch_and_keeps_one_chunks_memory():
    model, params = _model()
    n = 8 * sim.EVAL_CHUNK
    rng = np.random.default_rng(1)
    x, y = rng.random((n, 784), dtype=np.float32), rng.integers(0, 10, n)
    index = _clients(n, 2) + [np.array([], np.int64)]
    sim.per_client_accuracy(model, params, x[:sim.EVAL_CHUNK], y, [np.arange(sim.EVAL_CHUNK)])  # compiles
    tracemalloc.start()
    try:
        sim.per_client_accuracy(model, params, x[:sim.EVAL_CHUNK], y, [np.arange(sim.EVAL_CHUNK)])
        one_chunk = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        accs = sim.per_client_accuracy(model, params, x, y, index)
        whole = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    correct = _torch_logits(model, params, x).argmax(1) == y
    want = [correct[i].mean() if len(i) else np.nan for i in index]
    np.testing.assert_array_equal(accs, want)
    # eight chunks' worth of examples: the peak is the gathered examples (n <= EVAL_READ) and one chunk's
    # activations, not eight chunks' activations (one call over all n examples peaked at over 100 MB here)
    assert n <= sim.EVAL_READ and whole < x.nbytes + 2 * one_chunk, (whole, x.nbytes, one_chunk)
