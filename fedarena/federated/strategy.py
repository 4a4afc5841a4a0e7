"""The strategy interface of horizontal FL (simulation and gRPC runtime alike) and its aggregation rules.

A :class:`Strategy` has four hooks under one round loop (Flower's strategy template, McMahan et al.
2017's FedAvg round): ``select`` the round's clients, ``configure`` their local training,
``aggregate`` their updates into the next :class:`RoundState`, and ``evaluate`` (the per-client
accuracy distribution). The in-process simulation (:mod:`fedarena.federated.simulation`) calls all
four; the scheduler selects with :func:`select_clients` and aggregates its servers' partial sums
with :meth:`FedAvg.aggregate_partial`, so linear strategies share one code path with the runtime.

* FedAvg (McMahan et al., AISTATS 2017): the global update is the example-weighted mean of the
  client deltas, ``Delta = sum_i n_i Delta_i / sum_i n_i``, applied as ``x <- x + eta * Delta``
  (``eta = 1`` is plain FedAvg).
* Partial aggregation (the MindSpore Federated distributed aggregation): each FL-Server keeps
  ``(sum_i n_i Delta_i, sum_i n_i, clients)`` for its own clients; partials add up exactly, so the
  combined mean equals the mean over all clients whichever server each client used.
* FedAdagrad / FedAdam / FedYogi (Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
  Algorithm 2): with the mean delta as pseudo-gradient, ``m = b1 m + (1 - b1) Delta``;
  Adagrad ``v = v + Delta^2``; Adam ``v = b2 v + (1 - b2) Delta^2``;
  Yogi ``v = v - (1 - b2) Delta^2 sign(v - Delta^2)``; ``x <- x + eta m / (sqrt(v) + tau)``,
  with ``m_{-1} = 0`` and ``v_{-1} = tau^2`` (the paper requires ``v_{-1} >= tau^2``; no bias correction).

* SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1): clients correct each gradient by
  ``c - c_i``; the server applies ``x <- x + eta_g mean_S(Delta y_i)`` and
  ``c <- c + |S| / N mean_S(Delta c_i)`` (unweighted means, as in the paper).
* :class:`RobustAggregate`: the round with any rule of the one rule table,
  :data:`fedarena.federated.rules.AGGREGATION_RULES` (coordinate-wise median, trimmed mean, (multi-)Krum,
  geometric median, Krum preselection, and whatever :func:`fedarena.federated.rules.register_rule` adds), in place
  of the weighted mean. :func:`robust_rule` is the same table entry in the gRPC runtime's per-tensor form, and the
  runtime's bounded mean (:func:`bounded_mean`: norm bounding, Sun et al. 2019, and water-filled weight caps) is the
  table's ``mean`` with its two stages.
* Example-count bounds: a client's FedAvg weight is ``min(n_i, max_weight)`` so no client can
  dominate a round by claiming (or holding) many examples.

Parameters are ``dict[str, np.ndarray]``; accumulation is in float64, stored models keep their dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence

import numpy as np

from fedarena.federated import rules

Params = dict[str, np.ndarray]


@dataclass
class PartialAggregate:
    """Running ``sum n_i Delta_i``, ``sum n_i`` and the contributing client ids of one server and round."""

    sums: Params = field(default_factory=dict)
    weight: float = 0.0
    clients: list[str] = field(default_factory=list)
    loss_sum: float = 0.0

    def add(self, client_id: str, delta: Params, num_examples: float, loss: float = 0.0) -> None:
        if num_examples <= 0:
            raise ValueError(f"num_examples: must be positive, got {num_examples}")
        for name, d in delta.items():
            acc = self.sums.get(name)
            contrib = np.asarray(d, dtype=np.float64) * float(num_examples)
            self.sums[name] = contrib if acc is None else acc + contrib
        self.weight += float(num_examples)
        self.clients.append(client_id)
        self.loss_sum += float(loss) * float(num_examples)

    def merge(self, other: "PartialAggregate") -> None:
        dup = set(self.clients) & set(other.clients)
        if dup:
            raise ValueError(f"clients: {sorted(dup)} appear in two partial aggregates")
        for name, s in other.sums.items():
            self.sums[name] = s.copy() if name not in self.sums else self.sums[name] + s
        self.weight += other.weight
        self.clients.extend(other.clients)
        self.loss_sum += other.loss_sum

    def mean_delta(self) -> Params:
        if self.weight <= 0:
            raise ValueError("weight: no client contributed to this aggregate")
        return {name: s / self.weight for name, s in self.sums.items()}


ServerOptimizerName = Literal["fedavg", "fedadagrad", "fedadam", "fedyogi"]


@dataclass(frozen=True)
class ServerOptimizer:
    """Server update rule applied to the aggregated mean delta (see module docstring)."""

    name: ServerOptimizerName = "fedavg"
    lr: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def __post_init__(self) -> None:
        if self.name not in ("fedavg", "fedadagrad", "fedadam", "fedyogi"):
            raise ValueError(f"server_optimizer: unknown '{self.name}' (fedavg, fedadagrad, fedadam, fedyogi)")
        if not self.lr > 0:
            raise ValueError(f"server_lr: must be > 0, got {self.lr}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"beta1/beta2: must lie in [0, 1), got {self.beta1}, {self.beta2}")
        if not self.tau > 0:
            raise ValueError(f"tau: must be > 0, got {self.tau}")

    def init(self, params: Params) -> dict[str, Params]:
        if self.name == "fedavg":
            return {}
        return {
            "m": {k: np.zeros(v.shape, np.float64) for k, v in params.items()},
            "v": {k: np.full(v.shape, self.tau**2, np.float64) for k, v in params.items()},
        }

    def step(self, params: Params, delta: Params, state: dict[str, Params]) -> tuple[Params, dict[str, Params]]:
        """Return ``(new_params, new_state)``; inputs are not modified."""
        if set(delta) != set(params):
            raise ValueError(f"delta: names {sorted(delta)} differ from the model's {sorted(params)}")
        if self.name == "fedavg":
            new = {k: (params[k].astype(np.float64) + self.lr * delta[k]).astype(params[k].dtype) for k in params}
            return new, {}
        m_new, v_new, new = {}, {}, {}
        for k, x in params.items():
            d = np.asarray(delta[k], np.float64)
            m = self.beta1 * state["m"][k] + (1.0 - self.beta1) * d
            v_old = state["v"][k]
            d2 = d * d
            if self.name == "fedadagrad":
                v = v_old + d2
            elif self.name == "fedadam":
                v = self.beta2 * v_old + (1.0 - self.beta2) * d2
            else:  # fedyogi
                v = v_old - (1.0 - self.beta2) * d2 * np.sign(v_old - d2)
            m_new[k], v_new[k] = m, v
            new[k] = (x.astype(np.float64) + self.lr * m / (np.sqrt(v) + self.tau)).astype(x.dtype)
        return new, {"m": m_new, "v": v_new}


# ----------------------------------------------------------------------------- the strategy interface


@dataclass(frozen=True)
class FitConfig:
    """What every selected client runs in a round."""

    epochs: int = 1
    batch_size: int = 10
    lr: float = 0.1
    prox_mu: float = 0.0
    """FedProx proximal coefficient (Li et al. 2020, Eq. 2); 0 = FedAvg's local objective"""
    local_steps: int = 0
    """> 0: exactly this many minibatch steps (batches drawn epoch after epoch) instead of ``epochs``"""

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs: must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}")
        if self.prox_mu < 0:
            raise ValueError(f"prox_mu: must be >= 0, got {self.prox_mu}")
        if self.local_steps < 0:
            raise ValueError(f"local_steps: must be >= 0, got {self.local_steps}")


