"""Flower interoperability both ways (Flower's Message API: ``flwr.serverapp`` / ``flwr.clientapp``; flwr 1.42).

* :class:`FlowerStrategy` -- a fedarena :class:`~fedarena.federated.strategy.Strategy` (FedAvg/FedProx/FedAdam/...,
  every rule of :data:`fedarena.federated.rules.AGGREGATION_RULES` through ``RobustAggregate``, DP-FedAvg) as a ``flwr.serverapp.strategy.Strategy``: usable in a ``ServerApp`` under
  Flower's ``run_simulation`` and its deployment runtime alike (the ServerApp is the same object). It keeps the
  fedarena :class:`~fedarena.federated.strategy.RoundState` (server-optimizer moments), selects with the
  fedarena strategy's ``select`` over the nodes' fedarena client ids, sends the strategy's ``FitConfig`` as a
  ``ConfigRecord`` and aggregates with the strategy's ``aggregate``; replies carry either the whole local
  model (any Flower ClientApp) or an update encoded by :class:`UploadMod`. A malformed reply is dropped and
  counted (``rejected``), never aggregated, and the server keeps serving. fedarena's ``SecureAggregation`` is
  refused: ``aggregate_train`` receives every reply in the clear, so no strategy can hide the updates; Flower masks
  them in the ClientApp (``secaggplus_mod``) under its ``SecAggPlusWorkflow``, which drives the legacy
  ``flwr.server.strategy.Strategy`` (``configure_fit`` / ``aggregate_fit`` in a ``LegacyContext``), not this
  Message-API strategy.
* :class:`UploadMod` -- fedarena's upload stages (clipping, Gaussian local DP) and codecs (k-bit quantization,
  top-k with error feedback, optionally shifted by the trajectory prediction) as a Flower client *mod*: it turns
  any ClientApp's trained model into the fedarena-encoded model difference, keeping the error-feedback residual
  in the node's ``Context.state``.
* :func:`fedarena_client_app` -- a fedarena simulated client as a Flower ``ClientApp``: the simulation's own
  batched MLP trainer (:class:`~fedarena.federated.simulation.BatchedMLP`, one client), the same minibatches
  (generator ``(seed, round, client id)``), so a client trains in Flower exactly as it trains in fedarena.
* :class:`ClientAppTrainer` -- a Flower ``ClientApp`` as the local trainer of fedarena's
  :class:`~fedarena.federated.simulation.Simulation` (``client_trainer=``): every selected client's round is a
  Flower train ``Message`` to the app, called in-process with a persistent per-client ``Context``.

Record layout (the names a ClientApp and the server agree on): the instruction carries ``"arrays"`` (the
global model, an ``ArrayRecord`` keyed by fedarena's tensor names) and ``"config"`` (``server-round``,
``epochs``, ``batch-size``, ``lr``, ``prox-mu``, ``local-steps``); a reply carries ``"metrics"`` with
``num-examples`` (Flower's convention) and optionally ``train_loss``, plus either ``"arrays"`` (the local model)
or ``"update"`` (a ``ConfigRecord`` with ``codec``, ``data`` bytes). Flower starts its own Ray for
``run_simulation``; nothing here starts Ray.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, Metadata, MetricRecord, RecordDict
from flwr.app.message_type import MessageType
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Strategy as _FlowerStrategy

from fedarena.federated import compression as cz
from fedarena.federated.simulation import BatchedMLP, GroupPlan, batch_plan, client_key, make_group_plan
from fedarena.federated.strategy import ClientUpdate, FitConfig, Params, RoundState

log = logging.getLogger("fedarena.flower")

ARRAYS, CONFIG, METRICS, UPDATE = "arrays", "config", "metrics", "update"
CLIENT_ID_QUERY = "fedarena.client-id"


class RecordError(ValueError):
    """A Flower record that does not match what fedarena expects; the message names the field."""


# ----------------------------------------------------------------------------- records <-> fedarena values


def params_to_record(params: Mapping[str, np.ndarray]) -> ArrayRecord:
    """The model as an ``ArrayRecord`` keyed by fedarena's tensor names (float32)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(params[k], np.float32)) for k in sorted(params)})


