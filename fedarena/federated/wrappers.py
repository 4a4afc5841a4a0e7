"""Strategy wrappers: server-side stages around a :class:`~fedarena.federated.strategy.Strategy`, composed the same
way in the simulation, the gRPC runtime (``Scheduler(strategy=...)``) and Flower interop (``FlowerStrategy``), as
Flower's ``DifferentialPrivacyServerSideFixedClipping`` and ``SecAggPlusWorkflow`` wrap its strategies.

* :class:`StrategyWrapper`: forwards every hook of the protocol to ``inner``; a wrapper overrides what it changes.
* :class:`DPFedAvg`: DP-FedAvg (McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR
  2018): Poisson client sampling, server-side clipping, Gaussian noise on the sum, fixed denominator ``q N``.
* :class:`SecureAggregation`: SecAgg / SecAgg+ (Bonawitz et al., CCS 2017; Bell et al., CCS 2020) of the round's
  updates with the runtime's own secure-round encoding (:mod:`fedarena.federated.secure_round`: bounded
  fixed-point inputs ``[clip(Delta) n / N, n / N]`` and the checked decoding of the unmasked sum). The simulation
  relays the protocol's messages in process, the gRPC scheduler over the network; both apply the unmasked sum with
  the same method, so a simulated secure round and a gRPC one give the same model. Flower interop refuses it:
  Flower's ``Strategy`` receives every client's reply in the clear, so masking has to happen in the ClientApp
  (Flower's ``secaggplus_mod`` with the ``SecAggPlusWorkflow``), outside any strategy.

``linear`` (the aggregate is a function of partial sums) is False for DP-FedAvg and SecAgg whatever the inner
strategy: both need every update on its own (clipping, masking).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from fedarena.federated.rules import flatten_params, unflatten_params
from fedarena.federated.strategy import ClientUpdate, FitConfig, Params, PartialAggregate, RoundState
from fedarena.privacy.secure_random import SecureRandom


class StrategyWrapper:
    """A strategy around ``inner`` (a dataclass field of every subclass): every hook of
    :class:`~fedarena.federated.strategy.Strategy` forwards to it."""

    inner: Any

    @property
    def clients_per_round(self) -> int:
        return self.inner.clients_per_round

    @property
    def linear(self) -> bool:
        return self.inner.linear

    def select(self, rnd: int, candidates: Sequence[str], seed: int) -> list[str]:
        return self.inner.select(rnd, candidates, seed)

    def configure(self, rnd: int, state: RoundState) -> FitConfig:
        return self.inner.configure(rnd, state)

    def init_state(self, params: Params) -> RoundState:
        return self.inner.init_state(params)

    def weight(self, num_examples: float) -> float:
        return self.inner.weight(num_examples)

    def client_correction(self, state: RoundState, client_state: Params | None) -> Params | None:
        return self.inner.client_correction(state, client_state)

    def client_control_update(self, state: RoundState, client_state: Params | None, local: Params, start: Params,
                              steps: int, fit: FitConfig) -> tuple[Params, Params] | None:
        return self.inner.client_control_update(state, client_state, local, start, steps, fit)

    def aggregate(self, state: RoundState, updates: Sequence[ClientUpdate], num_clients: int) -> RoundState:
        return self.inner.aggregate(state, updates, num_clients)

    def aggregate_partial(self, state: RoundState, total: PartialAggregate) -> RoundState:
        return self.inner.aggregate_partial(state, total)

    def evaluate(self, rnd: int, client_accuracies: np.ndarray) -> dict[str, float]:
        return self.inner.evaluate(rnd, client_accuracies)


@dataclass(frozen=True)
class DPFedAvg(StrategyWrapper):
    """DP-FedAvg (McMahan et al. 2018) around a FedAvg-family strategy: Poisson client sampling with rate
    ``q``, server-side clipping, Gaussian noise on the sum, fixed denominator ``q N``; the inner strategy's
    server optimizer applies the noisy mean. ``epsilon(rounds)`` comes from the configured accountant (RDP or PLD)."""

    inner: Any
    mechanism: Any  # fedarena.privacy.dp_fedavg.DPFedAvgMechanism

    @property
    def clients_per_round(self) -> int:
        return 0

    @property
    def linear(self) -> bool:
        return False  # every update is clipped before the noisy sum

    def select(self, rnd: int, candidates, seed: int) -> list[str]:
        """Poisson sampling with rate ``q``. The accountant's amplification by sampling assumes the sample is
        secret, so it is drawn from the OS CSPRNG unless the mechanism has an explicit test seed."""
        seeded = self.mechanism.seed is not None
        rng = np.random.default_rng([self.mechanism.seed, rnd, 17]) if seeded else SecureRandom()
        cands = sorted(candidates)
        return [c for c, keep in zip(cands, rng.random(len(cands)) < self.mechanism.sample_rate) if keep]

    def aggregate(self, state, updates, num_clients: int):
        names = sorted(state.params)
        d = sum(state.params[k].size for k in names)
        ordered = sorted(updates, key=lambda u: u.client_id)
        mean = self.mechanism.noisy_mean(list(flatten_params([u.delta for u in ordered], names)) if ordered else [],
                                         d, state.round)
        delta = unflatten_params(mean, state.params, names)
        # the noisy mean as a partial of weight 1: the inner strategy's server step applies it
        return self.inner.aggregate_partial(state, PartialAggregate(delta, 1.0, [u.client_id for u in ordered]))

    def aggregate_partial(self, state, total):
        raise ValueError("dp: DP-FedAvg clips every update before the noisy sum; partial sums cannot be clipped")

    def evaluate(self, rnd: int, client_accuracies):
        out = self.inner.evaluate(rnd, client_accuracies)
        out["dp_epsilon"] = self.mechanism.epsilon(rnd)
        return out


@dataclass
class SecureAggregation(StrategyWrapper):
    """SecAgg / SecAgg+ of a FedAvg-family round, run with the real protocol objects of
    :mod:`fedarena.privacy.secagg` (X25519, Shamir, AES-GCM, every message through its wire format).

    Client ``i`` inputs the runtime's ``[clip(Delta_i, clip) n_i / W, n_i / W]`` (:func:`secure_round.client_input`,
    ``W = weight_scale``) in fixed point (``scale`` rounded down to a multiple of ``W``); the server learns only the
    sum over the survivors, checks it (:func:`secure_round.decode_aggregate`) and divides; the inner strategy applies
    the mean as a partial aggregate (so it must be linear). One wrapper in both runtimes that can hide the updates:

    * the simulation calls :meth:`aggregate`, which masks the round's updates and relays the protocol's messages in
      process (``dropout`` of the clients go silent before sending their masked input, drawn per round with the given
      seed; their masks are removed with Shamir shares);
    * the gRPC scheduler (``Scheduler(strategy=SecureAggregation(...))``, or built from a policy whose round config
      sets ``secagg``) opens the round's protocol server with :meth:`open_round`, only relays the clients' messages
      to it and runs the stage clock, then hands the unmasked sum to :meth:`aggregate_unmasked`.

    Both end in :meth:`aggregate_unmasked`. :meth:`round_config` is the runtime's ``RoundConfig`` of the same secure
    round (the clients read their secure-round parameters from it)."""

    inner: Any
    neighbours: int = 0
    """SecAgg+ neighbourhood size (even; 0 = every pair masks)"""
    threshold: float = 0.5
    """t = floor(threshold m) + 1 (at most m) of the m share holders"""
    clip: float = 1.0
    """every delta coordinate is clipped to [-clip, clip] before it is weighted"""
    scale: float = 2.0 ** 20
    """fixed-point scale (rounded down to a multiple of ``weight_scale``); ``clients * clip * scale`` must stay
    below 2^31 (at most 2,047 clients at 2^20)"""
    weight_scale: float = 1000.0
    """W: a client inputs weight ``n / W``, so ``n`` may not exceed ``W``"""
    dropout: float = 0.0
    seed: int = 0
    consistency_check: bool = False
    """the signed survivor-list round of the malicious-server variant (the runtime's default is on)"""
    colluders: int = -1
    """K >= 0: the threshold that resists a malicious server with K colluding share holders (RoundConfig's
    ``secagg_colluders``); -1 = use ``threshold``"""
    stage_seconds: float = 10.0
    """the runtime's window of each stage after the first"""
    last_report: dict = field(default_factory=dict)
    """time, survivors and example count of the last secure round (logged by the fedsim kind and the scheduler)"""

    @classmethod
    def from_round_config(cls, inner: Any, cfg: Any) -> "SecureAggregation":
        """The wrapper of the secure round a runtime :class:`~fedarena.federated.protocol.RoundConfig` describes."""
        return cls(inner, neighbours=cfg.secagg_neighbours, threshold=cfg.secagg_threshold, clip=cfg.secagg_clip,
                   scale=cfg.secagg_scale, weight_scale=float(cfg.secagg_max_examples),
                   consistency_check=cfg.secagg_consistency_check, colluders=cfg.secagg_colluders,
                   stage_seconds=cfg.secagg_stage_seconds)

    @property
    def linear(self) -> bool:
        return False  # every client's update is masked on its own; partial sums are not inputs of the protocol

    def aggregate_partial(self, state, total):
        raise ValueError("secagg: every update is masked by its client; a partial sum in the clear cannot be "
                         "securely aggregated")

    def round_config(self, **kw: Any):
        """The runtime's :class:`~fedarena.federated.protocol.RoundConfig` of this secure round; ``kw`` sets its
        other fields (local training, and may override the stage window)."""
        from fedarena.federated.protocol import RoundConfig

        fields = dict(secagg=True, secagg_threshold=self.threshold, secagg_colluders=self.colluders,
                      secagg_neighbours=self.neighbours, secagg_clip=self.clip, secagg_scale=self.scale,
                      secagg_max_examples=int(self.weight_scale), secagg_consistency_check=self.consistency_check,
                      secagg_stage_seconds=self.stage_seconds)
        return RoundConfig(**{**fields, **kw})

    def secagg_config(self, n: int, dimension: int):
        """The :class:`~fedarena.privacy.secagg.SecAggConfig` of a round of ``n`` clients and ``dimension`` inputs."""
        from fedarena.federated.secure_round import secagg_params

        return secagg_params(self.round_config(), n, dimension)

    def open_round(self, round_id: int, selected: Sequence[str], dimension: int, window_deadline: float):
        """The runtime's protocol server of round ``round_id`` (:class:`~fedarena.federated.secure_round.SecureRound`:
        the selected clients are parties 1..n in sorted order; ``dimension`` counts the weight coordinate); the
        scheduler relays the clients' messages to it and closes its stages on its clock."""
        from fedarena.federated.secure_round import SecureRound

        return SecureRound.open(self.round_config(), round_id, list(selected), dimension, window_deadline)

    def secure_sum(self, inputs: dict[int, np.ndarray], round_id: int):
        """Run one secure round over ``inputs`` (party id >= 1 -> vector) in process; returns the simulation
        report."""
        from fedarena.privacy.secagg.simulation import secure_aggregate

        n = len(inputs)
        cfg = self.secagg_config(n, next(iter(inputs.values())).size)
        rng = np.random.default_rng([self.seed, round_id, 29])
        ids = sorted(inputs)
        drop = {u for u, r in zip(ids, rng.random(n)) if r < self.dropout}
        return secure_aggregate(inputs, cfg, round_id=round_id, dropouts={"masked_input": drop})

    def aggregate_unmasked(self, state: RoundState, total: np.ndarray, survivors: Sequence[str]) -> RoundState:
        """Apply the unmasked modular sum ``total`` of the ``survivors``' inputs: check it against the inputs'
        bounds (:class:`~fedarena.federated.secure_round.AggregateOutOfRange` when no set of bounded inputs gives
        it: nothing is applied), divide, and let the inner strategy apply the mean (weight = the example count)."""
        from fedarena.federated.secure_round import decode_aggregate

        names = sorted(state.params)
        mean, examples = decode_aggregate(self.round_config(), total, len(survivors))
        self.last_report.update(secagg_survivors=len(survivors), secagg_examples=examples, secagg_aborted=0)
        part = PartialAggregate({k: v * examples for k, v in unflatten_params(mean, state.params, names).items()},
                                float(examples), sorted(survivors))
        return self.inner.aggregate_partial(state, part)

    def aggregate(self, state: RoundState, updates: Sequence[ClientUpdate], num_clients: int) -> RoundState:
        from fedarena.federated.secure_round import AggregateOutOfRange, client_input
        from fedarena.privacy.secagg.protocol import InsufficientSurvivorsError

        if len(updates) < 3:
            raise ValueError("secagg: secure aggregation needs at least 3 reporting clients per round (with 2, "
                             "the sum and one's own input give the other's)")
        names = sorted(state.params)
        ordered = sorted(updates, key=lambda u: u.client_id)  # party j is the j-th selected client, as in the runtime
        cfg = self.round_config()
        inputs = {}
        for j, u in enumerate(ordered, start=1):
            w = self.inner.weight(u.num_examples)
            if w > self.weight_scale:
                raise ValueError(f"secagg.weight_scale: client {u.client_id} has {u.num_examples} examples, more "
                                 f"than weight_scale = {self.weight_scale:g}")
            inputs[j] = client_input(flatten_params([u.delta], names)[0], int(round(w)), cfg)
        t0 = time.perf_counter()
        self.last_report = {"secagg_survivors": 0, "secagg_aborted": 1}
        try:
            rep = self.secure_sum(inputs, state.round)
            new = self.aggregate_unmasked(state, rep.result.total,
                                          [ordered[j - 1].client_id for j in rep.result.survivors])
        except (InsufficientSurvivorsError, AggregateOutOfRange):  # the round is abandoned, the model kept
            new = replace(state, round=state.round + 1)
        self.last_report["secagg_seconds"] = time.perf_counter() - t0
        return new
