"""FL-Scheduler: cluster membership and health, client-to-server assignment, and the round coordinator.

Follows the MindSpore Federated architecture of the FL chapter: the scheduler forms the cluster
(servers join and keep a heartbeat through their ``sync`` long-poll; a server silent for
``server_timeout_s`` is dead), hands every client a server (least loaded live server; a client that
reports its server unreachable is moved after a failed health ping), and owns the *round plan*:
which clients train in round r, with which config, until when.

Time-limited rounds: round r opens with ``selected`` clients and a window of ``window_seconds``.
The global counter is the set of admitted uploads (servers ask ``admit`` before accepting, so a
client is counted once whichever server it used). The round closes when every selected client has
been admitted or when the window ends, whichever is first; servers then send their partial
aggregates (waited for at most ``partial_grace_s``). If the partials cover at least
``ceil(min_fraction * |selected|)`` clients, the bounded weighted mean delta (by default each delta
clipped to ``norm_bound_multiple`` times the round's median update norm and each weight capped at
``max_client_weight`` of the round's total, :func:`~fedarena.federated.strategy.bounded_mean`; both off:
the servers' partial sums) or, with another rule of :data:`fedarena.federated.rules.AGGREGATION_RULES`, that rule
over the individual deltas is applied with the server optimizer
and the model version increases (servers forward every accepted delta whenever the rule needs them);
otherwise the round is abandoned and the next one starts with the same model. A secure round (SecAgg) is run by
the :class:`~fedarena.federated.wrappers.SecureAggregation` strategy, as in the simulation: it opens the round's
protocol server and applies the unmasked sum, while the scheduler relays the clients' SecAgg messages and closes
the protocol's stages on its clock. With a strategy, each round's client config takes local training from the
strategy's ``configure``. The current round's state is one
:class:`RoundProgress` whose :class:`Phase` moves idle -> open -> closing -> idle (or done). After every round the
global model, optimizer state and round history are written atomically (temp file + fsync + rename) in the
wire format, and a restarted scheduler continues from that file with identical model bytes.

Device budgets (``RoundPolicy.devices``, docs/devices.md): when a round opens, each selected client gets the widest
width level its device profile holds (:meth:`~fedarena.federated.devices.DeviceFleet.assign`; one no level fits is
not selected), the plan tells the servers each client's sub-model (kept units, scaler), and the round's update is
the per-coordinate mean of the clients' sub-model deltas (HeteroFL / FedRolex, :mod:`fedarena.federated.hetero`)
through the server optimizer; the history row records every client's level, cost and budgets. With int8 downloads
(``devices.int8_tiers``) the scheduler quantizes every level's sub-model once per round
(:mod:`fedarena.federated.int8_clients`, the simulation's code) and the plan carries the int8 files
(``int8_files``) that the servers send the int8 clients instead of the float32 sub-model.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from fedarena.federated import auth, rules, wire
from fedarena.federated.protocol import SCHEDULER_KINDS, Phase, RoundConfig, params_shapes
from fedarena.federated.secure_round import AggregateOutOfRange, SecureRound, capacity, check_secure_config
from fedarena.federated.strategy import (FedAvg, FitConfig, PartialAggregate, RoundState, ServerOptimizer,
                                         bounded_mean, robust_rule, select_clients)
from fedarena.federated.wrappers import SecureAggregation
from fedarena.federated.transport import Peer, ProtocolError, RemoteError, TLSFiles, TransportError, serve
from fedarena.platform.checkpoint import write_atomic

log = logging.getLogger("fedarena.federated.scheduler")

Params = dict[str, np.ndarray]
Aggregator = Callable[[Sequence[Params], Sequence[float]], Params]
"""A robust aggregation rule: the client deltas and their weights -> the global delta (same names and shapes)."""


@dataclass(frozen=True)
class RoundPolicy:
    """How rounds are planned and closed."""

    rounds: int = 30
    clients_per_round: int = 0
    """clients selected per round (0 = all candidates)"""
    min_fraction: float = 0.5
    """fraction of the selected clients whose updates must arrive for the round to count"""
    window_seconds: float = 10.0
    """how long a round stays open"""
    start_clients: int = 1
    """known clients needed before the first round opens"""
    selection: Literal["uniform", "available"] = "available"
    """'uniform': uniform over every registered client; 'available': uniform over clients seen recently"""
    availability_s: float = 5.0
    partial_grace_s: float = 5.0
    server_timeout_s: float = 3.0
    round_config: RoundConfig = field(default_factory=RoundConfig)
    server_optimizer: ServerOptimizer = field(default_factory=ServerOptimizer)
    seed: int = 0
    aggregation: str = "mean"
    """a rule of :data:`fedarena.federated.rules.AGGREGATION_RULES`. 'mean': the example-weighted mean (of the
    servers' partial sums, or bounded as below); any other rule runs over every individual delta"""
    rule_params: Mapping[str, Any] = field(default_factory=dict)
    """further parameters of the rule (one added by :func:`fedarena.federated.rules.register_rule`)"""
    trim_fraction: float = 0.2
    """trimmed mean: fraction cut at each end of every coordinate"""
    krum_byzantine: int = 0
    """Krum: the assumed number of Byzantine clients per round"""
    max_client_weight: float = 0.25
    """'mean': no client's weight exceeds this fraction of the round's total weight (weights above it are cut by
    water-filling; equal weights when fewer than 1 / max_client_weight clients report); 1 = uncapped"""
    norm_bound_multiple: float = 3.0
    """'mean': every delta is clipped to this multiple of the round's median update norm (0 = off; the servers'
    fixed ``max_update_norm`` still refuses larger uploads)"""
    devices: Any = None
    """a :class:`fedarena.federated.devices.DeviceFleet`: each client (``device_clients[i]`` has profile ``i``) trains
    the widest sub-model of ``widths`` its device's budget holds, and the scheduler averages the sub-model updates
    per coordinate (HeteroFL / FedRolex, :mod:`fedarena.federated.hetero`; docs/devices.md)"""
    widths: Any = None
    """with ``devices``: the :class:`fedarena.federated.hetero.WidthLevels`"""
    device_clients: tuple[str, ...] = ()
    """with ``devices``: the client ids in the order of the fleet's profiles"""
    int8_calibration: Any = None
    """with ``devices.int8_tiers``: the scheduler's calibration sample (float32 inputs,
    :func:`fedarena.federated.int8_clients.calibration_sample`) for the int8 models' activation ranges"""

    def rule(self) -> Aggregator | None:
        """The round's rule over individual deltas; None for the plain 'mean' (partial sums or bounded)."""
        if self.aggregation == "mean" and not self.rule_params:
            rules.aggregation_rule("mean")
            return None
        return robust_rule(self.aggregation, self.trim_fraction, self.krum_byzantine, **self.rule_params)

    def __post_init__(self) -> None:
        if isinstance(self.max_client_weight, bool) or not 0 < self.max_client_weight <= 1:
            raise ValueError(f"max_client_weight: must lie in (0, 1], got {self.max_client_weight}")
        if isinstance(self.norm_bound_multiple, bool) or not (self.norm_bound_multiple == 0
                                                              or self.norm_bound_multiple >= 1):
            raise ValueError(f"norm_bound_multiple: must be 0 (off) or >= 1 (a multiple of the median update norm), "
                             f"got {self.norm_bound_multiple}")
        self.rule()  # names a bad rule or parameter
        if self.aggregation != "mean":
            if self.round_config.secagg:
                raise ValueError(f"aggregation: '{self.aggregation}' needs every client's delta, which secure "
                                 "aggregation hides; use 'mean' with secagg")
        if self.devices is not None:
            if self.widths is None or len(self.device_clients) != len(self.devices.profiles):
                raise ValueError("devices: needs widths and one client id per device profile (device_clients)")
            if self.aggregation != "mean" or self.rule_params or self.round_config.secagg or self.round_config.signds_k:
                raise ValueError("devices: sub-model updates are averaged per coordinate; use aggregation 'mean' "
                                 "without secure aggregation or SignDS")
            if self.devices.int8_tiers is not None and (self.int8_calibration is None
                                                        or len(self.int8_calibration) == 0):
                raise ValueError("devices.int8_download: needs the scheduler's calibration sample (int8_calibration)")
        if self.rounds < 1:
            raise ValueError(f"rounds: must be >= 1, got {self.rounds}")
        if not 0 < self.min_fraction <= 1:
            raise ValueError(f"min_fraction: must lie in (0, 1], got {self.min_fraction}")
        if not self.window_seconds > 0:
            raise ValueError(f"window_seconds: must be > 0, got {self.window_seconds}")
        if self.selection not in ("uniform", "available"):
            raise ValueError(f"selection: unknown '{self.selection}' (uniform or available)")
        if self.clients_per_round < 0:
            raise ValueError(f"clients_per_round: must be >= 0, got {self.clients_per_round}")
        if self.round_config.secagg:
            n = self.clients_per_round or self.start_clients
            if n < 3:
                raise ValueError(f"clients_per_round/start_clients: a secure round needs at least 3 clients, got {n}")
            check_secure_config(self.round_config, n)


# ----------------------------------------------------------------------------- the round's state


@dataclass
class RoundProgress:
    """The scheduler's state of the current round (one object, replaced when the next round starts)."""

    phase: Phase = Phase.IDLE
    selected: list[str] = field(default_factory=list)
    opened_at: float = 0.0
    deadline: float = 0.0
    """when the window closes (monotonic seconds)"""
    closed_at: float = 0.0
    close_reason: str = ""
    grace_until: float = 0.0
    """how long the scheduler waits for the servers' partials after closing"""
    admitted: dict[str, str] = field(default_factory=dict)
    """client -> the server that admitted its upload (the global counter)"""
    partials: dict[str, tuple[PartialAggregate, int, int]] = field(default_factory=dict)
    """server -> (its partial aggregate, bytes up, bytes down)"""
    updates: dict[str, tuple[Params, float]] = field(default_factory=dict)
    """client -> (delta, weight), when the rule needs individual deltas"""
    levels: dict[str, int] = field(default_factory=dict)
    """with device budgets: client -> the width level it trains this round"""
    costs: dict[str, Any] = field(default_factory=dict)
    """with device budgets: client -> its :class:`~fedarena.federated.devices.TrainingCost` this round"""
    int8_files: list[bytes] = field(default_factory=list)
    """with int8 downloads: every width level's sub-model of the round's global model as the int8 file its int8
    clients download (empty when no selected client receives int8)"""
    config: RoundConfig | None = None
    """what the selected clients run (the strategy's ``configure`` of this round, or the policy's round config)"""
    secure: SecureRound | None = None
    """the secure round's protocol server (opened by the :class:`SecureAggregation` strategy), whose messages the
    scheduler relays"""


# ----------------------------------------------------------------------------- state file


def save_state(path: Path, state: dict[str, Any]) -> None:
    """Atomically replace ``path`` with the wire encoding of ``state``."""
    write_atomic(path, wire.encode("fl_state", state, wire.Limits(max_message_bytes=2**31 - 1)))


def load_state(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    msg = wire.decode(path.read_bytes(), wire.Limits(max_message_bytes=2**31 - 1), kinds={"fl_state"})
    return msg.body


# ----------------------------------------------------------------------------- scheduler


@dataclass
class _Server:
    address: str
    last_seen: float
    alive: bool = True


class Scheduler:
    """The FL-Scheduler node. ``evaluate(params) -> {metric: float}`` is called after each aggregation.

    ``aggregator``: a robust rule (see :data:`Aggregator`) used instead of the example-weighted mean; the
    plan then asks the FL-Servers for every accepted delta. A result that is not finite or does not match
    the model's tensors abandons the round.

    ``strategy``: a :class:`~fedarena.federated.strategy.Strategy` (``FedAvg``, ``RobustAggregate``, a wrapper such
    as :class:`~fedarena.federated.wrappers.DPFedAvg`) that selects the round's clients (``select``), sets their
    local training (``configure``: epochs, batch size, lr and FedProx's mu of the round's config; the policy's round
    config gives the other fields) and aggregates their individual updates (``aggregate``, the simulation's code
    path) in place of the policy's rule, selection and server optimizer.

    Secure rounds run the :class:`~fedarena.federated.wrappers.SecureAggregation` wrapper, the simulation's: either
    given as ``strategy`` (its inner strategy must be linear), or built from a policy whose round config sets
    ``secagg`` (around FedAvg with the policy's local training and server optimizer). The wrapper opens each
    round's protocol server and applies the unmasked sum; the scheduler only relays the clients' SecAgg messages to
    it (``secagg_up`` / ``secagg_down``) and closes its stages on its clock. No individual update reaches the
    scheduler or the servers in a secure round."""

    def __init__(
        self,
        policy: RoundPolicy,
        initial_params: Params,
        secret: bytes,
        state_path: str | Path,
        *,
        evaluate: Callable[[Params], dict[str, float]] | None = None,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
        chunk_bytes: int = wire.DEFAULT_CHUNK_BYTES,
        tls: TLSFiles | None = None,
        client_tls: TLSFiles | None = None,
        aggregator: Aggregator | None = None,
        strategy: Any = None,
    ) -> None:
        self.policy = policy
        if strategy is not None and aggregator is not None:
            raise ValueError("strategy: a strategy aggregates the individual updates itself; it takes no aggregator")
        rc = policy.round_config
        if strategy is None and rc.secagg:
            fit = FitConfig(rc.epochs, rc.batch_size, rc.lr, rc.prox_mu)
            strategy = SecureAggregation.from_round_config(
                FedAvg(fit, policy.server_optimizer, clients_per_round=policy.clients_per_round), rc)
        if rc.secagg and not isinstance(strategy, SecureAggregation):
            raise ValueError("strategy: the round config sets secagg; secure rounds run the SecureAggregation "
                             "wrapper (pass it as the strategy, around a linear one)")
        self.secure: SecureAggregation | None = strategy if isinstance(strategy, SecureAggregation) else None
        if self.secure is not None and not getattr(self.secure.inner, "linear", False):
            raise ValueError("strategy: secure aggregation releases only the sum; its inner strategy must be linear "
                             "(FedAvg family)")
        self.strategy = strategy
        if aggregator is None and strategy is None:
            aggregator = policy.rule()
        self.aggregator = aggregator
        # the default mean is bounded (norm clipping, weight cap): it needs every delta, as a robust rule does
        self.bounded = aggregator is None and strategy is None and policy.devices is None and (
            policy.max_client_weight < 1 or policy.norm_bound_multiple > 0)
        # every individual delta goes to the scheduler when the rule needs them; never in a secure round
        self.collect = self.secure is None and (aggregator is not None or self.bounded or strategy is not None
                                                or policy.devices is not None)
        self.secret = secret
        self.state_path = Path(state_path)
        self.evaluate = evaluate
        self.limits = limits
        self.chunk_bytes = chunk_bytes
        self.tls = tls
        self.client_tls = client_tls
        self.cond = threading.Condition()
        self.servers: dict[str, _Server] = {}
        self.clients: dict[str, dict[str, Any]] = {}  # id -> {num_examples, server, last_seen}
        self.assignments: dict[str, str] = {}
        self.round = 1
        self.version = 0
        self.current = RoundProgress()
        self._model_size, self._model_size_version = 0, -1  # wire size of the current model (cached per version)
        self.history: list[dict[str, Any]] = []
        self.params = {k: np.asarray(v) for k, v in initial_params.items()}
        self.opt_state = (strategy.init_state(self.params).opt_state if strategy is not None
                          else policy.server_optimizer.init(self.params))
        if self.secure is not None:
            check_secure_config(self._round_config(1), self.secure.clients_per_round or policy.clients_per_round
                                or policy.start_clients, where="strategy")
        restored = load_state(self.state_path)
        if restored is not None:
            self._restore(restored)
        self._shapes = params_shapes(self.params)
        self._stop = threading.Event()
        self._server = None
        self.port = 0
        self._thread: threading.Thread | None = None

    @property
    def phase(self) -> Phase:
        return self.current.phase

    @property
    def admitted(self) -> dict[str, str]:
        return self.current.admitted

    def _round_config(self, rnd: int) -> RoundConfig:
        """Round ``rnd``'s client config: the policy's, with the strategy's ``configure`` for local training and a
        secure strategy's secure-round fields; ValueError for a FitConfig the runtime's clients cannot run."""
        base = self.policy.round_config
        if self.strategy is None:
            return base
        fit = self.strategy.configure(rnd, RoundState(rnd, self.params, self.opt_state))
        if fit.local_steps:
            raise ValueError(f"configure: round {rnd} asks for {fit.local_steps} local steps; the runtime's clients "
                             "run whole epochs (local_steps = 0)")
        if self.secure is not None:
            base = self.secure.round_config(**{k: v for k, v in vars(base).items() if not k.startswith("secagg")})
        return replace(base, epochs=fit.epochs, batch_size=fit.batch_size, lr=fit.lr, prox_mu=fit.prox_mu)

    def _next_round(self, open_next: bool = True) -> None:
        """Count the round, start the next one's state, persist (call with ``cond`` held)."""
        self.round += 1
        self.current = RoundProgress(Phase.DONE if self.round > self.policy.rounds else Phase.IDLE)
        self._save()
        if open_next and self.current.phase == Phase.IDLE:
            self._open_round(time.monotonic())

    # -------------------------------------------------------------- persistence

    def _restore(self, s: dict[str, Any]) -> None:
        where = f"{self.state_path}"
        rnd = wire.field(s, "round", int, where=where)
        version = wire.field(s, "version", int, where=where)
        params = wire.field(s, "params", dict, where=where)
        opt_state = wire.field(s, "opt_state", dict, where=where)
        history = wire.field(s, "history", list, where=where)
        want = {k: (v.shape, v.dtype.str) for k, v in self.params.items()}
        got = {k: (getattr(v, "shape", None), getattr(getattr(v, "dtype", None), "str", None)) for k, v in params.items()}
        if want != got:
            raise wire.WireError(f"{where}.params", f"saved model {got} does not match the task's model {want}")
        if set(opt_state) != set(self.opt_state):
            raise wire.WireError(f"{where}.opt_state", f"saved optimizer state {sorted(opt_state)} does not match "
                                 f"server optimizer '{self.policy.server_optimizer.name}' ({sorted(self.opt_state)})")
        if not (1 <= rnd and 0 <= version < rnd and len(history) == rnd - 1):
            raise wire.WireError(where, f"inconsistent round state: round {rnd}, version {version}, "
                                 f"{len(history)} history rows")
        self.round, self.version, self.params, self.history = rnd, version, dict(params), list(history)
        self.opt_state = {k: dict(v) for k, v in opt_state.items()}
        if self.round > self.policy.rounds:
            self.current.phase = Phase.DONE
        log.info("scheduler: resumed at round %d, model version %d", self.round, self.version)

    def _save(self) -> None:
        save_state(self.state_path, {
            "round": self.round, "version": self.version, "params": self.params,
            "opt_state": self.opt_state, "history": self.history,
        })

    # -------------------------------------------------------------- lifecycle

    def start(self, address: str = "127.0.0.1:0") -> int:
        self._server, self.port = serve(self.handle, address, kinds=SCHEDULER_KINDS, limits=self.limits,
                                        chunk_bytes=self.chunk_bytes, tls=self.tls, name="scheduler",
                                        secret=self.secret)
        self._thread = threading.Thread(target=self._coordinate, name="coordinator", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        """Stop serving requests, then wake and join the coordinator thread."""
        self._stop.set()
        if self._server is not None:
            self._server.stop(grace=0.5)
        with self.cond:
            self.cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -------------------------------------------------------------- coordinator

    def _live_servers(self, now: float) -> list[str]:
        for sid, s in self.servers.items():
            if s.alive and now - s.last_seen > self.policy.server_timeout_s:
                s.alive = False
                log.warning("scheduler: server %s missed its heartbeat; marked dead", sid)
        return sorted(sid for sid, s in self.servers.items() if s.alive)

    def _candidates(self, now: float) -> list[str]:
        if self.policy.selection == "uniform":
            return sorted(self.clients)
        return sorted(c for c, info in self.clients.items() if now - info["last_seen"] <= self.policy.availability_s)

    def _coordinate(self) -> None:
        while not self._stop.is_set():
            try:
                self._coordinate_step()
            except Exception:  # noqa: BLE001 - e.g. a failed state write: log, keep the round state, retry
                log.exception("scheduler: coordinator step failed; retrying")
                self._stop.wait(0.5)

    def _coordinate_step(self) -> None:
        p = self.policy
        with self.cond:
            now = time.monotonic()
            self._live_servers(now)
            if self.current.phase == Phase.DONE:
                self.cond.wait(0.5)
                return
            if self.current.phase == Phase.IDLE:
                if not self._open_round(now):
                    self.cond.wait(0.05)
                return
            if self.current.phase == Phase.OPEN and self.current.secure is not None:
                sec = self.current.secure
                if sec.due(now):
                    sec.close_stage(now)
                    self.cond.notify_all()
                if sec.finished:
                    self.current.close_reason = "secagg_done" if sec.result is not None else "secagg_aborted"
                    self.current.closed_at = now
                    self.current.phase = Phase.CLOSING
                    self._finish_round()
                    self.cond.notify_all()
                else:
                    self.cond.wait(max(0.0, min(0.2, sec.deadline - now)))
                return
            if self.current.phase == Phase.OPEN:
                if len(self.current.admitted) >= len(self.current.selected) or now >= self.current.deadline:
                    cur = self.current
                    cur.close_reason = "all_reported" if len(cur.admitted) >= len(cur.selected) else "deadline"
                    self.current.closed_at = now
                    self.current.phase = Phase.CLOSING
                    self.current.grace_until = now + p.partial_grace_s
                    self.cond.notify_all()
                else:
                    self.cond.wait(min(0.5, self.current.deadline - now))
                return
            if self.current.phase == Phase.CLOSING:
                live = set(self._live_servers(now))
                expected = {s for s in self.current.admitted.values() if s in live}
                if expected - set(self.current.partials) and now < self.current.grace_until:
                    self.cond.wait(min(0.2, self.current.grace_until - now))
                    return
                self._finish_round()
                self.cond.notify_all()

    def _open_round(self, now: float) -> bool:
        """Open the next round if enough clients and a server are there (call with ``cond`` held)."""
        p = self.policy
        cands = self._candidates(now)
        need = p.start_clients if not self.history else 1
        if self.secure is not None:
            need = max(need, 3)  # with two clients the sum and one's own input give the other's
        if len(cands) < max(1, need) or not self._live_servers(now):
            return False
        k = len(cands) if p.clients_per_round == 0 else min(p.clients_per_round, len(cands))
        try:
            config = self._round_config(self.round)
        except ValueError as e:  # a strategy's configure the clients cannot run: abandon the round, no retry storm
            log.error("scheduler: cannot configure round %d: %s", self.round, e)
            self._abandon_unopened(now, [], str(e))
            return True
        selected = (select_clients(cands, k, p.seed, self.round) if self.strategy is None
                    else sorted(self.strategy.select(self.round, cands, p.seed)))
        secure = None
        if self.secure is not None:
            if len(selected) > capacity(config):  # more would overflow the fixed-point sum
                selected = select_clients(selected, capacity(config), p.seed, self.round)
            dim = sum(int(np.prod(s)) for s in self._shapes.values()) + 1
            try:
                secure = self.secure.open_round(self.round, selected, dim, now + p.window_seconds)
            except ValueError as e:  # parameters that do not fit this selection: abandon the round, no retry storm
                log.error("scheduler: cannot open secure round %d with %d clients: %s", self.round, k, e)
                self._abandon_unopened(now, selected, str(e))
                return True
        levels, costs, files = self._assign_levels(selected, config) if p.devices is not None else ({}, {}, [])
        self.current = RoundProgress(Phase.OPEN, [c for c in selected if c in levels or p.devices is None],
                                     opened_at=now, deadline=now + p.window_seconds, config=config, secure=secure,
                                     levels=levels, costs=costs, int8_files=files)
        log.info("scheduler: round %d open, %d clients selected", self.round, k)
        self.cond.notify_all()
        return True

    def _assign_levels(self, selected: Sequence[str], config: RoundConfig
                       ) -> tuple[dict[str, int], dict[str, Any], list[bytes]]:
        """Each selected client's width level and cost (:meth:`DeviceFleet.assign`, as the simulation's
        ``device_round``), and the levels' int8 files when a selected client receives int8 (priced at their
        lengths); a client no level fits, or with no device profile, sits the round out."""
        p = self.policy
        pos = {c: i for i, c in enumerate(p.device_clients)}
        levels, costs = {}, {}
        files = (self._int8_files() if any(c in pos and p.devices.receives_int8(pos[c]) for c in selected)
                 else [])
        for c in selected:
            n = self.clients.get(c, {}).get("num_examples", 0)
            if c not in pos or n <= 0:
                continue
            steps = config.epochs * math.ceil(n / config.batch_size)
            down = [len(b) for b in files] if files and p.devices.receives_int8(pos[c]) else None
            got = p.devices.assign(pos[c], self.round, config.batch_size, steps, config.prox_mu > 0, down)
            if got is not None:
                levels[c], costs[c] = got
        return levels, costs, files

    def _level_scale(self, level: int) -> float:
        """HeteroFL's scaler of width level ``level``: its hidden outputs are multiplied by this (1: no scaler)."""
        w = self.policy.widths
        return (w.rates[0] / w.rates[level]) if w.scaler else 1.0

    def _int8_files(self) -> list[bytes]:
        """Every width level's sub-model of the global model in this round as the int8 file an int8 client
        downloads (:meth:`~fedarena.federated.int8_clients.Int8Download.quantize`, the simulation's)."""
        from fedarena.federated.hetero import extract
        from fedarena.federated.int8_clients import Int8Download

        q = Int8Download(np.asarray(self.policy.int8_calibration, np.float32))
        return [q.quantize(extract(self.params, self._submodel_index(k)), sizes, self._level_scale(k))
                for k, sizes in enumerate(self.policy.devices.level_sizes)]

    def _submodel_index(self, level: int) -> list[np.ndarray]:
        from fedarena.federated.hetero import submodel_index

        sizes = [self._shapes["l0.w"][0]] + [self._shapes[f"l{i}.w"][1] for i in range(len(self._shapes) // 2)]
        return submodel_index(sizes, self.policy.widths.rates[level], self.policy.widths.kind, self.round)

    def _device_step(self, clients: Sequence[str], row: dict[str, Any]) -> tuple[Params, Any]:
        """The per-coordinate mean of the clients' sub-model updates (:class:`~fedarena.federated.hetero.
        CoordinateMean`) through the server optimizer; each client's device cost goes into ``row``."""
        from fedarena.federated.hetero import CoordinateMean

        deltas, _ = self._individual(clients)
        mean = CoordinateMean(self.params)
        for c, d in zip(sorted(clients), deltas):
            mean.add(d, self._submodel_index(self.current.levels[c]))
        fleet = self.policy.devices
        pos = {c: i for i, c in enumerate(self.policy.device_clients)}
        row["device_costs"] = {c: {"tier": fleet.profiles[pos[c]].tier, "level": self.current.levels[c],
                                   "width": self.policy.widths.rates[self.current.levels[c]],
                                   "int8": int(fleet.receives_int8(pos[c])),
                                   "memory_bytes": k.memory_bytes,
                                   "memory_budget": fleet.profiles[pos[c]].memory_bytes, "seconds": k.seconds,
                                   "time_budget": fleet.time_budget(pos[c], self.round), "flops": k.flops,
                                   "bytes_down": k.bytes_down, "bytes_up": k.bytes_up,
                                   "reported": int(c in clients)}
                               for c, k in sorted(self.current.costs.items())}
        return self.policy.server_optimizer.step(self.params, mean.mean(), self.opt_state)

    def _finish_round(self) -> None:
        p = self.policy
        total = PartialAggregate()
        bytes_up = bytes_down = 0
        for sid, (part, up, down) in sorted(self.current.partials.items()):  # _partial checked admission per client
            total.merge(part)
            bytes_up += up
            bytes_down += down
        if self.current.secure is not None:
            return self._finish_secure_round()
        need = max(1, math.ceil(p.min_fraction * len(self.current.selected)))
        row: dict[str, Any] = {
            "round": self.round, "selected": len(self.current.selected), "admitted": len(self.current.admitted),
            "reporting": len(total.clients), "needed": need, "close_reason": self.current.close_reason,
            "duration_s": self.current.closed_at - self.current.opened_at, "window_s": p.window_seconds,
            "closed_wall": time.time(),
            "bytes_up": bytes_up, "bytes_down": bytes_down,
            "servers": sorted(self.current.partials), "clients": sorted(total.clients),
        }
        applied = None
        if len(total.clients) >= need and total.weight > 0:
            try:
                if p.devices is not None:
                    applied = self._device_step(total.clients, row)
                elif self.strategy is not None:
                    applied = self._strategy_step(total.clients)
                elif self.bounded:
                    delta, info = bounded_mean(*self._individual(total.clients), p.max_client_weight,
                                               p.norm_bound_multiple)
                    row.update(info)
                    applied = p.server_optimizer.step(self.params, delta, self.opt_state)
                elif self.aggregator is None:  # the plain linear rule: the servers' partial sums suffice
                    applied = p.server_optimizer.step(self.params, total.mean_delta(), self.opt_state)
                else:
                    applied = p.server_optimizer.step(self.params, self._robust_delta(total.clients),
                                                      self.opt_state)
            except ValueError as e:  # a rule that fails or returns garbage: nothing is applied
                row["abort_reason"] = str(e)
                log.warning("scheduler: round %d abandoned: %s", self.round, e)
        version = self.version
        if applied is not None:
            self.params, self.opt_state = applied
            version += 1
            row["outcome"] = "aggregated"
            row["train_loss"] = total.loss_sum / total.weight
        else:
            row["outcome"] = "abandoned"
        row["model_version"] = version
        if self.evaluate is not None:
            row.update({k: float(v) for k, v in self.evaluate(self.params).items()})
        self.history.append(row)
        self.version = version  # after the row: whoever sees the new version (even without the lock) sees its round
        log.info("scheduler: round %d %s (%d/%d reported)", self.round, row["outcome"], len(total.clients),
                 len(self.current.selected))
        self._next_round()

    def _individual(self, clients: Sequence[str]) -> tuple[list[Params], list[float]]:
        """The deltas and weights of ``clients`` (sorted by id); ValueError if one did not reach the scheduler."""
        missing = sorted(set(clients) - set(self.current.updates))
        if missing:
            raise ValueError(f"updates: no individual update of {missing[:5]} reached the scheduler")
        order = sorted(clients)
        return [self.current.updates[c][0] for c in order], [self.current.updates[c][1] for c in order]

    def _strategy_step(self, clients: Sequence[str]) -> tuple[Params, dict]:
        """The strategy's ``aggregate`` over the individual updates of ``clients`` (sorted by id, as the simulation
        orders them); returns the new model and optimizer state."""
        from fedarena.federated.strategy import ClientUpdate, RoundState

        deltas, weights = self._individual(clients)
        updates = [ClientUpdate(c, d, w) for c, d, w in zip(sorted(clients), deltas, weights)]
        new = self.strategy.aggregate(RoundState(self.round, self.params, self.opt_state), updates, len(self.clients))
        return new.params, new.opt_state

    def _robust_delta(self, clients: Sequence[str]) -> Params:
        """The aggregator's delta over the individual updates of ``clients``; ValueError if unusable."""
        delta = self.aggregator(*self._individual(clients))
        if set(delta) != set(self._shapes):
            raise ValueError(f"aggregator: returned tensors {sorted(delta)}, the model has {sorted(self._shapes)}")
        out = {}
        for k, v in delta.items():
            v = np.asarray(v, np.float64)
            if v.shape != self._shapes[k] or not np.isfinite(v).all():
                raise ValueError(f"aggregator: tensor {k} has shape {v.shape} or is not finite")
            out[k] = v
        return out

    def _abandon_unopened(self, now: float, selected: list[str], reason: str) -> None:
        """Record a round that could not open as abandoned and move on (call with ``cond`` held)."""
        row = {"round": self.round, "selected": len(selected), "admitted": 0, "reporting": 0, "needed": 0,
               "close_reason": "not_opened", "duration_s": 0.0, "window_s": self.policy.window_seconds,
               "closed_wall": time.time(), "bytes_up": 0, "bytes_down": 0, "servers": [], "clients": [],
               "outcome": "abandoned", "abort_reason": reason, "model_version": self.version}
        self.history.append(row)
        self._next_round(open_next=False)
        self.cond.notify_all()

    def _finish_secure_round(self) -> None:
        """Record the secure round's relay statistics; the SecureAggregation strategy applies the unmasked sum."""
        p, sec = self.policy, self.current.secure
        assert sec is not None
        row: dict[str, Any] = {
            "round": self.round, "selected": len(self.current.selected), "admitted": 0, "reporting": 0,
            "needed": sec.server.config.threshold, "close_reason": self.current.close_reason,
            "duration_s": self.current.closed_at - self.current.opened_at, "window_s": p.window_seconds,
            "closed_wall": time.time(),
            # SecAgg messages as relayed, plus one model download (wire size) per client that took part
            "bytes_up": sec.bytes_up,
            "bytes_down": sec.bytes_down + self._model_wire_bytes() * len(sec.server.state.keys),
            "servers": [], "clients": [], "secagg_stage": sec.stage,
        }
        new, reason = None, sec.aborted
        if sec.result is not None:
            inverse = {v: k for k, v in sec.ids.items()}
            survivors = sorted(inverse[u] for u in sec.result.survivors)
            try:  # the strategy checks and applies the unmasked sum, as in the simulation
                new = self.secure.aggregate_unmasked(RoundState(self.round, self.params, self.opt_state),
                                                     sec.result.total, survivors)
            except AggregateOutOfRange as e:  # some client masked out-of-range values: nothing is applied
                reason = str(e)
                log.warning("scheduler: secure round %d abandoned: %s", self.round, e)
        version = self.version
        if new is not None:
            self.params, self.opt_state = new.params, new.opt_state
            version += 1
            row.update(outcome="aggregated", reporting=len(survivors),
                       examples=self.secure.last_report["secagg_examples"], clients=survivors)
        else:
            row.update(outcome="abandoned", abort_reason=reason)
        row["model_version"] = version
        if self.evaluate is not None:
            row.update({k: float(v) for k, v in self.evaluate(self.params).items()})
        self.history.append(row)
        self.version = version  # after the row, as in _finish_round
        log.info("scheduler: secure round %d %s (%d/%d survivors)", self.round, row["outcome"], row["reporting"],
                 len(self.current.selected))
        self._next_round()

    def _model_wire_bytes(self) -> int:
        if self._model_size_version != self.version:
            self._model_size = len(wire.encode("params", {"params": self.params}, self.limits))
            self._model_size_version = self.version
        return self._model_size

    def _secagg_up(self, b: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        rnd = wire.field(b, "round", int)
        cid = wire.field(b, "client_id", str)
        data = wire.field(b, "message", bytes)
        with self.cond:
            if self.current.secure is None or rnd != self.round or self.current.phase != Phase.OPEN:
                raise ProtocolError("body.round", f"round {rnd} is not an open secure round", "stale_round")
            self.current.secure.receive(cid, data)
            self.cond.notify_all()
            return "ack", {}

    def _secagg_down(self, b: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        rnd = wire.field(b, "round", int)
        cid = wire.field(b, "client_id", str)
        stage = wire.field(b, "stage", int)
        wait_s = min(max(wire.field(b, "wait_s", float, default=0.0), 0.0), 5.0)
        end = time.monotonic() + wait_s
        with self.cond:
            while True:
                if self.current.secure is None or rnd != self.round:
                    raise ProtocolError("body.round", f"round {rnd} is not an open secure round", "stale_round")
                data = self.current.secure.message_for(cid, stage)
                if data is not None:
                    return "secagg", {"message": data}
                left = end - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return "wait", {"round": rnd, "stage": self.current.secure.stage}
                self.cond.wait(left)

    # -------------------------------------------------------------- request handling

    def handle(self, msg: wire.Message, nbytes: int = 0) -> tuple[str, dict[str, Any]]:
        b = msg.body
        if msg.kind == "ping":
            return "pong", {"node": "scheduler"}
        if msg.kind == "assign":
            return self._assign(b)
        if not auth.check_cluster(self.secret, b.get("cluster_token")):
            raise ProtocolError("body.cluster_token", "invalid cluster token", "unauthenticated")
        if msg.kind == "status":
            return self._status()
        if msg.kind == "get_model":
            version = wire.field(b, "version", int)
            with self.cond:
                if version != self.version:
                    raise ProtocolError("body.version", f"model version {version} is not the current {self.version}",
                                        "stale_version")
                return "model", {"version": self.version, "params": self.params}
        server_id = wire.field(b, "server_id", str)
        if not auth.valid_client_id(server_id):
            raise ProtocolError("body.server_id", "must match [A-Za-z0-9_.-]{1,64}", "malformed")
        if msg.kind == "server_join":
            address = wire.field(b, "address", str)
            with self.cond:
                self.servers[server_id] = _Server(address, time.monotonic())
                log.info("scheduler: server %s joined at %s", server_id, address)
            return "joined", {}
        with self.cond:
            srv = self.servers.get(server_id)
            if srv is None:
                raise ProtocolError("body.server_id", f"unknown server '{server_id}' (send server_join first)",
                                    "unauthenticated")
            srv.last_seen = time.monotonic()
            if not srv.alive:
                srv.alive = True
                log.info("scheduler: server %s is back", server_id)
        if msg.kind == "sync":
            return self._sync(server_id, b)
        if msg.kind == "admit":
            return self._admit(server_id, b)
        if msg.kind == "partial":
            return self._partial(server_id, b)
        if msg.kind == "secagg_up":
            return self._secagg_up(b)
        if msg.kind == "secagg_down":
            return self._secagg_down(b)
        raise ProtocolError("kind", f"unsupported request kind {msg.kind!r}", "malformed")

    def _plan(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "round": self.round, "model_version": self.version, "phase": self.current.phase.value,
            "selected": list(self.current.selected) if self.current.phase == Phase.OPEN else [],
            "config": (self.current.config or self.policy.round_config).to_body(),
            "deadline_s": max(0.0, self.current.deadline - now) if self.current.phase == Phase.OPEN else 0.0,
            "rounds": self.policy.rounds, "collect_updates": self.collect,
            **({"submodels": self._submodel_plan()} if self.policy.devices is not None
               and self.current.phase == Phase.OPEN else {}),
            **({"int8_files": list(self.current.int8_files)} if self.current.int8_files
               and self.current.phase == Phase.OPEN else {}),
        }

    def _submodel_plan(self) -> dict[str, Any]:
        """Each selected client's sub-model: its width level, the kept units of every layer and HeteroFL's scaler
        (what an FL-Server extracts and sends it)."""
        p = self.policy
        pos = {c: i for i, c in enumerate(p.device_clients)}
        out = {}
        for c, k in self.current.levels.items():
            out[c] = {"level": k, "scale": self._level_scale(k),
                      "units": [np.asarray(u, np.int64) for u in self._submodel_index(k)]}
            if self.current.int8_files and p.devices.receives_int8(pos[c]):
                out[c]["int8"] = True  # the server sends the level's int8 file (the plan's int8_files) instead
        return out

    def _sync(self, server_id: str, b: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        known_round = wire.field(b, "known_round", int)
        known_phase = wire.field(b, "known_phase", str)
        clients = wire.field(b, "clients", dict)
        wait_s = min(max(wire.field(b, "wait_s", float), 0.0), 5.0)
        now = time.monotonic()
        with self.cond:
            for cid, info in clients.items():
                if not (auth.valid_client_id(cid) and isinstance(info, list) and len(info) == 2
                        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in info)):
                    raise ProtocolError(f"body.clients.{cid}", "expected [num_examples, seconds_since_seen]", "malformed")
                seen = now - float(info[1])
                old = self.clients.get(cid)
                if old is None or seen >= old["last_seen"]:
                    self.clients[cid] = {"num_examples": int(info[0]), "server": server_id, "last_seen": seen}
                    self.assignments.setdefault(cid, server_id)
            end = now + wait_s
            while (self.round, self.current.phase) == (known_round, known_phase) and not self._stop.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            plan = self._plan()
            if self.current.phase == Phase.OPEN and wire.field(b, "known_version", int, default=-1) != self.version:
                plan["params"] = self.params  # saves the server a get_model round trip
            return "plan", plan

    def _require_phase(self, rnd: int, phase: Phase) -> None:
        """ProtocolError unless ``rnd`` is the current round and in ``phase`` (call with ``cond`` held)."""
        if rnd != self.round or self.current.phase != phase:
            raise ProtocolError("body.round", f"round {rnd} is not {phase.value} (round {self.round} is "
                                f"{self.current.phase.value})", "stale_round")

    def _admit(self, server_id: str, b: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        rnd = wire.field(b, "round", int)
        cid = wire.field(b, "client_id", str)
        with self.cond:
            self._require_phase(rnd, Phase.OPEN)
            if cid not in self.current.selected:
                raise ProtocolError("body.client_id", f"client {cid} is not selected in round {rnd}", "not_selected")
            if cid in self.current.admitted:
                raise ProtocolError("body.client_id", f"client {cid} already reported in round {rnd}", "duplicate")
            self.current.admitted[cid] = server_id
            self.cond.notify_all()
            return "admitted", {"count": len(self.current.admitted)}

    def _partial(self, server_id: str, b: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        rnd = wire.field(b, "round", int)
        clients = wire.field(b, "clients", list)
        weight = wire.field(b, "weight", float)
        loss_sum = wire.field(b, "loss_sum", float)
        traffic = (wire.field(b, "bytes_up", int), wire.field(b, "bytes_down", int))
        sums_body = wire.field(b, "sums", dict)
        with self.cond:
            self._require_phase(rnd, Phase.CLOSING)
            for cid in clients:
                if self.current.admitted.get(cid) != server_id:
                    raise ProtocolError("body.clients", f"client {cid!r} was not admitted through {server_id}",
                                        "rejected")
            if clients and set(sums_body) != set(self._shapes) and not (self.policy.devices is not None
                                                                        and not sums_body):
                raise ProtocolError("body.sums", "tensor names differ from the model", "malformed")
            sums = {k: wire.check_array(v, f"body.sums.{k}", dtype="float64", shape=self._shapes[k], finite=True)
                    for k, v in sums_body.items()}
            if not (math.isfinite(weight) and weight >= 0 and math.isfinite(loss_sum)):
                raise ProtocolError("body.weight", "weight and loss_sum must be finite, weight >= 0", "malformed")
            part = PartialAggregate(sums=sums, weight=weight, clients=[str(c) for c in clients], loss_sum=loss_sum)
            updates: dict[str, tuple[Params, float]] = {}
            if self.collect:
                ups = wire.field(b, "updates", dict)
                ws = wire.field(b, "update_weights", dict)
                if set(ups) != set(clients) or set(ws) != set(clients):
                    raise ProtocolError("body.updates", "individual updates must cover exactly the partial's clients",
                                        "malformed")
                for cid, d in ups.items():
                    if not isinstance(d, dict) or set(d) != set(self._shapes):
                        raise ProtocolError(f"body.updates.{cid}", "tensor names differ from the model", "malformed")
                    shapes = self._shapes if self.policy.devices is None else self._sub_shapes(cid)
                    w = ws[cid]
                    if isinstance(w, bool) or not isinstance(w, (int, float)) or not (math.isfinite(w) and w > 0):
                        raise ProtocolError(f"body.update_weights.{cid}", "must be a finite number > 0", "malformed")
                    updates[cid] = ({k: wire.check_array(v, f"body.updates.{cid}.{k}", dtype="float64",
                                                         shape=shapes[k], finite=True) for k, v in d.items()},
                                    float(w))
            self.current.partials[server_id] = (part, *traffic)
            self.current.updates.update(updates)
            self.cond.notify_all()
            return "ack", {}

    def _sub_shapes(self, cid: str) -> dict[str, tuple[int, ...]]:
        """The parameter shapes of client ``cid``'s sub-model this round (ProtocolError if it has none)."""
        if cid not in self.current.levels:
            raise ProtocolError(f"body.updates.{cid}", "the client has no sub-model this round", "malformed")
        index = self._submodel_index(self.current.levels[cid])
        return {k: ((len(index[int(k[1:k.index(".")])]), len(index[int(k[1:k.index(".")]) + 1])) if k.endswith(".w")
                    else (len(index[int(k[1:k.index(".")]) + 1]),)) for k in self._shapes}

    def _ping_server(self, sid: str) -> bool:
        addr = self.servers[sid].address
        peer = Peer(addr, limits=self.limits, chunk_bytes=self.chunk_bytes, tls=self.client_tls,
                    credentials=auth.cluster_credentials(self.secret, "scheduler"))
        try:
            peer.call("ping", {}, timeout=1.0)
            return True
        except (TransportError, RemoteError, wire.WireError):
            return False
        finally:
            peer.close()

    def _assign(self, b: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        cid, token = b.get("client_id"), b.get("token")
        reason = auth.check_client(self.secret, cid, token)
        if reason:
            raise ProtocolError("body.token", reason, "unauthenticated")
        failed = wire.field(b, "failed_server", str, default="")
        if failed and failed in self.servers and self.servers[failed].alive and not self._ping_server(failed):
            with self.cond:
                self.servers[failed].alive = False
                log.warning("scheduler: server %s unreachable (reported by %s); marked dead", failed, cid)
        with self.cond:
            live = self._live_servers(time.monotonic())
            if not live:
                raise ProtocolError("server", "no live FL-Server to assign", "unavailable")
            current = self.assignments.get(cid)
            if current not in live or (current == failed and len(live) > 1):
                load = {s: 0 for s in live}
                for c, s in self.assignments.items():
                    if s in load and c != cid:
                        load[s] += 1
                choices = [s for s in live if s != failed] or live
                current = min(choices, key=lambda s: (load[s], s))
                self.assignments[cid] = current
            return "assignment", {"server_id": current, "address": self.servers[current].address}

    def _status(self) -> tuple[str, dict[str, Any]]:
        with self.cond:
            now = time.monotonic()
            return "status", {
                "round": self.round, "model_version": self.version, "phase": self.current.phase.value,
                "history": self.history, "selected": list(self.current.selected),
                "admitted": sorted(self.current.admitted),
                "servers": {s: {"address": v.address, "alive": v.alive} for s, v in self.servers.items()},
                "clients": {c: {"server": v["server"], "age_s": now - v["last_seen"]} for c, v in self.clients.items()},
                "assignments": dict(self.assignments),
            }
