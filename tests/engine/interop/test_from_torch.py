"""engine.from_torch against PyTorch itself: outputs, gradients w.r.t. parameters and inputs, errors.

The model comparisons run in float64 (``module.double()``), where both frameworks agree to round-off
(~1e-13), so the 1e-5 tolerance of the acceptance point is a real bound and not a float32-noise
allowance; a float32 check of the forward pass (relative 1e-5 of the output scale) and of the jitted
function follows.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops
from fedarena.engine.interop import TorchConversionError

from .torch_models import MLP, BasicBlock, ConvBN, NatureCNN, SequenceMixer, randomize_batch_norm

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

MODELS = {
    "mlp": (lambda: MLP(), (3, 10)),
    "cnn_batchnorm": (lambda: randomize_batch_norm(ConvBN(), 1), (3, 3, 12, 12)),
    "residual_block": (lambda: randomize_batch_norm(BasicBlock(), 2), (2, 4, 9, 9)),
    "sequence_mixer": (lambda: SequenceMixer(), (3, 6, 16)),
    "nature_cnn": (lambda: NatureCNN(), (2, 4, 84, 84)),
}


def _model(name: str, dtype):
    torch.manual_seed(0)
    build, shape = MODELS[name]
    module = build().eval().to(dtype)
    rng = np.random.default_rng(1)
    scale = 255.0 if name == "nature_cnn" else 1.0
    x = torch.tensor(rng.uniform(0, scale, shape) if scale > 1 else rng.normal(size=shape), dtype=dtype)
    return module, x


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("name", list(MODELS))
def test_outputs_and_gradients_match_torch_in_float64(name):
    module, x = _model(name, torch.float64)
    fn, params = engine.from_torch(module, (x,))
    rng = np.random.default_rng(2)
    # torch: a random linear functional of every output, differentiated w.r.t. parameters and input
    xt = x.clone().requires_grad_(True)
    outs = _flat(module(xt))
    cts = [rng.normal(size=tuple(o.shape)) for o in outs]
    loss = sum((o * torch.tensor(c)).sum() for o, c in zip(outs, cts))
    loss.backward()

    def objective(p, xv):
        return sum(ops.sum(o * c) for o, c in zip(_flat(fn(p, xv)), cts))

    ours_out = _flat(fn(params, x.numpy()))
    for o, t in zip(ours_out, outs):
        np.testing.assert_allclose(o, t.detach().numpy(), rtol=1e-5, atol=1e-7)
    value, (g_params, g_x) = engine.jit(engine.value_and_grad(objective, argnums=(0, 1)))(params, x.numpy())
    np.testing.assert_allclose(value, loss.item(), rtol=1e-10)
    np.testing.assert_allclose(g_x, xt.grad.numpy(), rtol=1e-5, atol=1e-7)
    torch_params = dict(module.named_parameters())
    assert set(fn.parameter_names) == set(torch_params)
    for pname, tp in torch_params.items():
        np.testing.assert_allclose(g_params[pname], tp.grad.numpy(), rtol=1e-5, atol=1e-7, err_msg=pname)
    for bname in fn.buffer_names:  # running statistics are read with their gradient stopped
        assert not np.any(g_params[bname]), bname


@pytest.mark.parametrize("name", ["cnn_batchnorm", "sequence_mixer", "nature_cnn"])
def test_float32_forward_eager_and_jit_match_torch(name):
    module, x = _model(name, torch.float32)
    fn, params = engine.from_torch(module, x)
    assert all(v.dtype == np.float32 for v in params.values())
    with torch.no_grad():
        ref = [t.numpy() for t in _flat(module(x))]
    jitted = engine.jit(fn)
    for out in (fn(params, x.numpy()), jitted(params, x.numpy())):
        for o, r in zip(_flat(out), ref):
            assert o.dtype == np.float32
            np.testing.assert_allclose(o, r, rtol=0, atol=1e-5 * (1 + np.abs(r).max()))


class Kitchen(nn.Module):
    """Functional and method calls of the supported set, layers with strides / dilation / groups /
    'same' padding, and a parameter used directly."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, padding="same", dilation=2)
        self.c2 = nn.Conv2d(8, 8, 3, stride=(2, 1), padding=(1, 2), groups=4)
        self.c3 = nn.Conv2d(8, 6, 2, padding="same")  # even kernel: asymmetric 'same' padding
        self.ln = nn.LayerNorm([6, 4])
        self.pool = nn.AvgPool2d(2, padding=1)
        self.mpool = nn.MaxPool2d(3, stride=1, padding=1)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 6))
        self.fc = nn.Linear(6, 3)
        self.act = nn.LeakyReLU(0.2)

    def forward(self, x):
        h = torch.sigmoid(self.c1(x)) * 2.0 - 1.0
        h = self.act(self.c2(h))
        h = self.mpool(F.gelu(self.c3(h), approximate="tanh"))          # (B, 6, 4, 8)
        h = self.ln(h.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)          # normalise over (6, 4)
        h = self.pool(h) + F.adaptive_avg_pool2d(h, (1, 1))            # (B, 6, 3, 5)
        h = F.avg_pool2d(h, (1, 5)).flatten(2).sum(-1)                 # (B, 6)
        t = torch.transpose(h, 0, 1).contiguous()                      # (6, B)
        gram = torch.matmul(h, t) / h.shape[1]                         # (B, B)
        h = torch.add(h, gram.mean(dim=1, keepdim=True), alpha=0.5) * self.scale
        z = torch.stack([h, -h], dim=0).reshape(2, -1, 6).sum(0)
        y = self.fc(torch.relu(h + z) - torch.tanh(h) / 3)
        return F.log_softmax(y, dim=-1), torch.unsqueeze(y.sum(1), 1).squeeze()


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
def test_the_supported_calls_match_torch_in_float64():
    torch.manual_seed(3)
    module = Kitchen().double().eval()
    x = torch.randn(3, 4, 8, 6, dtype=torch.float64, requires_grad=True)
    fn, params = engine.from_torch(module, x.detach())
    logp, s = module(x)
    (logp.sum() * 0 + (logp * torch.arange(9.0, dtype=torch.float64).reshape(3, 3)).sum() + s.sum()).backward()

    def objective(p, xv):
        a, b = fn(p, xv)
        return ops.sum(a * np.arange(9.0).reshape(3, 3)) + ops.sum(b)

    ours = fn(params, x.detach().numpy())
    np.testing.assert_allclose(ours[0], logp.detach().numpy(), rtol=1e-5, atol=1e-8)
    g_p, g_x = engine.grad(objective, argnums=(0, 1))(params, x.detach().numpy())
    np.testing.assert_allclose(g_x, x.grad.numpy(), rtol=1e-5, atol=1e-8)
    for name, p in module.named_parameters():
        np.testing.assert_allclose(g_p[name], p.grad.numpy(), rtol=1e-5, atol=1e-8, err_msg=name)


