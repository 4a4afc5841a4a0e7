"""Byzantine-robust aggregation beyond coordinate-wise rules in the simulation: the strategy wrapper that runs a
rule of the table (:mod:`fedarena.federated.rules`, where the stateless rules ``centered_clipping``, ``bucketing``,
``norm_bound`` and ``fltrust`` are registered) with the state a defence keeps across rounds, the server's clean
root set, and the builder of the ``strategy.defence`` section (:func:`build_defence`; the section itself is
:class:`fedarena.federated.config.DefenceConfig`, re-exported here).

* Centered clipping (Karimireddy, He & Jaggi, "Learning from History for Byzantine Robust Optimization",
  ICML 2021, Eq. 3): from a centre ``v`` (the previous round's aggregate, the paper's momentum),
  ``v <- v + 1/n sum_i (x_i - v) min(1, tau / ||x_i - v||)``, ``iterations`` times; its fixed point is the
  ``v`` with ``sum_i clip_tau(x_i - v) = 0``. An update moves the result by at most ``tau / n``. With
  ``weighted`` (``strategy.defence.weighted``) the ``1/n`` are the updates' weight shares (FedAvg's example
  counts), so the rule is FedAvg's weighted mean wherever it clips nothing.
* Bucketing (Karimireddy, He & Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing",
  ICLR 2022, Algorithm 1): a random permutation of the updates is cut into buckets of ``s``, each bucket is
  averaged, and a robust rule aggregates the bucket means (a bucket weighs the sum of its members' weights).
  Averaging shrinks the honest updates' spread (non-IID data) while a bucket holds few attackers. With
  ``weighted`` a bucket's mean is its members' weighted mean.
* Norm bounding with an adaptive bound (Sun et al., "Can You Really Backdoor Federated Learning?", 2019; the
  bound a multiple of the round's median norm as in FLAME, Nguyen et al. 2022): every update is clipped to
  ``multiple`` times the median update norm, then the weighted mean.
* FLTrust (Cao, Fang, Liu & Gong, NDSS 2021, Algorithm 2): the server trains on a small clean root set for the
  round's reference update ``g_0``; client ``i`` gets the trust score ``TS_i = ReLU(cos(g_i, g_0))``, its update
  is rescaled to ``||g_0||``, and the aggregate is ``sum_i TS_i ||g_0|| / ||g_i|| g_i / sum_i TS_i`` (zero when
  every score is zero).

The coordinate-wise and distance-based rules (median, trimmed mean, Krum, geometric median) and the four rules
above are entries of :data:`fedarena.federated.rules.AGGREGATION_RULES`; bucketing runs before any other rule of
the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from fedarena.federated import rules
from fedarena.federated.config import DEFENCES, DefenceConfig, DefenceName  # noqa: F401  (the section)
from fedarena.federated.rules import adaptive_norm_bound, bucketing, centered_clipping, fltrust  # noqa: F401
from fedarena.federated.simulation import BatchedModel, batch_plan, client_key, make_group_plan
from fedarena.federated.strategy import ClientUpdate, FitConfig, Params, RoundState
from fedarena.federated.wrappers import StrategyWrapper


# ----------------------------------------------------------------------------- the server's root set


@dataclass
class RootSet:
    """FLTrust's clean root set on the server: the reference update is local training of the global model on
    ``(x, y)`` with the round's :class:`FitConfig`, the same batched trainer the clients use."""

    model: BatchedModel
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.y) == 0:
            raise ValueError("defence.root_set: the root set is empty")
        self.x = np.ascontiguousarray(self.x, np.float32)
        self._onehot = np.eye(self.num_classes, dtype=np.float32)[np.asarray(self.y, np.int64)]

    def update(self, params: Params, fit: FitConfig, rnd: int) -> Params:
        """``w_root - params`` after training on the root set from ``params``."""
        rng = np.random.default_rng([self.seed, rnd, client_key("server-root")])
        batches, epochs = batch_plan(len(self.y), fit, rng)
        plan = make_group_plan([(np.arange(len(self.y)), batches, epochs)], [len(batches)], fit.batch_size)
        stack, _ = self.model.train_group(params, plan, self.x, self._onehot, fit)
        return {k: stack[k][0].astype(np.float64) - np.asarray(params[k], np.float64) for k in params}


# ----------------------------------------------------------------------------- the simulation's defended round


