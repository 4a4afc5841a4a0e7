"""The aggregation rules of horizontal FL: one name -> function table for the simulation, the gRPC runtime and Flower.

A rule maps the round's flattened client deltas ``updates`` (``(n, d)`` float64, one row per client in the order
the runtime received them, which every runtime makes the sorted client-id order) and their ``weights`` (``(n,)``,
the clients' capped example weights) to the aggregated delta (``(d,)``). :data:`AGGREGATION_RULES` holds every
rule by name; :func:`aggregation_rule` validates a name and its parameters once and returns the two-argument
rule; :func:`register_rule` adds a rule, after which :class:`~fedarena.federated.strategy.RobustAggregate` (the
simulation and Flower's :class:`~fedarena.federated.flower.FlowerStrategy`) and
:class:`~fedarena.federated.scheduler.RoundPolicy` (the gRPC runtime) take its name, as ``league/pfsp.py`` keeps
its weightings.

Built-in rules (``weights`` are used by ``mean`` only; the robust rules are unweighted, as in their papers):

* ``mean``: the weighted mean ``sum_i w_i x_i / sum_i w_i`` (FedAvg, McMahan et al. 2017).
* ``median``: coordinate-wise median; ``trimmed_mean``: per coordinate drop the ``floor(beta n)`` smallest and
  largest values and average the rest (Yin et al., ICML 2018).
* ``krum`` / ``multi_krum``: score = sum of squared distances to the ``n - f - 2`` nearest other updates; average
  the ``m`` lowest-scored (Blanchard et al., NeurIPS 2017; ``krum_keep`` = m, ``multi_krum`` defaults to
  ``m = n - f``).
* ``geometric_median``: ``argmin_z sum_i ||x_i - z||`` by RFA's smoothed Weiszfeld iteration (Pillutla, Kakade &
  Harchaoui, IEEE TSP 2022, Algorithm 2).

Defences beyond coordinate-wise rules (the stateful parts -- centered clipping's momentum centre, FLTrust's
per-round root-set update, bucketing's per-round permutation -- are :class:`fedarena.federated.defences.Defended`'s;
here each rule takes them as parameters):

* ``centered_clipping``: from ``center`` ``v`` (zeros when not given), ``v <- v + 1/n sum_i (x_i - v)
  min(1, tau / ||x_i - v||)``, ``iterations`` times (Karimireddy, He & Jaggi, ICML 2021, Eq. 3); an update moves
  the result by at most ``tau / n``. ``tau_quantile = q > 0`` sets ``tau`` each call to the ``q``-quantile of the
  distances ``||x_i - v||`` from the centre.
* ``bucketing``: a permutation (``seed``) of the updates cut into buckets of ``bucket_size``, each bucket averaged,
  and the table's rule ``rule`` (with ``rule_params``) over the bucket means (Karimireddy, He & Jaggi, ICLR 2022,
  Algorithm 1). ``weighted`` (here and in ``centered_clipping``): weighted bucket means and CC steps weighted by
  the weights' shares instead of the papers' unweighted ones.
* ``norm_bound``: the weighted mean after clipping every update to ``multiple`` times the round's median norm
  (Sun et al. 2019, FLAME's median bound, Nguyen et al. 2022).
* ``fltrust``: trust scores ``ReLU(cos(g_i, g_0))`` against the server's root-set update ``reference`` ``g_0``,
  updates rescaled to ``||g_0||`` (Cao et al., NDSS 2021, Algorithm 2); it needs ``reference`` (a ValueError
  without one).

Stages every rule takes through :func:`aggregation_rule` (they act before the rule):

* ``krum_preselect = f > 0``: keep the ``n - f`` updates with the lowest Krum scores (the selection stage of
  Bulyan, El Mhamdi et al., ICML 2018); not with ``krum`` itself.
* ``norm_bound_multiple = k > 0``: clip every update to ``k`` times the round's median L2 norm (Sun et al. 2019,
  with FLAME's median bound, Nguyen et al. 2022); ``max_client_weight = c < 1``: cap the weights by water-filling
  so none exceeds ``c`` of their sum (:func:`cap_weights`). The gRPC runtime's default ``mean`` is the mean with
  both stages (:func:`bounded_mean`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

Params = dict[str, np.ndarray]
AggregationRule = Callable[..., np.ndarray]
"""``rule(updates: (n, d) array, weights: (n,) array, **params) -> (d,) array``"""


@dataclass(frozen=True)
class RuleSpec:
    """A table entry: the function, its parameters with their defaults, and their check (raises ValueError)."""

    fn: AggregationRule
    params: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[..., None] | None = None


AGGREGATION_RULES: dict[str, AggregationRule] = {}
_SPECS: dict[str, RuleSpec] = {}
STAGE_PARAMS = {"krum_preselect": 0, "norm_bound_multiple": 0.0, "max_client_weight": 1.0}
"""parameters of the stages :func:`aggregation_rule` runs before every rule (see the module docstring)"""


def register_rule(name: str, fn: AggregationRule, *, params: Mapping[str, Any] | None = None,
                  check: Callable[..., None] | None = None, replace: bool = False) -> None:
    """Add ``fn`` to the table as ``name``; ``params`` are its keyword parameters with their defaults, ``check``
    is called once with the merged parameters (as keywords) and raises ValueError naming a bad one."""
    if not isinstance(name, str) or not name or not name.replace("_", "").isalnum():
        raise ValueError(f"aggregation: a rule name must be a non-empty identifier, got {name!r}")
    if name in _SPECS and not replace:
        raise ValueError(f"aggregation: rule '{name}' is already registered (pass replace=True to redefine it)")
    clash = set(params or {}) & set(STAGE_PARAMS)
    if clash:
        raise ValueError(f"aggregation: rule '{name}' may not take the stage parameters {sorted(clash)}")
    _SPECS[name] = RuleSpec(fn, dict(params or {}), check)
    AGGREGATION_RULES[name] = fn


def unregister_rule(name: str) -> None:
    """Remove a rule added by :func:`register_rule` (tests clean up with it)."""
    _SPECS.pop(name, None)
    AGGREGATION_RULES.pop(name, None)


def rule_params(name: str) -> dict[str, Any]:
    """The parameters of rule ``name`` with their defaults (ValueError for an unknown name)."""
    return dict(_spec(name).params)


def _spec(name: str) -> RuleSpec:
    spec = _SPECS.get(name)
    if spec is None:
        raise ValueError(f"aggregation: unknown '{name}' (one of {', '.join(sorted(_SPECS))})")
    return spec


def aggregation_rule(name: str, **params: Any) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Rule ``name`` with ``params`` bound: ``rule(updates, weights) -> delta``. Unknown names and parameters and
    bad values raise ValueError naming the field, here and not when the rule first runs."""
    spec = _spec(name)
    stage = {k: params.pop(k, v) for k, v in STAGE_PARAMS.items()}
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        raise ValueError(f"{unknown[0]}: rule '{name}' takes no such parameter (it takes "
                         f"{', '.join(sorted(spec.params)) or 'none'})")
    bound = {**spec.params, **params}
    if spec.check is not None:
        spec.check(**bound)
    f = int(stage["krum_preselect"])
    if isinstance(stage["krum_preselect"], bool) or f < 0:
        raise ValueError(f"krum_preselect: must be an integer >= 0 (the f of Krum), got {stage['krum_preselect']!r}")
    if f and name in ("krum", "multi_krum"):
        raise ValueError("krum_preselect: needs a coordinate-wise or geometric-median rule, not Krum itself")
    k, c = float(stage["norm_bound_multiple"]), float(stage["max_client_weight"])
    if not (k == 0 or k >= 1):
        raise ValueError(f"norm_bound_multiple: must be 0 (off) or >= 1 (a multiple of the median update norm), "
                         f"got {k}")
    if not 0 < c <= 1:
        raise ValueError(f"max_client_weight: must lie in (0, 1], got {c}")
    fn = spec.fn

    def rule(updates: np.ndarray, weights: np.ndarray) -> np.ndarray:
        x = np.asarray(updates, np.float64)
        w = np.asarray(weights, np.float64)
        if x.ndim != 2 or w.shape != (x.shape[0],):
            raise ValueError(f"updates: expected (n, d) updates and (n,) weights, got {x.shape} and {w.shape}")
        if f and len(x) > f:
            keep = np.sort(np.argsort(krum_scores(x, f), kind="stable")[: len(x) - f])
            x, w = x[keep], w[keep]
        if k > 0:
            x = x * norm_bound_scales(x, k)[:, None]
        if c < 1:
            w = cap_weights(w, c)
        return np.asarray(fn(x, w, **bound), np.float64)

    rule.__name__ = name
    return rule


