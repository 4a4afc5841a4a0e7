"""Process entry point of one deployment node: ``python -m fedarena.federated.node FOLDER ROLE [INDEX]``.

ROLE is ``scheduler``, ``server`` or ``client`` (for the scheduler, INDEX is the port to bind, 0 = any);
FOLDER holds ``deployment.json`` and ``secret.key`` written by
:class:`fedarena.federated.deployment.Deployment`, and ``identity/`` (a client reads its own SecAgg
identity key and the directory from there). Servers and clients find the scheduler through
``FOLDER/scheduler.address``. A node runs until SIGTERM (clients: until the
deployment is done).
"""

from __future__ import annotations

import json
import os
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from fedarena.federated import auth, wire


def _scheduler_address(folder: Path) -> str:
    path = folder / "scheduler.address"
    while not path.exists():
        time.sleep(0.05)
    return path.read_text().strip()


def main(argv: list[str] | None = None) -> int:
    from fedarena.federated.deployment import client_name, spec_from_json

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[1] not in ("scheduler", "server", "client"):
        print("usage: python -m fedarena.federated.node FOLDER scheduler|server|client [INDEX]", file=sys.stderr)
        return 2
    folder, role = Path(args[0]), args[1]
    index = int(args[2]) if len(args) > 2 else 0
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {role}{index if role != 'scheduler' else ''} "
                        "%(levelname)s %(name)s: %(message)s")
    spec = spec_from_json(json.loads((folder / "deployment.json").read_text()))
    secret = (folder / "secret.key").read_bytes()
    limits = wire.Limits(max_message_bytes=spec.max_message_bytes)
    tls = spec.tls if spec.tls.enabled else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    parent = os.getppid()

    def watch_parent() -> None:  # a node never outlives the process that launched the deployment
        while not stop.is_set():
            if os.getppid() != parent:
                stop.set()
            time.sleep(0.5)

    threading.Thread(target=watch_parent, daemon=True).start()

    if role == "scheduler":
        from fedarena.federated.scheduler import Scheduler
        from fedarena.federated.task import build_task

        task = build_task(spec.task)

        def evaluate(params):
            loss, acc = task.trainer.evaluate(params, *task.test)
            return {"test_loss": loss, "test_acc": acc}

        sched = Scheduler(spec.policy, task.trainer.init_params(spec.init_seed), secret,
                          folder / "scheduler_state.fl", evaluate=evaluate, limits=limits,
                          chunk_bytes=spec.chunk_bytes, tls=tls, client_tls=tls)
        port = sched.start(f"127.0.0.1:{index}")  # INDEX is the port for the scheduler (0 = any free port)
        tmp = folder / "scheduler.port.tmp"
        tmp.write_text(str(port))
        tmp.replace(folder / "scheduler.port")
        stop.wait()
        sched.stop()
        return 0

    address = _scheduler_address(folder)
    if role == "server":
        from fedarena.federated.server import FLServer

        server = FLServer(f"server{index}", address, secret, spec.server, limits=limits,
                          chunk_bytes=spec.chunk_bytes, tls=tls, scheduler_tls=tls)
        server.start("127.0.0.1:0")
        stop.wait()
        server.stop()
        return 0

    from fedarena.federated.client import FLClient
    from fedarena.federated.task import build_task

    from fedarena.federated.secure_round import load_identity

    task = build_task(spec.task)
    cid = client_name(index)
    identity = load_identity(folder / "identity", cid) if (folder / "identity" / f"{cid}.key").exists() else None
    attack, x, y = None, *task.clients[index]
    if spec.attack:
        from fedarena.federated.attacks import client_attack

        attack, x, y = client_attack(spec.attack, index, task.sizes[-1], x, y)
    client = FLClient(cid, auth.client_token(secret, cid), address, (x, y), task.trainer,
                      spec.client, limits=limits, chunk_bytes=spec.chunk_bytes,
                      tls=tls.for_client(cid) if tls is not None else None, identity=identity, attack=attack)
    worker = threading.Thread(target=client.run, daemon=True)
    worker.start()
    while worker.is_alive() and not stop.is_set():
        worker.join(0.2)
    logging.getLogger("fedarena.federated.client").info("%s: exiting: %s", cid, client.stats)
    return 0


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # do not wait at exit for gRPC worker threads parked in long-polls
