"""Policy, value and Q networks as (init, apply) pairs over parameter pytrees, written with engine ops.

Torsos: an MLP for vector observations, the Nature-DQN CNN (Mnih et al., 2015: 32 8x8/4, 64 4x4/2,
64 3x3/1, then a fully connected layer of 512 ReLU units) for images; the configs' ``hidden`` sizes apply to
the MLP only. Heads: policy logits / Gaussian mean (+ a free log-std), a scalar
value, Q-values, or the dueling decomposition Q = V + A - mean(A) (Wang et al., 2016, "Dueling
network architectures", eq. 9). Initialisation is orthogonal with gains sqrt(2) for hidden layers,
0.01 for the policy head and 1 for value heads (Saxe et al., 2014; the PPO implementation study of
Huang et al., 2022, "The 37 implementation details of PPO").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedarena.engine import ops
from fedarena.rl.distributions import DiagGaussian, Distribution
from fedarena.rl.spaces import ObservationAdapter

Params = dict[str, Any]

NATURE_CNN = ((32, 8, 4), (64, 4, 2), (64, 3, 1))


def orthogonal(rng: np.random.Generator, n_in: int, n_out: int, gain: float) -> np.ndarray:
    """An (n_in, n_out) matrix with orthonormal rows or columns, times ``gain`` (Saxe et al., 2014)."""
    a = rng.standard_normal((max(n_in, n_out), min(n_in, n_out)))
    q, r = np.linalg.qr(a)
    q = q * np.sign(np.diag(r))
    if n_in < n_out:
        q = q.T
    return (gain * q[:n_in, :n_out]).astype(np.float32)


def dense_init(rng: np.random.Generator, n_in: int, n_out: int, gain: float) -> Params:
    return {"w": orthogonal(rng, n_in, n_out, gain), "b": np.zeros(n_out, dtype=np.float32)}


def dense(p: Params, x: Any) -> Any:
    return ops.matmul(x, p["w"]) + p["b"]


def _activate(x: Any, activation: str) -> Any:
    if activation == "tanh":
        return ops.tanh(x)
    if activation == "relu":
        return ops.relu(x)
    raise ValueError(f"activation: expected 'tanh' or 'relu', got '{activation}'")


@dataclass(frozen=True)
class Torso:
    """The feature extractor chosen by the observation adapter."""

    kind: str  # "mlp" or "cnn"
    input_shape: tuple[int, ...]
    hidden: tuple[int, ...]
    activation: str = "tanh"

    @property
    def out_size(self) -> int:
        return self.hidden[-1] if self.hidden else int(np.prod(self.input_shape))

    def init(self, rng: np.random.Generator) -> Params:
        gain = math.sqrt(2.0)
        if self.kind == "mlp":
            sizes = (self.input_shape[0],) + self.hidden
            return {f"l{i}": dense_init(rng, a, b, gain) for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))}
        c, h, w = self.input_shape
        params: Params = {}
        for i, (out_c, k, s) in enumerate(NATURE_CNN):
            fan_in = c * k * k
            wmat = orthogonal(rng, fan_in, out_c, gain).T.reshape(out_c, c, k, k)
            params[f"c{i}"] = {"w": wmat, "b": np.zeros((1, out_c, 1, 1), dtype=np.float32)}
            h, w, c = (h - k) // s + 1, (w - k) // s + 1, out_c
            if h < 1 or w < 1:
                raise ValueError(f"observation_space: image {self.input_shape} is too small for the Nature CNN")
        params["fc"] = dense_init(rng, c * h * w, self.hidden[-1], gain)
        return params

    def apply(self, params: Params, x: Any) -> Any:
        if self.kind == "mlp":
            for i in range(len(self.hidden)):
                x = _activate(dense(params[f"l{i}"], x), self.activation)
            return x
        for i, (_, _, s) in enumerate(NATURE_CNN):
            # the bias rides in the convolution's GEMM (stored (1, C, 1, 1) as before)
            x = ops.relu(ops.conv2d(x, params[f"c{i}"]["w"], stride=s, bias=ops.reshape(params[f"c{i}"]["b"], (-1,))))
        x = ops.reshape(x, (x.shape[0], -1))
        return ops.relu(dense(params["fc"], x))


NATURE_CNN_FEATURES = 512


def torso_for(adapter: ObservationAdapter, hidden: tuple[int, ...], activation: str = "tanh") -> Torso:
    """The MLP over ``hidden`` for vector observations; the Nature CNN (its 512-unit layer) for images."""
    if adapter.torso == "cnn":
        return Torso("cnn", adapter.shape, (NATURE_CNN_FEATURES,), "relu")
    return Torso("mlp", adapter.shape, tuple(hidden), activation)


LOG_STD_MODES = ("state_independent", "state_dependent")
SDE_EPSILON = 1e-6  # added to gSDE's action variance (keeps log_std finite where phi(s) = 0)


@dataclass(frozen=True)
class ActorCritic:
    """Separate policy and value networks (same torso shape), the layout of PPO/IMPALA on classic control.

    Gaussian policies: ``log_std="state_independent"`` learns one free log-std vector (PPO's original
    continuous-control setup, Schulman et al., 2017, section 6.1); ``"state_dependent"`` adds a second linear
    head on the policy torso, log-std(s) = W h(s) + b (as SAC's and SB3's ``squash_output`` policies), clipped to
    [-20, 2]. Both start at ``log_std_init``. ``sde`` (generalized state-dependent exploration, gSDE: Raffin,
    Kober & Stulp, 2022, "Smooth exploration for robotic reinforcement learning") replaces both: the
    exploration noise is eps(s) = phi(s) E with phi(s) the policy torso's features (gradient stopped) and
    E_ij ~ N(0, sigma_ij^2) a (features x actions) noise matrix the actor resamples every ``sde_sample_freq`` steps,
    sigma = exp(params["pi"]["sde_log_std"]) learned, starting at exp(log_std_init). Given s the action is
    Gaussian with variance sum_i phi_i(s)^2 sigma_ij^2 per action j (+ 1e-6), so the policy returns that
    distribution's (mean, log_std) and the usual Gaussian likelihood and entropy apply. ``normalize_obs`` feeds
    the torsos ``clip((x - mean) / std, -obs_clip, obs_clip)`` with the running statistics in
    ``params["obs_norm"]`` (:mod:`fedarena.rl.normalization`).
    """

    torso: Torso
    dist: Distribution
    log_std: str = "state_independent"
    log_std_init: float = 0.0
    normalize_obs: bool = False
    obs_clip: float = 10.0
    sde: bool = False

    def __post_init__(self) -> None:
        if self.log_std not in LOG_STD_MODES:
            raise ValueError(f"log_std: expected one of {', '.join(LOG_STD_MODES)}, got '{self.log_std}'")
        if self.sde and not isinstance(self.dist, DiagGaussian):
            raise ValueError("use_sde: state-dependent exploration needs a Box (Gaussian) action space")
        if self.normalize_obs and self.torso.kind != "mlp":
            raise ValueError("normalize_obs: observation normalization applies to vector observations (MLP torso)")

    def init(self, rng: np.random.Generator) -> Params:
        t = self.torso
        params: Params = {
            "pi": {"torso": t.init(rng), "head": dense_init(rng, t.out_size, self.dist.head_size, 0.01)},
            "v": {"torso": t.init(rng), "head": dense_init(rng, t.out_size, 1, 1.0)},
        }
        if self.sde:
            params["pi"]["sde_log_std"] = np.full((t.out_size, self.dist.dim), self.log_std_init, dtype=np.float32)
        elif isinstance(self.dist, DiagGaussian):
            if self.log_std == "state_independent":
                params["pi"]["log_std"] = np.full(self.dist.dim, self.log_std_init, dtype=np.float32)
            else:
                head = dense_init(rng, t.out_size, self.dist.dim, 0.01)
                head["b"] = np.full(self.dist.dim, self.log_std_init, dtype=np.float32)
                params["pi"]["log_std_head"] = head
        if self.normalize_obs:
            d = int(np.prod(t.input_shape))
            params["obs_norm"] = {"mean": np.zeros(d, dtype=np.float32), "var": np.ones(d, dtype=np.float32)}
        return params

    def _input(self, params: Params, x: Any) -> Any:
        if not self.normalize_obs:
            return x
        from fedarena.rl.normalization import normalize

        return normalize(params["obs_norm"], x, self.obs_clip)

    def policy(self, params: Params, x: Any) -> tuple[Any, ...]:
        """The distribution's inputs: ``(logits,)`` or ``(mean, log_std)``."""
        return self.policy_and_features(params, x)[0]

    def policy_and_features(self, params: Params, x: Any) -> tuple[tuple[Any, ...], Any]:
        """:meth:`policy`'s output and the policy torso's features phi(s) (gSDE's noise is phi(s) E)."""
        h = self.torso.apply(params["pi"]["torso"], self._input(params, x))
        return self._head(params, h), h

    def sde_std(self, params: Params) -> Any:
        """sigma = exp(sde_log_std), the (features x actions) standard deviations of gSDE's noise matrix E."""
        return ops.exp(params["pi"]["sde_log_std"])

    def _head(self, params: Params, h: Any) -> tuple[Any, ...]:
        out = dense(params["pi"]["head"], h)
        if self.sde:
            phi = ops.stop_gradient(h)
            variance = ops.matmul(phi * phi, ops.exp(2.0 * params["pi"]["sde_log_std"]))
            return out, 0.5 * ops.log(variance + SDE_EPSILON)
        if isinstance(self.dist, DiagGaussian):
            if self.log_std == "state_independent":
                return out, params["pi"]["log_std"]
            return out, ops.clip(dense(params["pi"]["log_std_head"], h), -20.0, 2.0)
        return (out,)

    def value(self, params: Params, x: Any) -> Any:
        v = dense(params["v"]["head"], self.torso.apply(params["v"]["torso"], self._input(params, x)))
        return ops.reshape(v, (-1,))


@dataclass(frozen=True)
class QNetwork:
    """Q(s, .) for ``num_actions`` discrete actions; ``dueling`` uses separate value and advantage streams."""

    torso: Torso
    num_actions: int
    dueling: bool = False

    def init(self, rng: np.random.Generator) -> Params:
        t = self.torso
        params: Params = {"torso": t.init(rng)}
        if self.dueling:
            params["value"] = dense_init(rng, t.out_size, 1, 1.0)
            params["advantage"] = dense_init(rng, t.out_size, self.num_actions, 1.0)
        else:
            params["q"] = dense_init(rng, t.out_size, self.num_actions, 1.0)
        return params

    def __call__(self, params: Params, x: Any) -> Any:
        h = self.torso.apply(params["torso"], x)
        if not self.dueling:
            return dense(params["q"], h)
        a = dense(params["advantage"], h)
        return dense(params["value"], h) + a - ops.mean(a, axis=-1, keepdims=True)
