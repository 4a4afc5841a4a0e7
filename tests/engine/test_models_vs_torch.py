"""The model zoo (:mod:`fedarena.engine.models`) against PyTorch: the same module built in torch with the
engine's weights copied in gives the same logits and the same gradients (of a random linear function of
the logits, with respect to every parameter and, for images, the input), in float64 to rtol 1e-8 and in
float32 to rtol 1e-5 (each tensor compared relative to its own largest entry as well, ``atol = rtol *
max|ref|``). Sizes are tiny; the full-size models are checked by parameter count against the published
counts."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fedarena import engine  # noqa: E402
from fedarena.engine import models, nn  # noqa: E402

from .torch_twins import TorchEmnistCNN, TorchRecurrentLM, TorchResNetGN, TorchTransformerLM, _t  # noqa: E402

TOL = {np.float64: 1e-8, np.float32: 1e-5}


# ----------------------------------------------------------------------------- the comparison


def _close(a, b, rtol, what):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} vs torch {b.shape}"
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(np.abs(b).max(), 1e-30), err_msg=what)


def _compare(m, twin_cls, x, dtype, image: bool):
    rtol = TOL[dtype]
    params = m.init(np.random.default_rng(0), dtype)
    twin = twin_cls(m)
    twin = twin.double() if dtype == np.float64 else twin.float()
    with torch.no_grad():
        twin.load(params, dtype)
    xin = np.asarray(x, dtype) if image else np.asarray(x, np.int64)
    out = np.asarray(engine.jit(m.apply)(params, xin))
    cot = np.random.default_rng(1).standard_normal(out.shape).astype(dtype)

    def f(p, xx):
        return (m.apply(p, xx) * cot).sum()

    tx = _t(xin, dtype).requires_grad_(True) if image else torch.tensor(xin)
    tout = twin(tx)
    _close(out, tout.detach().numpy(), rtol, "logits")
    (tout * _t(cot, dtype)).sum().backward()
    if image:
        gp, gx = engine.jit(engine.grad(f, argnums=(0, 1)))(params, xin)
        _close(gx, tx.grad.numpy(), rtol, "d/dx")
    else:
        gp = engine.jit(engine.grad(f))(params, xin)
    ref = twin.grads()
    leaves, tree = engine.tree_flatten(gp)
    ref_leaves, ref_tree = engine.tree_flatten(ref)
    assert len(leaves) == len(ref_leaves), f"{len(leaves)} gradients vs torch's {len(ref_leaves)}"
    assert tree == ref_tree
    for i, (a, b) in enumerate(zip(leaves, ref_leaves)):
        _close(a, b.detach().numpy(), rtol, f"gradient leaf {i}")


DTYPES = [np.float64, np.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stem", ["imagenet", "cifar"])
def test_resnet_gn_matches_torch(dtype, stem):
    m = models.ResNetGN(5, blocks=(1, 2), widths=(4, 8), in_channels=3, groups=2, stem=stem)
    x = np.random.default_rng(2).standard_normal((2, 3, 12, 12))
    _compare(m, TorchResNetGN, x, dtype, image=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_emnist_cnn_matches_torch(dtype):
    m = models.EmnistCNN(7, image=(1, 10, 10), channels=(3, 4), hidden=6)
    x = np.random.default_rng(3).standard_normal((3, 1, 10, 10))
    _compare(m, TorchEmnistCNN, x, dtype, image=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["char", "word"])
def test_lstm_lms_match_torch(dtype, kind):
    m = (models.RecurrentLM(11, 3, 5, num_layers=2) if kind == "char" else
         models.RecurrentLM(13, 4, 6, num_layers=1, projection=3))
    tokens = np.random.default_rng(4).integers(0, m.vocab_size, (3, 6))
    _compare(m, TorchRecurrentLM, tokens, dtype, image=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_transformer_lm_matches_torch(dtype, causal):
    m = models.TransformerLM(9, d_model=8, num_heads=2, dim_feedforward=12, num_layers=2, max_len=8, causal=causal)
    tokens = np.random.default_rng(5).integers(0, 9, (2, 5))
    _compare(m, TorchTransformerLM, tokens, dtype, image=False)


def test_unrolled_lstm_equals_scanned():
    a, b = models.RecurrentLM(7, 3, 4, 2), models.RecurrentLM(7, 3, 4, 2, unroll=True)
    p = a.init(0, np.float64)
    tokens = np.random.default_rng(6).integers(0, 7, (2, 5))
    np.testing.assert_allclose(np.asarray(a.apply(p, tokens)), np.asarray(b.apply(p, tokens)), rtol=1e-12)


def _count(p) -> int:
    return sum(int(np.size(v)) for v in engine.tree_leaves(p))


def test_full_size_parameter_counts():
    # torchvision's resnet18 has 11,689,512 parameters for 1,000 classes; 100 classes drop 900 x 513 of the head
    assert _count(models.resnet18_gn(100).init(0)) == 11_689_512 - 900 * 513
    assert sum(p.numel() for p in TorchResNetGN(models.resnet18_gn(100)).parameters()) == 11_689_512 - 900 * 513
    # the TFF EMNIST CNN of Reddi et al. (Keras summary: 1,206,590)
    assert _count(models.EmnistCNN().init(0)) == 1_206_590
    # Keras LSTMs have one bias of 4H per layer, PyTorch's (and ours) two: 4H more per layer
    assert _count(models.word_lstm().init(0)) == 4_050_748 + 4 * 670
    so = TorchRecurrentLM(models.word_lstm())
    assert sum(p.numel() for p in so.parameters()) == 4_050_748 + 4 * 670
    sh = TorchRecurrentLM(models.char_lstm())
    assert _count(models.char_lstm().init(0)) == sum(p.numel() for p in sh.parameters())
    assert models.char_lstm().vocab_size == 90


def test_group_norm_rejects_bad_groups():
    with pytest.raises(ValueError, match="multiple of num_groups"):
        nn.GroupNorm(3, 8)


def test_full_size_resnet18_gn_forward_matches_torch():
    """The full ResNet-18-GN on one 24x24 CIFAR crop (Reddi et al.'s input size): logits as torch's, float32."""
    m = models.resnet18_gn(100)
    params = m.init(np.random.default_rng(0), np.float32)
    twin = TorchResNetGN(m).float()
    with torch.no_grad():
        twin.load(params, np.float32)
        want = twin(_t(np.random.default_rng(1).standard_normal((1, 3, 24, 24)), np.float32)).numpy()
    x = np.random.default_rng(1).standard_normal((1, 3, 24, 24)).astype(np.float32)
    got = np.asarray(engine.jit(m.apply)(params, x))
    _close(got, want, 1e-5, "resnet18_gn logits")
