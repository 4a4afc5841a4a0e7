"""FL-Client: fetch the round's model and config, train locally, protect and compress, upload, retry.

The client loop (FL chapter, FL-Client; FedAvg client update of McMahan et al. 2017, Algorithm 1):
ask the scheduler for a server (``assign``), ``register`` there with its token, then long-poll
``get_task``. For a task it trains E epochs of minibatch size B from the global model (FedProx term
when ``prox_mu > 0``), forms ``Delta = w_local - w_global``, runs the upload stages (clip, local DP,
then an encoder: dense / top-k / 8-bit) and uploads with a fresh 16-byte nonce.

Faults: transport failures are retried with exponential backoff and jitter; after
``switch_after`` consecutive failures the client reports the server to the scheduler and moves to
the server it is given (the same round and model are served there, and an upload that already
reached the old server is not counted twice: the scheduler admits a client once per round).
A restarted client process with the same id simply registers again (rejoin).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedarena.federated import wire
from fedarena.federated.protocol import RoundConfig, params_shapes, signds_config
from fedarena.federated.stages import Clip, GaussianLDP, UploadStage, encode_signds, encode_update
from fedarena.federated.trainer import LocalTrainer
from fedarena.federated.transport import Peer, RemoteError, TLSFiles, TransportError
from fedarena.privacy.secure_random import SecureRandom

log = logging.getLogger("fedarena.federated.client")


@dataclass(frozen=True)
class ClientOptions:
    encoding: str = "dense"
    """upload encoder: dense, topk or q8"""
    topk_fraction: float = 0.1
    clip_norm: float = 0.0
    """clip the delta to this global L2 norm before upload (0 = off)"""
    ldp_epsilon: float = 0.0
    """local DP (Gaussian mechanism) epsilon per upload; 0 = off; needs ldp_clip_norm"""
    ldp_delta: float = 1e-5
    ldp_clip_norm: float = 1.0
    wait_s: float = 2.0
    """long-poll length of get_task"""
    backoff_s: float = 0.05
    backoff_max_s: float = 2.0
    switch_after: int = 2
    """consecutive transport failures before asking the scheduler for another server"""
    rpc_timeout_s: float = 30.0
    seed: int = 0
    """seed of local training (minibatch order)"""
    secagg_min_threshold: float = 0.5
    """the lowest ``secagg_threshold`` this client accepts from a round's config (a scheduler that lowers the
    threshold of a secure round below it is refused); deployments set it to their configured value"""
    secagg_min_colluders: int = -1
    """the colluders a secure round's threshold must resist (``secagg_colluders`` rule; -1 = no such floor)"""
    privacy_seed: int = -1
    """seed of the privacy randomness (LDP noise, SignDS; compression's rounding follows ``seed``);
    -1 = every draw from the OS CSPRNG (:class:`~fedarena.privacy.secure_random.SecureRandom`); a seed is for
    reproducible tests only"""

    def stages(self) -> list[UploadStage]:
        out: list[UploadStage] = []
        if self.clip_norm > 0:
            out.append(Clip(self.clip_norm))
        if self.ldp_epsilon > 0:
            out.append(GaussianLDP(self.ldp_epsilon, self.ldp_delta, self.ldp_clip_norm))
        return out


@dataclass
class ClientStats:
    rounds_trained: int = 0
    uploads_accepted: int = 0
    uploads_refused: dict[str, int] = field(default_factory=dict)
    server_switches: int = 0
    transport_failures: int = 0