@dataclass(frozen=True)
class RoundState:
    """The server's state between rounds: the next round number, the global model, optimizer state, SCAFFOLD's c."""

    round: int
    params: Params
    opt_state: dict = field(default_factory=dict)
    control: Params = field(default_factory=dict)


@dataclass(frozen=True)
class ClientUpdate:
    """What one client returns: its model delta (float64), example count, training loss, SCAFFOLD's Delta c_i."""

    client_id: str
    delta: Params
    num_examples: int
    loss: float = 0.0
    control_delta: Params | None = None


def select_clients(candidates: Sequence[str], k: int, seed: int, rnd: int) -> list[str]:
    """``k`` of ``candidates`` uniformly without replacement, by the round's own generator ``(seed, round)``;
    ``k = 0`` selects all. The scheduler and the simulation select with this function."""
    cands = sorted(candidates)
    if k > len(cands):
        raise ValueError(f"clients_per_round: {k} exceeds the {len(cands)} available clients")
    if k == 0:
        return cands
    rng = np.random.default_rng([seed, rnd])
    return sorted(rng.choice(cands, size=k, replace=False).tolist())


def client_accuracy_summary(accs: np.ndarray, prefix: str = "client_acc") -> dict[str, float]:
    """Mean, 10th percentile and worst of a per-client accuracy vector."""
    a = np.asarray(accs, np.float64)
    if a.size == 0:
        return {}
    return {f"{prefix}_mean": float(a.mean()), f"{prefix}_p10": float(np.percentile(a, 10)),
            f"{prefix}_worst": float(a.min())}


