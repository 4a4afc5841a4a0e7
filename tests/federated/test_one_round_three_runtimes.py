"""One round, one Strategy, three runtimes: the in-process simulation (``Simulation``), the gRPC runtime (a real
scheduler, two FL-Servers and five FLClient threads on loopback) and Flower interop (``FlowerStrategy`` driving
fedarena ClientApps through Flower's Message API, delivered in-process) reach the same global model
(``||a - b|| / ||b|| < 1e-6``) after 5 rounds, for FedAvg, FedAdam, trimmed mean, geometric median and a rule this
module registers with ``register_rule`` (4 of 5 clients a round); SecAgg (simulation and runtime), 8-bit quantized
uploads and DP-FedAvg likewise; and the runtime's bounded mean is the rule table's mean with its two stages.

How the three train identically: the runtime's ``trainer="engine"`` clients and the simulation's batched MLP run the
same engine step on the same minibatches (generator ``(seed, round, client key)``), Flower's ClientApp is the
simulation's trainer for one client, all three select with ``select_clients(candidates, k, seed, round)`` and order
a round's updates by client id. The oracle of each runtime is the other two runtimes, computed independently over
different transports and aggregation paths (partial sums, individual deltas over gRPC, Flower records)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from fedarena.federated import rules
from fedarena.federated.protocol import RoundConfig
from fedarena.federated.scheduler import RoundPolicy
from fedarena.federated.simulation import BatchedMLP, Simulation
from fedarena.federated.strategy import FedAvg, FitConfig, RobustAggregate, ServerOptimizer
from fedarena.federated.task import TaskSpec

SEED, CLIENTS, PER_ROUND, ROUNDS = 3, 5, 4, 5
TASK = TaskSpec(dataset="synthetic", num_clients=CLIENTS, hidden=(8,), trainer="engine", synthetic_features=10,
                synthetic_classes=3, synthetic_examples=300, alpha=0.5)
CFG = RoundConfig(epochs=2, batch_size=8, lr=0.1)
FIT = FitConfig(CFG.epochs, CFG.batch_size, CFG.lr)


def inverse_norm_mean(updates: np.ndarray, weights: np.ndarray, damping: float = 1.0) -> np.ndarray:
    """A rule defined here: the mean weighted by ``w_i / (damping + ||x_i||)`` (uses the weights and a parameter)."""
    c = weights / (damping + np.linalg.norm(updates, axis=1))
    return c @ updates / c.sum()


def _check_damping(damping: float) -> None:
    if not damping > 0:
        raise ValueError(f"damping: must be > 0, got {damping}")


@pytest.fixture(scope="module", autouse=True)
def test_rule():
    rules.register_rule("inverse_norm_mean", inverse_norm_mean, params={"damping": 1.0}, check=_check_damping)
    yield
    rules.unregister_rule("inverse_norm_mean")


def _flat(p):
    return np.concatenate([np.asarray(p[k], np.float64).ravel() for k in sorted(p)])


def _data(task):
    x = np.concatenate([c[0] for c in task.clients])
    y = np.concatenate([c[1] for c in task.clients])
    off = np.cumsum([0] + [len(c[1]) for c in task.clients])
    return x, y, [np.arange(off[i], off[i + 1]) for i in range(len(task.clients))]


def _grpc(make_cluster, opt, rule="mean", rule_params=None, cfg=CFG, encoding="dense", strategy=None, **bounds):
    bounds = {"max_client_weight": 1.0, "norm_bound_multiple": 0.0, **bounds}  # default: the plain weighted mean
    policy = RoundPolicy(rounds=ROUNDS, clients_per_round=PER_ROUND, window_seconds=120, start_clients=CLIENTS,
                         min_fraction=1.0, selection="uniform", seed=SEED, round_config=cfg, server_optimizer=opt,
                         aggregation=rule, rule_params=rule_params or {}, trim_fraction=0.25, **bounds)
    c = make_cluster(policy, task=TASK, strategy=strategy)
    c.run_clients(CLIENTS, seed=SEED, wait_s=0.5, encoding=encoding)
    assert c.scheduler.version == ROUNDS, c.scheduler.history[-1]
    return c.task, c.scheduler.params, [sorted(r["clients"]) for r in c.scheduler.history]


def _simulate(task, strategy, upload=None):
    x, y, train = _data(task)
    ids = [f"c{i}" for i in range(CLIENTS)]
    kw = {"upload": upload} if upload is not None else {}
    s = Simulation(BatchedMLP(task.sizes), strategy, x, y, train, ids, task.sizes[-1], seed=SEED, **kw)
    state, records = s.run(ROUNDS, s.init_state(task.trainer.init_params(0)))
    return state.params, [r.reporting for r in records]


@pytest.fixture
def flower_rounds(in_process_grid, flower_task_identity):
    """Run ``ROUNDS`` rounds of a fedarena strategy through Flower's strategy API (configure_train ->
    send_and_receive -> aggregate_train, what ``Strategy.start`` does each round)."""
    pytest.importorskip("flwr")  # the optional extra 'flower'
    from flwr.app import ConfigRecord

    from fedarena.federated import flower

    def run(task, strategy, codec=None, mods=()):
        x, y, train = _data(task)
        app = flower.fedarena_client_app(x, y, train, task.sizes, num_classes=task.sizes[-1], seed=SEED,
                                         mods=list(mods))
        fs = flower.FlowerStrategy(strategy, codec=codec, seed=SEED, min_available_nodes=CLIENTS)
        grid = in_process_grid(app, CLIENTS)
        arrays = flower.params_to_record(task.trainer.init_params(0))
        selected = []
        for rnd in range(1, ROUNDS + 1):
            msgs = list(fs.configure_train(rnd, arrays, ConfigRecord(), grid))
            selected.append(sorted(fs._selected))
            arrays, metrics = fs.aggregate_train(rnd, grid.send_and_receive(msgs))
            assert metrics["reporting"] == len(msgs) and metrics["rejected"] == 0
        return flower.record_to_params(arrays), selected

    return run


def _assert_same(a, b, init):
    """``||a - b|| / ||b|| < 1e-6`` (the measure of test_fedsim_grpc.py), and the model moved from ``init``."""
    fa, fb = _flat(a), _flat(b)
    rel = float(np.linalg.norm(fa - fb) / np.linalg.norm(fb))
    assert rel < 1e-6, rel
    assert np.linalg.norm(fb - _flat(init)) > 1e-2 * np.linalg.norm(fb)  # the model moved


CASES = {
    "fedavg": (ServerOptimizer(), "mean", {}),
    "fedadam": (ServerOptimizer("fedadam", lr=0.05), "mean", {}),
    "trimmed_mean": (ServerOptimizer(), "trimmed_mean", {}),
    "geometric_median": (ServerOptimizer(), "geometric_median", {}),
    "registered": (ServerOptimizer(), "inverse_norm_mean", {"damping": 0.5}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_simulation_grpc_and_flower_give_the_same_model(case, make_cluster, flower_rounds):
    opt, rule, params = CASES[case]
    task, runtime, runtime_selected = _grpc(make_cluster, opt, rule, params)
    if rule == "mean":
        strategy = FedAvg(FIT, opt, clients_per_round=PER_ROUND)
    else:
        strategy = RobustAggregate(FIT, opt, clients_per_round=PER_ROUND, rule=rule, trim_fraction=0.25,
                                   rule_params=params)
    simulated, sim_selected = _simulate(task, strategy)
    flowered, flower_selected = flower_rounds(task, strategy)
    assert runtime_selected == sim_selected == flower_selected  # the same clients every round
    assert len({tuple(s) for s in sim_selected}) > 1
    init = task.trainer.init_params(0)
    _assert_same(simulated, runtime, init)
    _assert_same(flowered, runtime, init)
    if rule != "mean":  # the runtime really ran the rule: plain FedAvg ends elsewhere
        plain, _ = _simulate(task, FedAvg(FIT, opt, clients_per_round=PER_ROUND))
        assert np.linalg.norm(_flat(plain) - _flat(runtime)) > 1e-3 * np.linalg.norm(_flat(runtime))


def test_the_runtimes_bounded_mean_is_the_tables_mean_with_its_stages(make_cluster):
    """The gRPC runtime's default 'mean' (each delta clipped to 1.5 x the round's median norm here, weights capped
    at 0.3 of the round's total) is, in the simulation, ``RobustAggregate(rule="mean")`` with the same two stages of
    the rule table."""
    opt = ServerOptimizer()
    task, runtime, _ = _grpc(make_cluster, opt, max_client_weight=0.3, norm_bound_multiple=1.5)
    stages = {"max_client_weight": 0.3, "norm_bound_multiple": 1.5}
    simulated, _ = _simulate(task, RobustAggregate(FIT, opt, clients_per_round=PER_ROUND, rule="mean",
                                                   rule_params=stages))
    init = task.trainer.init_params(0)
    _assert_same(simulated, runtime, init)
    plain, _ = _simulate(task, FedAvg(FIT, opt, clients_per_round=PER_ROUND))
    assert np.linalg.norm(_flat(plain) - _flat(runtime)) > 1e-3 * np.linalg.norm(_flat(runtime))  # the bounds bind


def test_a_registered_rule_changes_the_model_and_its_params_are_checked():
    """The registered rule is really used: it differs from the plain mean on the same updates."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 6)), np.array([1.0, 2.0, 3.0, 4.0])
    got = rules.aggregation_rule("inverse_norm_mean", damping=0.5)(x, w)
    c = w / (0.5 + np.sqrt((x ** 2).sum(1)))
    np.testing.assert_allclose(got, (c[:, None] * x).sum(0) / c.sum())
    assert not np.allclose(got, rules.aggregation_rule("mean")(x, w))
    with pytest.raises(ValueError, match="damping: must be > 0"):
        RoundPolicy(aggregation="inverse_norm_mean", rule_params={"damping": 0.0})
    with pytest.raises(ValueError, match="aggregation: unknown 'no_such_rule'"):
        RobustAggregate(rule="no_such_rule")