# ----------------------------------------------------------------------------- the built-in rules


def mean(updates: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The weighted mean of the rows."""
    w = np.asarray(weights, np.float64)
    if not (w > 0).all():
        raise ValueError(f"weights: must be positive, got {w.tolist()}")
    return np.tensordot(w / w.sum(), updates, axes=1)


def median(updates: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The coordinate-wise median (unweighted)."""
    return np.median(updates, axis=0)


def trimmed_mean(updates: np.ndarray, weights: np.ndarray, trim_fraction: float = 0.2) -> np.ndarray:
    """Per coordinate: drop the ``floor(beta n)`` smallest and largest values and average the rest."""
    n = updates.shape[0]
    b = int(trim_fraction * n)
    if 2 * b >= n:
        raise ValueError(f"trim_fraction: {trim_fraction} trims every one of {n} updates")
    s = np.sort(updates, axis=0)
    return s[b: n - b].mean(axis=0)


def _check_trim(trim_fraction: float) -> None:
    if not 0 <= trim_fraction < 0.5:
        raise ValueError(f"trim_fraction: must lie in [0, 0.5), got {trim_fraction}")


def krum_scores(x: np.ndarray, num_byzantine: int) -> np.ndarray:
    """Krum's score of every row: the sum of squared distances to its ``n - f - 2`` nearest other rows."""
    n = x.shape[0]
    sq = np.sum(x * x, axis=1)
    d = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (x @ x.T), 0.0)
    m = max(1, n - num_byzantine - 2)
    return np.array([np.sort(np.delete(d[i], i))[:m].sum() for i in range(n)])