class Strategy(Protocol):
    """Hooks of one FL round (see the module docstring): every hook a runtime or a wrapper
    (:mod:`fedarena.federated.wrappers`) calls is declared here."""

    clients_per_round: int
    linear: bool
    """the aggregate is a function of the partial sums (:meth:`aggregate_partial`): the runtime's servers may
    pre-aggregate"""

    def select(self, rnd: int, candidates: Sequence[str], seed: int) -> list[str]: ...

    def configure(self, rnd: int, state: RoundState) -> FitConfig: ...

    def init_state(self, params: Params) -> RoundState: ...

    def weight(self, num_examples: float) -> float:
        """A client's aggregation weight for its example count."""

    def client_correction(self, state: RoundState, client_state: Params | None) -> Params | None:
        """The correction added to each local gradient of a client whose kept state is ``client_state`` (None:
        plain local SGD)."""

    def client_control_update(self, state: RoundState, client_state: Params | None, local: Params, start: Params,
                              steps: int, fit: FitConfig) -> tuple[Params, Params] | None:
        """After local training from ``start`` to ``local`` in ``steps`` steps: the client's new kept state and the
        control delta it uploads (None: the strategy keeps no client state)."""

    def aggregate(self, state: RoundState, updates: Sequence[ClientUpdate], num_clients: int) -> RoundState: ...

    def aggregate_partial(self, state: RoundState, total: PartialAggregate) -> RoundState: ...

    def evaluate(self, rnd: int, client_accuracies: np.ndarray) -> dict[str, float]: ...


def _stack(updates: Sequence[ClientUpdate], names: Sequence[str]) -> np.ndarray:
    return np.stack([np.concatenate([np.asarray(u.delta[k], np.float64).ravel() for k in names]) for u in updates])


def _unflatten(flat: np.ndarray, like: Params, names: Sequence[str]) -> Params:
    out, i = {}, 0
    for k in names:
        n = like[k].size
        out[k] = flat[i: i + n].reshape(like[k].shape)
        i += n
    return out


@dataclass(frozen=True)
class FedAvg:
    """FedAvg / FedProx (``fit.prox_mu > 0``) / FedAdagrad / FedAdam / FedYogi (``server_optimizer``)."""

    fit: FitConfig = field(default_factory=FitConfig)
    server_optimizer: ServerOptimizer = field(default_factory=ServerOptimizer)
    clients_per_round: int = 0
    max_weight: float = 0.0
    """example-count bound: a client weighs ``min(n_i, max_weight)`` (0 = unbounded)"""

    linear = True  # the aggregate is a function of partial sums: the runtime's servers can pre-aggregate

    def select(self, rnd: int, candidates: Sequence[str], seed: int) -> list[str]:
        """``clients_per_round`` of the candidates (all of them when fewer are available)."""
        k = self.clients_per_round
        return select_clients(candidates, k if k <= len(candidates) else 0, seed, rnd)

    def configure(self, rnd: int, state: RoundState) -> FitConfig:
        return self.fit

    def init_state(self, params: Params) -> RoundState:
        return RoundState(1, dict(params), self.server_optimizer.init(params))

    def weight(self, num_examples: float) -> float:
        return min(float(num_examples), self.max_weight) if self.max_weight > 0 else float(num_examples)

    def client_correction(self, state: RoundState, client_state: Params | None) -> Params | None:
        return None

    def client_control_update(self, state: RoundState, client_state: Params | None, local: Params, start: Params,
                              steps: int, fit: FitConfig) -> tuple[Params, Params] | None:
        return None

    def aggregate_partial(self, state: RoundState, total: PartialAggregate) -> RoundState:
        params, opt = self.server_optimizer.step(state.params, total.mean_delta(), state.opt_state)
        return RoundState(state.round + 1, params, opt, state.control)

    def aggregate(self, state: RoundState, updates: Sequence[ClientUpdate], num_clients: int) -> RoundState:
        """The example-weighted mean of the deltas (one vectorised :class:`PartialAggregate`), then the server step."""
        if not updates:
            return replace(state, round=state.round + 1)
        w = np.array([self.weight(u.num_examples) for u in updates], np.float64)
        if not (w > 0).all():
            raise ValueError(f"num_examples: must be positive, got {[u.num_examples for u in updates]}")
        sums = {k: np.tensordot(w, np.stack([np.asarray(u.delta[k], np.float64) for u in updates]), axes=1)
                for k in state.params}
        total = PartialAggregate(sums, float(w.sum()), [u.client_id for u in updates],
                                 float(np.dot(w, [u.loss for u in updates])))
        return self.aggregate_partial(state, total)

    def evaluate(self, rnd: int, client_accuracies: np.ndarray) -> dict[str, float]:
        return client_accuracy_summary(client_accuracies)


