"""McMahan et al. 2017's CNN in the batched simulation: parameter count (the paper's 1,663,370 on MNIST), FedAvg
rounds against PyTorch running the same clients on the same minibatches, and the MNIST path of the FedAvg table
on small generated IDX files."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.federated import data as fd
from fedarena.federated import simulation as sim
from fedarena.federated import strategy as st


def test_paper_cnn_has_the_papers_parameter_count():
    model = sim.BatchedCNN((1, 28, 28), 10)  # 32/64 channels, 512 units: the paper's MNIST CNN
    params = model.init_params(0)
    assert sum(v.size for v in params.values()) == 1_663_370
    assert params["conv1.w"].shape == (32, 1, 5, 5) and params["fc.w"].shape == (7 * 7 * 64, 512)


def _torch_fedavg(model, params, x, y, parts, selected_by_round, fit, seed):
    """FedAvg of the CNN in PyTorch: each selected client's SGD on the simulation's minibatches
    (:func:`fedarena.federated.simulation.batch_plan` with the client's generator), example-weighted mean."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    c, h, w = model.image

    def forward(p, xb):
        z = xb.reshape(-1, c, h, w)
        z = F.max_pool2d(F.relu(F.conv2d(z, p["conv1.w"], p["conv1.b"], padding=2)), 2)
        z = F.max_pool2d(F.relu(F.conv2d(z, p["conv2.w"], p["conv2.b"], padding=2)), 2)
        z = F.relu(z.reshape(z.shape[0], -1) @ p["fc.w"] + p["fc.b"])
        return z @ p["out.w"] + p["out.b"]

    g = {k: torch.tensor(v, dtype=torch.float64) for k, v in params.items()}
    for rnd, chosen in enumerate(selected_by_round, start=1):
        total, acc = 0, {k: torch.zeros_like(v) for k, v in g.items()}
        for cid in chosen:
            i = int(cid[1:])
            rng = np.random.default_rng([seed, rnd, sim.client_key(cid)])
            batches, _ = sim.batch_plan(len(parts[i]), fit, rng)
            p = {k: v.clone().requires_grad_(True) for k, v in g.items()}
            for row in batches:
                idx = parts[i][row[row >= 0]]
                loss = F.cross_entropy(forward(p, torch.tensor(x[idx], dtype=torch.float64)),
                                       torch.tensor(y[idx]))
                grads = torch.autograd.grad(loss, list(p.values()))
                with torch.no_grad():
                    p = {k: (v - fit.lr * gr).requires_grad_(True) for (k, v), gr in zip(p.items(), grads)}
            n = len(parts[i])
            total += n
            for k in g:
                acc[k] += n * (p[k].detach() - g[k])
        g = {k: g[k] + acc[k] / total for k in g}
    return {k: v.numpy() for k, v in g.items()}


def test_cnn_fedavg_on_digits_matches_pytorch():
    d = fd.load(fd.DataSpec("digits", partition=fd.PartitionSpec("iid", 12), held_out_fraction=0.0), 0)
    model = sim.BatchedCNN((1, 8, 8), 10, channels=(4, 6), hidden=16)
    fit = st.FitConfig(1, 10, 0.1)
    s = sim.Simulation(model, st.FedAvg(fit, clients_per_round=4), d.x, d.y, d.train,
                       [f"c{i}" for i in range(12)], 10, seed=2, test=d.test_set())
    p0 = model.init_params(2)
    state, recs = s.run(2, s.init_state(p0))
    want = _torch_fedavg(model, p0, d.x, d.y, d.train, [r.selected for r in recs], fit, 2)
    for k in want:
        np.testing.assert_allclose(state.params[k], want[k], rtol=2e-4, atol=2e-5, err_msg=k)
    # evaluation goes through the same compiled forward
    assert 0 <= recs[-1].metrics["test_acc"] <= 1


def test_fedavg_table_cnn_runs_on_mnist_format_files(tmp_path):
    """The FedAvg table's MNIST path with the CNN, on 28x28 IDX files generated here (MNIST itself is not on
    this machine): class-dependent bright squares, so the task is learnable."""
    from fedarena.federated.reproductions import FedAvgTableConfig
    from fedarena.federated.fedsim_experiment import build

    rng = np.random.default_rng(0)

    def images(n):
        labels = rng.integers(0, 4, n).astype(np.uint8)
        img = rng.integers(0, 40, (n, 28, 28)).astype(np.uint8)
        for i, lab in enumerate(labels):
            r, c = divmod(int(lab), 2)
            img[i, 4 + 12 * r: 12 + 12 * r, 4 + 12 * c: 12 + 12 * c] = 250
        return img, labels

    for split, n in (("train", 48), ("t10k", 16)):
        img, lab = images(n)
        fd.write_idx(tmp_path / f"{split}-images-idx3-ubyte", img)
        fd.write_idx(tmp_path / f"{split}-labels-idx1-ubyte", lab)
    cfg = FedAvgTableConfig(kind="fedavg_table", dataset="mnist", path=str(tmp_path), num_clients=4,
                            model="cnn", cnn_channels=[4, 8], cnn_hidden=16, lr=0.1, target=0.99, max_rounds=3,
                            client_fractions=[0.5], epochs=[1], batch_sizes=[10], partitions=["iid"])
    d, s = build(cfg.cell_config("iid", 0.5, 1, 10))
    assert isinstance(s.model, sim.BatchedCNN) and s.model.image == (1, 28, 28)
    state, recs = s.run(3)
    assert [r.metrics["reporting"] for r in recs] == [2, 2, 2]
    assert all(np.isfinite(v).all() for v in state.params.values())
    assert recs[-1].metrics["test_loss"] < recs[0].metrics["test_loss"]


def test_cnn_config_errors_name_the_field():
    from fedarena.federated.config import ModelConfig

    with pytest.raises(ValueError, match="model.image_shape: 30 features"):
        ModelConfig(arch="cnn").build(30, 3)
    with pytest.raises(ValueError, match="divisible by 4"):
        ModelConfig(arch="cnn", image_shape=[1, 6, 6]).build(36, 3)
