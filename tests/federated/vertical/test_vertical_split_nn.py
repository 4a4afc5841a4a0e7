"""Split NN with an encrypted interactive layer: training and inference equal centralized autodiff of the joint network."""

import numpy as np
import pytest
from sklearn.datasets import load_digits

from fedarena import engine
from fedarena.engine import ops
from fedarena.federated.vertical import paillier as P
from fedarena.federated.vertical.messages import ProtocolError
from fedarena.federated.vertical.split_nn import BackwardMsg, SplitNN, SplitNNConfig, encrypted_matmul


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    perm = np.random.default_rng(0).permutation(len(y))
    return x[perm], y[perm]


def _joint_sgd(model, xa, xb, y, cfg, epochs):
    """Centralized oracle: the same network as one function, gradients by engine autodiff, plain SGD."""
    a, b = model.a, model.b
    params = {"a": a.params, "b": b.params, "w_b": a.w_b}

    def loss_fn(p, xa, xb, y):
        a_b = b.bottom.apply(p["b"], xb)
        z = ops.matmul(a.bottom.apply(p["a"]["bottom"], xa), p["a"]["w_a"]) + ops.matmul(a_b, p["w_b"]) + p["a"]["bias"]
        return ops.cross_entropy(a.top.apply(p["a"]["top"], ops.relu(z)), y)

    vg = engine.value_and_grad(loss_fn)
    losses = []
    for epoch in range(1, epochs + 1):
        perm = np.random.default_rng([cfg.seed, epoch]).permutation(len(y))
        ls = []
        for s in range(0, len(y), cfg.batch_size):
            i = perm[s : s + cfg.batch_size]
            loss, g = vg(params, xa[i], xb[i], y[i])
            params = engine.tree_map(lambda p_, g_: p_ - cfg.learning_rate * g_, params, g)
            ls.append(float(loss))
        losses.append(ls)
    return params, losses


def test_encrypted_matmul_is_exact():
    pk, sk = P.generate_keypair(1024, allow_insecure_keys=True)
    fk, fs = P.FastPublicKey(pk), P.FastPrivateKey(sk)
    rng = np.random.default_rng(3)
    a, w = rng.uniform(-1, 1, (5, 4)), rng.uniform(-1, 1, (4, 6))
    w[1, 2] = 0.0
    cs = fk.encrypt_ints(P.encode(a.ravel(), 20, pk.n))
    z = encrypted_matmul([cs[i * 4 : (i + 1) * 4] for i in range(5)], fk, w, 16)
    got = [[P.to_signed(fs.decrypt_int(c), pk.n) for c in row] for row in z]
    ref = np.rint(a * 2**20).astype(np.int64).astype(object) @ np.rint(w * 2**16).astype(np.int64).astype(object)
    assert got == ref.tolist()


def test_split_protocol_equals_joint_autodiff(digits):
    x, y = digits
    x, y = x[:48], y[:48]
    cfg = SplitNNConfig(batch_size=16, optimizer="sgd", learning_rate=0.5, key_bits=1024, allow_insecure_keys=True, interactive_out=6,
                        bottom_hidden=8, top_hidden=8, bottom_out_a=3, bottom_out_b=3)
    model = SplitNN(x[:, :32], y, x[:, 32:], cfg)
    ref_params, ref_losses = _joint_sgd(model, x[:, :32], x[:, 32:], y, cfg, epochs=1)
    rep = model.train_epoch()
    np.testing.assert_allclose(rep.loss, np.mean(ref_losses[0]), atol=1e-5)  # equal batch sizes
    np.testing.assert_allclose(model.a.w_b, ref_params["w_b"], atol=1e-4)
    got_leaves = engine.tree_leaves({"a": model.a.params, "b": model.b.params})
    ref_leaves = engine.tree_leaves({"a": ref_params["a"], "b": ref_params["b"]})
    for g, r in zip(got_leaves, ref_leaves):
        np.testing.assert_allclose(g, r, atol=1e-4)
    assert rep.bytes > 0 and rep.seconds["crypto"] > 0
    # joint inference on other rows equals the centralized forward pass of the same network
    xt, yt = digits[0][100:130], digits[1][100:130]
    model.a.x, model.a.y, model.b.x = xt[:, :32], yt, xt[:, 32:]
    probs = model.predict(np.arange(len(yt)))
    a, b, p = model.a, model.b, {"a": model.a.params, "b": model.b.params, "w_b": model.a.w_b}
    z = a.bottom.apply(p["a"]["bottom"], xt[:, :32]) @ p["a"]["w_a"] + b.bottom.apply(p["b"], xt[:, 32:]) @ p["w_b"] + p["a"]["bias"]
    logits = np.asarray(a.top.apply(p["a"]["top"], np.maximum(z, 0)))
    ref = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(probs, ref / ref.sum(1, keepdims=True), atol=1e-4)


def test_split_messages_are_validated(digits):
    x, y = digits
    cfg = SplitNNConfig(batch_size=4, key_bits=1024, allow_insecure_keys=True, interactive_out=4, bottom_out_b=2)
    model = SplitNN(x[:8, :32], y[:8], x[:8, 32:], cfg)
    with pytest.raises(ProtocolError, match="vnn.backward"):
        model.b.backward(BackwardMsg(np.zeros((1, 2))))
    model.b.receive_batch(model.a.batch(np.arange(4), True))
    act = model.b.forward()
    with pytest.raises(ProtocolError, match="vnn.backward.grad"):
        model.b.backward(BackwardMsg(np.zeros((4, 3))))
    from fedarena.federated.vertical.split_nn import ActivationsMsg

    with pytest.raises(ProtocolError, match="vnn.activations"):
        model.a.interactive_forward(ActivationsMsg(act.rows, act.dims + 1, act.frac_bits, act.values))
    with pytest.raises(ProtocolError, match="vnn.activations.values"):
        model.a.interactive_forward(ActivationsMsg(act.rows, act.dims, act.frac_bits, b"\xff" * model.a.peer.width + act.values[model.a.peer.width:]))