def test_secure_aggregation_gives_the_same_model_in_simulation_and_runtime(make_cluster):
    """SecAgg is one wrapper in both runtimes: the simulation's SecureAggregation runs the real protocol objects in
    process; the scheduler gets the same wrapper as its strategy, which opens each round's protocol server and applies
    the unmasked sum while the scheduler relays every SecAgg message over gRPC. Both quantize the same bounded inputs
    ``[clip(Delta) n / N, n / N]`` to the same fixed point. The policy's round config (another lr, epochs and batch
    size, no secagg) is overridden by the wrapper's ``configure`` and secure-round fields. The two trainers' float32
    deltas may differ in their last bit (the runtime's engine trainer and the batched one agree to ~1e-7), which can
    flip a fixed-point rounding; at scale 2^28 one flip moves the mean by about 1e-7 of a coordinate, inside the
    tolerance."""
    from fedarena.federated.wrappers import SecureAggregation

    opt = ServerOptimizer()
    secure = SecureAggregation(FedAvg(FIT, opt, clients_per_round=PER_ROUND), threshold=0.5, clip=0.5,
                               scale=2.0 ** 28, weight_scale=10000, stage_seconds=30.0)
    other = RoundConfig(epochs=1, batch_size=4, lr=0.5)
    task, runtime, runtime_selected = _grpc(make_cluster, opt, cfg=other, strategy=secure)
    assert secure.last_report["secagg_survivors"] == PER_ROUND  # the runtime's rounds went through the wrapper
    simulated, sim_selected = _simulate(task, secure)
    assert runtime_selected == sim_selected
    assert secure.last_report["secagg_survivors"] == PER_ROUND
    init = task.trainer.init_params(0)
    _assert_same(simulated, runtime, init)
    plain, _ = _simulate(task, FedAvg(FIT, opt, clients_per_round=PER_ROUND))
    assert not np.allclose(_flat(plain), _flat(runtime), rtol=1e-9, atol=0)  # really the fixed-point path