class FLClient:
    def __init__(
        self,
        client_id: str,
        token: str,
        scheduler_address: str,
        data: tuple[np.ndarray, np.ndarray],
        trainer: LocalTrainer,
        options: ClientOptions = ClientOptions(),
        *,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
        chunk_bytes: int = wire.DEFAULT_CHUNK_BYTES,
        tls: TLSFiles | None = None,
        identity: Any = None,
        attack: Any = None,
    ) -> None:
        """``identity``: a :class:`~fedarena.federated.secure_round.SecAggIdentity` (long-term signing key and
        the clients' public keys) for secure rounds; without it the signing key is fresh per round. ``attack``: a
        :class:`~fedarena.federated.attacks.ClientAttack` makes this a malicious client: its ``upload(round,
        delta)`` replaces the trained delta before the upload stages (a data-poisoning attack poisons ``data``
        before the client is made)."""
        self.attack = attack
        self.client_id = client_id
        self.identity = identity
        self.token = token
        self.x, self.y = data
        self.trainer = trainer
        self.options = options
        self.limits = limits
        self.chunk_bytes = chunk_bytes
        self.tls = tls
        self.scheduler = Peer(scheduler_address, limits=limits, chunk_bytes=chunk_bytes, tls=tls)
        self.server: Peer | None = None
        self.server_id = ""
        self.params: dict[str, np.ndarray] | None = None
        self.version = -1
        self.stages = options.stages()
        self.stats = ClientStats()
        self._delay = options.backoff_s
        self._sat_out = -1  # a secure round this client refused to take part in (its update was not finite)
        self._submodels: dict[tuple, Any] = {}  # (layer sizes, scale) -> the compiled sub-model (device budgets)
        self._int8: Any = None  # the quantization-aware trainer (int8 downloads), made on the first int8 task

    # -------------------------------------------------------------- connection

    def _backoff(self) -> None:
        time.sleep(self._delay * (0.5 + secrets.randbelow(1000) / 1000.0))
        self._delay = min(self.options.backoff_max_s, self._delay * 2)

    def _connect(self, failed: str = "") -> None:
        """Get a server from the scheduler (reporting ``failed``) and register there; retries forever."""
        while True:
            try:
                reply = self.scheduler.call("assign", {"client_id": self.client_id, "token": self.token,
                                                       "failed_server": failed}, timeout=10)
                sid = wire.field(reply.body, "server_id", str)
                addr = wire.field(reply.body, "address", str)
                if self.server is None or sid != self.server_id:
                    if self.server is not None:
                        self.server.close()
                        self.stats.server_switches += 1
                        log.info("%s: moving from %s to %s", self.client_id, self.server_id, sid)
                    self.server = Peer(addr, limits=self.limits, chunk_bytes=self.chunk_bytes, tls=self.tls)
                    self.server_id = sid
                self.server.call("register", {"client_id": self.client_id, "token": self.token,
                                              "num_examples": int(len(self.x))}, timeout=10)
                self._delay = self.options.backoff_s
                return
            except RemoteError as e:
                if e.code == "unauthenticated":
                    raise
                log.info("%s: connect refused (%s); backing off", self.client_id, e)
            except TransportError as e:
                self.stats.transport_failures += 1
                log.info("%s: connect failed (%s); backing off", self.client_id, e)
            self._backoff()

    def _call_server(self, kind: str, body: dict[str, Any], timeout: float) -> wire.Message:
        """Call the current server; on repeated transport failures move to another server and retry."""
        failures = 0
        while True:
            assert self.server is not None
            try:
                reply = self.server.call(kind, {"client_id": self.client_id, "token": self.token, **body},
                                         timeout=timeout)
                self._delay = self.options.backoff_s
                return reply
            except TransportError as e:
                failures += 1
                self.stats.transport_failures += 1
                log.info("%s: %s to %s failed (%s)", self.client_id, kind, self.server_id, e.code)
                if failures >= self.options.switch_after:
                    self._connect(failed=self.server_id)
                    failures = 0
                else:
                    self._backoff()
            except RemoteError as e:
                if e.code == "unauthenticated" and "not registered" in e.reason:
                    self._connect()  # the server restarted and forgot us: register again
                    continue
                raise

    # -------------------------------------------------------------- the loop

    def run(self, max_rounds: int | None = None) -> ClientStats:
        """Take part until the deployment is done (or ``max_rounds`` trainings); returns the stats."""
        self._connect()
        while max_rounds is None or self.stats.rounds_trained < max_rounds:
            try:
                reply = self._call_server("get_task", {"have_version": self.version, "wait_s": self.options.wait_s},
                                          timeout=self.options.wait_s + self.options.rpc_timeout_s)
            except RemoteError as e:
                log.info("%s: get_task refused: %s", self.client_id, e)
                self._backoff()
                continue
            if reply.kind == "done":
                break
            if reply.kind != "task":
                continue
            try:
                self._run_task(reply.body)
            except (wire.WireError, ValueError, ArithmeticError) as e:  # a task we cannot use: skip this round
                log.warning("%s: unusable task: %s", self.client_id, e)
                self._backoff()
        return self.stats

    def _run_task(self, body: dict[str, Any]) -> None:
        rnd = wire.field(body, "round", int)
        version = wire.field(body, "model_version", int)
        if rnd == self._sat_out:  # the server offers the round again; training again would give the same update
            self._backoff()
            return
        cfg = RoundConfig.from_body(wire.field(body, "config", dict))
        if "params" in body:
            params = wire.field(body, "params", dict)
            self.params = {k: wire.check_array(v, f"body.params.{k}", dtype="float32", finite=True)
                           for k, v in params.items()}
            self.version = version
        sub = wire.field(body, "submodel", dict) if "submodel" in body else None
        int8 = sub is not None and wire.field(sub, "int8", bool, where="body.submodel", default=False)
        if not int8 and (self.params is None or self.version != version):
            self.version = -1  # we lack the model: ask again and get it sent
            return
        rng = np.random.default_rng([self.options.seed, rnd, int.from_bytes(self.client_id.encode()[:8], "little")])
        base = self.params
        if int8:  # int8 download: start from the int8 file's dequantized sub-model and train it quantization-aware
            base, local, loss = self._train_int8(wire.field(body, "int8", bytes),
                                                 wire.field(sub, "scale", float, where="body.submodel"), cfg, rng)
        elif sub is not None:  # device budgets: the width-scaled sub-model this client's device holds
            local, loss = self._train_submodel(wire.field(sub, "scale", float), cfg, rng)
        else:
            local, loss = self.trainer.train(self.params, self.x, self.y, epochs=cfg.epochs,
                                             batch_size=cfg.batch_size, lr=cfg.lr, prox_mu=cfg.prox_mu, rng=rng)
        self.stats.rounds_trained += 1
        delta = {k: (local[k].astype(np.float64) - base[k].astype(np.float64)).astype(np.float32) for k in base}
        if self.attack is not None:
            delta = self.attack.upload(rnd, delta)
        cid_key = int.from_bytes(self.client_id.encode()[:8], "little")
        prng = (SecureRandom() if self.options.privacy_seed < 0  # LDP/SignDS noise: the OS CSPRNG
                else np.random.default_rng([self.options.privacy_seed, rnd, cid_key]))
        for stage in self.stages:
            delta = stage(delta, prng)
        if cfg.secagg:
            self._run_secure(body, cfg, rnd, delta)
            return
        sds = signds_config(cfg, params_shapes(base))
        if sds is not None:
            encoding, payload = "signds", encode_signds(delta, sds, prng)
        else:
            encoding = self.options.encoding
            # rounding needs no secrecy; drawn from (seed, round, client key, 13) as in the simulation and Flower's mod
            crng = np.random.default_rng([self.options.seed, rnd, cid_key, 13])
            payload = encode_update(delta, encoding, crng, self.options.topk_fraction)
        upload = {"round": rnd, "model_version": version, "num_examples": int(len(self.x)),
                  "nonce": os.urandom(16), "encoding": encoding, "update": payload,
                  "train_loss": float(loss)}
        for attempt in range(5):
            try:
                self._call_server("upload", upload, timeout=self.options.rpc_timeout_s)
                self.stats.uploads_accepted += 1
                return
            except RemoteError as e:
                if e.code == "unavailable" and attempt < 4:  # the server could not reach the scheduler: retry
                    self._backoff()
                    continue
                self.stats.uploads_refused[e.code] = self.stats.uploads_refused.get(e.code, 0) + 1
                log.info("%s: upload for round %d refused: %s", self.client_id, rnd, e)
                return

    def _train_submodel(self, scale: float, cfg: RoundConfig, rng: np.random.Generator) -> tuple[dict, float]:
        """Local SGD of the sub-model ``self.params`` whose hidden outputs are multiplied by ``scale`` (HeteroFL's
        scaler): the simulation's :class:`~fedarena.federated.hetero.ScaledMLP` on the minibatches of
        :func:`~fedarena.federated.simulation.batch_plan` (the permutation per epoch the MLP trainers draw)."""
        from fedarena.federated.hetero import ScaledMLP
        from fedarena.federated.simulation import batch_plan, make_group_plan
        from fedarena.federated.strategy import FitConfig

        if not (math.isfinite(scale) and scale >= 1):
            raise wire.WireError("body.submodel.scale", f"must be a finite number >= 1, got {scale}")
        depth = len(self.params) // 2
        sizes = (self.params["l0.w"].shape[0], *(self.params[f"l{i}.w"].shape[1] for i in range(depth)))
        key = (sizes, scale)
        if key not in self._submodels:
            self._submodels[key] = ScaledMLP(sizes, 1.0 / scale, scaler=True)
        fit = FitConfig(cfg.epochs, cfg.batch_size, cfg.lr, cfg.prox_mu)
        mat, epochs = batch_plan(len(self.x), fit, rng)
        plan = make_group_plan([(np.arange(len(self.x)), mat, epochs)], [len(mat)], cfg.batch_size)
        onehot = np.eye(sizes[-1], dtype=np.float32)[np.asarray(self.y, np.int64)]
        stack, losses = self._submodels[key].train_group(self.params, plan, np.asarray(self.x, np.float32), onehot, fit)
        return {k: v[0] for k, v in stack.items()}, float(losses[0])

    def _train_int8(self, blob: bytes, scale: float, cfg: RoundConfig, rng: np.random.Generator
                    ) -> tuple[dict, dict, float]:
        """Quantization-aware local SGD from the int8 file ``blob`` (bytes from the network: parsed and checked by
        :func:`~fedarena.federated.int8_clients.parse_int8_mlp`, never unpickled) whose hidden outputs are scaled
        by ``scale``, on the minibatches :meth:`_train_submodel` runs (the simulation's ``device_round``). Returns
        the dequantized start, the trained parameters (unfolded) and the loss."""
        from fedarena.federated.int8_clients import Int8Download, parse_int8_mlp
        from fedarena.federated.simulation import batch_plan
        from fedarena.federated.strategy import FitConfig

        if not (math.isfinite(scale) and scale >= 1):
            raise wire.WireError("body.submodel.scale", f"must be a finite number >= 1, got {scale}")
        if cfg.prox_mu > 0:
            raise wire.WireError("body.config.prox_mu", "an int8 client trains plain SGD; the task asks for FedProx")
        y = np.asarray(self.y, np.int64)
        q, sizes = parse_int8_mlp(blob, "body.int8", int(np.shape(self.x)[1]), int(y.max(initial=-1)) + 1)
        mat, epochs = batch_plan(len(self.x), FitConfig(cfg.epochs, cfg.batch_size, cfg.lr), rng)
        batches = [row[row >= 0] for row in mat]
        last = epochs == epochs[-1] if len(mat) else np.zeros(0, bool)
        if self._int8 is None:
            self._int8 = Int8Download()  # a client only trains: no calibration sample
        return self._int8.train(q, sizes, scale, batches, last, self.x, y, cfg.lr)

    def _run_secure(self, body: dict[str, Any], cfg: RoundConfig, rnd: int, delta: dict[str, np.ndarray]) -> None:
        from fedarena.federated.secure_round import client_input, run_client, secagg_params, threshold
        from fedarena.federated.stages import flatten

        party = wire.field(body, "secagg_party", int)
        n_selected = wire.field(body, "secagg_selected", int)
        try:
            x = client_input(flatten(delta), len(self.x), cfg)
        except ValueError as e:  # a non-finite update: refused here, before anything is masked or sent
            self.stats.uploads_refused["secagg"] = self.stats.uploads_refused.get("secagg", 0) + 1
            log.warning("%s: secure round %d: %s; sitting this round out", self.client_id, rnd, e)
            self._sat_out = rnd
            return
        if len(self.x) > cfg.secagg_max_examples:
            log.warning("%s: %d examples exceed secagg_max_examples %d; the weight is clipped to it",
                        self.client_id, len(self.x), cfg.secagg_max_examples)
        floor = dataclasses.replace(cfg, secagg_threshold=self.options.secagg_min_threshold,
                                    secagg_colluders=self.options.secagg_min_colluders)
        if threshold(cfg, n_selected) < threshold(floor, n_selected):
            self.stats.uploads_refused["secagg"] = self.stats.uploads_refused.get("secagg", 0) + 1
            log.warning("%s: secure round %d: threshold %d of %d is below this client's floor %d; refusing to take "
                        "part", self.client_id, rnd, threshold(cfg, n_selected), n_selected,
                        threshold(floor, n_selected))
            self._sat_out = rnd
            return
        params = secagg_params(cfg, n_selected, x.size)
        pki: dict[str, Any] = {}
        if self.identity is not None:
            members = wire.field(body, "secagg_members", list)
            if len(members) != n_selected:
                self.stats.uploads_refused["secagg"] = self.stats.uploads_refused.get("secagg", 0) + 1
                log.warning("%s: secure round %d: %d members listed for %d selected clients", self.client_id, rnd,
                            len(members), n_selected)
                return
            try:
                pki = {"signing_key": self.identity.signing_key,
                       "identities": self.identity.party_keys(self.client_id, party, [str(m) for m in members])}
            except ValueError as e:
                self.stats.uploads_refused["secagg"] = self.stats.uploads_refused.get("secagg", 0) + 1
                log.warning("%s: secure round %d: %s", self.client_id, rnd, e)
                return
        deadline = time.monotonic() + wire.field(body, "deadline_s", float) + 5 * cfg.secagg_stage_seconds

        def send(data: bytes) -> None:
            self._call_server("secagg_send", {"round": rnd, "message": data}, timeout=self.options.rpc_timeout_s)

        def poll(stage: int) -> bytes | None:
            reply = self._call_server("secagg_poll", {"round": rnd, "stage": stage, "wait_s": 1.0},
                                      timeout=self.options.rpc_timeout_s)
            return wire.field(reply.body, "message", bytes) if reply.kind == "secagg" else None

        try:
            if run_client(send, poll, params, party, rnd, x, deadline, **pki):
                self.stats.uploads_accepted += 1
        except RemoteError as e:
            self.stats.uploads_refused[e.code] = self.stats.uploads_refused.get(e.code, 0) + 1
            log.info("%s: secure round %d: %s", self.client_id, rnd, e)
        except (ValueError, RuntimeError) as e:  # the SecAgg client refused a message or the round lacks survivors
            self.stats.uploads_refused["secagg"] = self.stats.uploads_refused.get("secagg", 0) + 1
            log.warning("%s: secure round %d: %s", self.client_id, rnd, e)

    def close(self) -> None:
        self.scheduler.close()
        if self.server is not None:
            self.server.close()
