"""Device budgets and width-scaled sub-models in fedsim (issue 35): HeteroFL / FedRolex extraction and the
per-coordinate aggregation against a numpy hand computation on a 2-layer model (one round of the simulation end
to end), the cost model against hand-counted FLOPs and bytes, a 5-level run that trains every level with every
client within its memory and time budget, and bad input refused in one line with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedarena.federated.devices import DeviceFleet, DeviceProfile, step_flops, training_cost, training_memory
from fedarena.federated.hetero import CoordinateMean, WidthLevels, extract, level_sizes, submodel_index
from fedarena.federated.simulation import BatchedMLP, Simulation
from fedarena.federated.strategy import FedAvg, FitConfig
from fedarena.platform.cli import main

REPO = Path(__file__).resolve().parents[2]
SIZES = (3, 4, 2)  # a 2-layer model: 3 inputs, 4 hidden units, 2 classes


def _params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"l0.w": rng.normal(size=(3, 4)).astype(np.float32), "l0.b": rng.normal(size=4).astype(np.float32),
            "l1.w": rng.normal(size=(4, 2)).astype(np.float32), "l1.b": rng.normal(size=2).astype(np.float32)}


def test_extraction_heterofl_leading_units_fedrolex_rolling_window():
    p = _params()
    # HeteroFL, width 1/2: hidden units {0, 1} in every round
    for rnd in (1, 2, 7):
        sub = extract(p, submodel_index(SIZES, 0.5, "heterofl", rnd))
        np.testing.assert_array_equal(sub["l0.w"], p["l0.w"][:, [0, 1]])
        np.testing.assert_array_equal(sub["l0.b"], p["l0.b"][[0, 1]])
        np.testing.assert_array_equal(sub["l1.w"], p["l1.w"][[0, 1], :])
        np.testing.assert_array_equal(sub["l1.b"], p["l1.b"])
    # FedRolex, width 1/2 of 4 units: round t keeps {(t-1) mod 4, t mod 4}
    for rnd, units in [(1, [0, 1]), (2, [1, 2]), (3, [2, 3]), (4, [3, 0]), (5, [0, 1])]:
        sub = extract(p, submodel_index(SIZES, 0.5, "fedrolex", rnd))
        np.testing.assert_array_equal(sub["l0.w"], p["l0.w"][:, units])
        np.testing.assert_array_equal(sub["l0.b"], p["l0.b"][units])
        np.testing.assert_array_equal(sub["l1.w"], p["l1.w"][units, :])
    # width 1/4 keeps one unit; width 1 is the whole model
    assert level_sizes(SIZES, 0.25) == (3, 1, 2)
    full = extract(p, submodel_index(SIZES, 1.0, "fedrolex", 3))
    for k in p:
        np.testing.assert_array_equal(full[k], p[k])


def test_coordinate_mean_by_hand():
    like = {k: np.zeros_like(v) for k, v in _params().items()}
    mean = CoordinateMean(like)
    d_full = _params(1)  # a width-1 client
    idx_half = submodel_index(SIZES, 0.5, "fedrolex", 4)  # units {3, 0}
    d_half = extract(_params(2), idx_half)
    mean.add(d_full, submodel_index(SIZES, 1.0, "heterofl", 4))
    mean.add(d_half, idx_half)
    got = mean.mean()
    # by hand: a coordinate held by both clients is their mean; held by the full client only: its value
    units = [3, 0]
    want_w0 = np.array(d_full["l0.w"], np.float64)
    want_b0 = np.array(d_full["l0.b"], np.float64)
    want_w1 = np.array(d_full["l1.w"], np.float64)
    for a, u in enumerate(units):
        for r in range(3):
            want_w0[r, u] = (float(d_full["l0.w"][r, u]) + float(d_half["l0.w"][r, a])) / 2
        want_b0[u] = (float(d_full["l0.b"][u]) + float(d_half["l0.b"][a])) / 2
        for c in range(2):
            want_w1[u, c] = (float(d_full["l1.w"][u, c]) + float(d_half["l1.w"][a, c])) / 2
    want_b1 = (d_full["l1.b"].astype(np.float64) + d_half["l1.b"].astype(np.float64)) / 2
    np.testing.assert_allclose(got["l0.w"], want_w0, rtol=1e-12)
    np.testing.assert_allclose(got["l0.b"], want_b0, rtol=1e-12)
    np.testing.assert_allclose(got["l1.w"], want_w1, rtol=1e-12)
    np.testing.assert_allclose(got["l1.b"], want_b1, rtol=1e-12)
    # a coordinate nobody held stays 0 (the global value is kept)
    only_half = CoordinateMean(like)
    only_half.add(d_half, idx_half)
    assert np.all(only_half.mean()["l0.w"][:, [1, 2]] == 0)


def _profile(tier: int, memory: float) -> DeviceProfile:
    return DeviceProfile(tier, memory, 1e9, 1e6, 1e6, 0.0, 86_400.0)


@pytest.mark.parametrize("kind, rnd", [("heterofl", 1), ("fedrolex", 3)])
def test_one_round_equals_hand_computation(kind, rnd, sgd_step_by_hand):
    """Two clients, one of width 1 and one of width 1/2 (its memory budget holds only that), one full-batch SGD
    step each: the new global model is the per-coordinate mean of the two sub-model updates, computed by hand."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(10, 3)).astype(np.float32)
    y = np.array([0, 1] * 5)
    train = [np.arange(0, 6), np.arange(6, 10)]
    sizes_k = [level_sizes(SIZES, 1.0), level_sizes(SIZES, 0.5)]
    fit = FitConfig(epochs=1, batch_size=6, lr=0.5)
    roomy = training_memory(sizes_k[0], 6) + 1
    tight = training_memory(sizes_k[1], 6) + 1
    assert training_memory(sizes_k[0], 6) > tight
    fleet = DeviceFleet([_profile(0, roomy), _profile(1, tight)], sizes_k)
    sim = Simulation(BatchedMLP(SIZES), FedAvg(fit=fit), x, y, train, ["a", "b"], 2, devices=fleet,
                     widths=WidthLevels((1.0, 0.5), kind, scaler=True), eval_clients=False)
    p0 = _params(3)
    state = sim.init_state(p0)
    state = type(state)(rnd, state.params, state.opt_state, state.control)
    new, rec = sim.round(state)
    assert rec.metrics["level0_clients"] == 1 and rec.metrics["level1_clients"] == 1
    # by hand
    idx_a = submodel_index(SIZES, 1.0, kind, rnd)
    idx_b = submodel_index(SIZES, 0.5, kind, rnd)
    sub_a, sub_b = extract(p0, idx_a), extract(p0, idx_b)
    xa, ya = x[train[0]].astype(np.float64), y[train[0]]
    xb, yb = x[train[1]].astype(np.float64), y[train[1]]
    da = {k: v - sub_a[k] for k, v in sgd_step_by_hand(sub_a, xa, ya, 0.5, 1.0).items()}
    db = {k: v - sub_b[k] for k, v in sgd_step_by_hand(sub_b, xb, yb, 0.5, 2.0).items()}
    want = {k: np.asarray(v, np.float64).copy() for k, v in p0.items()}
    count = {k: np.zeros(v.shape) for k, v in p0.items()}
    total = {k: np.zeros(v.shape) for k, v in p0.items()}
    for d, idx in ((da, idx_a), (db, idx_b)):
        for li in range(2):
            for a, r in enumerate(idx[li]):
                for b, c in enumerate(idx[li + 1]):
                    total[f"l{li}.w"][r, c] += d[f"l{li}.w"][a, b]
                    count[f"l{li}.w"][r, c] += 1
            for b, c in enumerate(idx[li + 1]):
                total[f"l{li}.b"][c] += d[f"l{li}.b"][b]
                count[f"l{li}.b"][c] += 1
    for k in want:
        held = count[k] > 0
        want[k][held] += total[k][held] / count[k][held]
        np.testing.assert_allclose(new.params[k], want[k], rtol=2e-5, atol=2e-6)
    # the narrow client's untouched units kept their global value exactly
    assert count["l0.w"].min() == 1
    rows = sim.pop_device_records()
    assert [r["level"] for r in sorted(rows, key=lambda r: r["client"])] == [0, 1]
    assert {r["client"]: r["bytes_up"] for r in rows} == {"a": 4 * 26, "b": 4 * 14}