def krum(updates: np.ndarray, weights: np.ndarray, krum_byzantine: int = 0, krum_keep: int = 1) -> np.ndarray:
    """(Multi-)Krum: the average of the ``krum_keep`` updates with the lowest Krum scores (``krum_keep = 0``:
    ``n - f`` of them, Blanchard et al.'s multi-Krum)."""
    n = updates.shape[0]
    keep = krum_keep if krum_keep > 0 else max(1, n - krum_byzantine)
    best = np.argsort(krum_scores(updates, krum_byzantine), kind="stable")[: max(1, keep)]
    return updates[best].mean(axis=0)


def _check_krum(krum_byzantine: int, krum_keep: int) -> None:
    if isinstance(krum_byzantine, bool) or not isinstance(krum_byzantine, (int, np.integer)) or krum_byzantine < 0:
        raise ValueError(f"krum_byzantine: must be an integer >= 0, got {krum_byzantine!r}")
    if isinstance(krum_keep, bool) or not isinstance(krum_keep, (int, np.integer)) or krum_keep < 0:
        raise ValueError(f"krum_keep: must be an integer >= 0 (0 = n - f), got {krum_keep!r}")


def geometric_median(updates: np.ndarray, weights: np.ndarray, smoothing: float = 1e-6, max_iter: int = 100,
                     tol: float = 1e-7) -> np.ndarray:
    """The geometric median by the smoothed Weiszfeld iteration of RFA: ``z <- sum_i b_i x_i / sum_i b_i`` with
    ``b_i = 1 / max(smoothing, ||x_i - z||)``, from the mean, until the objective ``sum_i ||x_i - z||`` improves
    by less than ``tol`` relatively (at most ``max_iter`` steps). Breakdown point 1/2."""
    x = updates
    z = x.mean(axis=0)
    obj = np.linalg.norm(x - z, axis=1).sum()
    for _ in range(max_iter):
        b = 1.0 / np.maximum(smoothing, np.linalg.norm(x - z, axis=1))
        z = (b[:, None] * x).sum(axis=0) / b.sum()
        new = np.linalg.norm(x - z, axis=1).sum()
        if obj - new <= tol * max(new, 1e-30):
            break
        obj = new
    return z


