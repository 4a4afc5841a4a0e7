"""Deep CFR (Brown, Lerer, Gross & Sandholm, 2019, "Deep counterfactual regret minimization", Algorithm 1) on
fedarena's engine.

Each iteration ``t`` and player ``p``: ``K`` external-sampling traversals against the profile in which every
player plays regret matching on its advantage network's outputs (uniform before its first training); each
information state of ``p`` the traversals reach adds its sampled advantages (the mean over the samples that
reached it) to ``p``'s advantage memory ``M_V,p`` with weight ``t * visits`` (linear CFR: an iteration's
samples count ``t`` times); each information state of the other players they reach adds that player's current
strategy to the strategy memory ``M_Pi`` with the same kind of weight. Then ``p``'s advantage network is trained
from scratch on ``M_V,p`` (weighted squared error). The average strategy is a network trained on ``M_Pi``
(weighted cross-entropy to the stored strategies); its exploitability is exact on games that compile.

The traversals are :meth:`fedarena.marl.mccfr.MCCFRSolver.sampled_regrets` (``K`` samples walked together as
counts on the compiled tree), and the networks read the game's information-state tensors
(:func:`fedarena.envs.efg_vector.compile_tables`). The memories hold every reached information state of every
iteration (no reservoir: a compiled game has few enough states).

Measured (loaded 2-core machine): Kuhn poker, 512 traversals, 200 advantage steps, 20 iterations: exploitability
0.016 (the memory's mean strategy and the trained network alike). Leduc hold'em with the default config: 0.59
after 40 iterations (7.1e6 sample-histories, 880 s), still falling slowly: this does not yet reach the 0.1 of
the paper's Leduc results; larger networks or more advantage steps per iteration were not tried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedarena import engine
from fedarena.engine import ops, optim
from fedarena.envs.efg import Game
from fedarena.envs.efg_vector import compile_tables
from fedarena.marl.cfr import regret_matching
from fedarena.marl.mccfr import MCCFROptions, MCCFRSolver
from fedarena.marl.policy import TabularPolicy
from fedarena.rl.networks import QNetwork, Torso


@dataclass(frozen=True)
class DeepCFRConfig:
    traversals: int = 2048          # K: external-sampling samples per player per iteration
    hidden: tuple[int, ...] = (64, 64)
    advantage_steps: int = 300      # gradient steps per advantage-network training (from scratch)
    policy_steps: int = 2000        # gradient steps of the average-strategy network
    batch_size: int = 512
    learning_rate: float = 1e-3


class DeepCFR:
    """Deep CFR on ``game``; :meth:`iteration` runs one iteration for every player."""

    def __init__(self, game: Game, config: DeepCFRConfig = DeepCFRConfig(), seed: int = 0) -> None:
        self.config = c = config
        self.rng = np.random.default_rng(seed)
        self.sampler = MCCFRSolver(game, MCCFROptions(sampling="external", batch=c.traversals), seed=seed)
        tree = self.tree = self.sampler.tree
        tables = compile_tables(game)
        self.x = tables.tensors[tables.rows_of(tree.infostates)].astype(np.float32)   # (S, D) per tree row
        self.net = QNetwork(Torso("mlp", (self.x.shape[1],), tuple(c.hidden), "relu"), tree.num_actions,
                            dueling=False)
        self.opt = optim.adam(c.learning_rate)
        self.advantage_params: list[Any] = [None] * tree.num_players
        self.memory_v: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in range(tree.num_players)]
        self.memory_pi: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
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
        params = self.net.init(self.rng)
        state = self.opt.init(params)
        legal = self.tree.legal.astype(np.float32)
        p = w / w.sum()
        for _ in range(steps):
            k = self.rng.choice(len(rows), size=self.config.batch_size, p=p)   # importance: sample by weight
            b = {"x": self.x[rows[k]], "y": y[k].astype(np.float32), "legal": legal[rows[k]],
                 "w": np.ones(len(k), dtype=np.float32)}
            params, state, _ = step(params, state, b)
        return params

    def _advantages(self, player: int) -> np.ndarray:
        out = np.zeros(self.tree.legal.shape)
        if self.advantage_params[player] is not None:
            rows = self.tree.player_infostates(player)
            out[rows] = np.asarray(self.net(self.advantage_params[player], self.x[rows]), dtype=np.float64)
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
            others = np.flatnonzero((tree.infostate_player != p) & (visits > 0))
            self.memory_pi.append((others, sigma[others], t * visits[others]))
            rows, y, w = (np.concatenate(v) for v in zip(*self.memory_v[p]))
            self.advantage_params[p] = self._fit(self._step_v, rows, y, w, self.config.advantage_steps)

    def average_policy_table(self) -> TabularPolicy:
        """The weighted mean of the strategy memory per information state (what the policy network fits)."""
        rows, y, w = (np.concatenate(v) for v in zip(*self.memory_pi))
        num = np.zeros(self.tree.legal.shape)
        np.add.at(num, rows, w[:, None] * y)
        total = num.sum(axis=1, keepdims=True)
        return TabularPolicy(self.tree, np.where(total > 0, num / np.where(total > 0, total, 1.0),
                                                 self.tree.uniform_probs()))

    def average_policy(self) -> TabularPolicy:
        """The average-strategy network trained on the strategy memory, as a table over every information state."""
        rows, y, w = (np.concatenate(v) for v in zip(*self.memory_pi))
        params = self._fit(self._step_pi, rows, y, w, self.config.policy_steps)
        logits = np.asarray(self.net(params, self.x), dtype=np.float64)
        logits = np.where(self.tree.legal, logits, -np.inf)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        return TabularPolicy(self.tree, probs / probs.sum(axis=1, keepdims=True))

    @property
    def nodes_touched(self) -> int:
        return self.sampler.nodes_touched