def test_cost_model_by_hand():
    sizes, batch = (3, 4, 2), 5
    # forward 2 B (12 + 8), backward 2 B (12 + 8) + 2 B 8, update 2 P with P = 12 + 4 + 8 + 2 = 26
    assert step_flops(sizes, batch) == 2 * 5 * 20 + 2 * 5 * 20 + 2 * 5 * 8 + 2 * 26
    # 2 P floats + activations B (3 + 4 [inputs] + 4 [pre-activation] + 2 x 2 [logits, softmax])
    assert training_memory(sizes, batch) == 4 * (2 * 26 + 5 * (3 + 4 + 4 + 4))
    assert training_memory(sizes, batch, proximal=True) == 4 * (3 * 26 + 5 * 15)
    prof = DeviceProfile(0, 1e6, 1e3, 50.0, 200.0, 0.0, 86_400.0)
    cost = training_cost(sizes, batch, 3, prof)
    assert cost.bytes_up == cost.bytes_down == 104
    assert cost.seconds == pytest.approx(104 / 200 + 3 * step_flops(sizes, batch) / 1e3 + 104 / 50)
    # a 6-hour window opening at 20:00: at 23:00 three hours are left; at 03:00 (wrapped past midnight) one; at
    # noon it is closed
    win = DeviceProfile(0, 1.0, 1.0, 1.0, 1.0, 20 * 3600.0, 6 * 3600.0)
    assert win.seconds_left(23 * 3600.0) == pytest.approx(3 * 3600)
    assert win.seconds_left(86_400.0 + 1 * 3600.0) == pytest.approx(1 * 3600)
    assert win.seconds_left(12 * 3600.0) == 0.0