@dataclass
class Defended(StrategyWrapper):
    """``inner``'s round (selection, fit, server optimizer, evaluation) with the table's rule ``rule`` (a name of
    :data:`fedarena.federated.rules.AGGREGATION_RULES`, with ``params``) in place of its aggregation.
    ``center_previous``: the rule gets ``center=`` the previous round's aggregate (centered clipping's momentum;
    zeros in the first round), through ``bucketing`` as its inner rule's parameter; ``center_momentum = beta >
    0``: the centre is instead the server's momentum of the aggregates, ``m_t = beta m_{t-1} + (1 - beta) v_t``
    (``m_1 = v_1``; the server's step is still the round's aggregate ``v_t``). ``root``: the rule gets
    ``reference=`` the round's root-set update (FLTrust). ``bucket_seeded``: bucketing's permutation of round ``r``
    is drawn by ``(seed, r)``."""

    inner: Any
    rule: str
    params: dict[str, Any] = field(default_factory=dict)
    center_previous: bool = False
    root: RootSet | None = None
    bucket_seeded: bool = False
    seed: int = 0
    center_momentum: float = 0.0
    previous: np.ndarray | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.center_momentum < 1:
            raise ValueError(f"center_momentum: must lie in [0, 1), got {self.center_momentum}")
        probe = dict(self.params)
        if self.root is not None:
            probe["reference"] = np.zeros(1)
        rules.aggregation_rule(self.rule, **probe)  # a bad name or parameter fails here, naming the field

    @property
    def linear(self) -> bool:
        return False  # the rule needs every individual update

    def init_state(self, params: Params) -> RoundState:
        self.previous = None
        return self.inner.init_state(params)

    def aggregate_partial(self, state, total):
        raise ValueError(f"strategy.defence: {self.rule} needs every individual update; partial sums cannot be "
                         "defended")

    def aggregate(self, state: RoundState, updates: Sequence[ClientUpdate], num_clients: int) -> RoundState:
        if not updates:
            return RoundState(state.round + 1, state.params, state.opt_state, state.control)
        names = sorted(state.params)
        ordered = sorted(updates, key=lambda u: u.client_id)
        x = rules.flatten_params([u.delta for u in ordered], names)
        w = np.array([self.inner.weight(u.num_examples) for u in ordered], np.float64)
        kw = dict(self.params)
        if self.center_previous:
            center = self.previous if self.previous is not None else np.zeros(x.shape[1])
            if self.rule == "bucketing":
                kw["rule_params"] = {**dict(kw.get("rule_params", {})), "center": center}
            else:
                kw["center"] = center
        if self.root is not None:
            ref = self.root.update(state.params, self.inner.configure(state.round, state), state.round)
            kw["reference"] = np.concatenate([ref[k].ravel() for k in names])
        if self.bucket_seeded:
            kw["seed"] = [self.seed, state.round]
        flat = rules.aggregation_rule(self.rule, **kw)(x, w)
        if self.previous is None or self.center_momentum == 0:
            self.previous = flat
        else:
            self.previous = self.center_momentum * self.previous + (1 - self.center_momentum) * flat
        delta = rules.unflatten_params(flat, state.params, names)
        params, opt = self.inner.server_optimizer.step(state.params, delta, state.opt_state)
        return RoundState(state.round + 1, params, opt, state.control)


def build_defence(cfg: DefenceConfig, strategy: Any, *, root: RootSet | None = None, seed: int = 0) -> Any:
    """``strategy`` defended as ``cfg`` says (``strategy`` itself for ``none``); ``root`` is the server's root set."""
    if cfg.kind == "none":
        return strategy
    if cfg.kind == "centered_clipping":
        return Defended(strategy, "centered_clipping", {"tau": cfg.tau, "iterations": cfg.iterations,
                                                        "weighted": cfg.weighted},
                        center_previous=True, seed=seed)
    if cfg.kind == "bucketing":
        inner = {k: v for k, v in {"tau": cfg.tau, "iterations": cfg.iterations, "trim_fraction": cfg.trim_fraction,
                                   "krum_byzantine": cfg.num_byzantine, "weighted": cfg.weighted}.items()
                 if k in rules.rule_params(cfg.bucket_rule)}
        return Defended(strategy, "bucketing", {"bucket_size": cfg.bucket_size, "rule": cfg.bucket_rule,
                                                "rule_params": inner, "weighted": cfg.weighted},
                        center_previous=cfg.bucket_rule == "centered_clipping", bucket_seeded=True, seed=seed)
    if cfg.kind == "norm_bound":
        return Defended(strategy, "norm_bound", {"multiple": cfg.norm_multiple}, seed=seed)
    if root is None or len(root.y) != cfg.root_size:
        raise ValueError(f"root_size: fltrust needs the server's root set of {cfg.root_size} examples")
    return Defended(strategy, "fltrust", {}, root=root, seed=seed)