ACTIVATIONS = [nn.ReLU(), nn.ReLU6(), nn.LeakyReLU(0.3), nn.Tanh(), nn.Sigmoid(), nn.SiLU(), nn.GELU(),
               nn.GELU(approximate="tanh"), nn.Softmax(dim=1), nn.LogSoftmax(dim=1), nn.Identity()]


@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda m: f"{type(m).__name__}{getattr(m, 'approximate', '')}")
def test_activation_layers_match_torch_in_float64(act):
    torch.manual_seed(5)
    module = nn.Sequential(nn.Linear(5, 6), act).double()
    x = (3 * torch.randn(4, 5, dtype=torch.float64)).requires_grad_(True)
    ct = np.random.default_rng(6).normal(size=(4, 6))
    out = module(x)
    (out * torch.tensor(ct)).sum().backward()
    fn, params = engine.from_torch(module, x.detach())
    np.testing.assert_allclose(fn(params, x.detach().numpy()), out.detach().numpy(), rtol=1e-5, atol=1e-8)
    g_p, g_x = engine.grad(lambda p, xv: ops.sum(fn(p, xv) * ct), argnums=(0, 1))(params, x.detach().numpy())
    np.testing.assert_allclose(g_x, x.grad.numpy(), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(g_p["0.weight"], module[0].weight.grad.numpy(), rtol=1e-5, atol=1e-8)


class TokenModel(nn.Module):
    """Token ids through an embedding, a buffer added, and functional calls on parameters used directly."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.w = nn.Parameter(torch.randn(5, 8))
        self.cw = nn.Parameter(torch.randn(4, 1, 3, 3))
        self.register_buffer("pos", torch.randn(7, 8))

    def forward(self, idx):
        h = F.layer_norm(self.emb(idx) + self.pos, (8,))
        h = F.dropout(h, 0.2, self.training)
        c = F.max_pool2d(F.conv2d(h.unsqueeze(1), self.cw, None, 1, 1), 2)
        return F.linear(h.mean(1), self.w) + c.view(c.size(0), -1)[:, :5]


def test_token_model_with_functional_calls_matches_torch_in_float64():
    torch.manual_seed(4)
    module = TokenModel().double().eval()
    idx = torch.randint(0, 20, (3, 7))
    fn, params = engine.from_torch(module, idx)
    assert fn.buffer_names == ("pos",) and sorted(fn.parameter_names) == ["cw", "emb.weight", "w"]
    ct = np.random.default_rng(5).normal(size=(3, 5))
    out = module(idx)
    (out * torch.tensor(ct)).sum().backward()
    np.testing.assert_allclose(fn(params, idx.numpy()), out.detach().numpy(), rtol=1e-5, atol=1e-8)
    g = engine.grad(lambda p: ops.sum(fn(p, idx.numpy()) * ct))(params)
    for name, p in module.named_parameters():
        np.testing.assert_allclose(g[name], p.grad.numpy(), rtol=1e-5, atol=1e-8, err_msg=name)


def test_vmap_over_examples_equals_the_batched_call():
    module, x = _model("cnn_batchnorm", torch.float64)
    fn, params = engine.from_torch(module, x)
    per_example = engine.vmap(lambda xi: fn(params, xi[None])[0])(x.numpy())
    np.testing.assert_allclose(per_example, fn(params, x.numpy()), rtol=1e-10)


def test_trained_params_go_back_into_the_torch_module():
    module, x = _model("mlp", torch.float32)
    fn, params = engine.from_torch(module, x)
    trained = {k: v + np.float32(0.1) for k, v in params.items()}
    module.load_state_dict(fn.state_dict(trained), strict=True)
    with torch.no_grad():
        np.testing.assert_allclose(module(x).numpy(), fn(trained, x.numpy()), atol=1e-5)


def test_shared_weights_are_one_parameter():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

    module = Tied().double()
    x = torch.randn(2, 4, dtype=torch.float64)
    fn, params = engine.from_torch(module, x)
    assert sorted(params) == ["a.bias", "a.weight", "b.bias"]
    module(x).sum().backward()
    g = engine.grad(lambda p: ops.sum(fn(p, x.numpy())))(params)
    np.testing.assert_allclose(g["a.weight"], module.a.weight.grad.numpy(), rtol=1e-10)


# ----------------------------------------------------------------------------- errors


def test_unsupported_module_names_the_node_its_target_and_path():
    class WithGRU(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(3, 3), nn.GRU(3, 3))

        def forward(self, x):
            return self.encoder(x)

    with pytest.raises(TorchConversionError) as e:
        engine.from_torch(WithGRU(), torch.randn(2, 3))
    msg = str(e.value)
    assert "\n" not in msg
    assert "call_module" in msg and "'encoder.1'" in msg and "torch.nn.modules.rnn.GRU" in msg


def test_unsupported_function_and_method_name_the_node():
    class Cumsum(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(3, 3))
            self.block = Block()

        def forward(self, x):
            return self.block(self.inner(x))

    class Block(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, 1)

    with pytest.raises(TorchConversionError, match=r"unsupported node 'cumsum' \(call_function .*cumsum, module 'block'\)"):
        engine.from_torch(Cumsum(), torch.randn(2, 3))

    class Method(nn.Module):
        def forward(self, x):
            return x.clamp_min(0.0)

    with pytest.raises(TorchConversionError, match=r"call_method clamp_min, module '<root>'.*'clamp_min'"):
        engine.from_torch(Method(), torch.randn(2, 3))


def test_untraceable_control_flow_names_the_module_and_the_line():
    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x
            return -x

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(2, 2), Branchy())

        def forward(self, x):
            return self.body(x)

    with pytest.raises(TorchConversionError) as e:
        engine.from_torch(Outer(), torch.randn(2, 2))
    msg = str(e.value)
    assert "cannot trace module 'body.1' (Branchy)" in msg and "test_from_torch.py" in msg and "control flow" in msg


@pytest.mark.parametrize("module, needle", [
    (nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)), "training mode"),
    (nn.Sequential(nn.Dropout(0.5)), "training mode"),
    (nn.Sequential(nn.Conv2d(3, 3, 3, padding=1, padding_mode="reflect")), "padding_mode='reflect'"),
    (nn.Sequential(nn.MaxPool2d(2, ceil_mode=True)), "ceil_mode"),
    (nn.Sequential(nn.AvgPool2d(2, count_include_pad=False)), "count_include_pad"),
])
def test_unsupported_configurations_are_refused_with_the_reason(module, needle):
    x = torch.randn(2, 3) if isinstance(module[0], (nn.Linear, nn.Dropout)) else torch.randn(2, 3, 6, 6)
    with pytest.raises(TorchConversionError, match=needle) as e:
        engine.from_torch(module.train(), x)
    assert "module '0'" in str(e.value) or "module '1'" in str(e.value)


def test_in_place_op_whose_input_is_read_later_is_refused():
    class Clobber(nn.Module):
        def forward(self, x):
            y = x * 2
            z = F.relu(y, inplace=True)
            return z + y  # torch: y is now relu(y)

    with pytest.raises(TorchConversionError, match="in-place"):
        engine.from_torch(Clobber(), torch.randn(2, 3))


def test_example_inputs_of_a_wrong_shape_fail_at_conversion_naming_the_node():
    with pytest.raises(TorchConversionError, match=r"example_inputs failed \(in torch node 'net_0' \(call_module net\.0, module 'net\.0'\)\): ShapeError"):
        engine.from_torch(MLP(), torch.randn(2, 7))


def test_load_torch_factory_errors():
    from fedarena.engine.interop import load_torch_factory

    with pytest.raises(ValueError, match="expected 'torch:<module.path>:<factory>'"):
        load_torch_factory("torch:nofactory")
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        load_torch_factory("torch:no_such_module_xyz:f")
    with pytest.raises(ValueError, match="has no callable 'nope'"):
        load_torch_factory("torch:math:nope")
    assert load_torch_factory("torch:math:sqrt")(4.0) == 2.0
