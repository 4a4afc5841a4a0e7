"""The built-in attacks against their papers' closed forms on small hand-built update sets, the simulation's
coalition wrapper against a hand-made round, and the attack config's errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedarena.federated.attacks import (ALIE, IPM, AttackConfig, AttackContext, Attacked, Backdoor, LabelFlip,
                                        MinMax, MinSum, Scaling, SignFlip, alie_z, attack_success_rate,
                                        perturbation, poison_clients)
from fedarena.federated.strategy import ClientUpdate, FedAvg, FitConfig

RNG = np.random.default_rng(0)
HONEST = RNG.normal(size=(7, 5)) + np.array([1.0, -2.0, 0.5, 0.0, 3.0])
OWN = RNG.normal(size=(3, 5))
CTX = AttackContext(num_updates=10)


def test_sign_flip_and_scaling_multiply_the_own_update():
    np.testing.assert_allclose(SignFlip(3.0).attack(1, HONEST, OWN, CTX), -3.0 * OWN)
    np.testing.assert_allclose(Scaling(2.5).attack(1, None, OWN, CTX), 2.5 * OWN)


def test_alie_is_mean_minus_z_std_with_baruchs_z():
    # n = 10, f = 3: s = floor(10/2 + 1) - 3 = 3, z = Phi^{-1}(7/10) = 0.5244005127080407 (normal table)
    assert alie_z(10, 3) == pytest.approx(0.5244005127080407, abs=1e-12)
    out = ALIE().attack(1, HONEST, OWN, CTX)
    want = HONEST.mean(0) - 0.5244005127080407 * np.sqrt(((HONEST - HONEST.mean(0)) ** 2).mean(0))
    np.testing.assert_allclose(out, np.tile(want, (3, 1)), rtol=1e-12)
    # without the honest updates (a runtime coalition) it estimates from its own
    np.testing.assert_allclose(ALIE(z=1.5).attack(1, None, OWN, CTX)[0], OWN.mean(0) - 1.5 * OWN.std(0))


def test_ipm_is_minus_epsilon_times_the_honest_mean():
    np.testing.assert_allclose(IPM(0.1).attack(1, HONEST, OWN, CTX), np.tile(-0.1 * HONEST.mean(0), (3, 1)))
    # the aggregate's inner product with the honest mean becomes negative once a * eps > h (Xie et al.)
    agg = np.vstack([HONEST, IPM(3.0).attack(1, HONEST, OWN, CTX)]).mean(0)
    assert agg @ HONEST.mean(0) < 0


def _max_dist(m, g):
    return max(np.linalg.norm(m - gi) for gi in g)


@pytest.mark.parametrize("direction", ["unit", "std", "sign"])
def test_min_max_gamma_is_the_largest_feasible_on_a_grid(direction):
    atk = MinMax(direction, gamma_init=10.0, tolerance=1e-6)
    mu, p = HONEST.mean(0), perturbation(HONEST, direction)
    bound = max(np.linalg.norm(a - b) for a in HONEST for b in HONEST)
    gamma = atk.gamma(HONEST)
    assert _max_dist(mu + gamma * p, HONEST) <= bound + 1e-9
    assert _max_dist(mu + (gamma + 1e-5) * p, HONEST) > bound
    grid = np.linspace(0, 20, 200_001)  # brute force: the largest feasible grid point is within one step
    feasible = [g for g in grid[::100] if _max_dist(mu + g * p, HONEST) <= bound]
    fine = grid[(grid >= feasible[-1]) & (grid <= feasible[-1] + 0.01)]
    best = max(g for g in fine if _max_dist(mu + g * p, HONEST) <= bound)
    assert gamma == pytest.approx(best, abs=1e-4 + 1e-9)
    out = atk.attack(1, HONEST, OWN, CTX)
    np.testing.assert_allclose(out, np.tile(mu + gamma * p, (3, 1)))


def test_min_sum_gamma_is_the_largest_feasible_on_a_grid():
    atk = MinSum("unit", tolerance=1e-6)
    mu, p = HONEST.mean(0), perturbation(HONEST, "unit")
    np.testing.assert_allclose(p, -mu / np.linalg.norm(mu))

    def total(m):
        return sum(np.sum((m - g) ** 2) for g in HONEST)
    bound = max(total(g) for g in HONEST)
    gamma = atk.gamma(HONEST)
    grid = np.arange(0, 30, 1e-4)  # brute force, vectorised over the grid
    m = mu[None] + grid[:, None] * p[None]
    totals = sum(((m - g) ** 2).sum(1) for g in HONEST)
    best = grid[totals <= bound].max()
    assert gamma == pytest.approx(best, abs=2e-4)
    # closed form: sum_i ||mu + g p - g_i||^2 = sum_i ||mu - g_i||^2 + n g^2 (p is orthogonal to sum(mu - g_i))
    n = len(HONEST)
    closed = math.sqrt((bound - total(mu)) / n)
    assert gamma == pytest.approx(closed, abs=1e-5)


def test_label_flip_relabels_and_backdoor_stamps_and_boosts():
    x, y = np.zeros((6, 64), np.float32), np.arange(6)
    np.testing.assert_array_equal(LabelFlip(10).poison(x, y, RNG)[1], 9 - y)
    bd = Backdoor(target=7, poison_fraction=0.5)
    px, py = bd.poison(x, y, np.random.default_rng(1))
    assert len(py) == 9 and (py[6:] == 7).all() and (px[6:, [54, 55, 62, 63]] == 1.0).all()
    np.testing.assert_array_equal(px[:6], x)
    # model replacement: n / (eta a) = 10 / (0.5 * 3)
    np.testing.assert_allclose(bd.attack(1, HONEST, OWN, AttackContext(10, 0.5)), OWN * 10 / 1.5)


def test_attack_success_rate_counts_triggered_non_target_examples():
    bd = Backdoor(target=2)
    x = np.zeros((5, 64))
    x[0, 54] = 0.5  # stamping overwrites it
    y = np.array([0, 1, 2, 3, 4])

    def logits(v):  # predicts the target iff pixel 54 is lit, and example 3 (pixel 0 set) never
        out = np.zeros((len(v), 5))
        out[:, 2] = v[:, 54] - 10 * v[:, 0]
        out[:, 0] = 0.5
        return out
    x[3, 0] = 1.0
    assert attack_success_rate(logits, x, y, bd) == pytest.approx(3 / 4)


def _update(cid, vec, n=10):
    return ClientUpdate(cid, {"a": vec[:2].reshape(1, 2), "b": vec[2:]}, n)


def test_attacked_replaces_only_the_coalition_with_the_honest_round_in_view():
    seen = {}

    class Spy:
        def attack(self, rnd, honest, own, ctx):
            seen.update(rnd=rnd, honest=honest.copy(), own=own.copy(), n=ctx.num_updates, lr=ctx.server_lr)
            return -own

    vecs = RNG.normal(size=(4, 5))
    ups = [_update(f"c{i}", vecs[i], n=10 + i) for i in range(4)]
    inner = FedAvg(fit=FitConfig(), clients_per_round=4)
    wrapped = Attacked(inner, Spy(), frozenset({"c1", "c3"}))
    state = inner.init_state({"a": np.zeros((1, 2), np.float32), "b": np.zeros(3, np.float32)})
    new = wrapped.aggregate(state, ups, 4)
    # flattened in sorted name order: "a" then "b"
    np.testing.assert_allclose(seen["honest"], vecs[[0, 2]])
    np.testing.assert_allclose(seen["own"], vecs[[1, 3]])
    assert seen["n"] == 4 and seen["rnd"] == 1 and seen["lr"] == 1.0 and wrapped.last_attackers == 2
    w = np.array([10, 11, 12, 13], float)
    want = (w[:, None] * vecs * np.array([1, -1, 1, -1])[:, None]).sum(0) / w.sum()
    got = np.concatenate([new.params["a"].ravel(), new.params["b"]])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # every other hook is the inner strategy's (StrategyWrapper forwards them)
    assert wrapped.configure(1, state) == inner.configure(1, state) and wrapped.weight(7) == inner.weight(7)
    assert wrapped.clients_per_round == inner.clients_per_round and wrapped.linear is False


def test_poison_clients_changes_only_the_coalitions_training_data():
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10) % 3
    train = [np.array([0, 1, 2]), np.array([3, 4]), np.array([5, 6, 7])]
    nx, ny, nt = poison_clients(LabelFlip(3), x, y, train, ["a", "b", "c"], frozenset({"b"}), 0)
    np.testing.assert_array_equal(nx[:10], x)
    np.testing.assert_array_equal(ny[:10], y)
    assert nt[0] is train[0] and nt[2] is train[2]
    np.testing.assert_array_equal(nx[nt[1]], x[[3, 4]])
    np.testing.assert_array_equal(ny[nt[1]], 2 - y[[3, 4]])
    same = poison_clients(SignFlip(), x, y, train, ["a", "b", "c"], frozenset({"b"}), 0)
    assert same[0] is x and same[2] == train


def test_attack_config_builds_a_seeded_coalition():
    ids = [f"c{i}" for i in range(10)]
    plan = AttackConfig("alie", num_attackers=3).build(ids, 10, seed=5)
    assert len(plan.attacker_ids) == 3 and plan.attacker_ids <= set(ids)
    assert plan.attacker_ids == AttackConfig("ipm", num_attackers=3).build(ids, 10, seed=5).attacker_ids
    assert isinstance(plan.attack, ALIE)
    inner = FedAvg()
    assert AttackConfig().build(ids, 10, 0).strategy(inner) is inner
    assert isinstance(plan.strategy(inner), Attacked)


@pytest.mark.parametrize("kw, build, field", [
    (dict(kind="alie", num_attackers=11), True, "num_attackers"),
    (dict(kind="alie", num_attackers=0), False, "num_attackers"),
    (dict(kind="lie", num_attackers=1), False, "kind"),
    (dict(kind="ipm", num_attackers=1, epsilon=0.0), False, "epsilon"),
    (dict(kind="min_max", num_attackers=1, direction="up"), False, "direction"),
    (dict(kind="backdoor", num_attackers=1, target=10), True, "target"),
    (dict(kind="backdoor", num_attackers=1, poison_fraction=0.0), False, "poison_fraction"),
])
def test_attack_config_errors_are_one_line_naming_the_field(kw, build, field):
    with pytest.raises(ValueError) as e:
        AttackConfig(**kw).build([f"c{i}" for i in range(10)], 10, 0)
    msg = str(e.value)
    assert msg.startswith(field + ":") and "\n" not in msg


def test_backdoor_through_local_training_plants_the_trigger_under_fedavg():
    from fedarena.federated.defences import DefenceConfig, RootSet
    from fedarena.federated.simulation import BatchedMLP, Simulation

    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 6)).astype(np.float32)
    x[:, 5] = 0.0  # the trigger feature is blank in clean data
    y = (x[:, 0] > 0).astype(np.int64)
    ids = [f"c{i}" for i in range(10)]
    train = [np.arange(i * 30, (i + 1) * 30) for i in range(10)]
    model = BatchedMLP((6, 2))
    bd = Backdoor(target=1, trigger=(5,), trigger_value=3.0)
    coalition = frozenset({"c3", "c7"})
    px, py, pt = poison_clients(bd, x, y, train, ids, coalition, 0)
    asr = {}
    for name, cfg in [("fedavg", DefenceConfig()), ("fltrust", DefenceConfig("fltrust", root_size=40))]:
        inner = cfg.build(FedAvg(fit=FitConfig(1, 10, 0.1), clients_per_round=10),
                          root=RootSet(model, x[300:340], y[300:340], 2))
        sim = Simulation(model, Attacked(inner, bd, coalition), px, py, pt, ids, 2, test=(x[340:], y[340:]),
                         eval_clients=False, eval_every=30)
        state, recs = sim.run(30)
        asr[name] = attack_success_rate(lambda v: model.logits(state.params, v), x[340:], y[340:], bd)
        assert recs[-1].metrics["test_acc"] > 0.85, (name, recs[-1].metrics)
    # the clean model never sees feature 5, so only the planted backdoor turns class 0 into class 1
    assert asr["fedavg"] > 0.9 and asr["fltrust"] < 0.5, asr
