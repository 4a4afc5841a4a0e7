"""A loopback deployment: scheduler, FL-Servers and FL-Clients as separate OS processes.

:class:`Deployment` writes one JSON node config (plain data; the deployment secret sits in its own
0600 file) into the deployment folder and starts nodes with ``python -m fedarena.federated.node``.
Each node logs to ``<folder>/logs/<node>.log``. The scheduler writes its bound port to
``scheduler.port`` and its round state to ``scheduler_state.fl``; starting a scheduler again on the
same folder resumes from that file. Before any node starts, the deployment issues every client a SecAgg
identity key (Ed25519) and the directory of all clients' public keys (``identity/``, keys mode 0600;
:func:`~fedarena.federated.secure_round.write_identities`), so clients refuse members and keys the
scheduler made up. Nodes can be killed (SIGKILL), stalled (SIGSTOP) and resumed
(SIGCONT) one by one, which is what the fault tests do.
"""

from __future__ import annotations

import json
import os
import signal as _signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedarena.federated import auth, wire
from fedarena.federated.client import ClientOptions
from fedarena.federated.protocol import model_bytes
from fedarena.federated.scheduler import RoundPolicy
from fedarena.federated.secure_round import write_identities
from fedarena.federated.server import ServerOptions
from fedarena.federated.task import TaskSpec
from fedarena.federated.transport import Peer, RemoteError, TLSFiles, TransportError
from fedarena.platform.errors import RunError


@dataclass(frozen=True)
class DeploymentSpec:
    task: TaskSpec = field(default_factory=TaskSpec)
    policy: RoundPolicy = field(default_factory=RoundPolicy)
    server: ServerOptions = field(default_factory=ServerOptions)
    client: ClientOptions = field(default_factory=ClientOptions)
    num_servers: int = 2
    init_seed: int = 0
    chunk_bytes: int = wire.DEFAULT_CHUNK_BYTES
    max_message_bytes: int = wire.DEFAULT_LIMITS.max_message_bytes
    tls: TLSFiles = field(default_factory=TLSFiles)
    attack: dict[str, Any] = field(default_factory=dict)
    """malicious clients (:func:`fedarena.federated.attacks.client_attack`): kind, params, the coalition's client
    indices, and the public round facts the attack uses; empty = every client honest"""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        cal = d["policy"].get("int8_calibration")
        if cal is not None:  # the int8 calibration sample: float32 values, exact as JSON numbers
            d["policy"]["int8_calibration"] = {"shape": list(cal.shape), "values": cal.ravel().tolist()}
        return d


def spec_from_json(d: dict[str, Any]) -> DeploymentSpec:
    from fedarena.federated.protocol import RoundConfig
    from fedarena.federated.strategy import ServerOptimizer

    pol = dict(d["policy"])
    pol["round_config"] = RoundConfig(**pol["round_config"])
    pol["server_optimizer"] = ServerOptimizer(**pol["server_optimizer"])
    if pol.get("devices") is not None:  # device budgets (docs/devices.md): the fleet and the width levels
        from fedarena.federated.devices import DeviceFleet, DeviceProfile
        from fedarena.federated.hetero import WidthLevels

        dev = dict(pol["devices"])
        dev["profiles"] = [DeviceProfile(**q) for q in dev["profiles"]]
        dev["level_sizes"] = [tuple(z) for z in dev["level_sizes"]]
        dev["int8_tiers"] = None if dev.get("int8_tiers") is None else tuple(dev["int8_tiers"])
        pol["devices"] = DeviceFleet(**dev)
        pol["widths"] = WidthLevels(**{**pol["widths"], "rates": tuple(pol["widths"]["rates"])})
        pol["device_clients"] = tuple(pol["device_clients"])
        cal = pol.get("int8_calibration")
        if cal is not None:
            import numpy as np

            pol["int8_calibration"] = np.asarray(cal["values"], np.float32).reshape(cal["shape"])
    task = dict(d["task"])
    task["hidden"] = tuple(task["hidden"])
    return DeploymentSpec(
        task=TaskSpec(**task), policy=RoundPolicy(**pol), server=ServerOptions(**d["server"]),
        client=ClientOptions(**d["client"]), num_servers=d["num_servers"], init_seed=d["init_seed"],
        chunk_bytes=d["chunk_bytes"], max_message_bytes=d["max_message_bytes"], tls=TLSFiles(**d["tls"]),
        attack=dict(d.get("attack") or {}),
    )


