"""The aggregation-rule table (fedarena.federated.rules): names and parameters are checked once, with one-line errors
naming the field; the stages and multi-Krum against brute-force oracles written here from the papers' definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedarena.federated import rules


def _brute_krum_scores(x, f):
    """Blanchard et al. 2017: the sum of squared distances to the n - f - 2 nearest other rows, by explicit loops."""
    n = len(x)
    out = []
    for i in range(n):
        d = sorted(float(np.sum((x[i] - x[j]) ** 2)) for j in range(n) if j != i)
        out.append(sum(d[: max(1, n - f - 2)]))
    return np.array(out)


def test_unknown_names_and_parameters_are_one_line_errors_naming_the_field():
    with pytest.raises(ValueError, match=r"^aggregation: unknown 'avg' \(one of .*geometric_median.*trimmed_mean"):
        rules.aggregation_rule("avg")
    with pytest.raises(ValueError, match=r"^trim: rule 'trimmed_mean' takes no such parameter \(it takes trim_fraction\)"):
        rules.aggregation_rule("trimmed_mean", trim=0.1)
    with pytest.raises(ValueError, match=r"^trim_fraction: must lie in \[0, 0.5\)"):
        rules.aggregation_rule("trimmed_mean", trim_fraction=0.5)
    with pytest.raises(ValueError, match=r"^krum_byzantine: must be an integer >= 0"):
        rules.aggregation_rule("krum", krum_byzantine=-1)
    with pytest.raises(ValueError, match=r"^krum_preselect: needs a coordinate-wise"):
        rules.aggregation_rule("krum", krum_preselect=1)
    with pytest.raises(ValueError, match=r"^norm_bound_multiple: must be 0 \(off\) or >= 1"):
        rules.aggregation_rule("mean", norm_bound_multiple=0.5)
    with pytest.raises(ValueError, match=r"^max_client_weight: must lie in \(0, 1\]"):
        rules.aggregation_rule("median", max_client_weight=0.0)


def test_register_rule_refuses_a_second_definition_and_stage_parameter_names():
    def first(updates, weights):
        return updates[0]

    rules.register_rule("first_row", first)
    try:
        with pytest.raises(ValueError, match="already registered"):
            rules.register_rule("first_row", first)
        with pytest.raises(ValueError, match="stage parameters"):
            rules.register_rule("other", first, params={"norm_bound_multiple": 1.0})
        x = np.arange(6.0).reshape(3, 2)
        np.testing.assert_array_equal(rules.aggregation_rule("first_row")(x, np.ones(3)), x[0])
        assert "first_row" in rules.AGGREGATION_RULES
    finally:
        rules.unregister_rule("first_row")
    assert "first_row" not in rules.AGGREGATION_RULES


@pytest.mark.parametrize("f", [0, 1, 2])
def test_multi_krum_averages_the_n_minus_f_best_scored_updates(f):
    rng = np.random.default_rng(f)
    x = rng.standard_normal((8, 5))
    x[:f] += 10.0  # f far-away updates
    want_idx = np.argsort(_brute_krum_scores(x, f), kind="stable")[: 8 - f]
    got = rules.aggregation_rule("multi_krum", krum_byzantine=f)(x, np.ones(8))
    np.testing.assert_allclose(got, x[want_idx].mean(0))
    if f:
        assert not set(want_idx) & set(range(f))  # the outliers are never kept


def test_norm_bound_and_weight_cap_stages_act_before_the_rule():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 4)) * np.array([[1.0], [1.0], [1.0], [1.0], [20.0]])
    w = np.array([1.0, 2.0, 3.0, 4.0, 40.0])
    got = rules.aggregation_rule("mean", norm_bound_multiple=2.0, max_client_weight=0.4)(x, w)
    norms = np.linalg.norm(x, axis=1)
    bound = 2.0 * np.median(norms)
    clipped = np.array([r * min(1.0, bound / nr) for r, nr in zip(x, norms)])
    # the water level L with min(w_i, L) summing so that L = 0.4 of the total, found by bisection
    lo, hi = 0.0, w.max()
    for _ in range(200):
        mid = (lo + hi) / 2
        capped = np.minimum(w, mid)
        lo, hi = (mid, hi) if mid < 0.4 * capped.sum() else (lo, mid)
    capped = np.minimum(w, lo)
    np.testing.assert_allclose(got, capped @ clipped / capped.sum(), rtol=1e-9)
    assert np.linalg.norm(clipped[4]) < norms[4]  # the norm bound clipped the large update


def test_krum_preselection_before_the_geometric_median_drops_the_outliers():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((7, 3))
    x[0] = -40.0 * x[1:].mean(0)  # a sign-flipped, scaled update
    got = rules.aggregation_rule("geometric_median", krum_preselect=1, tol=0.0, max_iter=2000)(x, np.ones(7))
    keep = np.sort(np.argsort(_brute_krum_scores(x, 1), kind="stable")[:6])
    assert 0 not in keep
    # oracle: the geometric median of the kept rows minimises the sum of distances (checked on a grid around it)
    rest = x[keep]

    def cost(z):
        return np.linalg.norm(rest - z, axis=1).sum()

    for step in itertools.product((-1e-3, 0.0, 1e-3), repeat=3):
        assert cost(got) <= cost(got + np.array(step)) + 1e-9