def record_to_params(rec: Any, like: Mapping[str, np.ndarray] | None = None, where: str = ARRAYS) -> Params:
    """The float32 arrays of an ``ArrayRecord``; with ``like``, names, shapes and finiteness are checked."""
    if not isinstance(rec, ArrayRecord):
        raise RecordError(f"{where}: expected an ArrayRecord, got {type(rec).__name__}")
    out = {}
    for k in rec.keys():
        a = rec[k].numpy()
        if a.dtype.kind != "f":
            raise RecordError(f"{where}.{k}: expected floating-point values, got {a.dtype}")
        out[k] = np.asarray(a, np.float32)
    if like is not None:
        missing, extra = set(like) - set(out), set(out) - set(like)
        if missing or extra:
            raise RecordError(f"{where}: tensor names differ from the model: missing {sorted(missing)}, "
                              f"unexpected {sorted(extra)}")
        for k, v in like.items():
            if out[k].shape != tuple(v.shape):
                raise RecordError(f"{where}.{k}: shape {out[k].shape}, the model's is {tuple(v.shape)}")
            if not np.isfinite(out[k]).all():
                raise RecordError(f"{where}.{k}: values are not finite")
    return out


def fit_to_config(cfg: FitConfig, rnd: int) -> ConfigRecord:
    return ConfigRecord({"server-round": int(rnd), "epochs": int(cfg.epochs), "batch-size": int(cfg.batch_size),
                         "lr": float(cfg.lr), "prox-mu": float(cfg.prox_mu), "local-steps": int(cfg.local_steps)})


