"""Fault tests with real OS processes on loopback: dead and stalled clients, a dead server, a dead deployment.

Each test launches a scheduler, two FL-Servers and client processes (python -m fedarena.federated.node),
injects faults with SIGKILL / SIGSTOP and checks the scheduler's round history. The timeouts passed to
``wait_for`` only bound how long a broken deployment may hang the suite; nothing asserts speed.
"""

from __future__ import annotations

import signal

import pytest

from fedarena.federated.deployment import Deployment, DeploymentSpec, client_name
from fedarena.federated.protocol import RoundConfig, model_bytes
from fedarena.federated.scheduler import RoundPolicy, load_state
from fedarena.federated.task import TaskSpec

WINDOW = 3.0


def _spec(num_clients, availability_s=5.0):
    return DeploymentSpec(
        task=TaskSpec(dataset="synthetic", num_clients=num_clients, hidden=(8,), trainer="numpy",
                      synthetic_features=10, synthetic_classes=3, synthetic_examples=100 * num_clients),
        policy=RoundPolicy(rounds=10_000, window_seconds=WINDOW, start_clients=num_clients, min_fraction=0.6,
                           selection="available", availability_s=availability_s, partial_grace_s=5.0, server_timeout_s=3.0,
                           round_config=RoundConfig(epochs=1, batch_size=16, lr=0.1)),
        num_servers=2,
    )


@pytest.fixture
def deployments():
    made = []
    yield made
    for d in made:
        d.stop()


def _row(status, rnd):
    return next(r for r in status["history"] if r["round"] == rnd)


def test_dead_and_stalled_clients_do_not_stop_rounds(tmp_path, deployments):
    # frozen clients stay "available" for 10 s, so the round that opens after the freeze still selects them
    d = Deployment(tmp_path / "dep", _spec(10, availability_s=10.0))
    deployments.append(d)
    d.start()
    st = d.wait_for(lambda s: len(s["history"]) >= 2, 120)
    assert all(r["outcome"] == "aggregated" and r["reporting"] == 10 for r in st["history"][:2])

    # kill 30% of the clients in the middle of a round they were selected for: freeze them first so they
    # cannot upload, wait for a round that opened after the freeze and selected them (an upload already in
    # flight when SIGSTOP lands could still arrive in the round that was open then), then SIGKILL them
    victims = [client_name(i) for i in (2, 3, 4)]
    for v in victims:
        d.signal(v, signal.SIGSTOP)
    frozen_at = d.status()["round"]
    st = d.wait_for(lambda s: s["phase"] == "open" and s["round"] > frozen_at and set(victims) <= set(s["selected"]),
                    60, poll=0.02)
    killed_round = st["round"]
    for v in victims:
        d.signal(v, signal.SIGKILL)
    st = d.wait_for(lambda s: any(r["round"] == killed_round for r in s["history"]), 60)
    row = _row(st, killed_round)
    assert row["outcome"] == "aggregated"  # completed through the min_fraction threshold
    assert row["reporting"] == row["selected"] - 3 >= row["needed"]
    assert not set(victims) & set(row["clients"])
    assert row["close_reason"] == "deadline"
    # training goes on with the survivors, and later rounds no longer wait for the dead
    st = d.wait_for(lambda s: any(r["round"] > killed_round and r["outcome"] == "aggregated"
                                  and r["close_reason"] == "all_reported" for r in s["history"]), 60)
    assert not set(victims) & set(st["history"][-1]["clients"])
    # a crashed client restarted with the same id rejoins and is aggregated again
    d.start_client(2)
    st = d.wait_for(lambda s: any(r["round"] > killed_round and victims[0] in r["clients"] for r in s["history"]), 60)

    # stall two clients (SIGSTOP) beyond the window: the round closes on its timer without them
    stalled = [client_name(5), client_name(6)]
    for v in stalled:
        d.signal(v, signal.SIGSTOP)
    frozen_at = d.status()["round"]
    st = d.wait_for(lambda s: s["phase"] == "open" and s["round"] > frozen_at and set(stalled) <= set(s["selected"]),
                    60, poll=0.02)
    stall_round = st["round"]
    st = d.wait_for(lambda s: any(r["round"] > stall_round for r in s["history"]), 60)
    row = _row(st, stall_round)
    assert row["close_reason"] == "deadline" and row["outcome"] == "aggregated"
    assert row["reporting"] == row["selected"] - 2 and not set(stalled) & set(row["clients"])
    assert WINDOW <= row["duration_s"] < 2 * WINDOW  # the coordinator's own clock: closed at the window's end
    # the stalled processes are still stopped, yet a further round completes
    assert all(d.procs[v].poll() is None for v in stalled)
    versions = [r["model_version"] for r in st["history"]]
    assert versions == sorted(versions) and versions[-1] == sum(r["outcome"] == "aggregated" for r in st["history"])
    for v in stalled:
        d.signal(v, signal.SIGCONT)


def test_dead_server_moves_clients_and_dead_deployment_resumes_identically(tmp_path, deployments):
    folder = tmp_path / "dep"
    spec = _spec(6)
    d = Deployment(folder, spec)
    deployments.append(d)
    d.start()
    st = d.wait_for(lambda s: len(s["history"]) >= 2, 120)
    on0 = sorted(c for c, s in st["assignments"].items() if s == "server0")
    assert on0 and len(on0) < 6  # both servers carry clients
    done_before = len(st["history"])
    d.signal("server0", signal.SIGKILL)
    st = d.wait_for(lambda s: any(r["round"] > done_before + 1 and r["reporting"] == 6 for r in s["history"])
                    and all(v == "server1" for v in s["assignments"].values()), 90)
    assert not st["servers"]["server0"]["alive"]
    hist = st["history"]
    assert [r["round"] for r in hist] == list(range(1, len(hist) + 1))  # no round lost or repeated
    versions = [r["model_version"] for r in hist]
    assert versions == sorted(versions) and versions[-1] == sum(r["outcome"] == "aggregated" for r in hist)
    assert all(r["servers"] == ["server1"] for r in hist if r["round"] > done_before + 1)

    # kill the whole deployment with SIGKILL, then resume from the folder
    for name in list(d.procs):
        d.signal(name, signal.SIGKILL)
    state = load_state(folder / "scheduler_state.fl")
    saved = model_bytes(state["params"])
    d2 = Deployment(folder, spec)
    deployments.append(d2)
    d2.start_scheduler()
    st = d2.status()
    assert (st["round"], st["model_version"]) == (state["round"], state["version"])
    assert len(st["history"]) == state["round"] - 1
    assert d2.model_bytes(state["version"]) == saved  # identical global model bytes
    for i in range(spec.num_servers):
        d2.start_server(i)
    for i in range(spec.task.num_clients):
        d2.start_client(i)
    st = d2.wait_for(lambda s: any(r["round"] == state["round"] for r in s["history"]), 120)
    row = _row(st, state["round"])
    assert row["outcome"] == "aggregated" and row["model_version"] == state["version"] + 1


def test_tls_process_deployment_trains(tmp_path, deployments, self_signed_tls):
    import dataclasses

    tls = self_signed_tls
    spec = _spec(2)
    spec = dataclasses.replace(spec, tls=tls, policy=dataclasses.replace(spec.policy, rounds=2))
    d = Deployment(tmp_path / "dep", spec)
    deployments.append(d)
    d.start()
    st = d.wait_for(lambda s: s["phase"] == "done", 120)
    assert [r["outcome"] for r in st["history"]] == ["aggregated", "aggregated"]
    assert all(r["reporting"] == 2 for r in st["history"])