def fedprox(mu: float, fit: FitConfig = FitConfig(), **kw) -> FedAvg:
    """FedProx (Li et al., MLSys 2020): FedAvg whose clients minimise ``F_k(w) + mu/2 ||w - w_t||^2``."""
    return FedAvg(fit=replace(fit, prox_mu=mu), **kw)


@dataclass(frozen=True)
class Scaffold(FedAvg):
    """SCAFFOLD (option II control variates); the simulation keeps each client's ``c_i``."""

    server_lr: float = 1.0

    linear = False

    def init_state(self, params: Params) -> RoundState:
        return RoundState(1, dict(params), {}, {k: np.zeros(v.shape, np.float64) for k, v in params.items()})

    def client_correction(self, state: RoundState, client_state: Params | None) -> Params:
        """``c - c_i`` (``c_i = 0`` before the client's first round)."""
        return {k: state.control[k] - (0.0 if client_state is None else client_state[k]) for k in state.control}

    def client_control_update(self, state: RoundState, client_state: Params | None, local: Params, start: Params,
                              steps: int, fit: FitConfig) -> tuple[Params, Params]:
        """Option II: ``c_i+ = c_i - c + (x - y_i) / (K lr)``; returns ``(c_i+, Delta c_i)``."""
        old = client_state if client_state is not None else \
            {k: np.zeros(v.shape, np.float64) for k, v in state.control.items()}
        K = max(steps, 1)
        new = {k: old[k] - state.control[k] + (start[k].astype(np.float64) - local[k].astype(np.float64))
               / (K * fit.lr) for k in old}
        return new, {k: new[k] - old[k] for k in old}

    def aggregate(self, state: RoundState, updates: Sequence[ClientUpdate], num_clients: int) -> RoundState:
        if not updates:
            return replace(state, round=state.round + 1)
        if any(u.control_delta is None for u in updates):
            raise ValueError("control_delta: every SCAFFOLD update must carry its Delta c_i")
        s = len(updates)
        params = {k: (v.astype(np.float64) + self.server_lr * sum(np.asarray(u.delta[k], np.float64) for u in updates)
                      / s).astype(v.dtype) for k, v in state.params.items()}
        control = {k: c + sum(u.control_delta[k] for u in updates) / num_clients for k, c in state.control.items()}
        return RoundState(state.round + 1, params, {}, control)


RobustRule = str
"""the name of a rule of :data:`fedarena.federated.rules.AGGREGATION_RULES`"""


def coordinate_median(x: np.ndarray) -> np.ndarray:
    """The ``median`` rule of :mod:`fedarena.federated.rules`."""
    return rules.median(x, np.ones(len(x)))


def trimmed_mean(x: np.ndarray, beta: float) -> np.ndarray:
    """The ``trimmed_mean`` rule of :mod:`fedarena.federated.rules`."""
    return rules.trimmed_mean(x, np.ones(len(x)), beta)


def krum(x: np.ndarray, num_byzantine: int, keep: int = 1) -> np.ndarray:
    """The ``krum`` rule of :mod:`fedarena.federated.rules` (average of the ``keep`` lowest-scored updates)."""
    return rules.krum(x, np.ones(len(x)), num_byzantine, max(1, keep))


def geometric_median(x: np.ndarray, smoothing: float = 1e-6, max_iter: int = 100, tol: float = 1e-7) -> np.ndarray:
    """The ``geometric_median`` rule of :mod:`fedarena.federated.rules`."""
    return rules.geometric_median(x, np.ones(len(x)), smoothing, max_iter, tol)