class NodeExited(RunError):
    """A scheduler or FL-Server process of the deployment exited while the run still needed it."""


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {_signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def client_name(i: int) -> str:
    return f"client{i:03d}"


class Deployment:
    """Start, watch, fault-inject and stop the processes of one loopback deployment."""

    def __init__(self, folder: str | Path, spec: DeploymentSpec, *, python: str = sys.executable) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "logs").mkdir(exist_ok=True)
        self.spec = spec
        self.python = python
        secret_path = self.folder / "secret.key"
        if not secret_path.exists():  # a resumed deployment keeps its secret, so old tokens stay valid
            fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(auth.new_secret())
        self.secret = secret_path.read_bytes()
        # the clients' SecAgg identity keys (a PKI): issued here, by the launcher, before any node starts
        write_identities(self.folder / "identity", [client_name(i) for i in range(spec.task.num_clients)])
        self.config_path = self.folder / "deployment.json"
        self.config_path.write_text(json.dumps(spec.to_json(), indent=1))
        self.procs: dict[str, subprocess.Popen] = {}
        self.scheduler_address = ""
        self._peer: Peer | None = None

    # -------------------------------------------------------------- processes

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.folder / "logs" / f"{name}.log", "ab")
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        env.setdefault("MKL_NUM_THREADS", "1")
        proc = subprocess.Popen([self.python, "-m", "fedarena.federated.node", str(self.folder), *args],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def start_scheduler(self, timeout: float = 60.0, port: int = 0) -> str:
        """Start the scheduler (on ``port``, 0 = any free port; a restart passes the old one so servers and clients
        find it again) and wait for its port; :class:`NodeExited` if it exits first."""
        port_file = self.folder / "scheduler.port"
        port_file.unlink(missing_ok=True)
        proc = self._spawn("scheduler", "scheduler", str(int(port)))
        end = time.monotonic() + timeout
        while not port_file.exists():
            if proc.poll() is not None:
                raise NodeExited(f"scheduler: exited at start ({_exit_reason(proc.returncode)}); see "
                                 f"{self.folder / 'logs' / 'scheduler.log'}")
            if time.monotonic() > end:
                raise NodeExited(f"scheduler: did not report its port within {timeout:g} s; see "
                                 f"{self.folder / 'logs' / 'scheduler.log'}")
            time.sleep(0.05)
        self.scheduler_address = f"127.0.0.1:{int(port_file.read_text())}"
        (self.folder / "scheduler.address").write_text(self.scheduler_address)
        if self._peer is not None:
            self._peer.close()
        self._peer = Peer(self.scheduler_address, chunk_bytes=self.spec.chunk_bytes,
                          limits=wire.Limits(max_message_bytes=self.spec.max_message_bytes), tls=self._client_tls())
        return self.scheduler_address

    def _client_tls(self) -> TLSFiles | None:
        return self.spec.tls if self.spec.tls.enabled else None

    def start_server(self, i: int) -> subprocess.Popen:
        return self._spawn(f"server{i}", "server", str(i))

    def start_client(self, i: int) -> subprocess.Popen:
        return self._spawn(client_name(i), "client", str(i))

    def start(self) -> None:
        """Scheduler, every server and every client of the task."""
        self.start_scheduler()
        for i in range(self.spec.num_servers):
            self.start_server(i)
        for i in range(self.spec.task.num_clients):
            self.start_client(i)

    def check_nodes(self, restart: bool = False) -> list[str]:
        """Supervise the scheduler and the FL-Servers: raise :class:`NodeExited` naming the first one whose process
        has exited, or, with ``restart``, start it again (the scheduler on its old port, resuming from its state
        file; a server re-joins and re-syncs) and return the names restarted. Clients are not watched: they may
        come and go."""
        restarted = []
        names = ["scheduler"] + [f"server{i}" for i in range(self.spec.num_servers)]
        for name in names:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is None:
                continue
            reason = _exit_reason(proc.returncode)
            if not restart:
                raise NodeExited(f"{name}: process exited ({reason}); see {self.folder / 'logs' / (name + '.log')}")
            if name == "scheduler":
                self.start_scheduler(port=int(self.scheduler_address.rsplit(":", 1)[1]))
            else:
                self.start_server(int(name[len("server"):]))
            with open(self.folder / "logs" / "supervisor.log", "a") as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {name} {reason}; restarted\n")
            restarted.append(name)
        return restarted

    def signal(self, name: str, sig: int = _signal.SIGKILL) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.kill(proc.pid, sig)
        if sig == _signal.SIGKILL:
            proc.wait(timeout=30)

    def stop(self, sig: int = _signal.SIGTERM) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, _signal.SIGCONT)
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, _signal.SIGKILL)
                proc.wait(timeout=10)
        if self._peer is not None:
            self._peer.close()
            self._peer = None

    # -------------------------------------------------------------- observing

    def status(self, timeout: float = 10.0) -> dict[str, Any]:
        assert self._peer is not None, "start the scheduler first"
        return self._peer.call("status", {"cluster_token": auth.cluster_token(self.secret)}, timeout=timeout).body

    def model(self, version: int) -> dict[str, Any]:
        assert self._peer is not None
        body = self._peer.call("get_model", {"cluster_token": auth.cluster_token(self.secret), "version": version},
                               timeout=30).body
        return body["params"]

    def model_bytes(self, version: int) -> bytes:
        return model_bytes(self.model(version))

    def wait_for(self, predicate, timeout: float, poll: float = 0.1, watch=None) -> dict[str, Any]:
        """Poll the scheduler's status until ``predicate(status)`` holds; raises TimeoutError with the last status.

        ``watch()`` runs before every poll (the experiment driver passes :meth:`check_nodes`, which raises
        :class:`NodeExited` for a dead scheduler or server)."""
        end = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < end:
            if watch is not None:
                watch()
            try:
                last = self.status()
                if predicate(last):
                    return last
            except (TransportError, RemoteError):
                pass
            time.sleep(poll)
        raise TimeoutError(f"condition not reached in {timeout}s; last status: round {last.get('round')}, "
                           f"phase {last.get('phase')}, history {len(last.get('history', []))} rounds")
