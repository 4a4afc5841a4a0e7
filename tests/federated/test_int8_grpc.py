"""int8 downloads in the gRPC runtime (issue 35): one round with int8 and float32 clients at two widths through a
real scheduler, two FL-Servers and four FLClient threads on loopback reaches the simulation's global model
(``Simulation.device_round``, the oracle computed in process over no transport) to ``1e-5``, the int8 clients'
cost rows price the int8 file the simulation's server sends, and the int8 file a client receives from the network
is parsed with validation: a malformed or hostile one is refused with one ``ValueError`` naming the field."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from fedarena.federated.devices import DeviceFleet, DeviceProfile, qat_training_cost, training_cost
from fedarena.federated.hetero import WidthLevels, level_sizes
from fedarena.federated.int8_clients import Int8Download, calibration_sample, parse_int8_mlp
from fedarena.federated.protocol import RoundConfig
from fedarena.federated.scheduler import RoundPolicy
from fedarena.federated.task import TaskSpec, build_task

SEED, CLIENTS = 3, 4
TASK = TaskSpec(dataset="synthetic", num_clients=CLIENTS, hidden=(8, 8), trainer="engine", synthetic_features=10,
                synthetic_classes=3, synthetic_examples=200, alpha=0.5)
CFG = RoundConfig(epochs=2, batch_size=8, lr=0.1)


def _fleet(sizes):
    """c0, c1 hold the full width, c2, c3 only half (in float and in QAT); tiers 1 and 3 (c1, c3) receive int8."""
    full, half = level_sizes(sizes, 1.0), level_sizes(sizes, 0.5)

    def need(s):  # the largest memory either training mode needs at width s (the file length barely matters)
        return max(training_cost(s, CFG.batch_size, 1, PROFILE).memory_bytes,
                   qat_training_cost(s, CFG.batch_size, 1, PROFILE, 1.0).memory_bytes)

    assert need(half) + 1 < min(training_cost(full, CFG.batch_size, 1, PROFILE).memory_bytes,
                                qat_training_cost(full, CFG.batch_size, 1, PROFILE, 1.0).memory_bytes)
    mem = [need(full) + 1, need(full) + 1, need(half) + 1, need(half) + 1]
    return DeviceFleet([DeviceProfile(i, m, 1e12, 1e9, 1e9, 0.0, 86_400.0) for i, m in enumerate(mem)],
                       [full, half], int8_tiers=(1, 3), int8_calibration=50)


PROFILE = DeviceProfile(0, 1e12, 1e12, 1e9, 1e9, 0.0, 86_400.0)


def test_one_round_with_int8_clients_at_two_widths_over_grpc_equals_the_simulation(make_cluster, pooled_clients,
                                                                                     device_simulation):
    task = build_task(TASK)
    x, _, train = pooled_clients(task)
    fleet = _fleet(task.sizes)
    widths = WidthLevels((1.0, 0.5), "heterofl", scaler=True)
    ids = tuple(f"c{i}" for i in range(CLIENTS))
    policy = RoundPolicy(rounds=1, clients_per_round=CLIENTS, window_seconds=120, start_clients=CLIENTS,
                         min_fraction=1.0, selection="uniform", seed=SEED, round_config=CFG, max_client_weight=1.0,
                         norm_bound_multiple=0.0, devices=fleet, widths=widths, device_clients=ids,
                         int8_calibration=calibration_sample(x, train, SEED, fleet.int8_calibration))
    c = make_cluster(policy, task=TASK)
    clients = c.run_clients(CLIENTS, seed=SEED, wait_s=0.5)
    assert c.scheduler.version == 1, c.scheduler.history[-1]
    assert all(cl.stats.uploads_accepted == 1 for cl in clients), [cl.stats for cl in clients]
    row = c.scheduler.history[-1]
    costs = row["device_costs"]
    assert {cid: (d["level"], d["int8"]) for cid, d in costs.items()} == {"c0": (0, 0), "c1": (0, 1), "c2": (1, 0),
                                                                         "c3": (1, 1)}

    sim = device_simulation(task, CFG, _fleet(task.sizes), widths, SEED)
    init = task.trainer.init_params(0)
    state, rec = sim.round(sim.init_state(init))
    assert rec.metrics["int8_clients"] == 2 and rec.metrics["reporting"] == CLIENTS
    # the cost rows (bytes down = the int8 file's length for c1 and c3) are the simulation's
    for r in sim.pop_device_records():
        got = costs[r["client"]]
        assert (got["level"], got["int8"], got["bytes_down"], got["bytes_up"]) == (r["level"], r["int8"],
                                                                                  r["bytes_down"], r["bytes_up"])
        assert got["memory_bytes"] == pytest.approx(r["memory_bytes"]) and got["seconds"] == pytest.approx(r["seconds"])
    assert costs["c1"]["bytes_down"] != costs["c0"]["bytes_down"]  # the int8 file, not the float32 model
    a = np.concatenate([np.asarray(c.scheduler.params[k], np.float64).ravel() for k in sorted(init)])
    b = np.concatenate([np.asarray(state.params[k], np.float64).ravel() for k in sorted(init)])
    i = np.concatenate([np.asarray(init[k], np.float64).ravel() for k in sorted(init)])
    assert np.linalg.norm(a - b) / np.linalg.norm(b - i) < 1e-5, np.linalg.norm(a - b) / np.linalg.norm(b - i)
    assert np.abs(a - b).max() < 1e-5
    # the int8 clients matter: the same round with every client in float32 lands elsewhere
    from dataclasses import replace

    flt = device_simulation(task, CFG, replace(_fleet(task.sizes), int8_tiers=None), widths, SEED)
    f_state, _ = flt.round(flt.init_state(init))
    f = np.concatenate([np.asarray(f_state.params[k], np.float64).ravel() for k in sorted(init)])
    assert np.abs(f - b).max() > 1e-3


def _file(sizes=(10, 8, 3), seed=0):
    rng = np.random.default_rng(seed)
    params = {f"l{i}.{k}": rng.normal(size=(a, b) if k == "w" else (b,)).astype(np.float32)
              for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])) for k in "wb"}
    return Int8Download(rng.normal(size=(20, sizes[0])).astype(np.float32)).quantize(params, sizes, 2.0)


def _rewrite_header(blob, edit):
    """``blob`` with its JSON header changed by ``edit`` (what a hostile server could send)."""
    hlen = int.from_bytes(blob[4:12], "little")
    header = json.loads(zlib.decompress(blob[12:12 + hlen]))
    edit(header)
    h = zlib.compress(json.dumps(header).encode())
    return blob[:4] + len(h).to_bytes(8, "little") + h + blob[12 + hlen:]


def _set(path, value):
    def edit(header):
        d = header
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return edit


def test_a_received_int8_file_is_parsed_with_validation():
    good = _file()
    q, sizes = parse_int8_mlp(good, "body.int8", 10, 3)
    assert sizes == (10, 8, 3) and len(q.layers) == 2
    hlen = int.from_bytes(good[4:12], "little")
    bomb = zlib.compress(b" " * (1 << 25))  # inflates past the header bound
    hostile = {
        "not bytes": ({"weights": [1, 2]}, "expected bytes"),
        "empty": (b"", "magic"),
        "pickle": (b"\x80\x04\x95" + bytes(40), "magic"),
        "header past the end": (good[:4] + (1 << 40).to_bytes(8, "little") + good[12:], "header"),
        "zip bomb": (good[:4] + len(bomb).to_bytes(8, "little") + bomb, "header"),
        "truncated arrays": (good[:12 + hlen + 5], "lies outside"),
        "huge claimed shape": (_rewrite_header(good, _set(["layers", 0, "weight", "shape"], [1 << 30, 1 << 30])),
                               "layers[0].weight"),
        "negative offset": (_rewrite_header(good, _set(["layers", 1, "bias", "offset"], -8)), "layers[1].bias"),
        "nan scale": (_rewrite_header(good, _set(["layers", 0, "out", "scale"], float("nan"))), "layers[0].out.scale"),
        "unchained sizes": (_rewrite_header(good, lambda h: h["layers"].insert(1, h["layers"][0])),
                            "layer 1 takes 10 inputs"),
        "no relu between layers": (_rewrite_header(good, _set(["layers", 0, "relu"], False)), "fused ReLU"),
        "a flatten layer": (_rewrite_header(good, lambda h: h["layers"].insert(0, {"kind": "flatten"})), "not an MLP"),
    }
    for name, (blob, reason) in hostile.items():
        with pytest.raises(ValueError, match="body.int8") as e:
            parse_int8_mlp(blob, "body.int8", 10, 3)
        assert reason in str(e.value) and "\n" not in str(e.value), (name, str(e.value))
    with pytest.raises(ValueError, match="this client's data has 12 features"):
        parse_int8_mlp(good, "body.int8", 12, 3)
    with pytest.raises(ValueError, match="labels up to 3"):
        parse_int8_mlp(good, "body.int8", 10, 4)


def test_the_server_refuses_a_plan_int8_file_that_is_not_the_submodel():
    """An FL-Server checks the scheduler's int8 file before sending it: a file of other layer sizes, or no file,
    is one WireError naming it (the sync loop logs it and keeps serving)."""
    from fedarena.federated import wire
    from fedarena.federated.server import FLServer

    rng = np.random.default_rng(1)
    params = {"l0.w": rng.normal(size=(10, 8)).astype(np.float32), "l0.b": np.zeros(8, np.float32),
              "l1.w": rng.normal(size=(8, 3)).astype(np.float32), "l1.b": np.zeros(3, np.float32)}
    assert FLServer._check_int8([_file()], 0, params) == _file()
    for files, reason in [([], "missing"), ([_file((10, 6, 3))], "are not the sub-model's (10, 8, 3)"),
                          ([b"FAQM" + bytes(20)], "header")]:
        with pytest.raises(wire.WireError, match=r"plan\.int8_files\[0\]") as e:
            FLServer._check_int8(files, 0, params)
        assert reason in str(e.value), str(e.value)


def test_a_deployment_carries_the_calibration_sample_exactly(pooled_clients):
    """The node config (JSON) holds the scheduler's calibration sample; the scheduler node reads back the same
    float32 values, so its int8 files are the ones the in-process scheduler would make."""
    from fedarena.federated.deployment import DeploymentSpec, spec_from_json

    task = build_task(TASK)
    x, _, train = pooled_clients(task)
    cal = calibration_sample(x, train, SEED, 50)
    policy = RoundPolicy(rounds=1, start_clients=CLIENTS, round_config=CFG, devices=_fleet(task.sizes),
                         widths=WidthLevels((1.0, 0.5), "heterofl"), device_clients=tuple(f"c{i}" for i in range(4)),
                         int8_calibration=cal)
    back = spec_from_json(json.loads(json.dumps(DeploymentSpec(task=TASK, policy=policy).to_json())))
    got = back.policy.int8_calibration
    assert got.dtype == np.float32 and got.shape == (50, 10) and np.array_equal(got, cal)
    assert back.policy.devices.int8_tiers == (1, 3)
