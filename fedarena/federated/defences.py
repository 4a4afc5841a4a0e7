"""Byzantine-robust aggregation beyond coordinate-wise rules, as aggregation rules of the form
``rule(updates: (n, d), weights: (n,), **params) -> (d,)`` and a strategy wrapper that applies one in the
simulation.

* Centered clipping (Karimireddy, He & Jaggi, "Learning from History for Byzantine Robust Optimization",
  ICML 2021, Eq. 3): from a centre ``v`` (the previous round's aggregate, the paper's momentum),
  ``v <- v + 1/n sum_i (x_i - v) min(1, tau / ||x_i - v||)``, ``iterations`` times; its fixed point is the
  ``v`` with ``sum_i clip_tau(x_i - v) = 0``. An update moves the result by at most ``tau / n``.
* Bucketing (Karimireddy, He & Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing",
  ICLR 2022, Algorithm 1): a random permutation of the updates is cut into buckets of ``s``, each bucket is
  averaged, and a robust rule aggregates the bucket means (a bucket weighs the sum of its members' weights).
  Averaging shrinks the honest updates' spread (non-IID data) while a bucket holds few attackers.
* Norm bounding with an adaptive bound (Sun et al., "Can You Really Backdoor Federated Learning?", 2019; the
  bound a multiple of the round's median norm as in FLAME, Nguyen et al. 2022): every update is clipped to
  ``multiple`` times the median update norm, then the weighted mean (:func:`~fedarena.federated.strategy.bounded_mean`).
* FLTrust (Cao, Fang, Liu & Gong, NDSS 2021, Algorithm 2): the server trains on a small clean root set for the
  round's reference update ``g_0``; client ``i`` gets the trust score ``TS_i = ReLU(cos(g_i, g_0))``, its update
  is rescaled to ``||g_0||``, and the aggregate is ``sum_i TS_i ||g_0|| / ||g_i|| g_i / sum_i TS_i`` (zero when
  every score is zero).

The coordinate-wise and distance-based rules (median, trimmed mean, Krum, geometric median) are
:mod:`fedarena.federated.strategy`'s; bucketing runs before any rule of the signature above.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np

from fedarena.federated.simulation import BatchedModel, batch_plan, client_key, make_group_plan
from fedarena.federated.strategy import (ClientUpdate, FitConfig, Params, RoundState, bounded_mean,
                                         coordinate_median, geometric_median, krum, trimmed_mean)

Rule = Callable[..., np.ndarray]


def centered_clipping(updates: np.ndarray, weights: np.ndarray, *, tau: float, iterations: int = 1,
                      center: np.ndarray | None = None) -> np.ndarray:
    """Karimireddy et al.'s centered clipping from ``center`` (zeros when None); unweighted, as in the paper."""
    x = np.asarray(updates, np.float64)
    if not tau > 0:
        raise ValueError(f"tau: must be > 0, got {tau}")
    if iterations < 1:
        raise ValueError(f"iterations: must be >= 1, got {iterations}")
    v = np.zeros(x.shape[1]) if center is None else np.asarray(center, np.float64).copy()
    for _ in range(iterations):
        diff = x - v
        norms = np.linalg.norm(diff, axis=1)
        scale = np.minimum(1.0, tau / np.maximum(norms, 1e-300))
        v = v + (diff * scale[:, None]).mean(0)
    return v


def bucketing(updates: np.ndarray, weights: np.ndarray, *, bucket_size: int, rule: Rule, seed: Any = 0,
              **rule_params: Any) -> np.ndarray:
    """``rule`` over the means of buckets of ``bucket_size`` updates of a permutation drawn by
    ``np.random.default_rng(seed)`` (the last bucket may be smaller)."""
    if bucket_size < 1:
        raise ValueError(f"bucket_size: must be >= 1, got {bucket_size}")
    x, w = np.asarray(updates, np.float64), np.asarray(weights, np.float64)
    perm = np.random.default_rng(seed).permutation(len(x))
    groups = [perm[i: i + bucket_size] for i in range(0, len(x), bucket_size)]
    means = np.stack([x[g].mean(0) for g in groups])
    return rule(means, np.array([w[g].sum() for g in groups]), **rule_params)


def adaptive_norm_bound(updates: np.ndarray, weights: np.ndarray, *, multiple: float = 1.0) -> np.ndarray:
    """The weighted mean after clipping every update to ``multiple`` times the round's median update norm."""
    if not multiple > 0:
        raise ValueError(f"multiple: must be > 0, got {multiple}")
    mean, _ = bounded_mean([{"delta": row} for row in np.asarray(updates, np.float64)], weights, 1.0, multiple)
    return mean["delta"]


