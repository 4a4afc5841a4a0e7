"""Deep CFR (Brown, Lerer, Gross & Sandholm, 2019, "Deep counterfactual regret minimization", Algorithm 1) and
Single Deep CFR (Steinberger, 2019, "Single deep counterfactual regret minimization") on fedarena's engine.

Each iteration ``t`` and player ``p``: ``K`` external-sampling traversals against the profile in which every
player plays regret matching on its newest advantage network's outputs (uniform before its first training); each
information state of ``p`` the traversals reach adds its sampled advantages (the mean over the samples that
reached it) to ``p``'s advantage memory ``M_V,p`` with weight ``t * visits`` (linear CFR: an iteration's
samples count ``t`` times); each information state of the other players they reach adds that player's current
strategy to the strategy memory ``M_Pi`` with the same kind of weight. Then ``p``'s advantage network is trained
from scratch on ``M_V,p`` (weighted squared error over the legal actions, Adam, gradients clipped to norm 1).

The average strategy is either (``average="network"``, Deep CFR) a network trained on ``M_Pi`` (weighted
cross-entropy to the stored strategies), or (``average="mixture"``, Single Deep CFR) the mixture of every
iteration's advantage networks: player ``p`` picks network ``V_p^t`` with probability proportional to ``t`` at
the start of a game and plays regret matching on it throughout. That mixture's behaviour at an information
state ``I`` of ``p`` is ``sum_t t pi_p^t(I) sigma_p^t(I) / sum_t t pi_p^t(I)``, ``pi_p^t(I)`` being ``p``'s own
probability of reaching ``I`` under ``sigma_p^t`` (:func:`mixture_average`); it is computed exactly from the
stored networks at every information state, so no second network's approximation error enters the score.

The traversals are :meth:`fedarena.marl.mccfr.MCCFRSolver.sampled_regrets` (``K`` samples walked together as
counts on the compiled tree), and the networks read the game's information-state tensors
(:func:`fedarena.envs.efg_vector.compile_tables`). The memories hold every reached information state of every
iteration: a compiled game has few enough information states that no reservoir is needed. Because the squared
error of many samples with the same input equals, up to a constant, the squared error of their weighted mean
with their summed weight, each training first merges a memory's entries per information state; it then runs
full-batch steps where the merged memory fits ``batch_size`` and steps on minibatches drawn by weight otherwise.

Measured (seed 0, Leduc hold'em, shared 2-core machine at load average about 15): Single Deep CFR with 16,384
traversals, 64-64 networks and 1,000 full-batch steps (``experiments/leduc_deep_cfr.yaml``) reaches exact
exploitability 0.095 at iteration 55 (3.9e7 sample-histories touched, 604 s solver time) and 0.075 at iteration 120
(8.6e7, 1,107 s). Deep CFR with the same settings (``average: network``, 2,000 full-batch steps of the
average-strategy network) reaches 0.108 at iteration 40 and 0.092 at 60 (4.3e7, 411 s). The earlier version of this
module (300 minibatch steps per advantage network, the average network scored) stood at 0.59 after 40 iterations of
2,048 traversals. With the same 2,048 traversals, 1,000 full-batch steps bring the mixture to 0.151 at iteration 40,
and regret matching on the merged memory's exact weighted means (no network) reaches 0.120 there: what is left is
mostly sampling noise, which more traversals shrink at little cost (one update of any batch is a few array
operations per depth level, and the merged memory does not grow with it).
Kuhn poker, 512 traversals, one 32-unit layer, 300 steps, 15 iterations: 0.042 to 0.066 over seeds 0-7.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedarena import engine
from fedarena.engine import ops, optim
from fedarena.envs.efg import Game
from fedarena.envs.efg_vector import compile_tables
from fedarena.marl.cfr import normalize_average, regret_matching
from fedarena.marl.game_tree import GameTree
from fedarena.marl.mccfr import MCCFROptions, MCCFRSolver
from fedarena.marl.policy import TabularPolicy
from fedarena.marl.tree_walk import player_reach
from fedarena.rl.networks import QNetwork, Torso

AVERAGES = ("mixture", "network")


@dataclass(frozen=True)
class DeepCFRConfig:
    traversals: int = 2048          # K: external-sampling samples per player per iteration
    hidden: tuple[int, ...] = (64, 64)
    advantage_steps: int = 300      # gradient steps per advantage-network training (from scratch)
    policy_steps: int = 2000        # gradient steps of the average-strategy network (average="network")
    batch_size: int = 512
    learning_rate: float = 1e-3
    max_grad_norm: float = 1.0
    average: str = "network"        # "network": Deep CFR; "mixture": Single Deep CFR

    def __post_init__(self) -> None:
        if self.average not in AVERAGES:
            raise ValueError(f"average: expected one of {', '.join(AVERAGES)}, got '{self.average}'")
        for name in ("traversals", "advantage_steps", "policy_steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)}")
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden: expected positive layer sizes, got {list(self.hidden)}")
        if not self.learning_rate > 0 or not self.max_grad_norm > 0:
            raise ValueError("learning_rate and max_grad_norm: must be positive")


def mixture_average(tree: GameTree, strategies: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """The behaviour policy of the mixture that picks the profile ``strategies[k]`` (rows over the information
    states) with probability proportional to ``weights[k]`` before the game and follows it throughout: at each
    information state of player ``p``, ``sum_k w_k pi_p^k(I) sigma^k(I) / sum_k w_k pi_p^k(I)`` (Kuhn's theorem:
    the realization-equivalent behaviour strategy); uniform where no profile reaches ``I``."""
    num = np.zeros(tree.legal.shape)
    own = tree.infostate_player
    for sigma, w in zip(strategies, weights):
        R = player_reach(tree, sigma)                        # (P, N) each player's own reach
        reach = R[own, tree.infostate_node]                  # pi_p(I) of the player acting at I
        num += (w * reach)[:, None] * sigma
    return normalize_average(tree, num)


class DeepCFR:
    """Deep CFR / Single Deep CFR on ``game``; :meth:`iteration` runs one iteration for every player."""

    def __init__(self, game: Game, config: DeepCFRConfig = DeepCFRConfig(), seed: int = 0) -> None:
        self.config = c = config
        self.rng = np.random.default_rng(seed)
        self.sampler = MCCFRSolver(game, MCCFROptions(sampling="external", batch=c.traversals), seed=seed)
        tree = self.tree = self.sampler.tree
        tables = compile_tables(game)
        self.x = tables.tensors[tables.rows_of(tree.infostates)].astype(np.float32)   # (S, D) per tree row
        self.net = QNetwork(Torso("mlp", (self.x.shape[1],), tuple(c.hidden), "relu"), tree.num_actions,
                            dueling=False)
        self.opt = optim.adam(c.learning_rate, max_grad_norm=c.max_grad_norm)
        self.advantage_params: list[Any] = [None] * tree.num_players
        self.memory_v: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in range(tree.num_players)]
        self.memory_pi: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        # Single Deep CFR: every iteration's advantage networks, as the strategies they play (rows of that player)
        self.strategies: list[np.ndarray] = []
        self.iterations = 0
        self._step_v = engine.jit(self._train_step_v)
        self._step_pi = engine.jit(self._train_step_pi)

    # ------------------------------------------------------------------ networks
    def _loss_v(self, params: Any, b: Any) -> Any:
        err = self.net(params, b["x"]) - b["y"]
        return ops.sum(b["w"] * ops.sum(ops.square(err) * b["legal"], axis=-1)) / ops.sum(b["w"])

    def _loss_pi(self, params: Any, b: Any) -> Any:
        logp = ops.log_softmax(ops.where(b["legal"], self.net(params, b["x"]), -1e9), axis=-1)
        return -ops.sum(b["w"] * ops.sum(b["y"] * logp, axis=-1)) / ops.sum(b["w"])

    def _train_step_v(self, params: Any, state: Any, b: Any) -> tuple:
        loss, g = engine.value_and_grad(self._loss_v)(params, b)
        params, state = self.opt.update(g, state, params)
        return params, state, loss

    def _train_step_pi(self, params: Any, state: Any, b: Any) -> tuple:
        loss, g = engine.value_and_grad(self._loss_pi)(params, b)
        params, state = self.opt.update(g, state, params)
        return params, state, loss

    def _fit(self, step: Any, rows: np.ndarray, y: np.ndarray, w: np.ndarray, steps: int) -> Any:
        """Train a fresh network on the memory ``(rows, y, w)``, merged per information state first."""
        S = self.tree.num_infostates
        W = np.bincount(rows, w, minlength=S)
        Y = np.zeros((S, y.shape[1]))
        np.add.at(Y, rows, w[:, None] * y)
        keep = np.flatnonzero(W > 0)
        rows, y, w = keep, (Y[keep] / W[keep, None]).astype(np.float32), W[keep]
        params = self.net.init(self.rng)
        state = self.opt.init(params)
        legal = self.tree.legal.astype(np.float32)
        full = len(rows) <= self.config.batch_size
        if full:
            b = {"x": self.x[rows], "y": y, "legal": legal[rows], "w": (w / w.sum()).astype(np.float32)}
        p = w / w.sum()
        for _ in range(steps):
            if not full:   # minibatch drawn by weight: an unbiased estimate of the full loss
                k = self.rng.choice(len(rows), size=self.config.batch_size, p=p)
                b = {"x": self.x[rows[k]], "y": y[k], "legal": legal[rows[k]],
                     "w": np.ones(len(k), dtype=np.float32)}
            params, state, _ = step(params, state, b)
        return params

    def _advantages(self, player: int, params: Any = None) -> np.ndarray:
        out = np.zeros(self.tree.legal.shape)
        params = self.advantage_params[player] if params is None else params
        if params is not None:
            rows = self.tree.player_infostates(player)
            out[rows] = np.asarray(self.net(params, self.x[rows]), dtype=np.float64)
        return out

    def current_profile(self) -> np.ndarray:
        """Every player's regret matching on its advantage network (uniform before its first training)."""
        adv = sum(self._advantages(p) for p in range(self.tree.num_players))
        return regret_matching(self.tree, np.where(self.tree.legal, adv, 0.0))

    # ------------------------------------------------------------------ the algorithm
    def iteration(self) -> None:
        self.iterations = t = self.iterations + 1
        tree = self.tree
        for p in range(tree.num_players):
            sigma = self.current_profile()
            regrets, visits = self.sampler.sampled_regrets(p, sigma)
            mine = np.flatnonzero((tree.infostate_player == p) & (visits > 0))
            self.memory_v[p].append((mine, regrets[mine] / visits[mine, None], t * visits[mine]))
            if self.config.average == "network":
                others = np.flatnonzero((tree.infostate_player != p) & (visits > 0))
                self.memory_pi.append((others, sigma[others], t * visits[others]))
            rows, y, w = (np.concatenate(v) for v in zip(*self.memory_v[p]))
            self.advantage_params[p] = self._fit(self._step_v, rows, y, w, self.config.advantage_steps)
        # iteration t's networks, as the profile they play (each player's rows from its own network)
        self.strategies.append(self.current_profile())

    def mixture_policy(self) -> TabularPolicy:
        """Single Deep CFR's average strategy: the mixture of iteration ``t``'s networks with weight ``t``,
        as its exact behaviour policy at every information state."""
        if not self.strategies:
            return TabularPolicy(self.tree, self.tree.uniform_probs())
        weights = [float(t) for t in range(1, len(self.strategies) + 1)]
        return TabularPolicy(self.tree, mixture_average(self.tree, self.strategies, weights))

    def average_policy_table(self) -> TabularPolicy:
        """The weighted mean of the strategy memory per information state (what the policy network fits)."""
        rows, y, w = (np.concatenate(v) for v in zip(*self.memory_pi))
        num = np.zeros(self.tree.legal.shape)
        np.add.at(num, rows, w[:, None] * y)
        return TabularPolicy(self.tree, normalize_average(self.tree, num))

    def average_policy(self) -> TabularPolicy:
        """The average strategy of the configured kind: the mixture (Single Deep CFR) or the average-strategy
        network trained on the strategy memory (Deep CFR), as a table over every information state."""
        if self.config.average == "mixture":
            return self.mixture_policy()
        if not self.memory_pi:
            return TabularPolicy(self.tree, self.tree.uniform_probs())
        rows, y, w = (np.concatenate(v) for v in zip(*self.memory_pi))
        params = self._fit(self._step_pi, rows, y, w, self.config.policy_steps)
        logits = np.asarray(self.net(params, self.x), dtype=np.float64)
        logits = np.where(self.tree.legal, logits, -np.inf)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        return TabularPolicy(self.tree, probs / probs.sum(axis=1, keepdims=True))

    @property
    def nodes_touched(self) -> int:
        return self.sampler.nodes_touched

    # ------------------------------------------------------------------ checkpoints: arrays and scalars
    def state_dict(self) -> dict:
        def merged(memory: list) -> dict:
            if not memory:
                return {}
            rows, y, w = (np.concatenate(v) for v in zip(*memory))
            return {"rows": rows, "y": y, "w": w}

        S, A = self.tree.legal.shape
        trained = {str(p): engine.tree_map(np.asarray, q) for p, q in enumerate(self.advantage_params) if q is not None}
        return {"iterations": int(self.iterations), "sampler": self.sampler.state_dict(),
                "rng": self.rng.bit_generator.state, "advantage_params": trained,
                "memory_v": [merged(m) for m in self.memory_v], "memory_pi": merged(self.memory_pi),
                "strategies": np.stack(self.strategies) if self.strategies else np.zeros((0, S, A))}

    def load_state_dict(self, state: dict) -> None:
        S, A = self.tree.legal.shape
        strategies = np.asarray(state["strategies"], dtype=np.float64)
        if strategies.shape[1:] != (S, A) or len(state["memory_v"]) != self.tree.num_players:
            raise ValueError(f"checkpoint: not a Deep CFR state of this game ({S} information states, {A} actions)")

        def split(m: dict) -> list:
            return [(np.asarray(m["rows"], dtype=np.int64), np.asarray(m["y"]), np.asarray(m["w"]))] if m else []

        self.iterations = int(state["iterations"])
        self.sampler.load_state_dict(state["sampler"])
        self.rng.bit_generator.state = state["rng"]
        self.advantage_params = [state["advantage_params"].get(str(p)) for p in range(self.tree.num_players)]
        self.memory_v = [split(m) for m in state["memory_v"]]
        self.memory_pi = split(state["memory_pi"])
        self.strategies = list(strategies)