@dataclass(frozen=True)
class ScheduledFedAvg(FedAvg):
    """FedAvg whose ``configure`` changes the local training every round (lr decay, epochs alternating)."""

    def configure(self, rnd, state):
        return FitConfig(epochs=1 + rnd % 2, batch_size=self.fit.batch_size, lr=0.3 / rnd)


def test_the_strategys_configure_sets_each_rounds_local_training_in_every_runtime(make_cluster, flower_rounds):
    """``configure`` is the one source of a round's client config: a strategy whose configure changes lr and epochs
    per round gives the same model in the simulation, the runtime (whose policy's round config says otherwise) and
    Flower, and a different one than the constant FIT."""
    opt = ServerOptimizer()
    scheduled = ScheduledFedAvg(FIT, opt, clients_per_round=PER_ROUND)
    task, runtime, runtime_selected = _grpc(make_cluster, opt, strategy=scheduled)
    simulated, sim_selected = _simulate(task, scheduled)
    flowered, flower_selected = flower_rounds(task, scheduled)
    assert runtime_selected == sim_selected == flower_selected
    init = task.trainer.init_params(0)
    _assert_same(simulated, runtime, init)
    _assert_same(flowered, runtime, init)
    constant, _ = _simulate(task, FedAvg(FIT, opt, clients_per_round=PER_ROUND))
    assert np.linalg.norm(_flat(constant) - _flat(runtime)) > 1e-3 * np.linalg.norm(_flat(constant))


