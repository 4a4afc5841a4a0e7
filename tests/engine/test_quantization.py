"""fedarena.engine.quantization: the native int8 kernels against their numpy reference (bit for bit)
and the numpy reference against independent oracles (int64 products, torch's conv2d and max_pool2d),
fake quantization's straight-through gradients against their definition and finite differences,
post-training and quantization-aware int8 accuracy on scikit-learn's digits, the model file, and
bad input."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.engine.quantization import (
    QuantizedModel,
    activation_params,
    calibrate,
    fake_quant,
    qat_model,
    qgemm,
    qgemm_reference,
    quantize_model,
    quantize_weights,
)
from fedarena.engine.quantization import kernel as K
from fedarena.engine.quantization.qat import round_half_even
from fedarena.engine.quantization.scheme import MinMaxObserver, PercentileObserver

NATIVE = ("native", "scalar")  # the AVX2 build and the build without SIMD


def _gemm_case(rng, m, n, k):
    x = rng.integers(-128, 128, (m, k)).astype(np.int8)
    w = rng.integers(-127, 128, (n, k)).astype(np.int8)
    bias = rng.integers(-50_000, 50_000, n).astype(np.int32)
    mult = rng.uniform(1e-5, 5e-2, n)
    zp = int(rng.integers(-128, 128))
    lo = int(rng.integers(-128, zp + 1))
    hi = int(rng.integers(lo, 128))
    return x, w, bias, mult, zp, lo, hi


# ----------------------------------------------------------------------------- the int8 GEMM


@pytest.mark.parametrize("backend", NATIVE)
def test_qgemm_equals_the_numpy_reference_bit_for_bit_on_random_shapes(backend):
    rng = np.random.default_rng(0)
    shapes = [(1, 1, 1), (0, 3, 5), (3, 0, 5), (2, 3, 0), (7, 9, 17), (4, 8, 16), (5, 13, 33), (64, 10, 64), (33, 31, 129)]
    shapes += [tuple(int(v) for v in rng.integers(1, 70, 3)) for _ in range(40)]
    for m, n, k in shapes:
        x, w, bias, mult, zp, lo, hi = _gemm_case(rng, m, n, k)
        y, acc = qgemm(x, w, bias, mult, zp, lo, hi, backend, return_acc=True)
        y_ref, acc_ref = qgemm_reference(x, w, bias, mult, zp, lo, hi, return_acc=True)
        # the int32 accumulators against int64 products (an oracle independent of both)
        assert np.array_equal(acc.astype(np.int64), x.astype(np.int64) @ w.astype(np.int64).T + bias), (m, n, k)
        assert acc.dtype == acc_ref.dtype == np.int32 and np.array_equal(acc, acc_ref), (m, n, k)
        assert y.dtype == np.int8 and np.array_equal(y, y_ref), (m, n, k)


@pytest.mark.parametrize("backend", NATIVE)
def test_requantization_rounds_half_to_even_and_saturates(backend):
    x = np.ones((1, 1), np.int8)
    w = np.ones((8, 1), np.int8)
    bias = np.array([-6, -4, -2, 0, 1, 2, 4, 1000], np.int32)  # acc = bias + 1: -5 -3 -1 1 2 3 5 1001
    y = qgemm(x, w, bias, np.full(8, 0.5), 0, -128, 127, backend)
    #          -2.5 -1.5 -0.5 0.5 1 1.5 2.5 500.5 -> half to even, then the int8 ceiling
    assert y.tolist() == [[-2, -2, 0, 0, 1, 2, 2, 127]]
    assert qgemm(x, w, bias, np.full(8, 0.5), 3, 3, 127, backend).tolist() == [[3, 3, 3, 3, 4, 5, 5, 127]]  # fused ReLU: lo = zero point
    big = qgemm(np.full((1, 4), -128, np.int8), np.full((8, 4), 127, np.int8), np.zeros(8, np.int32), np.full(8, 1.0), 0, -128, 127, backend)
    assert (big == -128).all()  # -65024 saturates at the int8 floor


def test_qgemm_refuses_operands_it_cannot_take():
    x, w = np.zeros((2, 3), np.int8), np.zeros((4, 3), np.int8)
    b, m = np.zeros(4, np.int32), np.ones(4)
    with pytest.raises(ValueError, match="must share K"):
        qgemm(x, np.zeros((4, 2), np.int8), b, m, 0)
    with pytest.raises(ValueError, match="int8"):
        qgemm(x.astype(np.int16), w, b, m, 0)
    with pytest.raises(ValueError, match="bias must be int32"):
        qgemm(x, w, b.astype(np.int64), m, 0)
    with pytest.raises(ValueError, match="overflow the int32 accumulator"):
        qgemm(np.zeros((1, 140_000), np.int8), np.zeros((4, 140_000), np.int8), b, m, 0)
    with pytest.raises(ValueError, match="backend"):
        qgemm(x, w, b, m, 0, backend_name="vnni")


def test_the_kernel_is_built_once_and_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDARENA_KERNEL_CACHE", str(tmp_path))
    path = K.build(K.SCALAR_FLAGS)
    assert path.parent == tmp_path and path.exists()
    mtime = path.stat().st_mtime_ns
    assert K.build(K.SCALAR_FLAGS) == path and path.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


# ----------------------------------------------------------------------------- data movement


def test_reference_im2col_and_maxpool_agree_with_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    for b, c, h, w, o, k, s, p, d in [(2, 3, 7, 5, 4, 3, 1, 1, 1), (1, 2, 9, 9, 3, 3, 2, 0, 2), (3, 1, 8, 8, 5, 2, 2, 1, 1)]:
        x = rng.integers(-128, 128, (b, c, h, w)).astype(np.int8)
        wt = rng.integers(-127, 128, (o, c, k, k)).astype(np.int8)
        cols, (_, oh, ow) = K.Reference.im2col(x, (k, k), (s, s), (p, p), (d, d), 0)
        got = (cols.astype(np.int64) @ wt.reshape(o, -1).astype(np.int64).T).reshape(b, oh, ow, o).transpose(0, 3, 1, 2)
        want = torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float64), torch.tensor(wt, dtype=torch.float64), stride=s, padding=p, dilation=d)
        assert np.array_equal(got, want.numpy().astype(np.int64))
        pooled = K.Reference.maxpool(x, (k, k), (s, s), (min(p, k // 2),) * 2, -128)
        want = torch.nn.functional.max_pool2d(torch.tensor(x, dtype=torch.float64), k, s, min(p, k // 2))
        assert np.array_equal(pooled, want.numpy().astype(np.int8))


@pytest.mark.parametrize("backend", NATIVE)
def test_native_data_movement_equals_the_reference(backend):
    rng = np.random.default_rng(2)
    be, ref = K.backend(backend), K.Reference
    x = rng.normal(0, 3, (3, 5, 7, 9)).astype(np.float32)
    x[0, 0, 0, :4] = [0.25, 0.75, -0.25, 1.25]  # x / 0.5 on a tie
    assert np.array_equal(be.quantize(x, 0.5, -3, -128, 127), ref.quantize(x, 0.5, -3, -128, 127))
    q = ref.quantize(x, 0.05, 7, -128, 127)
    assert np.array_equal(be.dequantize(q, 0.05, 7), ref.dequantize(q, 0.05, 7))
    for k, s, p, d in [(3, 1, 1, 1), (2, 2, 0, 1), (3, 2, 2, 2), (1, 1, 0, 1), (5, 3, 1, 1)]:
        a, sa = be.im2col(q, (k, k), (s, s), (p, p), (d, d), 7)
        r, sr = ref.im2col(q, (k, k), (s, s), (p, p), (d, d), 7)
        assert sa == sr and np.array_equal(a, r), (k, s, p, d)
        pp = min(p, k // 2)
        assert np.array_equal(be.maxpool(q, (k, k), (s, s), (pp, pp), -128), ref.maxpool(q, (k, k), (s, s), (pp, pp), -128))


# ----------------------------------------------------------------------------- quantization scheme


def test_per_channel_symmetric_weights():
    rng = np.random.default_rng(3)
    w = rng.normal(0, 1, (6, 4, 3, 3)).astype(np.float32) * np.arange(1, 7, dtype=np.float32)[:, None, None, None]
    w[5] = 0.0
    q, scale = quantize_weights(w, 8, axis=0)
    assert q.dtype == np.int8 and scale.shape == (6,)
    assert np.abs(q[:5]).reshape(5, -1).max(axis=1).tolist() == [127] * 5  # each channel uses the full range
    assert (q[5] == 0).all() and scale[5] == 1.0
    err = np.abs(q * scale[:, None, None, None] - w)
    assert (err <= scale[:, None, None, None] / 2 + 1e-7).all()
    q4, s4 = quantize_weights(w, 4, axis=0)
    assert np.abs(q4).max() == 7


def test_activation_params_represent_zero_exactly_and_span_the_range():
    a = activation_params(-0.7, 2.3, 8)
    assert (a.qmin, a.qmax) == (-128, 127)
    assert np.isclose(a.scale, 3.0 / 255, rtol=1e-6)
    assert K.Reference.dequantize(K.Reference.quantize(np.zeros(1), a.scale, a.zero_point, -128, 127), a.scale, a.zero_point)[0] == 0.0
    relu = activation_params(0.5, 4.0, 8)  # the range is widened to contain 0
    assert relu.zero_point == -128


def test_percentile_observer_against_numpy_percentile():
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.normal(0, 1, 200_000), [40.0, -35.0]])  # two outliers min-max would keep
    mm = MinMaxObserver()
    for part in np.array_split(x, 7):
        mm.observe(part)
    assert mm.range() == (-35.0, 40.0)
    po = PercentileObserver(*mm.range(), percentile=99.9, bins=2048)
    for part in np.array_split(x, 7):
        po.observe(part)
    lo, hi = po.range()
    width = 75.0 / 2048
    assert abs(lo - np.percentile(x, 0.1)) <= 2 * width
    assert abs(hi - np.percentile(x, 99.9)) <= 2 * width


def test_calibrating_on_batches_equals_calibrating_on_the_whole_set():
    model = nn.MLP([5, 7, 3], activation="relu")
    params = model.init(2)
    x = np.random.default_rng(9).standard_t(3, (300, 5)).astype(np.float32)  # heavy tails: percentile < min-max
    for method in ("minmax", "percentile"):
        whole = calibrate(model, params, x, method=method, batch_size=1000)
        parts = calibrate(model, params, [x[:7], x[7:150], x[150:]], method=method)
        assert whole.ranges == parts.ranges and len(whole.ranges) == 3
    mm, pc = calibrate(model, params, x).ranges[0], calibrate(model, params, x, method="percentile", percentile=99.0).ranges[0]
    assert mm[0] < pc[0] < pc[1] < mm[1]


# ----------------------------------------------------------------------------- models


def _cnn(c1: int = 8, c2: int = 16) -> nn.Sequential:
    return nn.Sequential([
        nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(c2 * 4, 32), nn.ReLU(), nn.Linear(32, 10),
    ])


def test_int8_models_are_bit_exact_across_backends():
    rng = np.random.default_rng(5)
    odd = nn.Sequential([nn.Conv2d(3, 5, 3, stride=2, padding=2, dilation=2), nn.MaxPool2d(3, stride=1, padding=1), nn.ReLU(),
                         nn.Conv2d(5, 7, (2, 3)), nn.Flatten(), nn.Linear(7 * 4 * 2, 9), nn.ReLU(), nn.Linear(9, 3)])
    for model, shape in [(nn.MLP([13, 11, 7, 5], activation="relu"), (37, 13)), (_cnn(), (19, 1, 8, 8)), (odd, (6, 3, 9, 7))]:
        params = model.init(1)
        x = rng.normal(0, 1, shape).astype(np.float32)
        x.flags.writeable = False  # a read-only input takes the other address path
        for method in ("minmax", "percentile"):
            qm = quantize_model(model, params, x, method=method)
            ref = qm.forward_int8(x, "reference")[0]
            for backend in NATIVE:
                assert np.array_equal(qm.forward_int8(x, backend)[0], ref)
                assert np.array_equal(qm.forward(x, backend), qm.forward(x, "reference"))
            # int8 tracks float: within a few output steps of the float model on its own calibration set
            out, fl = qm.forward(x), np.asarray(model.apply(params, x))
            step = qm.forward_int8(x)[1].scale
            if method == "minmax":
                assert np.abs(out - fl).max() <= 6 * step + 0.05 * np.abs(fl).max()


@pytest.fixture(scope="module")
def digits():
    from fedarena.federated.data import load_digits

    x, y = load_digits()
    order = np.random.default_rng(0).permutation(len(x))
    te, tr = order[:360], order[360:]
    return np.asarray(x[tr], np.float32), np.asarray(y[tr], np.int64), np.asarray(x[te], np.float32), np.asarray(y[te], np.int64)


def _train(model, x, y, epochs, seed=0):
    params = model.init(seed)
    opt = optim.adam(3e-3)
    state = opt.init(params)

    @engine.jit
    def step(p, s, xb, yb):
        v, g = engine.value_and_grad(lambda q: ops.cross_entropy(model.apply(q, xb), yb))(p)
        p, s = opt.update(g, s, p)
        return p, s

    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for i in range(0, len(x) - 31, 32):
            params, state = step(params, state, x[order[i : i + 32]], y[order[i : i + 32]])
    return params


def _acc(out, y):
    return float(np.mean(np.argmax(np.asarray(out), 1) == y))


@pytest.fixture(scope="module")
def trained(digits):
    xtr, ytr, _, _ = digits
    mlp = nn.MLP([64, 64, 10], activation="relu")
    cnn = _cnn()
    return {"mlp": (mlp, _train(mlp, xtr, ytr, 15), xtr), "cnn": (cnn, _train(cnn, xtr.reshape(-1, 1, 8, 8), ytr, 6), xtr.reshape(-1, 1, 8, 8))}


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_post_training_int8_on_digits_loses_at_most_one_point(digits, trained, name):
    _, _, xte, yte = digits
    model, params, xtr = trained[name]
    xt = xte.reshape(-1, 1, 8, 8) if name == "cnn" else xte
    acc_float = _acc(model.apply(params, xt), yte)
    assert acc_float > 0.9
    for method in ("minmax", "percentile"):
        qm = quantize_model(model, params, calibrate(model, params, xtr[:512], method=method))
        acc_int8 = _acc(qm.forward(xt), yte)
        assert acc_int8 >= acc_float - 0.01, (method, acc_float, acc_int8)


def test_save_load_round_trip_and_size(tmp_path, trained):
    model, params, xtr = trained["cnn"]
    qm = quantize_model(model, params, xtr[:256])
    size = qm.save(tmp_path / "m.int8")
    back = QuantizedModel.load(tmp_path / "m.int8")
    assert np.array_equal(back.forward_int8(xtr[:50])[0], qm.forward_int8(xtr[:50])[0])
    float_bytes = sum(np.asarray(a).nbytes for a in engine.tree_leaves(params))
    # int8 weights and a float32 scale and bias per output channel: 1 byte a weight instead of 4
    assert qm.weight_bytes == sum(w.size + 8 * w.shape[0] for w in (l.weight for l in qm.layers if l.weight is not None))
    assert 3.5 < float_bytes / qm.weight_bytes < 4.0
    assert size - qm.weight_bytes < 600  # the compressed header


def _corrupt(data: bytes, old: bytes, new: bytes) -> bytes:
    """The file with one edit in its (zlib-compressed JSON) header."""
    n = int.from_bytes(data[4:12], "little")
    text = zlib.decompress(data[12 : 12 + n])
    assert old in text
    h = zlib.compress(text.replace(old, new, 1))
    return data[:4] + len(h).to_bytes(8, "little") + h + data[12 + n :]


def test_a_corrupt_model_file_is_one_value_error_naming_the_field(tmp_path):
    model = nn.MLP([6, 5, 3], activation="relu")
    params = model.init(0)
    good = quantize_model(model, params, np.random.default_rng(0).normal(size=(20, 6)).astype(np.float32)).to_bytes()
    cases = {
        b"XXXX" + good[4:]: "magic",
        good[:40]: "header",
        good[:12] + b"{" * (len(good) - 12): "header: is not zlib",
        _corrupt(good, b'"version":1', b'"version":7'): "header.version",
        _corrupt(good, b'"kind":"linear"', b'"kind":"lambda"'): r"layers\[0\].kind",
        _corrupt(good, b'"relu":true', b'"relu":"yes"'): r"layers\[0\].relu",
        _corrupt(good, b'"qmin":-128', b'"qmin":-999'): "header.input.qmin",
        _corrupt(good, b'"offset":0', b'"offset":99999'): r"layers\[0\].weight.offset",
        _corrupt(good, b'"shape":[5,6]', b'"shape":[5,-6]'): r"layers\[0\].weight.shape",
        _corrupt(good, b'"dtype":"|i1"', b'"dtype":"|O"'): r"layers\[0\].weight",
        good[:-8]: "offset",  # truncated data
    }
    for i, (data, field) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.int8"
        path.write_bytes(data)
        with pytest.raises(ValueError, match=field):
            QuantizedModel.load(path)
    with pytest.raises(ValueError, match="cannot be read"):
        QuantizedModel.load(tmp_path / "missing.int8")


def test_bad_input_is_a_clear_value_error():
    model = nn.MLP([4, 3, 2], activation="relu")
    params = model.init(0)
    x = np.ones((5, 4), np.float32)
    with pytest.raises(ValueError, match="calibration: the calibration set is empty"):
        calibrate(model, params, np.zeros((0, 4), np.float32))
    with pytest.raises(ValueError, match="calibration: the calibration set is empty"):
        quantize_model(model, params, [])
    for bits in (1, 9, 8.0, True):
        with pytest.raises(ValueError, match=r"weight_bits: must be an integer in \[2, 8\]"):
            quantize_model(model, params, x, weight_bits=bits)
    with pytest.raises(ValueError, match="activation_bits"):
        qat_model(model, activation_bits=16)
    with pytest.raises(ValueError, match="calibration.method"):
        calibrate(model, params, x, method="entropy")
    with pytest.raises(ValueError, match="model.activation: int8 quantization supports relu or identity"):
        quantize_model(nn.MLP([4, 3, 2]), params, x)  # tanh
    with pytest.raises(ValueError, match=r"model.layers\[1\]: .*LayerNorm"):
        quantize_model(nn.Sequential([nn.Linear(4, 3), nn.LayerNorm(3)]), [params[0], nn.LayerNorm(3).init()], x)
    with pytest.raises(ValueError, match="backend"):
        quantize_model(model, params, x).forward(x, backend="gpu")


# ----------------------------------------------------------------------------- fake quantization and QAT


def test_round_half_even_by_addition_equals_numpy_rint():
    v = np.concatenate([np.arange(-300, 300, 0.5), np.random.default_rng(6).uniform(-300, 300, 20_000),
                        [np.nextafter(0.5, 0), -np.nextafter(0.5, 0), 2.5, -2.5]]).astype(np.float32)
    assert np.array_equal(np.asarray(round_half_even(v)), np.rint(v))
    assert np.array_equal(np.asarray(engine.jit(round_half_even)(v)), np.rint(v))


def _fake_quant_np(x, s, zp, qmin, qmax):
    return (np.clip(np.rint(x / s) + zp, qmin, qmax) - zp) * s


def test_fake_quant_forward_and_straight_through_gradients():
    rng = np.random.default_rng(7)
    x = rng.uniform(-3, 3, (6, 40)).astype(np.float32)
    x[0, :3] = [0.25, 0.75, -1.25]  # ties of x / 0.5
    s, zp, qmin, qmax = np.float32(0.02), np.float32(-10.0), -128, 127
    out = np.asarray(fake_quant(x, s, zp, qmin, qmax))
    assert np.allclose(out, _fake_quant_np(x.astype(np.float64), 0.02, -10, qmin, qmax), atol=1e-6)
    assert np.allclose(np.asarray(fake_quant(x[0, :3], np.float32(0.5), np.float32(0), -8, 7)), [0.0, 1.0, -1.0])  # half to even

    ct = rng.normal(size=x.shape).astype(np.float32)
    gx, gs, gz = engine.grad(lambda a, b, c: ops.sum(fake_quant(a, b, c, qmin, qmax) * ct), argnums=(0, 1, 2))(x, s, zp)
    u = x.astype(np.float64) / 0.02 - 10
    inside, below, above = (u >= qmin) & (u <= qmax), u < qmin, u > qmax
    assert inside.any() and below.any() and above.any()
    # d/dx is the gradient of the clip the STE stands for: finite differences of it, away from its corners
    lo, hi = 0.02 * (qmin + 10), 0.02 * (qmax + 10)
    h = 1e-4
    x64 = x.astype(np.float64)
    fd = (np.clip(x64 + h, lo, hi) - np.clip(x64 - h, lo, hi)) / (2 * h)
    away = np.abs(u - qmin) * 0.02 > 2 * h
    away &= np.abs(u - qmax) * 0.02 > 2 * h
    assert np.allclose(np.asarray(gx)[away], (ct * fd)[away], atol=1e-5)
    # outside the range the fake-quant is differentiable in x (flat) and in s (linear): finite differences
    hs = 1e-4
    fq = lambda sv: _fake_quant_np(x.astype(np.float64), sv, -10, qmin, qmax)
    fd_s = (fq(0.02 + hs) - fq(0.02 - hs)) / (2 * hs)
    clipped = (below | above) & (np.abs(np.abs(u - (qmin + qmax) / 2) - (qmax - qmin) / 2) > 1)
    lsq = np.where(inside, np.rint(x / 0.02) - x / 0.02, np.where(below, qmin + 10.0, qmax + 10.0))
    assert np.allclose(fd_s[clipped], lsq[clipped])
    # the scale's gradient is LSQ's (Esser et al. 2020, eq. 3), summed over the broadcast elements
    assert np.isclose(float(gs), float(np.sum(ct * lsq)), rtol=1e-4)
    assert float(gz) == 0.0


def test_per_channel_fake_quant_scale_gradient_is_summed_per_channel():
    rng = np.random.default_rng(8)
    w = rng.normal(size=(5, 3)).astype(np.float32)
    s = np.abs(w).max(axis=0, keepdims=True).astype(np.float32) / 100  # (1, 3): many clipped values
    g = engine.grad(lambda sv: ops.sum(fake_quant(w, sv, np.float32(0), -127, 127)), argnums=0)(s)
    v = w / s
    lsq = np.where(np.abs(v) <= 127, np.rint(v) - v, np.sign(v) * 127)
    assert np.asarray(g).shape == (1, 3) and np.allclose(np.asarray(g), lsq.sum(axis=0, keepdims=True), atol=1e-3)


def test_fake_quant_forward_simulates_the_int8_model(trained):
    model, params, xtr = trained["cnn"]
    qat = qat_model(model)
    ranges = qat.init_ranges(params, xtr[:256])
    sim, stats = qat.apply(params, ranges, xtr[:200])
    int8 = qat.to_int8(params, ranges).forward(xtr[:200])
    step = activation_params(*ranges[-1], 8).scale
    assert np.abs(np.asarray(sim) - int8).max() <= 3 * step
    assert np.mean(np.argmax(np.asarray(sim), 1) == np.argmax(int8, 1)) >= 0.98
    assert np.asarray(stats).shape == (len(ranges), 2)


def test_qat_recovers_float_accuracy_on_digits(digits, trained):
    _, _, xte, yte = digits
    model, params, xtr = trained["mlp"]
    ytr = digits[1]
    acc_float = _acc(model.apply(params, xte), yte)
    qat = qat_model(model)
    ranges = qat.init_ranges(params, xtr[:512])
    opt = optim.adam(5e-4)
    state = opt.init(params)
    step = qat.train_step(opt)
    rng = np.random.default_rng(1)
    p = params
    for _ in range(2):
        order = rng.permutation(len(xtr))
        for i in range(0, len(xtr) - 31, 32):
            p, state, ranges, loss = step(p, state, ranges, xtr[order[i : i + 32]], ytr[order[i : i + 32]])
    assert np.isfinite(loss)
    acc_qat = _acc(qat.to_int8(p, ranges).forward(xte), yte)
    assert acc_qat >= acc_float - 0.005, (acc_float, acc_qat)


def test_a_received_int8_model_round_trips_through_qat_parameters(trained):
    """What a federated client that receives an int8 model does: float parameters and ranges from it,
    (training), back to int8; with no training step in between the int8 model is the same."""
    from fedarena.engine.quantization import dequantize_params

    for name in ("mlp", "cnn"):
        model, params, xtr = trained[name]
        q = quantize_model(model, params, xtr[:256])
        back = qat_model(model).to_int8(dequantize_params(model, q), q.ranges())
        assert [l.kind for l in back.layers] == [l.kind for l in q.layers]
        for a, b in zip(back.layers, q.layers):
            if a.weight is not None:
                assert np.array_equal(a.weight, b.weight) and np.array_equal(a.weight_scale, b.weight_scale)
                assert (a.out.zero_point, a.out.scale) == (b.out.zero_point, b.out.scale)
        assert np.array_equal(back.forward_int8(xtr[:100])[0], q.forward_int8(xtr[:100])[0])
    with pytest.raises(ValueError, match="qmodel: has 2 dense/conv layers but the model has 3"):
        dequantize_params(nn.MLP([64, 64, 10, 10], activation="relu"), quantize_model(*trained["mlp"][:2], trained["mlp"][2][:50]))
