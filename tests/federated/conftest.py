"""In-process FL clusters for the federated tests (a real scheduler and FL-Servers on loopback gRPC) and the
hand-computed oracles the width-scaled and int8 client tests share."""

from __future__ import annotations

import pytest

from fedarena.federated import auth, wire
from fedarena.federated.protocol import RoundConfig
from fedarena.federated.scheduler import RoundPolicy, Scheduler
from fedarena.federated.server import FLServer, ServerOptions
from fedarena.federated.task import TaskSpec, build_task
from fedarena.federated.transport import Peer

SMALL_TASK = TaskSpec(dataset="synthetic", num_clients=4, hidden=(8,), trainer="numpy", synthetic_features=10,
                      synthetic_classes=3, synthetic_examples=400)


class Cluster:
    def __init__(self, tmp_path, policy, n_servers=2, tls=None, task=SMALL_TASK, server_options=None, limits=None,
                 chunk_bytes=wire.DEFAULT_CHUNK_BYTES, aggregator=None, strategy=None):
        self.chunk_bytes = chunk_bytes
        self.task = build_task(task)
        self.secret = auth.new_secret()
        self.limits = limits or wire.DEFAULT_LIMITS
        self.tls = tls
        self.scheduler = Scheduler(policy, self.task.trainer.init_params(0), self.secret, tmp_path / "state.fl",
                                   evaluate=self.evaluate, tls=tls, client_tls=tls, limits=self.limits,
                                   chunk_bytes=chunk_bytes, aggregator=aggregator, strategy=strategy)
        port = self.scheduler.start("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        opts = server_options or ServerOptions(sync_wait_s=0.2, max_update_norm=50.0)
        self.servers = [FLServer(f"s{i}", self.address, self.secret, opts, tls=tls, scheduler_tls=tls,
                                 limits=self.limits, chunk_bytes=chunk_bytes) for i in range(n_servers)]
        for s in self.servers:
            s.start("127.0.0.1:0")
        self.peers = []

    def evaluate(self, params):
        loss, acc = self.task.trainer.evaluate(params, *self.task.test)
        return {"test_loss": loss, "test_acc": acc}

    def token(self, cid):
        return auth.client_token(self.secret, cid)

    def peer(self, server_index):
        p = Peer(self.servers[server_index].address, tls=self.tls, limits=self.limits, chunk_bytes=self.chunk_bytes)
        self.peers.append(p)
        return p

    def run_clients(self, n, **options):
        """``n`` FLClient threads ``c0..c{n-1}`` with ``ClientOptions(**options)`` until the scheduler is done."""
        import threading

        from fedarena.federated.client import ClientOptions, FLClient

        clients = [FLClient(f"c{i}", self.token(f"c{i}"), self.address, self.task.clients[i], self.task.trainer,
                            ClientOptions(**options)) for i in range(n)]
        threads = [threading.Thread(target=cl.run, daemon=True) for cl in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for cl in clients:
            cl.close()
        return clients

    def close(self):
        for p in self.peers:
            p.close()
        for s in self.servers:
            s.stop()
        self.scheduler.stop()


@pytest.fixture
def make_cluster(tmp_path):
    made = []

    def make(policy=None, **kw):
        policy = policy or RoundPolicy(rounds=3, window_seconds=60, start_clients=2, min_fraction=0.5,
                                       round_config=RoundConfig(epochs=1, batch_size=8, lr=0.1))
        c = Cluster(tmp_path, policy, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def self_signed_tls(tmp_path):
    """A self-signed certificate for 'localhost' (PEM files in tmp_path) as TLSFiles for nodes and clients."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    from fedarena.federated.transport import TLSFiles

    return TLSFiles(cert_chain=str(tmp_path / "cert.pem"), private_key=str(tmp_path / "key.pem"),
                    root_cert=str(tmp_path / "cert.pem"), server_name="localhost")


class InProcessGrid:
    """A Flower Grid stand-in that delivers each message to a ClientApp in this process (node i = partition i);
    ``tamper`` rewrites a node's train reply (a hostile or broken client)."""

    def __init__(self, app, n, tamper=None):
        from flwr.app import Context, RecordDict

        self.app, self.n, self.tamper = app, n, tamper or {}
        self.contexts = {i + 1: Context(run_id=0, node_id=i + 1, node_config={"partition-id": i}, state=RecordDict(),
                                        run_config={}) for i in range(n)}

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        from flwr.app import Message, Metadata

        out = []
        for m in messages:
            node = m.metadata.dst_node_id
            meta = Metadata(run_id=0, message_id=f"m{len(out)}", src_node_id=0, dst_node_id=node, reply_to_message_id="",
                            group_id="", created_at=0.0, ttl=60.0, message_type=m.metadata.message_type)
            reply = self.app(Message(m.content, metadata=meta), self.contexts[node])
            if node in self.tamper and m.metadata.message_type == "train":
                reply = Message(self.tamper[node](reply.content), reply_to=Message(m.content, metadata=meta))
            out.append(reply)
        return out


@pytest.fixture
def in_process_grid():
    """The :class:`InProcessGrid` class (Flower's Grid interface, messages delivered in this process)."""
    return InProcessGrid


@pytest.fixture
def flower_task_identity():
    """What a ServerApp run sets before a strategy creates Messages (restored afterwards)."""
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 0, 0, 0
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = old


@pytest.fixture
def cli_error_line(capsys):
    """``check(config, out, sets, message)``: ``fedarena run config --out out --set s...`` exits 2 with one
    stderr line that contains ``message``."""
    from fedarena.platform.cli import main

    def check(config, out, sets, message):
        args = ["run", str(config), "--out", str(out), "--quiet"]
        for s in sets:
            args += ["--set", s]
        assert main(args) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and message in err[0], err

    return check


def _sgd_step_by_hand(sub, x, y, lr, scale):
    """One full-batch SGD step of relu(x W0 + b0) * scale -> W1, b1 with mean cross-entropy, in float64."""
    import numpy as np

    w0, b0, w1, b1 = (np.asarray(sub[k], np.float64) for k in ("l0.w", "l0.b", "l1.w", "l1.b"))
    x = np.asarray(x, np.float64)
    pre = x @ w0 + b0
    h = np.maximum(pre, 0) * scale
    z = h @ w1 + b1
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz = (p - np.eye(z.shape[1])[y]) / len(y)
    dpre = (dz @ w1.T) * scale * (pre > 0)
    grads = {"l0.w": x.T @ dpre, "l0.b": dpre.sum(0), "l1.w": h.T @ dz, "l1.b": dz.sum(0)}
    return {k: np.asarray(sub[k], np.float64) - lr * g for k, g in grads.items()}


@pytest.fixture
def sgd_step_by_hand():
    """``step(sub, x, y, lr, scale)``: one float64 full-batch SGD step of the two-layer MLP ``sub`` whose hidden
    ReLU outputs are multiplied by ``scale`` (the oracle of the width-scaled and int8 client tests)."""
    return _sgd_step_by_hand


def _pooled_clients(task):
    """``(x, y, train)``: the clients' examples of a built task stacked in client order, and each client's rows."""
    import numpy as np

    x = np.concatenate([cl[0] for cl in task.clients])
    y = np.concatenate([cl[1] for cl in task.clients])
    off = np.cumsum([0] + [len(cl[1]) for cl in task.clients])
    return x, y, [np.arange(off[i], off[i + 1]) for i in range(len(task.clients))]


@pytest.fixture
def pooled_clients():
    """``pool(task)``: ``(x, y, train)``, a built task's clients' examples stacked in client order and each
    client's rows (the data layout of :class:`fedarena.federated.simulation.Simulation`)."""
    return _pooled_clients


@pytest.fixture
def device_simulation():
    """``make(task, cfg, devices, widths, seed)``: the in-process oracle of the gRPC device rounds, a FedAvg
    ``Simulation`` of the MLP of a built task over its pooled clients (all of them each round, ids ``c0``, ``c1``,
    ...), with device fleet ``devices`` and width levels ``widths``."""
    from fedarena.federated.simulation import BatchedMLP, Simulation
    from fedarena.federated.strategy import FedAvg, FitConfig

    def make(task, cfg, devices, widths, seed):
        x, y, train = _pooled_clients(task)
        n = len(task.clients)
        fedavg = FedAvg(FitConfig(cfg.epochs, cfg.batch_size, cfg.lr), clients_per_round=n)
        return Simulation(BatchedMLP(task.sizes), fedavg,
                          x, y, train, [f"c{i}" for i in range(n)], task.sizes[-1], seed=seed, devices=devices,
                          widths=widths, eval_clients=False)

    return make