def test_assign_picks_the_widest_level_that_fits_memory_and_time():
    sizes_k = [level_sizes((8, 16, 16, 4), r) for r in (1.0, 0.5, 0.25)]
    mems = [training_memory(s, 4) for s in sizes_k]
    fleet = DeviceFleet([_profile(0, mems[1] + 1), _profile(0, mems[2] - 1)], sizes_k)
    assert fleet.assign(0, 1, 4, 10)[0] == 1
    assert fleet.assign(1, 1, 4, 10) is None  # not even the narrowest fits
    # a deadline shorter than the width-1/2 client's time moves it down to 1/4
    t = [training_cost(s, 4, 10, fleet.profiles[0]).seconds for s in sizes_k]
    tight = DeviceFleet(fleet.profiles, sizes_k, deadline_s=(t[1] + t[2]) / 2)
    assert tight.assign(0, 1, 4, 10)[0] == 2


def _config(tmp_path: Path, extra: str = "") -> Path:
    text = (REPO / "experiments" / "heterofl_digits.yaml").read_text() + extra
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_five_levels_all_trained_every_client_within_its_budget(tmp_path):
    from fedarena.federated.fedsim_experiment import FedSimConfig, _devices_plot, read_device_records
    from fedarena.platform.config import build

    out = tmp_path / "run"
    assert main(["run", str(_config(tmp_path)), "--out", str(out), "--quiet", "--no-report", "--set", "rounds=4",
                 "--set", "clients.per_round=40", "--set", "evaluation.every=4"]) == 0
    rec = read_device_records(out / "device_costs.csv")
    assert set(rec["level"].astype(int)) == {0, 1, 2, 3, 4}  # every width level trained
    assert (rec["memory_bytes"] <= rec["memory_budget"]).all()
    assert (rec["seconds"] <= rec["time_budget"]).all()
    assert (rec["time_budget"] <= 5.0).all()  # the 5-second deadline binds (or the window's end, earlier)
    # each client's level is its tier's (the tiers' memory fits exactly one width each) and its upload is the
    # dense float32 sub-model of that width
    np.testing.assert_array_equal(rec["level"], rec["tier"])
    # budgets as configured (spread 0: the tier's value) and memory by hand: hidden units h = 64 r, P = 64 h + h +
    # h h + h + 10 h + 10, memory 4 (2 P + B (64 + h + h + h + h + 2 x 10)) with B = 10
    np.testing.assert_allclose(rec["memory_budget"], np.array([100e3, 50e3, 25e3, 12e3, 8e3])[rec["tier"].astype(int)])
    hidden = 64 * np.array([1, .5, .25, .125, .0625])[rec["level"].astype(int)]
    params = 64 * hidden + hidden + hidden * hidden + hidden + 10 * hidden + 10
    np.testing.assert_array_equal(rec["memory_bytes"], 4 * (2 * params + 10 * (64 + 4 * hidden + 20)))
    up = rec["reported"] == 1
    np.testing.assert_array_equal(rec["bytes_up"][up], 4 * params[up])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["over_budget"] == 0 for r in rows)
    assert {f"test_acc_level{k}" for k in range(5)} <= set(rows[-1])
    # the report's device figure, drawn from the run's records and metrics
    cfg = build(FedSimConfig, yaml.safe_load(_config(tmp_path).read_text()))
    (tmp_path / "report").mkdir()
    path = _devices_plot(rec, [{"step": i + 1, **r} for i, r in enumerate(rows)], cfg, "t", tmp_path / "report")
    assert Path(path).stat().st_size > 10_000


