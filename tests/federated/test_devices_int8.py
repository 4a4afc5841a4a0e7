"""Clients that receive an int8 model and train it quantization-aware (issue 35, fedsim's ``devices.int8_download``):
one round of two such clients of two widths against the engine's quantization API driven by hand (post-training
quantization of the sub-model, the file's bytes, ``dequantize_params``, ``QATModel.train_step``), the folded
HeteroFL scaler against a float64 numpy SGD step of the scaled model, and bad input refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from fedarena.engine import nn, optim
from fedarena.engine.quantization import QuantizedModel, dequantize_params, qat_model, quantize_model
from fedarena.federated.devices import DeviceFleet, DeviceProfile, qat_training_cost, training_memory
from fedarena.federated.hetero import WidthLevels, extract, level_sizes, submodel_index
from fedarena.federated.int8_clients import folded_tree, layer_sgd, unfolded
from fedarena.federated.simulation import BatchedMLP, Simulation, batch_plan, client_key
from fedarena.federated.strategy import FedAvg, FitConfig

REPO = Path(__file__).resolve().parents[2]
SIZES = (3, 4, 2)


def _params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"l0.w": rng.normal(size=(3, 4)).astype(np.float32), "l0.b": rng.normal(size=4).astype(np.float32),
            "l1.w": rng.normal(size=(4, 2)).astype(np.float32), "l1.b": rng.normal(size=2).astype(np.float32)}


def _tree(p: dict[str, np.ndarray], depth: int = 2) -> list[dict[str, np.ndarray]]:
    return [{"w": p[f"l{i}.w"].copy(), "b": p[f"l{i}.b"].copy()} for i in range(depth)]


def test_folded_scaler_sgd_equals_the_scaled_model_by_hand(sgd_step_by_hand):
    """SGD with ``layer_sgd`` on the folded model (``W1' = s W1``, step ``lr s^2``), unfolded, equals one float64
    SGD step of ``relu(x W0 + b0) * s -> W1, b1`` computed by hand."""
    from fedarena.engine import ops
    from fedarena.engine.transforms.autodiff import value_and_grad

    rng = np.random.default_rng(1)
    x = rng.normal(size=(7, 3)).astype(np.float32)
    y = rng.integers(0, 2, 7)
    p, s, lr = _params(2), 4.0, 0.3
    mlp = nn.MLP(list(SIZES), activation="relu")
    tree = folded_tree(p, 2, s)
    _, g = value_and_grad(lambda t: ops.cross_entropy(mlp.apply(t, x), y))(tree)
    new, _ = layer_sgd(lr, s).update(g, {}, tree)
    got = unfolded([{k: np.asarray(v) for k, v in layer.items()} for layer in new], s)
    want = sgd_step_by_hand(p, x, y, lr, s)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def _hand_qat_client(sub, sizes, scale, x, y, batches, lr, calibration):
    """One int8 client by hand: PTQ of the folded sub-model, its file, the dequantized start, QAT steps."""
    mlp = nn.MLP(list(sizes), activation="relu")
    blob = quantize_model(mlp, folded_tree(sub, 2, scale), calibration).to_bytes()
    q = QuantizedModel.from_bytes(blob)
    start, ranges = dequantize_params(mlp, q), q.ranges()
    opt = optim.sgd(lr) if scale == 1 else layer_sgd(lr, scale)
    st = opt.init(start)
    step = qat_model(mlp).train_step(opt)
    tree = start
    for idx in batches:
        tree, st, ranges, _ = step(tree, st, ranges, x[idx], y[idx])
    return blob, unfolded(start, scale), unfolded(tree, scale)


def test_int8_round_equals_quantization_api_by_hand(tmp_path):
    """Two int8 clients, width 1 (plain ``optim.sgd``: the engine's own optimizer) and width 1/2 (scaler 2), two
    minibatches each: the new global model is the per-coordinate mean of their QAT updates (trained minus the
    dequantized start), the download is the int8 file's length (= the saved file's size), the memory priced is
    QAT's."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(12, 3)).astype(np.float32)
    y = np.array([0, 1] * 6)
    train = [np.arange(0, 6), np.arange(6, 12)]
    fit = FitConfig(epochs=1, batch_size=3, lr=0.5)
    sizes_k = [level_sizes(SIZES, 1.0), level_sizes(SIZES, 0.5)]
    prof = lambda tier, mem: DeviceProfile(tier, mem, 1e9, 1e6, 1e6, 0.0, 86_400.0)  # noqa: E731
    need = [qat_training_cost(s, 3, 2, prof(0, 1.0), 0).memory_bytes for s in sizes_k]
    assert need[0] > training_memory(sizes_k[0], 3) and need[1] < need[0]
    fleet = DeviceFleet([prof(0, need[0] + 1), prof(1, need[1] + 1)], sizes_k, int8_tiers=(0, 1))
    sim = Simulation(BatchedMLP(SIZES), FedAvg(fit=fit), x, y, train, ["a", "b"], 2, devices=fleet,
                     widths=WidthLevels((1.0, 0.5), "heterofl", scaler=True), eval_clients=False)
    p0 = _params(3)
    state = sim.init_state(p0)
    new, rec = sim.round(state)
    assert rec.metrics["level0_clients"] == 1 and rec.metrics["level1_clients"] == 1
    assert rec.metrics["int8_clients"] == 2
    rows = {r["client"]: r for r in sim.pop_device_records()}
    want = {k: np.asarray(v, np.float64).copy() for k, v in p0.items()}
    total = {k: np.zeros(v.shape) for k, v in p0.items()}
    count = {k: np.zeros(v.shape) for k, v in p0.items()}
    for c, i, rate, scale in (("a", 0, 1.0, 1.0), ("b", 1, 0.5, 2.0)):
        index = submodel_index(SIZES, rate, "heterofl", 1)
        sub = extract(p0, index)
        mat, _ = batch_plan(len(train[i]), fit, np.random.default_rng([sim.seed, 1, client_key(c)]))
        batches = [train[i][r[r >= 0]] for r in mat]
        blob, start, trained = _hand_qat_client(sub, level_sizes(SIZES, rate), scale, x, y, batches, 0.5, x)
        assert rows[c]["int8"] == 1 and rows[c]["bytes_down"] == len(blob)
        assert QuantizedModel.from_bytes(blob).save(tmp_path / f"{c}.int8") == len(blob)
        assert rows[c]["memory_bytes"] == need[i] and rows[c]["bytes_up"] == 4 * sum(v.size for v in sub.values())
        for li in range(2):
            rows_i, cols_i = np.ix_(index[li], index[li + 1])
            total[f"l{li}.w"][rows_i, cols_i] += trained[f"l{li}.w"] - start[f"l{li}.w"]
            count[f"l{li}.w"][rows_i, cols_i] += 1
            total[f"l{li}.b"][index[li + 1]] += trained[f"l{li}.b"] - start[f"l{li}.b"]
            count[f"l{li}.b"][index[li + 1]] += 1
    for k in want:
        held = count[k] > 0
        want[k][held] += total[k][held] / count[k][held]
        np.testing.assert_allclose(new.params[k], want[k], rtol=1e-5, atol=1e-5)
    # the update is float32 and not the int8 grid: the width-1 client's layer-0 weights moved off it
    assert not np.allclose(new.params["l0.w"], p0["l0.w"])


def _config(tmp_path: Path) -> Path:
    cfg = yaml.safe_load((REPO / "experiments" / "heterofl_digits.yaml").read_text())
    cfg["rounds"] = 2
    cfg["devices"]["int8_download"] = True
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


@pytest.mark.parametrize("sets, message", [
    (["devices.int8_tiers=[0,5]"], "devices.int8_tiers: distinct tier indices in [0, 4] (5 tiers), got [0, 5]"),
    (["devices.int8_download=false", "devices.int8_tiers=[1]"],
     "devices.int8_tiers: names the tiers that receive int8 models; set int8_download: true too"),
    (["clients.prox_mu=0.1"], "clients.prox_mu: clients that receive int8 models (devices.int8_download) train"),
    (["devices.int8_calibration=0"], "devices.int8_calibration: must be >= 1, got 0"),
])
def test_bad_int8_input_is_one_line_exit_2(tmp_path, cli_error_line, sets, message):
    cli_error_line(_config(tmp_path), tmp_path / "r", sets, message)