def _check_geometric_median(smoothing: float, max_iter: int, tol: float) -> None:
    if not (smoothing > 0 and tol >= 0):
        raise ValueError(f"smoothing/tol: need smoothing > 0 and tol >= 0, got {smoothing}, {tol}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"max_iter: must be an integer >= 1, got {max_iter!r}")


# ----------------------------------------------------------------------------- defences beyond coordinate-wise rules


def centered_clipping(updates: np.ndarray, weights: np.ndarray, tau: float = 0.15, iterations: int = 1,
                      center: np.ndarray | None = None, tau_quantile: float = 0.0, weighted: bool = False
                      ) -> np.ndarray:
    """Karimireddy et al.'s centered clipping from ``center`` (zeros when None): ``iterations`` times
    ``v <- v + sum_i p_i (x_i - v) min(1, tau / ||x_i - v||)`` with ``p_i = 1/n`` (the paper's unweighted rule)
    or, ``weighted``, ``p_i = w_i / sum_j w_j`` (then the rule is the weighted mean when nothing is clipped, and an
    update moves the result by at most ``p_i tau``). ``tau_quantile = q > 0``: the radius is the round's
    ``q``-quantile of the distances ``||x_i - center||`` (numpy's linear interpolation) instead of the fixed
    ``tau``; at ``q <= 1/2`` it is at most the largest honest distance while fewer than half the updates are
    Byzantine."""
    x = np.asarray(updates, np.float64)
    _check_centered_clipping(tau, iterations, center, tau_quantile)
    v = np.zeros(x.shape[1]) if center is None else np.asarray(center, np.float64).copy()
    if v.shape != (x.shape[1],):
        raise ValueError(f"center: expected a ({x.shape[1]},) vector, got shape {v.shape}")
    if weighted:
        p = np.asarray(weights, np.float64)
        if not (p > 0).all():
            raise ValueError(f"weights: must be positive, got {p.tolist()}")
        p = p / p.sum()
    else:
        p = np.full(len(x), 1.0 / len(x))
    if tau_quantile > 0:
        tau = float(np.quantile(np.linalg.norm(x - v, axis=1), tau_quantile))
        if tau <= 0:  # every update is the centre
            return v
    for _ in range(iterations):
        diff = x - v
        norms = np.linalg.norm(diff, axis=1)
        scale = np.minimum(1.0, tau / np.maximum(norms, 1e-300))
        v = v + (p * scale) @ diff
    return v


def _check_centered_clipping(tau: float, iterations: int, center: Any, tau_quantile: float = 0.0,
                             weighted: bool = False) -> None:
    if not tau > 0:
        raise ValueError(f"tau: must be > 0, got {tau}")
    if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) or iterations < 1:
        raise ValueError(f"iterations: must be an integer >= 1, got {iterations!r}")
    if not 0 <= tau_quantile <= 1:
        raise ValueError(f"tau_quantile: must lie in [0, 1] (0 = the fixed tau), got {tau_quantile}")


def bucketing(updates: np.ndarray, weights: np.ndarray, bucket_size: int = 2, rule: str = "centered_clipping",
              rule_params: Mapping[str, Any] | None = None, seed: Any = 0, weighted: bool = False) -> np.ndarray:
    """The table's rule ``rule`` (with ``rule_params``) over the means of buckets of ``bucket_size`` updates of a
    permutation drawn by ``np.random.default_rng(seed)`` (the last bucket may be smaller); a bucket weighs the sum
    of its members' weights. A bucket's mean is unweighted (the paper's), or, ``weighted``, its members' weighted
    mean (so a weighted rule over the buckets sees the updates' weighted mean when it clips nothing)."""
    _check_bucketing(bucket_size, rule, rule_params, seed)
    w = np.asarray(weights, np.float64)
    means, groups = bucket_means(updates, w, bucket_size, seed, weighted)
    return aggregation_rule(rule, **dict(rule_params or {}))(means, np.array([w[g].sum() for g in groups]))