def fltrust(updates: np.ndarray, weights: np.ndarray, *, reference: np.ndarray | None = None) -> np.ndarray:
    """FLTrust's trust-weighted, norm-equalised mean against the root-set update ``reference``."""
    if reference is None:
        raise ValueError("reference: FLTrust needs the server's root-set update (configure a clean root set)")
    x = np.asarray(updates, np.float64)
    g0 = np.asarray(reference, np.float64)
    n0 = float(np.linalg.norm(g0))
    norms = np.linalg.norm(x, axis=1)
    safe = np.maximum(norms, 1e-300)
    trust = np.maximum(0.0, (x @ g0) / (safe * max(n0, 1e-300)))
    if trust.sum() <= 0:
        return np.zeros(x.shape[1])
    return ((trust * n0 / safe)[:, None] * x).sum(0) / trust.sum()


# the robust rules of fedarena.federated.strategy in the rule signature (bucketing's inner rules); the lead's
# merge replaces this with the shared rule table
def _mean(u, w):
    return np.tensordot(np.asarray(w, np.float64) / np.sum(w), u, axes=1)


INNER_RULES: dict[str, Rule] = {
    "mean": _mean,
    "median": lambda u, w: coordinate_median(u),
    "trimmed_mean": lambda u, w, trim_fraction=0.2: trimmed_mean(u, trim_fraction),
    "krum": lambda u, w, num_byzantine=0, keep=1: krum(u, num_byzantine, keep),
    "geometric_median": lambda u, w: geometric_median(u),
    "centered_clipping": centered_clipping,
}


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
class Defended:
    """``strategy``'s round (selection, fit, server optimizer, evaluation) with ``rule(updates, weights,
    **params)`` in place of its aggregation. ``center_previous``: the rule gets ``center=`` the previous round's
    aggregate (centered clipping's momentum; zeros in the first round), also through ``bucketing``. ``root``:
    the rule gets ``reference=`` the round's root-set update (FLTrust). ``seed``: bucketing's permutation of round
    ``r`` is drawn by ``(seed, r)``."""

    strategy: Any
    rule: Rule
    params: dict[str, Any] = field(default_factory=dict)
    center_previous: bool = False
    root: RootSet | None = None
    bucket_seeded: bool = False
    seed: int = 0
    previous: np.ndarray | None = field(default=None, init=False)

    linear = False

    @property
    def clients_per_round(self) -> int:
        return self.strategy.clients_per_round

    def select(self, rnd, candidates, seed):
        return self.strategy.select(rnd, candidates, seed)

    def configure(self, rnd, state):
        return self.strategy.configure(rnd, state)

    def init_state(self, params: Params) -> RoundState:
        self.previous = None
        return self.strategy.init_state(params)

    def evaluate(self, rnd, client_accuracies):
        return self.strategy.evaluate(rnd, client_accuracies)

    def __getattr__(self, name: str) -> Any:
        if name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)

    def aggregate(self, state: RoundState, updates: Sequence[ClientUpdate], num_clients: int) -> RoundState:
        if not updates:
            return RoundState(state.round + 1, state.params, state.opt_state, state.control)
        names = sorted(state.params)
        x = np.stack([np.concatenate([np.asarray(u.delta[k], np.float64).ravel() for k in names]) for u in updates])
        w = np.array([self.strategy.weight(u.num_examples) for u in updates], np.float64)
        kw = dict(self.params)
        if self.center_previous:
            kw["center"] = self.previous if self.previous is not None else np.zeros(x.shape[1])
        if self.root is not None:
            ref = self.root.update(state.params, self.strategy.configure(state.round, state), state.round)
            kw["reference"] = np.concatenate([ref[k].ravel() for k in names])
        if self.bucket_seeded:
            kw["seed"] = [self.seed, state.round]
        flat = self.rule(x, w, **kw)
        self.previous = flat
        delta, i = {}, 0
        for k in names:
            n = state.params[k].size
            delta[k] = flat[i: i + n].reshape(state.params[k].shape)
            i += n
        params, opt = self.strategy.server_optimizer.step(state.params, delta, state.opt_state)
        return RoundState(state.round + 1, params, opt, state.control)


# ----------------------------------------------------------------------------- config

