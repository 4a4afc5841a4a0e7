"""FL-Server: authenticates clients, serves the round's task, validates uploads, aggregates partially.

One of several FL-Servers of a deployment (MindSpore Federated's loosely coupled servers, FL
chapter): each server follows the scheduler's round plan through a ``sync`` long-poll, caches the
global model of the current version, and answers any client (a client may switch servers at any
time and gets the same round and model). Uploads are validated in this order, each failure being a
clear ``error`` reply that is also logged, while the server keeps serving:

1. token (HMAC, :mod:`fedarena.federated.auth`) and registration here (``register`` first) -> ``unauthenticated``
2. the round is open and ``round`` / ``model_version`` match -> ``stale_round`` / ``stale_version``
3. the client is selected in this round -> ``not_selected``
4. ``num_examples`` in 1..``max_examples`` and at most the count the client registered here ->
   ``too_many_examples``; finite ``train_loss``
5. payload names, dtypes, shapes, indices, finiteness (:func:`~fedarena.federated.stages.decode_update`)
6. global L2 norm of the delta <= ``max_update_norm`` -> ``norm_bound``
7. fresh 16-byte nonce (replays of an earlier message) -> ``replay``; one upload per round -> ``duplicate``
8. the scheduler's global counter admits it (one count per client per round over all servers)

Accepted deltas enter this server's :class:`~fedarena.federated.strategy.PartialAggregate`
(example-weighted sum), which is sent to the scheduler when the round closes. When the scheduler
needs individual deltas (its plan says ``collect_updates``: the default bounded mean, which clips each
delta to a multiple of the round's median norm and caps each weight, or a robust rule), the server also
sends every accepted client's delta and weight, since neither can be formed from sums.

Under device budgets the plan names each selected client's sub-model: the server sends that client its
sub-model of the global model with HeteroFL's scaler (``submodel`` in the task), checks its upload against the
sub-model's shapes, and forwards the delta individually (sub-models of different widths have no common sum). An
int8 client (``submodel.int8`` in the plan) gets its level's int8 file from the plan (``int8``, checked to parse
as that sub-model's MLP) instead of the float32 sub-model.

A client's example count is fixed by its ``register``: registering again here may keep or lower it but
not raise it, and an upload may not claim more than the registered count.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedarena.federated import auth, wire
from fedarena.federated.protocol import CLIENT_KINDS, Phase, RoundConfig, params_shapes, signds_config
from fedarena.federated.stages import decode_signds, decode_update, global_norm
from fedarena.federated.strategy import PartialAggregate
from fedarena.federated.transport import Peer, ProtocolError, RemoteError, TLSFiles, TransportError, serve

log = logging.getLogger("fedarena.federated.server")


@dataclass(frozen=True)
class ServerOptions:
    """An FL-Server's limits: ``max_update_norm``, uploads whose delta has a larger global L2 norm are refused;
    ``max_examples``, the largest num_examples a client may claim (bounds its FedAvg weight; deployments set it from
    the task); ``max_wait_s``, the longest long-poll a client may ask for; ``sync_wait_s``, the long-poll of the
    server's own sync with the scheduler; ``nonce_memory``, how many upload nonces it remembers against replays."""

    max_update_norm: float = 100.0
    max_examples: int = 1_000_000
    max_wait_s: float = 5.0
    sync_wait_s: float = 1.0
    nonce_memory: int = 100_000

    def __post_init__(self) -> None:
        if isinstance(self.max_examples, bool) or not isinstance(self.max_examples, int) or self.max_examples < 1:
            raise ValueError(f"server.max_examples: must be an integer >= 1, got {self.max_examples!r}")