def bucket_means(updates: np.ndarray, weights: np.ndarray, bucket_size: int, seed: Any, weighted: bool = False
                 ) -> tuple[np.ndarray, list[np.ndarray]]:
    """:func:`bucketing`'s buckets: the means (weighted means with ``weighted``) of the buckets of ``bucket_size``
    updates of the permutation drawn by ``np.random.default_rng(seed)``, and each bucket's update indices."""
    x, w = np.asarray(updates, np.float64), np.asarray(weights, np.float64)
    perm = np.random.default_rng(seed).permutation(len(x))
    groups = [perm[i: i + bucket_size] for i in range(0, len(x), bucket_size)]
    if weighted:
        if not (w > 0).all():
            raise ValueError(f"weights: must be positive, got {w.tolist()}")
        return np.stack([w[g] @ x[g] / w[g].sum() for g in groups]), groups
    return np.stack([x[g].mean(0) for g in groups]), groups


def _check_bucketing(bucket_size: int, rule: str, rule_params: Mapping[str, Any] | None, seed: Any,
                     weighted: bool = False) -> None:
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, (int, np.integer)) or bucket_size < 1:
        raise ValueError(f"bucket_size: must be an integer >= 1, got {bucket_size!r}")
    if rule == "bucketing":
        raise ValueError("rule: bucketing's inner rule must be another rule of the table")
    aggregation_rule(rule, **dict(rule_params or {}))  # names an unknown inner rule or parameter


def adaptive_norm_bound(updates: np.ndarray, weights: np.ndarray, multiple: float = 1.0) -> np.ndarray:
    """The weighted mean after clipping every update to ``multiple`` times the round's median update norm."""
    _check_norm_bound(multiple)
    x = np.asarray(updates, np.float64)
    return mean(x * norm_bound_scales(x, multiple)[:, None], weights)


def _check_norm_bound(multiple: float) -> None:
    if not multiple > 0:
        raise ValueError(f"multiple: must be > 0, got {multiple}")


def fltrust(updates: np.ndarray, weights: np.ndarray, reference: np.ndarray | None = None) -> np.ndarray:
    """FLTrust's trust-weighted, norm-equalised mean ``sum_i TS_i ||g_0|| / ||g_i|| g_i / sum_i TS_i`` with
    ``TS_i = ReLU(cos(g_i, g_0))`` against the root-set update ``reference`` ``g_0`` (zero when nobody is
    trusted)."""
    _check_fltrust(reference)
    x = np.asarray(updates, np.float64)
    g0 = np.asarray(reference, np.float64)
    if g0.shape != (x.shape[1],):
        raise ValueError(f"reference: expected a ({x.shape[1]},) root-set update, got shape {g0.shape}")
    n0 = float(np.linalg.norm(g0))
    safe = np.maximum(np.linalg.norm(x, axis=1), 1e-300)
    trust = np.maximum(0.0, (x @ g0) / (safe * max(n0, 1e-300)))
    if trust.sum() <= 0:
        return np.zeros(x.shape[1])
    return ((trust * n0 / safe)[:, None] * x).sum(0) / trust.sum()


def _check_fltrust(reference: Any) -> None:
    if reference is None:
        raise ValueError("reference: FLTrust needs the server's root-set update (configure a clean root set)")


register_rule("mean", mean)
register_rule("median", median)
register_rule("trimmed_mean", trimmed_mean, params={"trim_fraction": 0.2}, check=_check_trim)
register_rule("krum", krum, params={"krum_byzantine": 0, "krum_keep": 1}, check=_check_krum)
register_rule("multi_krum", krum, params={"krum_byzantine": 0, "krum_keep": 0}, check=_check_krum)
register_rule("geometric_median", geometric_median, params={"smoothing": 1e-6, "max_iter": 100, "tol": 1e-7},
              check=_check_geometric_median)
register_rule("centered_clipping", centered_clipping, params={"tau": 0.15, "iterations": 1, "center": None,
                                                              "tau_quantile": 0.0, "weighted": False},
              check=_check_centered_clipping)
