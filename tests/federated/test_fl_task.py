"""Local training and the non-IID split: numpy MLP gradients vs PyTorch, FedProx term, Dirichlet split."""

import numpy as np
import pytest

from fedarena.federated.task import TaskSpec, build_task, dirichlet_split
from fedarena.federated.trainer import NumpyMLPTrainer


def test_numpy_mlp_loss_and_gradients_match_pytorch():
    torch = pytest.importorskip("torch")
    tr = NumpyMLPTrainer((6, 5, 4, 3))
    p = {k: v.astype(np.float64) for k, v in tr.init_params(1).items()}
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((9, 6)), rng.integers(0, 3, 9)
    loss, grads = tr.loss_and_grad(p, x, y)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    h = torch.tensor(x)
    for i in range(3):
        h = h @ tp[f"l{i}.w"] + tp[f"l{i}.b"]
        if i < 2:
            h = torch.relu(h)
    tl = torch.nn.functional.cross_entropy(h, torch.tensor(y))
    tl.backward()
    assert loss == pytest.approx(tl.item(), rel=1e-12)
    for k in p:
        np.testing.assert_allclose(grads[k], tp[k].grad.numpy(), rtol=1e-10, atol=1e-12)


def test_fedprox_step_adds_mu_times_distance_to_the_global_model():
    tr = NumpyMLPTrainer((3, 2))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 3)).astype(np.float32), np.array([0, 1, 1, 0])
    g = tr.init_params(0)
    # one full-batch step from the global model: the proximal gradient is zero there
    one, _ = tr.train(g, x, y, epochs=1, batch_size=4, lr=0.5, prox_mu=10.0, rng=np.random.default_rng(1))
    plain, _ = tr.train(g, x, y, epochs=1, batch_size=4, lr=0.5, prox_mu=0.0, rng=np.random.default_rng(1))
    for k in g:
        np.testing.assert_allclose(one[k], plain[k], rtol=1e-6)
    # second step: w2 = w1 - lr (grad(w1) + mu (w1 - g))
    two, _ = tr.train(g, x, y, epochs=2, batch_size=4, lr=0.5, prox_mu=10.0, rng=np.random.default_rng(1))
    _, grads = tr.loss_and_grad(one, x, y)
    for k in g:
        np.testing.assert_allclose(two[k], one[k] - 0.5 * (grads[k] + 10.0 * (one[k] - g[k])), rtol=1e-5, atol=1e-6)


def test_dirichlet_split_is_a_partition_with_stronger_skew_for_small_alpha():
    labels = np.repeat(np.arange(10), 100)
    skews = {}
    for alpha in (0.1, 0.5, 100.0):
        parts = dirichlet_split(labels, 20, alpha, np.random.default_rng(0), min_examples=5)
        allidx = np.concatenate(parts)
        assert len(allidx) == len(labels) and len(np.unique(allidx)) == len(labels)  # every example exactly once
        assert min(len(p) for p in parts) >= 5
        # mean total-variation distance of client label histograms to the global (uniform) one
        tv = [0.5 * np.abs(np.bincount(labels[p], minlength=10) / len(p) - 0.1).sum() for p in parts]
        skews[alpha] = float(np.mean(tv))
    assert skews[0.1] > skews[0.5] > skews[100.0]
    assert skews[100.0] < 0.15
    iid = dirichlet_split(labels, 4, 0.0, np.random.default_rng(0))
    assert sorted(len(p) for p in iid) == [250] * 4
    with pytest.raises(ValueError, match="num_clients"):
        dirichlet_split(labels, 300, 0.5, np.random.default_rng(0), min_examples=5)


def test_task_is_deterministic_and_config_errors_name_fields():
    spec = TaskSpec(dataset="synthetic", num_clients=5, trainer="numpy", synthetic_examples=500)
    a, b = build_task(spec), build_task(spec)
    for (xa, ya), (xb, yb) in zip(a.clients, b.clients):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert sum(len(c[1]) for c in a.clients) + len(a.test[1]) == 500
    with pytest.raises(ValueError, match="task.dataset"):
        TaskSpec(dataset="mnist")
    with pytest.raises(ValueError, match="task.alpha"):
        TaskSpec(alpha=-1)


@pytest.mark.parametrize("prox_mu", [0.0, 0.5])
def test_engine_trainer_matches_numpy_reference(prox_mu):
    from fedarena.federated.engine_trainer import EngineMLPTrainer

    sizes = (10, 16, 3)
    ref, eng = NumpyMLPTrainer(sizes), EngineMLPTrainer(sizes)
    p = ref.init_params(3)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((37, 10)).astype(np.float32), rng.integers(0, 3, 37)
    a, la = ref.train(p, x, y, epochs=3, batch_size=8, lr=0.05, prox_mu=prox_mu, rng=np.random.default_rng(7))
    b, lb = eng.train(p, x, y, epochs=3, batch_size=8, lr=0.05, prox_mu=prox_mu, rng=np.random.default_rng(7))
    assert la == pytest.approx(lb, rel=1e-4)
    for k in p:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-5)
        assert b[k].dtype == np.float32
    assert eng.evaluate(b, x, y) == pytest.approx(ref.evaluate(a, x, y), rel=1e-4)