@dataclass(frozen=True)
class RobustAggregate(FedAvg):
    """FedAvg's round with a rule of :data:`fedarena.federated.rules.AGGREGATION_RULES` in place of the linear
    weighted mean (the built-in robust rules are unweighted, see :mod:`fedarena.federated.rules`); the rule gets
    the client deltas in sorted client-id order and their :meth:`FedAvg.weight`."""

    rule: RobustRule = "median"
    trim_fraction: float = 0.2
    num_byzantine: int = 0
    """Krum's f (assumed number of Byzantine clients per round)"""
    krum_keep: int | None = None
    """multi-Krum's m (1 = Krum); Blanchard et al.'s multi-Krum with m = n - f averages every update it trusts;
    None: the table's default of the rule (1 for ``krum``, ``n - f`` for ``multi_krum``)"""
    krum_preselect: bool = False
    """before median / trimmed mean / geometric median, keep the ``n - f`` updates with the lowest Krum scores
    (the selection stage of Bulyan, El Mhamdi et al. ICML 2018): a sign-flipped update stands out in the whole
    parameter space while, coordinate by coordinate, it hides inside the honest clients' noise"""
    rule_params: Mapping[str, Any] = field(default_factory=dict)
    """further parameters of ``rule`` (a rule added by :func:`fedarena.federated.rules.register_rule`)"""

    linear = False

    def __post_init__(self) -> None:
        if self.num_byzantine < 0:
            raise ValueError(f"krum_byzantine: must be >= 0, got {self.num_byzantine}")
        if self.krum_preselect and self.num_byzantine < 1:
            raise ValueError("krum_preselect: needs a coordinate-wise or geometric-median rule and krum_byzantine >= 1")
        self.bound_rule()  # a bad name or parameter fails here, naming the field

    def bound_rule(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """The table's rule with this strategy's parameters (built per call: the strategy stays picklable)."""
        return _bind_rule(self.rule, self.trim_fraction, self.num_byzantine, self.krum_keep, self.krum_preselect,
                          self.rule_params)

    def robust_delta(self, x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """The rule over the ``(n, d)`` updates ``x`` (``weights`` default to equal ones)."""
        return self.bound_rule()(x, np.ones(len(x)) if weights is None else weights)

    def aggregate(self, state: RoundState, updates: Sequence[ClientUpdate], num_clients: int) -> RoundState:
        if not updates:
            return replace(state, round=state.round + 1)
        names = sorted(state.params)
        ordered = sorted(updates, key=lambda u: u.client_id)
        w = np.array([self.weight(u.num_examples) for u in ordered], np.float64)
        delta = _unflatten(self.robust_delta(_stack(ordered, names), w), state.params, names)
        params, opt = self.server_optimizer.step(state.params, delta, state.opt_state)
        return RoundState(state.round + 1, params, opt, state.control)


def _bind_rule(rule: str, trim_fraction: float, krum_byzantine: int, krum_keep: int | None, krum_preselect: bool,
               extra: Mapping[str, Any]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The table's rule with those of the named parameters it takes (the others belong to other rules; None: the
    table's default)."""
    named = {"trim_fraction": trim_fraction, "krum_byzantine": krum_byzantine, "krum_keep": krum_keep}
    takes = rules.rule_params(rule)
    params = {k: v for k, v in named.items() if k in takes and v is not None}
    if krum_preselect:
        if rule in ("krum", "multi_krum"):
            raise ValueError("krum_preselect: needs a coordinate-wise or geometric-median rule and krum_byzantine >= 1")
        params["krum_preselect"] = krum_byzantine
    return rules.aggregation_rule(rule, **params, **dict(extra))


cap_weights = rules.cap_weights
bounded_mean = rules.bounded_mean
krum_scores = rules.krum_scores


def robust_rule(rule: RobustRule, trim_fraction: float = 0.2, krum_byzantine: int = 0, krum_keep: int | None = None,
                krum_preselect: bool = False, **rule_params: Any
                ) -> Callable[[Sequence[Params], Sequence[float]], Params]:
    """A rule of :data:`fedarena.federated.rules.AGGREGATION_RULES` in the gRPC runtime's form
    (``Scheduler(aggregator=...)``): the client deltas and their weights -> the global delta. A bad argument
    raises ValueError naming the field."""
    if krum_byzantine < 0:
        raise ValueError(f"krum_byzantine: must be >= 0, got {krum_byzantine}")
    return rules.params_rule(_bind_rule(rule, trim_fraction, krum_byzantine, krum_keep, krum_preselect, rule_params))