DefenceName = Literal["none", "centered_clipping", "bucketing", "norm_bound", "fltrust"]
DEFENCES: tuple[str, ...] = ("none", "centered_clipping", "bucketing", "norm_bound", "fltrust")


@dataclass(frozen=True)
class DefenceConfig:
    """The defence part of the ``strategy`` section: which defence and its parameters.

    ``centered_clipping`` clips around the previous aggregate; ``bucketing`` runs ``bucket_rule`` (default
    centered clipping) over bucket means; ``norm_bound`` clips to ``norm_multiple`` median norms;
    ``fltrust`` needs a root set (``root_size`` examples the server holds)."""

    kind: DefenceName = "none"
    tau: float = 0.15
    """centered clipping's radius, in the units of the flattened update: it should be about an honest update's
    distance from the previous aggregate. 0.15 did best of {0.05, 0.15, 0.5} for the digits MLP of
    benchmarks/fedsim_robustness.py on its tuning seed (100), whose honest updates have norms 0.1-0.4"""
    iterations: int = 1
    """centered clipping's iterations per round (the paper: one suffices with momentum)"""
    bucket_size: int = 2
    """bucketing's s"""
    bucket_rule: Literal["centered_clipping", "median", "trimmed_mean", "krum", "geometric_median", "mean"] = \
        "centered_clipping"
    trim_fraction: float = 0.2
    num_byzantine: int = 0
    """Krum's f for bucketing's krum rule (in buckets)"""
    norm_multiple: float = 1.0
    """norm bound: clip to this many median norms (1 = FLAME's median-norm bound)"""
    root_size: int = 0
    """FLTrust: examples of the server's clean root set (0 = none configured)"""

    def __post_init__(self) -> None:
        if self.kind not in DEFENCES:
            raise ValueError(f"defence.kind: unknown '{self.kind}' ({', '.join(DEFENCES)})")
        if not self.tau > 0:
            raise ValueError(f"defence.tau: must be > 0, got {self.tau}")
        if self.iterations < 1:
            raise ValueError(f"defence.iterations: must be >= 1, got {self.iterations}")
        if self.bucket_size < 1:
            raise ValueError(f"defence.bucket_size: must be >= 1, got {self.bucket_size}")
        if self.bucket_rule not in INNER_RULES:
            raise ValueError(f"defence.bucket_rule: unknown '{self.bucket_rule}' ({', '.join(INNER_RULES)})")
        if not 0 <= self.trim_fraction < 0.5:
            raise ValueError(f"defence.trim_fraction: must lie in [0, 0.5), got {self.trim_fraction}")
        if self.num_byzantine < 0:
            raise ValueError(f"defence.num_byzantine: must be >= 0, got {self.num_byzantine}")
        if not self.norm_multiple > 0:
            raise ValueError(f"defence.norm_multiple: must be > 0, got {self.norm_multiple}")
        if self.root_size < 0:
            raise ValueError(f"defence.root_size: must be >= 0, got {self.root_size}")
        if self.kind == "fltrust" and self.root_size == 0:
            raise ValueError("defence.root_size: fltrust needs a clean root set on the server (root_size > 0)")

    def build(self, strategy: Any, *, root: RootSet | None = None, seed: int = 0) -> Any:
        """``strategy`` defended (``strategy`` itself for ``none``); ``root`` is the server's root set."""
        if self.kind == "none":
            return strategy
        if self.kind == "centered_clipping":
            return Defended(strategy, centered_clipping, {"tau": self.tau, "iterations": self.iterations},
                            center_previous=True, seed=seed)
        if self.kind == "bucketing":
            inner: dict[str, Any] = {
                "centered_clipping": {"tau": self.tau, "iterations": self.iterations},
                "trimmed_mean": {"trim_fraction": self.trim_fraction},
                "krum": {"num_byzantine": self.num_byzantine}}.get(self.bucket_rule, {})
            return Defended(strategy, bucketing, {"bucket_size": self.bucket_size,
                                                  "rule": INNER_RULES[self.bucket_rule], **inner},
                            center_previous=self.bucket_rule == "centered_clipping", bucket_seeded=True, seed=seed)
        if self.kind == "norm_bound":
            return Defended(strategy, adaptive_norm_bound, {"multiple": self.norm_multiple}, seed=seed)
        if root is None or len(root.y) != self.root_size:
            raise ValueError(f"defence.root_size: fltrust needs the server's root set of {self.root_size} examples")
        return Defended(strategy, fltrust, {}, root=root, seed=seed)