def test_window_closed_clients_are_not_selected():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = rng.integers(0, 2, 40)
    train = [np.arange(i * 10, i * 10 + 10) for i in range(4)]
    sizes_k = [level_sizes(SIZES, 1.0)]
    # windows of 1 hour opening at 00:00, 01:00, 02:00, 03:00; rounds 30 minutes apart
    profiles = [DeviceProfile(0, 1e9, 1e9, 1e9, 1e9, h * 3600.0, 3600.0) for h in range(4)]
    fleet = DeviceFleet(profiles, sizes_k, round_interval_s=1800.0)
    sim = Simulation(BatchedMLP(SIZES), FedAvg(fit=FitConfig(batch_size=5, lr=0.1)), x, y, train,
                     ["c0", "c1", "c2", "c3"], 2, devices=fleet, widths=WidthLevels((1.0,)), eval_clients=False)
    state = sim.init_state(_params())
    for rnd in range(1, 7):  # round r starts at (r - 1) x 30 min: client floor((r - 1) / 2) is the one online
        state, rec = sim.round(state)
        assert rec.selected == [f"c{(rnd - 1) // 2}"], (rnd, rec.selected)
        row = sim.pop_device_records()[0]
        assert row["time_budget"] == pytest.approx(3600.0 - ((rnd - 1) % 2) * 1800.0)