def config_to_fit(cr: Any) -> tuple[int, FitConfig]:
    """(round, FitConfig) of a train instruction's ``config`` record (ValueError naming the field)."""
    if not isinstance(cr, ConfigRecord):
        raise RecordError(f"{CONFIG}: expected a ConfigRecord, got {type(cr).__name__}")
    keys = {"server-round": int, "epochs": int, "batch-size": int, "lr": float, "prox-mu": float, "local-steps": int}
    vals = {}
    for k, t in keys.items():
        if k not in cr:
            raise RecordError(f"{CONFIG}.{k}: missing")
        v = cr[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RecordError(f"{CONFIG}.{k}: expected a number, got {type(v).__name__}")
        vals[k] = t(v)
    try:
        fit = FitConfig(vals["epochs"], vals["batch-size"], vals["lr"], vals["prox-mu"], vals["local-steps"])
    except ValueError as e:
        raise RecordError(f"{CONFIG}: {e}") from None
    return vals["server-round"], fit


def _num_examples(content: RecordDict) -> int:
    m = content.get(METRICS) if METRICS in content else None
    if not isinstance(m, MetricRecord) or "num-examples" not in m:
        raise RecordError(f"{METRICS}.num-examples: missing")
    n = m["num-examples"]
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not n > 0 or not math.isfinite(float(n)):
        raise RecordError(f"{METRICS}.num-examples: must be a positive number, got {n!r}")
    return int(n)


def _loss(content: RecordDict) -> float:
    m = content.get(METRICS) if METRICS in content else None
    v = m.get("train_loss", float("nan")) if isinstance(m, MetricRecord) else float("nan")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


def model_delta(local: Params, start: Params) -> Params:
    """``w_local - w_global`` in float32, formed as fedarena's clients form it (float64 difference, then float32)."""
    return {k: (np.asarray(local[k], np.float64) - np.asarray(start[k], np.float64)).astype(np.float32) for k in start}


def decode_reply(content: RecordDict, start: Params, codec: cz.Codec | None) -> tuple[Params, int]:
    """The float64 model difference of a train reply and its upload bytes: from ``"update"`` (an
    :class:`UploadMod` encoding in the server's ``codec``) or from ``"arrays"`` (the local model)."""
    if UPDATE in content:
        if codec is None:
            raise RecordError(f"{UPDATE}: encoded uploads are not enabled on this server (no codec)")
        rec = content[UPDATE]
        if not isinstance(rec, ConfigRecord) or "codec" not in rec or "data" not in rec:
            raise RecordError(f"{UPDATE}: expected a ConfigRecord with 'codec' and 'data'")
        if rec["codec"] != codec_name(codec):
            raise RecordError(f"{UPDATE}.codec: '{rec['codec']}', this server decodes '{codec_name(codec)}'")
        data = rec["data"]
        if not isinstance(data, bytes):
            raise RecordError(f"{UPDATE}.data: expected bytes, got {type(data).__name__}")
        d = sum(v.size for v in start.values())
        try:
            flat = codec.decode(data, d)
        except ValueError as e:
            raise RecordError(f"{UPDATE}.data: {e}") from None
        return cz.unflatten(flat, start), len(data)
    if ARRAYS not in content:
        raise RecordError(f"reply: carries neither '{ARRAYS}' nor '{UPDATE}'")
    local = record_to_params(content[ARRAYS], start)
    delta = model_delta(local, start)
    return {k: v.astype(np.float64) for k, v in delta.items()}, sum(4 * v.size for v in delta.values())


def codec_name(codec: cz.Codec) -> str:
    """``kind:bits:fraction``, the codec a reply says it used (the server accepts only its own)."""
    return f"{codec.kind}:{codec.bits}:{codec.fraction:g}"


# ----------------------------------------------------------------------------- (a) fedarena strategy in Flower


class FlowerStrategy(_FlowerStrategy):
    """A fedarena strategy run by Flower's ``Strategy.start`` (see the module docstring).

    ``codec``: the upload codec clients' :class:`UploadMod` uses (None: clients send their local model).
    ``seed``: the selection seed (fedarena's ``select(round, candidates, seed)``). ``evaluate_clients``:
    send every node an evaluate message each round and summarise the returned ``accuracy`` values with
    the strategy's ``evaluate`` (mean, 10th percentile, worst). ``query_client_ids``: ask every node once
    (a Flower ``query`` message) for its fedarena client id so selection matches fedarena's simulation;
    nodes that do not answer are named ``node<id>``. ``min_available_nodes``: a round waits (up to ``timeout``
    seconds) until that many nodes are connected, as Flower's own strategies do."""

    def __init__(self, strategy: Any, *, codec: cz.Codec | None = None, seed: int = 0, evaluate_clients: bool = False,
                 query_client_ids: bool = True, min_available_nodes: int = 1, timeout: float = 600.0) -> None:
        from fedarena.federated.stages import SecureAggregation
        from fedarena.federated.strategy import Scaffold

        if isinstance(strategy, SecureAggregation):
            raise ValueError("strategy: a Flower strategy receives every ClientApp's reply in the clear, so "
                             "SecureAggregation cannot hide the updates here; use Flower's secaggplus_mod in the "
                             "ClientApp with SecAggPlusWorkflow in the ServerApp")
        if isinstance(strategy, Scaffold):
            raise ValueError("strategy: SCAFFOLD needs client control variates, which Flower ClientApps do not send")
        self.strategy = strategy
        self.codec = codec
        self.seed = seed
        self.evaluate_clients = evaluate_clients
        self.query_client_ids = query_client_ids
        self.timeout = timeout
        if min_available_nodes < 1:
            raise ValueError(f"min_available_nodes: must be >= 1, got {min_available_nodes}")
        self.min_available_nodes = min_available_nodes
        self.state: RoundState | None = None
        self.names: dict[int, str] = {}
        self.history: list[dict[str, float]] = []
        self._selected: dict[str, int] = {}
        self._num_clients = 0

    def summary(self) -> None:
        log.info("fedarena strategy %s (codec %s)", type(self.strategy).__name__,
                 codec_name(self.codec) if self.codec else "none: local models")

    def _client_names(self, grid: Any, nodes: list[int]) -> dict[int, str]:
        unknown = [n for n in nodes if n not in self.names]
        if unknown and self.query_client_ids:
            msgs = [Message(RecordDict({CONFIG: ConfigRecord({"query": CLIENT_ID_QUERY})}), dst_node_id=n,
                            message_type=MessageType.QUERY) for n in unknown]
            for r in grid.send_and_receive(msgs, timeout=self.timeout):
                if r.has_error() or CONFIG not in r.content:
                    continue
                cid = r.content[CONFIG].get("client-id")
                if isinstance(cid, str) and cid and cid not in self.names.values():
                    self.names[r.metadata.src_node_id] = cid
        for n in unknown:
            self.names.setdefault(n, f"node{n}")
        return {n: self.names[n] for n in nodes}

    def _wait_for_nodes(self, grid: Any) -> list[int]:
        deadline = time.monotonic() + self.timeout
        while len(nodes := sorted(grid.get_node_ids())) < self.min_available_nodes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"min_available_nodes: {len(nodes)} of {self.min_available_nodes} nodes connected "
                                   f"after {self.timeout:g} s")
            time.sleep(0.2)
        return nodes

    def _sync_state(self, server_round: int, arrays: ArrayRecord) -> RoundState:
        params = record_to_params(arrays)
        if self.state is None:
            self.state = replace(self.strategy.init_state(params), round=server_round)
        elif set(params) != set(self.state.params) or any(
                not np.array_equal(params[k], np.asarray(self.state.params[k], np.float32)) for k in params):
            self.state = replace(self.state, params=params)  # the driver changed the model: follow it
        return replace(self.state, round=server_round)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any
                        ) -> Iterable[Message]:
        self.state = self._sync_state(server_round, arrays)
        nodes = self._wait_for_nodes(grid)
        names = self._client_names(grid, nodes)
        by_name = {v: k for k, v in names.items()}
        selected = self.strategy.select(server_round, sorted(by_name), self.seed)
        fit = self.strategy.configure(server_round, self.state)
        cfg = fit_to_config(fit, server_round)
        for k, v in config.items():  # the driver's own train_config travels along
            cfg.setdefault(k, v)
        self._selected = {c: by_name[c] for c in selected}
        self._num_clients = len(nodes)
        record = RecordDict({ARRAYS: params_to_record(self.state.params), CONFIG: cfg})
        return [Message(record, dst_node_id=by_name[c], message_type=MessageType.TRAIN) for c in selected]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        assert self.state is not None, "configure_train runs first"
        start = self.state.params
        node_to_name = {n: c for c, n in self._selected.items()}
        updates, failed, rejected, nbytes = [], 0, 0, 0
        for r in replies:
            if r.has_error():
                failed += 1
                continue
            cid = node_to_name.get(r.metadata.src_node_id)
            try:
                if cid is None:
                    raise RecordError(f"reply: node {r.metadata.src_node_id} was not selected this round")
                delta, b = decode_reply(r.content, start, self.codec)
                n = _num_examples(r.content)
            except RecordError as e:
                log.warning("round %d: dropped the reply of %s: %s", server_round, cid, e)
                rejected += 1
                continue
            nbytes += b
            updates.append(ClientUpdate(cid, delta, n, _loss(r.content)))
        updates.sort(key=lambda u: u.client_id)  # arrival order must not change the aggregate
        self.state = self.strategy.aggregate(self.state, updates, self._num_clients)
        m = {"reporting": len(updates), "failed": failed, "rejected": rejected, "bytes_up": nbytes}
        losses = [u.loss for u in updates if math.isfinite(u.loss)]
        if losses:
            m["train_loss"] = float(np.mean(losses))
        self.history.append(dict(m, round=server_round))
        return params_to_record(self.state.params), MetricRecord(m)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any
                           ) -> Iterable[Message]:
        if not self.evaluate_clients:
            return []
        record = RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord({"server-round": int(server_round)})})
        return [Message(record, dst_node_id=n, message_type=MessageType.EVALUATE) for n in sorted(grid.get_node_ids())]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        accs = []
        for r in replies:
            if r.has_error() or METRICS not in r.content:
                continue
            a = r.content[METRICS].get("accuracy")
            if isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1:
                accs.append(float(a))
        out = self.strategy.evaluate(server_round, np.asarray(accs))
        return MetricRecord(out) if out else None


