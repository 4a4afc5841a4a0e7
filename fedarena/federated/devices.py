"""Device profiles of simulated clients and the on-device cost of a round of local training.

Each client is a device with a training-memory budget, a sustained training throughput, an uplink and a downlink
bandwidth and a daily availability window (the system heterogeneity that FedScale, Lai et al. 2022, replays from
device and behaviour traces). Profiles are drawn per client from tiers (a fraction of the population each, a
median per quantity and a log-normal spread around it); :func:`training_cost` prices one client's local training
of a ReLU MLP -- FLOPs, peak memory, bytes down and up, and the seconds they take on that device -- and
:meth:`DeviceFleet.assign` gives a client the widest sub-model width (HeteroFL, Diao et al. 2021) whose cost fits
its memory and its time budget (the round deadline, cut short when the device's availability window closes first).

The cost model (stated so that it can be checked by hand; float32 everywhere):

* parameters ``P = sum_i (d_i d_{i+1} + d_{i+1})`` for layer sizes ``(d_0, ..., d_L)``;
* FLOPs of one step on a batch of ``B``: forward ``2 B sum_i d_i d_{i+1}``; backward ``2 B sum_i d_i d_{i+1}``
  (weight gradients) plus ``2 B sum_{i>=1} d_i d_{i+1}`` (gradients of the hidden activations; the input needs
  none); the SGD update ``2 P``;
* peak memory: the weights and their gradients (``2 P`` floats; FedProx's ``mu > 0`` keeps the global model as
  the proximal anchor: ``+P``; plain SGD keeps no optimizer state), plus the activations kept for the backward
  pass -- each layer's input ``B d_i`` (``i < L``), each hidden layer's pre-activation ``B d_i`` (the ReLU mask),
  and the logits and their softmax ``2 B d_L`` -- times 4 bytes;
* time: ``bytes_down / downlink + steps x FLOPs per step / throughput + bytes_up / uplink``.

A client that receives the int8 model and trains it quantization-aware (:mod:`fedarena.federated.int8_clients`)
downloads the int8 file (its length in bytes), uploads the dense float32 update, and its training adds, in this
model (our accounting of the fake-quant forward and backward pass, not a measurement):

* memory: the fake-quantized copy of every weight (``sum_i d_i d_{i+1}`` floats) and, at each activation
  quantization point (the input and every layer's output), the float value kept for the straight-through mask
  (``B (d_0 + sum_{i>=1} d_i)`` floats);
* FLOPs: :data:`FAKE_QUANT_FLOPS` per fake-quantized element (weights and activations) and step.

:data:`DEFAULT_TIERS` are this project's assumptions (five tiers for HeteroFL's five width levels).
:data:`PUBLISHED_TIERS` take each tier's memory, throughput and bandwidth from published measurements, cited beside
each number (the tier shares and the devices standing for a tier are our assumptions); docs/devices.md has the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

DAY_S = 86_400.0

FAKE_QUANT_FLOPS = 6
"""FLOPs counted per fake-quantized element and step: divide by the scale, add the zero point, round, clip,
subtract the zero point and multiply back in the forward pass (the straight-through mask of the backward pass is
counted within them)"""


@dataclass(frozen=True)
class DeviceTier:
    """A class of devices: its share of the population and the median of each quantity."""

    fraction: float
    memory_bytes: float
    """memory the device grants the training process"""
    flops_per_s: float
    """sustained training throughput (FLOP/s)"""
    up_bytes_per_s: float
    down_bytes_per_s: float

    def __post_init__(self) -> None:
        for name in ("fraction", "memory_bytes", "flops_per_s", "up_bytes_per_s", "down_bytes_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"devices: a tier's {name} must be > 0, got {getattr(self, name)}")


DEFAULT_TIERS = (
    DeviceTier(0.2, 512e6, 20e9, 20e6 / 8, 50e6 / 8),
    DeviceTier(0.2, 256e6, 10e9, 10e6 / 8, 25e6 / 8),
    DeviceTier(0.2, 128e6, 5e9, 5e6 / 8, 10e6 / 8),
    DeviceTier(0.2, 64e6, 2.5e9, 2e6 / 8, 5e6 / 8),
    DeviceTier(0.2, 32e6, 1.25e9, 1e6 / 8, 2e6 / 8),
)
"""Assumed tiers (high-end to low-end phone; memory granted to training 512 ... 32 MB, throughput 20 ... 1.25
GFLOP/s, uplink 20, 10, 5, 2, 1 Mbit/s, downlink 50, 25, 10, 5, 2 Mbit/s): assumptions, see the module
docstring."""

MOBILENET_V1_FLOPS = 1.138e9
"""FLOPs of one MobileNet v1 (1.0, 224) inference: 569 million multiply-adds (Howard et al. 2017, "MobileNets",
Papers with Code lists 1.138 GFLOPs)"""

MOBILENET_V2_FLOPS = 0.6e9
"""FLOPs of one MobileNetV2 (1.0, 224) inference: 300 million multiply-adds (Sandler et al. 2018, "MobileNetV2")"""

PUBLISHED_TIERS = (
    # high-end phone
    DeviceTier(
        1 / 3,  # assumed: three equally common tiers
        256 * 2**20,  # dalvik.vm.heapgrowthlimit=256m of an 8 GiB phone (phone-xhdpi-8192-dalvik-heap.mk, LineageOS
        # frameworks/native): the heap an app gets without largeHeap
        MOBILENET_V1_FLOPS / 32.2e-3,  # 35.3 GFLOP/s: TFLite MobileNet_1.0_224 (float), 1 thread, iPhone 8: 32.2 ms
        # (tensorflow.org/lite/performance/benchmarks)
        21.08e6 / 8,  # median global 5G upload, Q3 2021: 21.08 Mbit/s (Ookla, "Growing and Slowing: The State of 5G
        # Worldwide in 2021")
        166.13e6 / 8,  # median global 5G download, Q3 2021: 166.13 Mbit/s (same)
    ),
    # mid-range phone
    DeviceTier(
        1 / 3,  # assumed
        192 * 2**20,  # dalvik.vm.heapgrowthlimit=192m of AOSP's 2 GB phone (phone-xhdpi-2048-dalvik-heap.mk; the same
        # in the 1 GB xhdpi and the 4 GB configs)
        MOBILENET_V1_FLOPS / 123.3e-3,  # 9.23 GFLOP/s: TFLite MobileNet_1.0_224 (float), 1 thread, Pixel 2: 123.3 ms
        # (tensorflow.org/lite/performance/benchmarks)
        12.61e6 / 8,  # global mobile upload from Ookla's Speedtest Global Index as livemint.com reported it on
        # 2021-09-24: 12.61 Mbit/s (the article's "average"; it does not say which month)
        56.74e6 / 8,  # global mobile download, same report: 56.74 Mbit/s
    ),
    # entry-level phone
    DeviceTier(
        1 / 3,  # assumed
        48 * 2**20,  # dalvik.vm.heapgrowthlimit=48m of AOSP's "high density phone with around 512MB total RAM"
        # (phone-hdpi-512-dalvik-heap.mk)
        MOBILENET_V2_FLOPS / 1.25,  # 0.48 GFLOP/s: MobileNetV2 (fp32) on one Cortex-A55 little core of a Galaxy S20
        # (SM-G980F), IREE's benchmark: 1225-1252 ms; assumed to stand for an entry-level phone's cores
        5.09e6 / 8,  # India's mobile upload in the same report: 5.09 Mbit/s
        17.77e6 / 8,  # India's mobile download, same report: 17.77 Mbit/s
    ),
)
"""Tiers from published measurements (each number's source beside it; docs/devices.md, "Published profiles").
Assumed: the tier shares, that the per-app Java heap limit is the memory a training process gets (a native trainer
is not bound by it), that single-thread float inference throughput is the sustained training throughput (FedScale's
runtime likewise prices training at 3x the inference latency per sample, the FLOPs of forward plus backward), and
which device stands for a tier."""


@dataclass(frozen=True)
class DeviceProfile:
    """One client's device."""

    tier: int
    memory_bytes: float
    flops_per_s: float
    up_bytes_per_s: float
    down_bytes_per_s: float
    window_start_s: float
    """start of the daily availability window, seconds after midnight"""
    window_s: float
    """length of the window (``DAY_S``: always available)"""

    def seconds_left(self, clock_s: float) -> float:
        """Seconds until the availability window closes at simulated time ``clock_s`` (0 outside the window)."""
        if self.window_s >= DAY_S:
            return math.inf
        into = (clock_s - self.window_start_s) % DAY_S
        return self.window_s - into if into < self.window_s else 0.0


def draw_profiles(tiers: Sequence[DeviceTier], n: int, seed: int, spread: float = 0.0,
                  window_s: float = DAY_S) -> list[DeviceProfile]:
    """``n`` profiles: a tier drawn by ``fraction``, each quantity its median times ``exp(spread z - spread^2/2)``
    (log-normal, the median's mean kept), a window of ``window_s`` starting uniformly over the day."""
    rng = np.random.default_rng([seed, 211])
    p = np.array([t.fraction for t in tiers], float)
    which = rng.choice(len(tiers), size=n, p=p / p.sum())
    noise = np.exp(spread * rng.standard_normal((n, 4)) - spread ** 2 / 2)
    starts = rng.uniform(0, DAY_S, n)
    out = []
    for i in range(n):
        t = tiers[which[i]]
        out.append(DeviceProfile(int(which[i]), t.memory_bytes * noise[i, 0], t.flops_per_s * noise[i, 1],
                                 t.up_bytes_per_s * noise[i, 2], t.down_bytes_per_s * noise[i, 3],
                                 float(starts[i]), float(window_s)))
    return out


@dataclass(frozen=True)
class TrainingCost:
    """What one client's local training of a round costs on its device."""

    flops: float
    memory_bytes: float
    bytes_down: float
    bytes_up: float
    seconds: float


def mlp_parameters(sizes: Sequence[int]) -> int:
    """``sum_i (d_i d_{i+1} + d_{i+1})``."""
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


def step_flops(sizes: Sequence[int], batch: int) -> float:
    """FLOPs of one SGD step on a batch of ``batch`` (module docstring)."""
    mac = sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
    hidden_grad = sum(a * b for a, b in zip(sizes[1:-1], sizes[2:]))
    return 2.0 * batch * (2 * mac + hidden_grad) + 2.0 * mlp_parameters(sizes)


def training_memory(sizes: Sequence[int], batch: int, proximal: bool = False) -> float:
    """Peak bytes of local training (module docstring)."""
    p = mlp_parameters(sizes)
    activations = batch * (sum(sizes[:-1]) + sum(sizes[1:-1]) + 2 * sizes[-1])
    return 4.0 * ((3 if proximal else 2) * p + activations)


def training_cost(sizes: Sequence[int], batch: int, steps: int, profile: DeviceProfile,
                  proximal: bool = False) -> TrainingCost:
    """The cost of ``steps`` SGD steps of the MLP ``sizes`` on ``profile``, the float32 model down and its dense
    float32 update up."""
    nbytes = 4.0 * mlp_parameters(sizes)
    flops = steps * step_flops(sizes, batch)
    seconds = nbytes / profile.down_bytes_per_s + flops / profile.flops_per_s + nbytes / profile.up_bytes_per_s
    return TrainingCost(flops, training_memory(sizes, batch, proximal), nbytes, nbytes, seconds)


def quantized_elements(sizes: Sequence[int], batch: int) -> tuple[int, int]:
    """(weights, activation elements of a batch) that quantization-aware training fake-quantizes each step."""
    return sum(a * b for a, b in zip(sizes[:-1], sizes[1:])), batch * sum(sizes)


def qat_training_cost(sizes: Sequence[int], batch: int, steps: int, profile: DeviceProfile, int8_bytes: float
                      ) -> TrainingCost:
    """The cost of ``steps`` quantization-aware SGD steps of the MLP ``sizes`` on ``profile``, an int8 file of
    ``int8_bytes`` down and the dense float32 update up (module docstring)."""
    weights, acts = quantized_elements(sizes, batch)
    flops = steps * (step_flops(sizes, batch) + FAKE_QUANT_FLOPS * (weights + acts))
    memory = training_memory(sizes, batch) + 4.0 * (weights + acts)
    up = 4.0 * mlp_parameters(sizes)
    seconds = int8_bytes / profile.down_bytes_per_s + flops / profile.flops_per_s + up / profile.up_bytes_per_s
    return TrainingCost(flops, memory, float(int8_bytes), up, seconds)


@dataclass
class DeviceFleet:
    """Every client's device, the width levels a client may train and the simulated clock of the rounds.

    ``level_sizes[k]`` are the layer sizes of width level ``k`` (widest first); the clients of ``int8_tiers``
    receive their level as an int8 model (:mod:`fedarena.federated.int8_clients`). Round ``r`` starts at simulated time
    ``start_s + (r - 1) round_interval_s``; a client is available when its window is open then, and its time budget
    is ``min(deadline_s, seconds left in its window)`` (``deadline_s = 0``: no deadline)."""

    profiles: list[DeviceProfile]
    level_sizes: list[tuple[int, ...]]
    round_interval_s: float = 600.0
    deadline_s: float = 0.0
    start_s: float = 0.0
    int8_tiers: tuple[int, ...] | None = None
    """the tiers whose clients receive the global model as int8 and train it quantization-aware (None: no tier)"""
    int8_calibration: int = 100
    """examples in the server's calibration sample for the int8 models"""

    def receives_int8(self, i: int) -> bool:
        return self.int8_tiers is not None and self.profiles[i].tier in self.int8_tiers

    def clock(self, rnd: int) -> float:
        return self.start_s + (rnd - 1) * self.round_interval_s

    def time_budget(self, i: int, rnd: int) -> float:
        left = self.profiles[i].seconds_left(self.clock(rnd))
        return min(left, self.deadline_s) if self.deadline_s > 0 else left

    def available(self, i: int, rnd: int) -> bool:
        return self.profiles[i].seconds_left(self.clock(rnd)) > 0

    def assign(self, i: int, rnd: int, batch: int, steps: int, proximal: bool = False,
               int8_bytes: Sequence[float] | None = None) -> tuple[int, TrainingCost] | None:
        """The widest level whose cost fits client ``i``'s memory and time budget in round ``rnd``, with its cost;
        None when not even the narrowest fits. ``int8_bytes``: the client receives level ``k`` as an int8 file of
        ``int8_bytes[k]`` bytes and trains it quantization-aware (:func:`qat_training_cost`)."""
        prof, budget = self.profiles[i], self.time_budget(i, rnd)
        for k, sizes in enumerate(self.level_sizes):
            cost = (training_cost(sizes, batch, steps, prof, proximal) if int8_bytes is None else
                    qat_training_cost(sizes, batch, steps, prof, int8_bytes[k]))
            if cost.memory_bytes <= prof.memory_bytes and cost.seconds <= budget:
                return k, cost
        return None