class FLServer:
    def __init__(
        self,
        server_id: str,
        scheduler_address: str,
        secret: bytes,
        options: ServerOptions = ServerOptions(),
        *,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
        chunk_bytes: int = wire.DEFAULT_CHUNK_BYTES,
        tls: TLSFiles | None = None,
        scheduler_tls: TLSFiles | None = None,
    ) -> None:
        self.server_id = server_id
        self.secret = secret
        self.options = options
        self.limits = limits
        self.chunk_bytes = chunk_bytes
        self.tls = tls
        self.scheduler = Peer(scheduler_address, limits=limits, chunk_bytes=chunk_bytes, tls=scheduler_tls)
        self.cluster_token = auth.cluster_token(secret)
        self.cond = threading.Condition()
        self.upload_lock = threading.Lock()
        self.plan: dict[str, Any] = {"round": 0, "phase": Phase.IDLE.value, "model_version": -1, "selected": [],
                                     "config": {}, "deadline_s": 0.0}
        self.selected: frozenset[str] = frozenset()
        self.round_config = RoundConfig()
        self.signds = None
        self.params: dict[str, np.ndarray] | None = None
        self.params_version = -1
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.model_size = 0
        self.clients: dict[str, list[float]] = {}  # id -> [num_examples, last_seen]
        self.partial = PartialAggregate()
        self.partial_round = 0
        self.partial_sent = -1
        self.uploaded: set[str] = set()
        self.collect = False  # the plan asks for individual updates (robust aggregation at the scheduler)
        self.submodels: dict[str, tuple[dict[str, np.ndarray], dict[str, Any]]] = {}
        """device budgets: client -> (its sub-model this round, its task's ``submodel`` entry)"""
        self.updates: dict[str, tuple[dict[str, np.ndarray], float]] = {}
        self.nonces: OrderedDict[bytes, None] = OrderedDict()
        self.bytes_up = 0
        self.bytes_down = 0
        self.rejections: dict[str, int] = {}
        self._stop = threading.Event()
        self._grpc = None
        self.port = 0
        self.address = ""

    # -------------------------------------------------------------- lifecycle

    def start(self, address: str = "127.0.0.1:0") -> int:
        self._grpc, self.port = serve(self.handle, address, kinds=CLIENT_KINDS, limits=self.limits,
                                      chunk_bytes=self.chunk_bytes, tls=self.tls, name=self.server_id,
                                      secret=self.secret)
        host = address.rsplit(":", 1)[0]
        self.address = f"{host}:{self.port}"
        self._join()
        threading.Thread(target=self._sync_loop, name=f"{self.server_id}-sync", daemon=True).start()
        return self.port

    def stop(self) -> None:
        self._stop.set()
        with self.cond:
            self.cond.notify_all()
        if self._grpc is not None:
            self._grpc.stop(grace=0.5)
        self.scheduler.close()

    def _join(self) -> None:
        delay = 0.05
        while not self._stop.is_set():
            try:
                self.scheduler.call("server_join", {"server_id": self.server_id, "cluster_token": self.cluster_token,
                                                    "address": self.address}, timeout=5)
                return
            except (TransportError, RemoteError) as e:
                log.warning("%s: could not join the scheduler (%s); retrying", self.server_id, e)
                time.sleep(delay)
                delay = min(2.0, delay * 2)

    # -------------------------------------------------------------- scheduler sync

    def _sync_loop(self) -> None:
        delay = 0.05
        while not self._stop.is_set():
            now = time.monotonic()
            with self.cond:
                clients = {c: [v[0], now - v[1]] for c, v in self.clients.items()}
                known = (self.plan["round"], self.plan["phase"])
            try:
                reply = self.scheduler.call("sync", {
                    "server_id": self.server_id, "cluster_token": self.cluster_token, "known_round": known[0],
                    "known_phase": known[1], "known_version": self.params_version, "clients": clients,
                    "wait_s": self.options.sync_wait_s,
                }, timeout=self.options.sync_wait_s + 10)
                self._apply_plan(reply.body)
                delay = 0.05
            except RemoteError as e:
                if e.code == "unauthenticated" and "server_join" in e.reason:
                    self._forget_round()  # a restarted scheduler re-runs its unfinished round from the start
                    self._join()  # the scheduler restarted and forgot us
                else:
                    log.warning("%s: sync refused: %s", self.server_id, e)
                    time.sleep(delay)
            except (TransportError, wire.WireError) as e:
                log.info("%s: scheduler unreachable (%s); retrying", self.server_id, e)
                time.sleep(delay)
                delay = min(2.0, delay * 2)
            except Exception:  # noqa: BLE001 - the sync thread must survive anything a plan does
                log.exception("%s: sync failed; retrying", self.server_id)
                time.sleep(0.5)

    def _forget_round(self) -> None:
        """Drop this round's uploads and partial: the scheduler that admitted them is gone, and its successor (resumed
        from its state file) opens the same round number afresh, so those clients must be able to upload again."""
        with self.upload_lock, self.cond:
            self.partial, self.partial_round, self.partial_sent = PartialAggregate(), 0, -1
            self.uploaded, self.updates = set(), {}
            self.bytes_up = self.bytes_down = 0

    def _apply_plan(self, plan: dict[str, Any]) -> None:
        version = wire.field(plan, "model_version", int)
        phase = wire.field(plan, "phase", str)
        rnd = wire.field(plan, "round", int)
        if phase == Phase.OPEN and version != self.params_version:
            if "params" in plan:
                params = wire.field(plan, "params", dict)
            else:
                reply = self.scheduler.call("get_model", {"cluster_token": self.cluster_token, "version": version},
                                            timeout=30)
                params = wire.field(reply.body, "params", dict)
            with self.cond:
                self.params = {k: np.asarray(v) for k, v in params.items()}
                self.params_version = version
                self.shapes = params_shapes(self.params)
                self.model_size = len(wire.encode("params", {"params": self.params}, self.limits))
        with self.upload_lock, self.cond:
            if rnd != self.partial_round:
                self.partial, self.partial_round = PartialAggregate(), rnd
                self.uploaded, self.updates = set(), {}
                self.bytes_up = self.bytes_down = 0
            if phase == Phase.OPEN and plan.get("config"):
                self.round_config = RoundConfig.from_body(plan["config"])
                self.signds = signds_config(self.round_config, self.shapes)
            self.plan = {k: v for k, v in plan.items() if k not in ("params", "submodels", "int8_files")}
            if phase == Phase.OPEN:
                self.submodels = self._check_submodels(plan.get("submodels"), plan.get("int8_files"))
            self.plan["received_at"] = time.monotonic()
            self.selected = frozenset(plan.get("selected", []))
            if phase == Phase.OPEN:
                self.collect = bool(plan.get("collect_updates", False))
            self.cond.notify_all()
        if phase == Phase.CLOSING and self.partial_sent != rnd:
            self._send_partial(rnd)

    def _check_submodels(self, plan_sub: Any, plan_int8: Any = None
                         ) -> dict[str, tuple[dict[str, np.ndarray], dict[str, Any]]]:
        """Each client's sub-model of this round (device budgets): its parameters (the kept units of every layer of
        the global model, :func:`fedarena.federated.hetero.extract`) and what its task says of it; an int8 client's
        task carries its level's int8 file (``int8``), checked here to parse as that sub-model's MLP."""
        if plan_sub is None:
            return {}
        from fedarena.federated.hetero import extract

        out = {}
        depth = len(self.shapes) // 2
        files = [] if plan_int8 is None else wire.field({"int8_files": plan_int8}, "int8_files", list, where="plan")
        checked: dict[int, bytes] = {}
        for cid, sub in wire.field({"submodels": plan_sub}, "submodels", dict).items():
            units = wire.field(sub, "units", list)
            if len(units) != depth + 1:
                raise wire.WireError(f"plan.submodels.{cid}.units", f"expected {depth + 1} index arrays")
            index = [wire.check_array(u, f"plan.submodels.{cid}.units", dtype="int64") for u in units]
            level = wire.field(sub, "level", int)
            task: dict[str, Any] = {"level": level, "scale": wire.field(sub, "scale", float)}
            params = extract(self.params, index)
            if wire.field(sub, "int8", bool, default=False):
                if level not in checked:
                    checked[level] = self._check_int8(files, level, params)
                task["int8"] = checked[level]
            out[cid] = (params, task)
        return out

    @staticmethod
    def _check_int8(files: list, level: int, params: dict[str, np.ndarray]) -> bytes:
        """Width level ``level``'s int8 file of the plan, checked to be the ReLU MLP of the sub-model ``params``."""
        from fedarena.federated.int8_clients import parse_int8_mlp

        where = f"plan.int8_files[{level}]"
        if not 0 <= level < len(files):
            raise wire.WireError(where, f"missing ({len(files)} files)")
        depth = len(params) // 2
        try:
            _, sizes = parse_int8_mlp(files[level], where, params["l0.w"].shape[0], params[f"l{depth - 1}.w"].shape[1])
        except ValueError as e:
            raise wire.WireError(where, str(e).removeprefix(f"{where}: ")) from None
        want = (params["l0.w"].shape[0], *(params[f"l{i}.w"].shape[1] for i in range(depth)))
        if sizes != want:
            raise wire.WireError(where, f"layer sizes {sizes} are not the sub-model's {want}")
        return bytes(files[level])

    def _send_partial(self, rnd: int) -> None:
        with self.upload_lock:  # no upload can slip in between the snapshot and the send
            part = self.partial
            body = {
                "server_id": self.server_id, "cluster_token": self.cluster_token, "round": rnd,
                "weight": part.weight, "clients": list(part.clients), "loss_sum": part.loss_sum,
                "sums": part.sums, "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
            }
            if self.collect:
                body["updates"] = {c: d for c, (d, _) in self.updates.items()}
                body["update_weights"] = {c: w for c, (_, w) in self.updates.items()}
        try:
            self.scheduler.call("partial", body, timeout=30)
            self.partial_sent = rnd
        except RemoteError as e:
            log.warning("%s: partial for round %d refused: %s", self.server_id, rnd, e)
            self.partial_sent = rnd
        except TransportError as e:
            log.warning("%s: partial for round %d not delivered: %s", self.server_id, rnd, e)

    # -------------------------------------------------------------- client requests

    def _refuse(self, field: str, reason: str, code: str) -> ProtocolError:
        self.rejections[code] = self.rejections.get(code, 0) + 1
        return ProtocolError(field, reason, code)

    def _auth(self, b: dict[str, Any]) -> str:
        cid = b.get("client_id")
        reason = auth.check_client(self.secret, cid, b.get("token"))
        if reason:
            raise self._refuse("body.token" if auth.valid_client_id(cid) else "body.client_id", reason,
                               "unauthenticated")
        return cid  # type: ignore[return-value]

    def _registered(self, cid: str) -> None:
        """Uploads and secure-aggregation messages come only from clients that registered here."""
        with self.cond:
            known = cid in self.clients
        if not known:
            raise self._refuse("body.client_id", f"client {cid} is not registered here (send register)",
                               "unauthenticated")

    def handle(self, msg: wire.Message, nbytes: int = 0) -> tuple[str, dict[str, Any]]:
        try:
            return self._dispatch(msg, nbytes)
        except wire.WireError as e:  # a missing or mistyped field
            self.rejections["malformed"] = self.rejections.get("malformed", 0) + 1
            log.info("%s: refused %s: %s", self.server_id, msg.kind, e)
            raise ProtocolError(e.field, e.reason, "malformed") from None
        except ProtocolError as e:
            log.info("%s: refused %s from %r: %s", self.server_id, msg.kind, msg.body.get("client_id"), e)
            raise

    def _dispatch(self, msg: wire.Message, nbytes: int) -> tuple[str, dict[str, Any]]:
        if msg.kind == "ping":
            return "pong", {"node": self.server_id}
        b = msg.body
        cid = self._auth(b)
        if msg.kind == "register":
            n = wire.field(b, "num_examples", int)
            if not 1 <= n <= self.options.max_examples:
                raise self._refuse("body.num_examples", f"must lie in 1..{self.options.max_examples}, got {n}",
                                   "too_many_examples")
            with self.cond:
                known = self.clients.get(cid)
                if known is not None and n > known[0]:
                    raise self._refuse("body.num_examples", f"client {cid} registered {int(known[0])} examples "
                                       f"here; a registration may not raise it (got {n})", "too_many_examples")
                self.clients[cid] = [float(n), time.monotonic()]
                return "registered", {"server_id": self.server_id, "round": self.plan["round"]}
        if msg.kind == "get_task":
            return self._get_task(cid, b)
        if msg.kind == "upload":
            self._registered(cid)
            return self._upload(cid, b, nbytes)
        if msg.kind in ("secagg_send", "secagg_poll"):
            self._registered(cid)
            return self._secagg(msg.kind, cid, b, nbytes)
        raise ProtocolError("kind", f"unsupported request kind {msg.kind!r}", "malformed")

    def _get_task(self, cid: str, b: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        have = wire.field(b, "have_version", int)
        wait_s = min(max(wire.field(b, "wait_s", float, default=0.0), 0.0), self.options.max_wait_s)
        end = time.monotonic() + wait_s
        with self.cond:
            if cid not in self.clients:
                raise self._refuse("body.client_id", f"client {cid} is not registered here (send register)",
                                   "unauthenticated")
            while True:
                self.clients[cid][1] = time.monotonic()
                plan = self.plan
                if plan["phase"] == Phase.DONE:
                    return "done", {"round": plan["round"]}
                if (plan["phase"] == Phase.OPEN and cid in self.selected and cid not in self.uploaded
                        and self.params_version == plan["model_version"]):
                    left = plan["deadline_s"] - (time.monotonic() - plan["received_at"])
                    body: dict[str, Any] = {"round": plan["round"], "model_version": plan["model_version"],
                                            "config": plan["config"], "deadline_s": max(0.0, left)}
                    if self.round_config.secagg:
                        body["secagg_party"] = sorted(self.selected).index(cid) + 1
                        body["secagg_selected"] = len(self.selected)
                        body["secagg_members"] = sorted(self.selected)  # party i is members[i - 1]
                    if cid in self.submodels:  # device budgets: this client's sub-model, every time
                        sub, task = self.submodels[cid]
                        body["submodel"] = {k: v for k, v in task.items() if k != "int8"}
                        if "int8" in task:  # int8 download: the int8 file instead of the float32 sub-model
                            body["submodel"]["int8"] = True
                            body["int8"] = task["int8"]
                            self.bytes_down += len(wire.encode("int8", {"int8": task["int8"]}, self.limits))
                        else:
                            body["params"] = sub
                            self.bytes_down += len(wire.encode("params", {"params": sub}, self.limits))
                    elif have != plan["model_version"]:
                        body["params"] = self.params
                        self.bytes_down += self.model_size
                    return "task", body
                left = end - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return "wait", {"round": plan["round"], "reason": f"round {plan['round']} is {plan['phase']}"
                                    + ("" if cid in self.selected or plan["phase"] != Phase.OPEN else "; not selected")}
                self.cond.wait(left)

    def _secagg(self, kind: str, cid: str, b: dict[str, Any], nbytes: int) -> tuple[str, dict[str, Any]]:
        """Relay a secure-aggregation message to / from the scheduler (which holds the SecAgg server)."""
        rnd = wire.field(b, "round", int)
        with self.cond:
            plan, selected, secure = dict(self.plan), self.selected, self.round_config.secagg
        if plan["phase"] != Phase.OPEN or rnd != plan["round"] or not secure:
            raise self._refuse("body.round", f"round {rnd} is not an open secure round (current round "
                               f"{plan['round']} is {plan['phase']})", "stale_round")
        if cid not in selected:
            raise self._refuse("body.client_id", f"client {cid} is not selected in round {rnd}", "not_selected")
        common = {"server_id": self.server_id, "cluster_token": self.cluster_token, "round": rnd, "client_id": cid}
        if kind == "secagg_send":
            body = dict(common, message=wire.field(b, "message", bytes))
            timeout = 30.0
        else:
            wait_s = min(max(wire.field(b, "wait_s", float, default=0.0), 0.0), self.options.max_wait_s)
            body = dict(common, stage=wire.field(b, "stage", int), wait_s=wait_s)
            timeout = wait_s + 30.0
        try:
            reply = self.scheduler.call("secagg_up" if kind == "secagg_send" else "secagg_down", body, timeout=timeout)
        except RemoteError as e:
            raise self._refuse(e.field, e.reason, e.code) from None
        except TransportError as e:
            raise self._refuse("server", f"scheduler unreachable ({e.code}); retry later", "unavailable") from None
        with self.cond:
            if self.partial_round != rnd:
                # the round moved on while the scheduler answered: this client takes no part in the new round yet,
                # so it must not be marked (that would lock it out of the new round's task)
                return reply.kind, reply.body
            if kind == "secagg_send":
                self.uploaded.add(cid)  # taking part: get_task no longer offers this round's task
                self.bytes_up += nbytes
            elif reply.kind == "secagg":
                self.bytes_down += len(reply.body.get("message", b""))
        return reply.kind, reply.body

    def _upload(self, cid: str, b: dict[str, Any], nbytes: int) -> tuple[str, dict[str, Any]]:
        rnd = wire.field(b, "round", int)
        version = wire.field(b, "model_version", int)
        nonce = wire.field(b, "nonce", bytes)
        n = wire.field(b, "num_examples", int)
        loss = wire.field(b, "train_loss", float)
        encoding = wire.field(b, "encoding", str)
        payload = wire.field(b, "update", dict)
        with self.upload_lock:
            with self.cond:
                plan = dict(self.plan)
                selected = self.selected
            if plan["phase"] != Phase.OPEN or rnd != plan["round"]:
                raise self._refuse("body.round", f"round {rnd} is not open (current round {plan['round']} is "
                                   f"{plan['phase']})", "stale_round")
            if version != plan["model_version"] or version != self.params_version:
                raise self._refuse("body.model_version", f"model version {version} is not the round's "
                                   f"{plan['model_version']}", "stale_version")
            if cid not in selected:
                raise self._refuse("body.client_id", f"client {cid} is not selected in round {rnd}", "not_selected")
            if self.round_config.secagg:
                raise self._refuse("body.encoding", "this round uses secure aggregation (send secagg_send messages)",
                                   "malformed")
            if len(nonce) != 16:
                raise self._refuse("body.nonce", f"must be 16 bytes, got {len(nonce)}", "malformed")
            if not 1 <= n <= self.options.max_examples:
                raise self._refuse("body.num_examples", f"must lie in 1..{self.options.max_examples}, got {n}",
                                   "too_many_examples")
            with self.cond:
                registered = int(self.clients[cid][0])
            if n > registered:
                raise self._refuse("body.num_examples", f"client {cid} claims {n} examples but registered "
                                   f"{registered}", "too_many_examples")
            if not math.isfinite(loss):
                raise self._refuse("body.train_loss", "must be finite", "malformed")
            if self.signds is not None:
                if encoding != "signds":
                    raise self._refuse("body.encoding", f"this round takes SignDS reports only, got {encoding!r}",
                                       "malformed")
                delta = decode_signds(payload, self.shapes, self.signds, self.round_config.signds_lr)
                weight = 1  # SignDS averages the reports with equal weight (Jiang et al. 2022)
            else:
                sub = self.submodels.get(cid)
                delta = decode_update(encoding, payload, self.shapes if sub is None else params_shapes(sub[0]))
                weight = n
            norm = global_norm(delta)
            if not norm <= self.options.max_update_norm:
                raise self._refuse("body.update", f"update norm {norm:.4g} exceeds the bound "
                                   f"{self.options.max_update_norm}", "norm_bound")
            if nonce in self.nonces:
                raise self._refuse("body.nonce", "this message was already received (replay)", "replay")
            if cid in self.uploaded:
                raise self._refuse("body.client_id", f"client {cid} already uploaded in round {rnd}", "duplicate")
            self.nonces[nonce] = None
            while len(self.nonces) > self.options.nonce_memory:
                self.nonces.popitem(last=False)
            try:
                admitted = self.scheduler.call("admit", {"server_id": self.server_id, "cluster_token": self.cluster_token,
                                                         "round": rnd, "client_id": cid}, timeout=10)
            except RemoteError as e:
                raise self._refuse(e.field, e.reason, e.code) from None
            except TransportError as e:
                self.nonces.pop(nonce, None)  # not counted anywhere: the client may retry this very message
                raise self._refuse("server", f"scheduler unreachable ({e.code}); retry later", "unavailable") from None
            # sub-models differ in shape: the scheduler averages their individual updates per coordinate
            self.partial.add(cid, delta if cid not in self.submodels else {}, weight, loss)
            if self.collect:
                self.updates[cid] = (delta, float(weight))
            self.uploaded.add(cid)
            self.bytes_up += nbytes
            return "ack", {"round": rnd, "clients_admitted": int(admitted.body.get("count", 0))}