# ----------------------------------------------------------------------------- fedarena stages as a Flower mod


def _client_id(context: Context) -> str:
    pid = context.node_config.get("partition-id")
    return f"c{int(pid)}" if pid is not None else f"node{context.node_id}"


@dataclass
class UploadMod:
    """A Flower client mod: fedarena's upload stages (``stages``: :class:`~fedarena.federated.stages.Clip`,
    :class:`~fedarena.federated.stages.GaussianLDP`) then the ``codec`` with error feedback, applied to the
    model difference of the wrapped ClientApp's train reply. Privacy noise comes from the OS CSPRNG unless
    ``privacy_seed >= 0``; the codec's stochastic rounding from ``(seed, round, client id)``."""

    stages: Sequence[Any] = ()
    codec: cz.Codec | None = None
    error_feedback: bool = True
    seed: int = 0
    privacy_seed: int = -1

    def __call__(self, msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        reply = call_next(msg, context)
        if msg.metadata.message_type != MessageType.TRAIN or reply.has_error():
            return reply
        from fedarena.privacy.secure_random import SecureRandom

        start = record_to_params(msg.content[ARRAYS])
        rnd = int(msg.content[CONFIG].get("server-round", 0))
        cid = _client_id(context)
        delta = model_delta(record_to_params(reply.content[ARRAYS], start, "reply.arrays"), start)
        prng = SecureRandom() if self.privacy_seed < 0 else np.random.default_rng([self.privacy_seed, rnd,
                                                                                    client_key(cid)])
        for stage in self.stages:
            delta = stage(delta, prng)
        content = RecordDict({k: v for k, v in reply.content.items() if k != ARRAYS})
        if self.codec is None:
            content[ARRAYS] = params_to_record({k: np.asarray(start[k], np.float64) + delta[k] for k in start})
            return Message(content, reply_to=msg)
        v = cz.flatten(delta)
        key = "fedarena.residual"
        if self.error_feedback and key in context.state:
            v = v + context.state[key]["e"].numpy()
        data = self.codec.encode(v, np.random.default_rng([self.seed, rnd, client_key(cid), 13]))
        if self.error_feedback:
            context.state[key] = ArrayRecord({"e": Array(v - self.codec.decode(data, v.size))})
        content[UPDATE] = ConfigRecord({"codec": codec_name(self.codec), "data": data})
        return Message(content, reply_to=msg)


# ----------------------------------------------------------------------------- (c) fedarena client as a ClientApp


@functools.lru_cache(maxsize=8)
def _batched_mlp(sizes: tuple[int, ...]) -> BatchedMLP:
    """One compiled trainer per process and architecture: Flower's Ray backend unpickles the ClientApp for every
    message, and a fresh :class:`BatchedMLP` would trace and compile its step again each time."""
    return BatchedMLP(sizes)


def fedarena_client_app(x: np.ndarray, y: np.ndarray, train: Sequence[np.ndarray], sizes: Sequence[int], *,
                        num_classes: int, seed: int = 0, held_out: Sequence[np.ndarray] | None = None,
                        mods: Sequence[Any] = ()) -> ClientApp:
    """A Flower ClientApp whose node ``partition-id = i`` is fedarena's simulated client ``c{i}`` with training
    examples ``train[i]`` of ``(x, y)``: it trains the ReLU MLP ``sizes`` with the simulation's trainer and
    minibatches, answers fedarena's client-id query, and evaluates on ``held_out[i]`` (``accuracy``)."""
    sizes = tuple(int(s) for s in sizes)
    x = np.ascontiguousarray(x, np.float32)
    y = np.asarray(y, np.int64)
    onehot = np.eye(num_classes, dtype=np.float32)[y]
    app = ClientApp(mods=list(mods))

    def partition(context: Context) -> int:
        pid = context.node_config.get("partition-id")
        if pid is None or not 0 <= int(pid) < len(train):
            raise ValueError(f"node_config.partition-id: {pid!r} is not one of the {len(train)} clients")
        return int(pid)

    @app.train()
    def _train(msg: Message, context: Context) -> Message:
        pid = partition(context)
        rnd, fit = config_to_fit(msg.content[CONFIG])
        start = record_to_params(msg.content[ARRAYS])
        idx = np.asarray(train[pid], np.int64)
        rng = np.random.default_rng([seed, rnd, client_key(f"c{pid}")])
        batches, epochs = batch_plan(len(idx), fit, rng)
        plan: GroupPlan = make_group_plan([(idx, batches, epochs)], [len(batches)], fit.batch_size)
        stack, losses = _batched_mlp(sizes).train_group(start, plan, x, onehot, fit)
        local = {k: v[0] for k, v in stack.items()}
        content = RecordDict({ARRAYS: params_to_record(local),
                              METRICS: MetricRecord({"num-examples": len(idx), "train_loss": float(losses[0])})})
        return Message(content, reply_to=msg)

    @app.evaluate()
    def _evaluate(msg: Message, context: Context) -> Message:
        from fedarena.federated.simulation import evaluate_params

        pid = partition(context)
        idx = np.asarray(held_out[pid] if held_out is not None else train[pid], np.int64)
        loss, acc = evaluate_params(_batched_mlp(sizes), record_to_params(msg.content[ARRAYS]), x[idx], y[idx])
        return Message(RecordDict({METRICS: MetricRecord({"num-examples": max(len(idx), 1), "loss": loss,
                                                          "accuracy": acc})}), reply_to=msg)

    @app.query()
    def _query(msg: Message, context: Context) -> Message:
        return Message(RecordDict({CONFIG: ConfigRecord({"client-id": f"c{partition(context)}"})}), reply_to=msg)

    return app


# ----------------------------------------------------------------------------- (b) a ClientApp inside fedarena


@dataclass
class LocalResult:
    """One client's local training as a :class:`~fedarena.federated.simulation.Simulation` needs it."""

    params: Params
    loss: float
    num_examples: int
    steps: int


@dataclass
class ClientAppTrainer:
    """Local training of fedarena's simulated clients by a Flower ``ClientApp`` (``Simulation(client_trainer=)``).

    Client ``client_ids[i]`` is the Flower node with ``node_id = i + 1`` and ``node_config = {"partition-id": i,
    "num-partitions": N}`` (Flower simulation's convention), with one ``Context`` kept across rounds (its
    ``state`` persists, as on a Flower SuperNode). The app is called in-process, one message per client; its
    reply must carry the local model in ``"arrays"`` (upload stages and codecs belong to the Simulation here,
    not to a Flower mod)."""

    app: ClientApp
    client_ids: Sequence[str]
    run_config: dict = field(default_factory=dict)
    _contexts: dict[str, Context] = field(default_factory=dict, repr=False)

    def _context(self, cid: str) -> Context:
        if cid not in self._contexts:
            i = list(self.client_ids).index(cid)
            self._contexts[cid] = Context(run_id=0, node_id=i + 1, node_config={
                "partition-id": i, "num-partitions": len(self.client_ids)}, state=RecordDict(),
                run_config=dict(self.run_config))
        return self._contexts[cid]

    def train(self, params: Params, client_ids: Sequence[str], rnd: int, cfg: FitConfig) -> dict[str, LocalResult]:
        out = {}
        for cid in client_ids:
            ctx = self._context(cid)
            meta = Metadata(run_id=0, message_id=f"{rnd}:{cid}", src_node_id=0, dst_node_id=ctx.node_id,
                            reply_to_message_id="", group_id=str(rnd), created_at=0.0, ttl=3600.0,
                            message_type=MessageType.TRAIN)
            msg = Message(RecordDict({ARRAYS: params_to_record(params), CONFIG: fit_to_config(cfg, rnd)}),
                          metadata=meta)
            reply = self.app(msg, ctx)
            if reply.has_error():
                raise RuntimeError(f"client {cid}: the ClientApp replied with an error: {reply.error.reason}")
            if UPDATE in reply.content:
                raise RecordError(f"client {cid}: reply.update: the ClientApp encodes its upload (a Flower mod); "
                                  "inside fedarena's simulation give the stages to the Simulation instead")
            local = record_to_params(reply.content.get(ARRAYS) if ARRAYS in reply.content else None, params,
                                     "reply.arrays")
            n = _num_examples(reply.content)
            steps = cfg.local_steps or cfg.epochs * math.ceil(n / cfg.batch_size)
            out[cid] = LocalResult(local, _loss(reply.content), n, steps)
        return out