register_rule("bucketing", bucketing, params={"bucket_size": 2, "rule": "centered_clipping", "rule_params": {},
                                              "seed": 0, "weighted": False}, check=_check_bucketing)
register_rule("norm_bound", adaptive_norm_bound, params={"multiple": 1.0}, check=_check_norm_bound)
register_rule("fltrust", fltrust, params={"reference": None}, check=_check_fltrust)


# ----------------------------------------------------------------------------- the stages and the runtime's mean


def norm_bound_scales(x: np.ndarray, multiple: float) -> np.ndarray:
    """Per row, the factor that clips it to ``multiple`` times the median row L2 norm (1 where it is inside)."""
    norms = np.linalg.norm(x, axis=1)
    bound = multiple * float(np.median(norms))
    scale = np.ones(len(x))
    over = norms > bound
    scale[over] = bound / norms[over]
    return scale


def cap_weights(weights: Sequence[float], max_fraction: float) -> np.ndarray:
    """``min(w_i, L)`` with the largest level ``L`` at which no weight exceeds ``max_fraction`` of their sum
    (water-filling); equal weights when ``max_fraction * n <= 1`` (no level can satisfy the cap)."""
    w = np.asarray(weights, np.float64)
    n = w.size
    if n == 0 or max_fraction >= 1 or w.max() <= max_fraction * w.sum():
        return w
    if max_fraction * n <= 1:
        return np.full(n, w.mean())
    desc = np.sort(w)[::-1]
    for k in range(1, n):  # the k largest weights are cut to L = c * (rest + k L)
        level = max_fraction * desc[k:].sum() / (1 - max_fraction * k)
        if desc[k] <= level <= desc[k - 1]:
            return np.minimum(w, level)
    return np.full(n, w.mean())  # not reached for max_fraction * n > 1


def flatten_params(deltas: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]) -> np.ndarray:
    """The ``(n, d)`` float64 matrix of ``deltas``, tensors in the order ``names``."""
    return np.stack([np.concatenate([np.asarray(d[k], np.float64).ravel() for k in names]) for d in deltas])


def unflatten_params(flat: np.ndarray, like: Mapping[str, np.ndarray], names: Sequence[str]) -> Params:
    out, i = {}, 0
    for k in names:
        n = int(np.prod(np.shape(like[k])))
        out[k] = flat[i: i + n].reshape(np.shape(like[k]))
        i += n
    return out


def params_rule(rule: Callable[[np.ndarray, np.ndarray], np.ndarray]
                ) -> Callable[[Sequence[Params], Sequence[float]], Params]:
    """``rule`` over the gRPC runtime's per-tensor deltas: ``(deltas, weights) -> delta`` (tensors in sorted
    name order when flattened)."""

    def aggregate(deltas: Sequence[Params], weights: Sequence[float]) -> Params:
        names = sorted(deltas[0])
        flat = rule(flatten_params(deltas, names), np.asarray(weights, np.float64))
        return unflatten_params(flat, deltas[0], names)

    return aggregate


def bounded_mean(deltas: Sequence[Params], weights: Sequence[float], max_client_weight: float,
                 norm_bound_multiple: float) -> tuple[Params, dict[str, float]]:
    """``mean`` with the ``norm_bound_multiple`` and ``max_client_weight`` stages over per-tensor deltas.

    Returns the mean and ``{"norm_bound", "norm_clipped", "weight_capped"}`` (the bound used, 0 when off, and how
    many deltas / weights were cut)."""
    names = sorted(deltas[0])
    x = flatten_params(deltas, names)
    w0 = np.asarray(weights, np.float64)
    scale = norm_bound_scales(x, norm_bound_multiple) if norm_bound_multiple > 0 else np.ones(len(x))
    w = cap_weights(w0, max_client_weight)
    delta = unflatten_params(mean(x * scale[:, None], w), deltas[0], names)
    bound = norm_bound_multiple * float(np.median(np.linalg.norm(x, axis=1))) if norm_bound_multiple > 0 else 0.0
    return delta, {"norm_bound": bound, "norm_clipped": int((scale < 1).sum()),
                   "weight_capped": int((w < w0 - 1e-12 * w0.max()).sum())}