def test_eight_bit_uploads_give_the_same_model_in_every_runtime(make_cluster, flower_rounds):
    """8-bit stochastic quantization (QSGD levels) with the rounding drawn from ``(seed, round, client key, 13)`` in
    every runtime, so each client's quantization is the same draw. The runtime's ``q8`` quantizes tensor by tensor
    (its wire form), which the simulation reproduces with ``per_tensor=True``; Flower's UploadMod sends the codec's
    bytes of the flattened difference with error feedback, as the simulation's default form does. Both are the one
    ``Codec("quantize", bits=8)``."""
    from fedarena.federated import compression as cz
    from fedarena.federated import flower

    opt = ServerOptimizer()
    strategy = FedAvg(FIT, opt, clients_per_round=PER_ROUND)
    codec = cz.Codec("quantize", bits=8)
    task, runtime, _ = _grpc(make_cluster, opt, encoding="q8")
    init = task.trainer.init_params(0)
    wire_form, _ = _simulate(task, strategy, cz.UploadCompression(codec, per_tensor=True))
    _assert_same(wire_form, runtime, init)
    flat_form, _ = _simulate(task, strategy, cz.UploadCompression(codec, error_feedback=True))
    flowered, _ = flower_rounds(task, strategy, codec=codec,
                                mods=[flower.UploadMod((), codec, error_feedback=True, seed=SEED)])
    _assert_same(flowered, flat_form, init)
    dense, _ = _simulate(task, strategy)
    for quantized in (runtime, flat_form):  # the quantization really happened (8-bit error >> float32 rounding)
        assert np.abs(_flat(quantized) - _flat(dense)).max() > 1e-5


def test_dp_fedavg_gives_the_same_model_in_every_runtime(make_cluster, flower_rounds):
    """DP-FedAvg (Poisson sampling, clipping, Gaussian noise on the sum, denominator q N) is one wrapper in all three
    runtimes: the simulation's strategy, the scheduler's ``strategy=`` and Flower's ``FlowerStrategy``. With the
    mechanism's test seed the sample and the noise are the same draws everywhere."""
    from fedarena.federated.wrappers import DPFedAvg
    from fedarena.privacy.dp_fedavg import DPFedAvgMechanism

    mech = DPFedAvgMechanism(clip_norm=0.5, noise_multiplier=0.3, sample_rate=0.6, num_clients=CLIENTS, seed=11)
    dp = DPFedAvg(FedAvg(FIT, ServerOptimizer()), mech)
    task, runtime, runtime_selected = _grpc(make_cluster, ServerOptimizer(), strategy=dp)
    simulated, sim_selected = _simulate(task, dp)
    flowered, flower_selected = flower_rounds(task, dp)
    assert runtime_selected == sim_selected == flower_selected
    assert len({len(s) for s in sim_selected}) > 1 and all(sim_selected)  # Poisson sizes vary; no empty round
    init = task.trainer.init_params(0)
    _assert_same(simulated, runtime, init)
    _assert_same(flowered, runtime, init)