@pytest.mark.parametrize("sets, message", [
    (["devices.width_levels=[1.0,0.5,0.0078125]"],
     "devices.width_levels: width 0.0078125 leaves hidden layer 0 (64 units) with 0 units; the smallest width "
     "this model allows is 1/64 = 0.015625"),
    (["devices.tier_memory_mb=[0.1,0.05,0,0.012,0.008]"],
     "devices.tier_memory_mb: every tier needs a value > 0, got [0.1, 0.05, 0.0, 0.012, 0.008]"),
    (["devices.width_levels=[0.5,1.0]"], "devices.width_levels: distinct widths, widest first, got [0.5, 1.0]"),
    (["model.arch=cnn"], "model.arch: width-scaled sub-models (devices.enabled) are defined for the MLP"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, cli_error_line, sets, message):
    cli_error_line(_config(tmp_path), tmp_path / "r", sets, message)


def test_resumed_run_has_the_same_device_records(tmp_path):
    from fedarena.platform.runs import execute, read_metrics

    cfg = yaml.safe_load((REPO / "experiments" / "heterofl_digits.yaml").read_text())
    cfg.update(rounds=4, checkpoint={"every": 1, "keep": 2}, evaluation={"every": 2})
    cfg["data"]["num_clients"] = 30
    cfg["clients"]["per_round"] = 10
    cfg["devices"]["submodel"] = "fedrolex"
    execute(cfg, out=tmp_path / "a", quiet=True, report=False)
    execute(dict(cfg, rounds=2), out=tmp_path / "b", quiet=True, report=False)
    # a row of a round after the checkpoint (a run stopped mid-round 3) goes when the run resumes
    with open(tmp_path / "b" / "device_costs.csv", "a") as f:
        f.write("3,c0,0,0,1.0,1,1,1,1,1,1,1,1\n")
    execute(None, overrides=["rounds=4"], resume=tmp_path / "b", quiet=True, report=False)
    assert (tmp_path / "a" / "device_costs.csv").read_text() == (tmp_path / "b" / "device_costs.csv").read_text()
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    np.testing.assert_allclose([r["test_loss"] for r in b if "test_loss" in r],
                               [r["test_loss"] for r in a if "test_loss" in r], rtol=1e-12)


def test_profiles_follow_the_tiers():
    from fedarena.federated.devices import DEFAULT_TIERS, DeviceTier, draw_profiles

    profiles = draw_profiles(DEFAULT_TIERS, 20_000, seed=3, spread=0.5, window_s=6 * 3600.0)
    tier = np.array([p.tier for p in profiles])
    np.testing.assert_allclose(np.bincount(tier, minlength=5) / len(tier), 0.2, atol=0.015)
    # the log-normal factor exp(0.5 z - 0.125) has mean 1 and median exp(-0.125)
    factor = np.array([p.memory_bytes / DEFAULT_TIERS[p.tier].memory_bytes for p in profiles])
    assert factor.mean() == pytest.approx(1.0, abs=0.02)
    assert np.median(factor) == pytest.approx(np.exp(-0.125), abs=0.02)
    # a 6-hour window is open a quarter of the day
    assert np.mean([p.seconds_left(10 * 3600.0) > 0 for p in profiles]) == pytest.approx(0.25, abs=0.015)
    with pytest.raises(ValueError, match="memory_bytes must be > 0"):
        DeviceTier(0.5, 0.0, 1e9, 1e6, 1e6)


def test_device_round_on_the_emulated_device_backend_matches_numpy():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(60, 3)).astype(np.float32)
    y = rng.integers(0, 2, 60)
    train = [np.arange(i * 10, i * 10 + 10) for i in range(6)]
    sizes_k = [level_sizes(SIZES, r) for r in (1.0, 0.5)]
    mem = [training_memory(s, 5) for s in sizes_k]
    fleet = DeviceFleet([_profile(i % 2, mem[i % 2] + 1) for i in range(6)], sizes_k)
    out = []
    for backend in ("numpy", "cupy-emulated"):
        sim = Simulation(BatchedMLP(SIZES), FedAvg(fit=FitConfig(batch_size=5, lr=0.2)), x, y, train,
                         [f"c{i}" for i in range(6)], 2, devices=fleet, widths=WidthLevels((1.0, 0.5), "fedrolex"),
                         engine_backend=backend, eval_clients=False)
        assert [m.engine_backend for m in sim._level_models] == [backend, backend]
        state = sim.init_state(_params())
        for _ in range(3):
            state, rec = sim.round(state)
        assert rec.metrics["level0_clients"] == 3 and rec.metrics["level1_clients"] == 3
        out.append(state.params)
    for k in out[0]:
        np.testing.assert_allclose(out[1][k], out[0][k], rtol=1e-5, atol=1e-6)
