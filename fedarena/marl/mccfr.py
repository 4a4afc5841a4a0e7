"""Monte Carlo CFR: external sampling and outcome sampling (Lanctot, Waugh, Zinkevich & Bowling, 2009,
"Monte Carlo sampling for regret minimization in extensive games"; Lanctot, 2013, PhD thesis, ch. 4).

Each iteration updates every player in turn (alternating). For the updating player ``i``:

- **External sampling** samples one outcome at every chance node and one action at every node of the other
  players (from their current policies) and explores all of ``i``'s actions: the sampled tree. Its values
  ``v(h)`` (``i``'s own policy mixes its children, elsewhere the one sampled child) give the sampled
  counterfactual regrets ``r(I, a) += v(h a) - v(h)`` at every reached history ``h`` of ``i``; the other
  players' average policies get ``s(I, .) += w_t sigma(I, .)`` at each of their reached histories
  (stochastically-weighted averaging, as OpenSpiel's ``ExternalSamplingMCCFRSolver`` with ``SIMPLE`` averaging).
- **Outcome sampling** samples one terminal history per episode: chance and the others on-policy, ``i`` from
  ``epsilon * uniform + (1 - epsilon) * sigma``. With ``W = u_i(z) / q_i(z)`` (``q_i``: ``i``'s sampling
  probabilities along the path; the others' cancel), each history ``h`` of ``i`` on the path with sampled
  action ``a*`` gets ``r(I, a) += W (pi_i(z | h a*) [a = a*] - pi_i(z | h))``, and ``s(I, .) += w_t
  pi_i(h) sigma(I, .) / q(h)`` (stochastically-weighted averaging, Lanctot, 2013, sec. 4.1.2).

``w_t`` is 1 (uniform averaging) or ``t`` (linear averaging); ``discount=(alpha, beta, gamma)`` applies
discounted CFR's weights after iteration ``t`` (Brown & Sandholm, 2019): positive regrets times
``t^alpha / (t^alpha + 1)``, negative ones times ``t^beta / (t^beta + 1)``, the average's numerator times
``(t / (t + 1))^gamma``.

Two walks of the same algorithms:

- :class:`MCCFRSolver` runs on the compiled tree (:mod:`fedarena.marl.game_tree`, games up to
  ``max_tree_nodes``): one iteration draws ``batch`` independent samples per player with the same policy and
  walks them together, level by level, as flat numpy arrays of (sample, history) pairs that only hold the
  sampled histories; the regrets and average of the ``batch`` samples are summed (``batch=1`` is the textbook
  one-sample iteration).
- :class:`LazyMCCFRSolver` walks :class:`~fedarena.envs.efg.State` objects one sample at a time with
  dictionaries keyed by information-state strings, so it runs on games whose trees are too large to compile
  (chess, oshi_zumo, 3-player Leduc); only the information states it meets take memory.

Both count the histories they touch (``nodes_touched``), the cost measure of Lanctot et al. (2009).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedarena.envs.efg import CHANCE, TERMINAL, Game
from fedarena.marl.cfr import normalize_average, regret_matching
from fedarena.marl.game_tree import SAMPLED_ALTERNATIVE, GameTree, game_tree
from fedarena.marl.policy import TabularPolicy

SAMPLINGS = ("external", "outcome")
AVERAGINGS = ("uniform", "linear")


@dataclass(frozen=True)
class MCCFROptions:
    """What varies between MCCFR runs (validated at construction; one-line ``ValueError`` naming the field)."""

    sampling: str = "external"
    averaging: str = "uniform"
    discount: tuple[float, float, float] | None = None
    exploration: float = 0.6          # outcome sampling's epsilon at the updating player's histories
    batch: int = 1                    # samples per player per iteration (compiled-tree solver)

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling: expected one of {SAMPLINGS}, got {self.sampling!r}")
        if self.averaging not in AVERAGINGS:
            raise ValueError(f"averaging: expected one of {AVERAGINGS}, got {self.averaging!r}")
        if self.discount is not None:
            if len(self.discount) != 3 or not all(math.isfinite(float(x)) for x in self.discount):
                raise ValueError(f"discount: expected [alpha, beta, gamma] (finite numbers), got {self.discount!r}")
        if not 0.0 < self.exploration <= 1.0:
            raise ValueError(f"exploration: expected 0 < epsilon <= 1, got {self.exploration}")
        if self.batch < 1:
            raise ValueError(f"batch: must be at least 1, got {self.batch}")


def _discount_factors(t: int, discount: tuple[float, float, float]) -> tuple[float, float, float]:
    alpha, beta, gamma = (float(x) for x in discount)
    pos = t ** alpha / (t ** alpha + 1.0)
    neg = t ** beta / (t ** beta + 1.0)
    return pos, neg, (t / (t + 1.0)) ** gamma


class MCCFRSolver:
    """External- or outcome-sampling MCCFR on the compiled tree of ``game``; call :meth:`iteration`."""

    def __init__(self, game: Game | GameTree, options: MCCFROptions = MCCFROptions(), seed: int = 0,
                 max_tree_nodes: int | None = None) -> None:
        self.options = options
        self.tree = tree = game_tree(game, max_nodes=max_tree_nodes, method="MCCFR on the compiled tree",
                                     alternative="LazyMCCFRSolver instead (the mccfr kind with lazy: true)")
        self.rng = np.random.default_rng(seed)
        N, S, A, P = tree.num_nodes, tree.num_infostates, tree.num_actions, tree.num_players
        self.regrets = np.zeros((S, A))
        self.cumulative_policy = np.zeros((S, A))
        self.iterations = 0
        self.nodes_touched = 0
        # per history: its children by action (player histories), by outcome (chance histories), its payoffs
        self._children = -np.ones((N, A), dtype=np.int64)
        moved = tree.actor[tree.parent[1:]] >= 0
        kids = np.arange(1, N)
        self._children[tree.parent[kids[moved]], tree.action[kids[moved]]] = kids[moved]
        chance_kids = kids[~moved]
        order = np.argsort(tree.parent[chance_kids], kind="stable")
        chance_kids = chance_kids[order]
        chance_nodes, first, counts = np.unique(tree.parent[chance_kids], return_index=True, return_counts=True)
        C = int(counts.max()) if len(counts) else 1
        self._chance_row = -np.ones(N, dtype=np.int64)
        self._chance_row[chance_nodes] = np.arange(len(chance_nodes))
        self._chance_children = np.zeros((max(len(chance_nodes), 1), C), dtype=np.int64)
        self._chance_cdf = np.full((max(len(chance_nodes), 1), C), 2.0)   # past the last outcome: never chosen
        col = np.arange(len(chance_kids)) - np.repeat(first, counts)
        row = np.repeat(np.arange(len(chance_nodes)), counts)
        self._chance_children[row, col] = chance_kids
        probs = np.zeros_like(self._chance_cdf)
        probs[row, col] = tree.chance_prob[chance_kids]
        cdf = np.cumsum(probs, axis=1)
        self._chance_cdf[row, col] = (cdf / cdf[:, -1:])[row, col]
        self._payoff = np.zeros((N, P))
        self._payoff[tree.terminals] = tree.utilities

    # ------------------------------------------------------------------ shared pieces
    def current_policy_probs(self) -> np.ndarray:
        return regret_matching(self.tree, self.regrets)

    def _weight(self) -> float:
        return float(self.iterations) if self.options.averaging == "linear" else 1.0

    def _sample_children(self, nodes: np.ndarray, probs: np.ndarray) -> np.ndarray:
        """One child of each node: chance by its outcome probabilities, players by the rows of ``probs``."""
        out = np.empty(len(nodes), dtype=np.int64)
        u = self.rng.random(len(nodes))
        ch = self._chance_row[nodes]
        is_c = ch >= 0
        if is_c.any():
            rows = ch[is_c]
            k = (u[is_c, None] >= self._chance_cdf[rows]).sum(axis=1)
            out[is_c] = self._chance_children[rows, k]
        if (~is_c).any():
            pn = nodes[~is_c]
            cdf = np.cumsum(probs[self.tree.infoset[pn]], axis=1)
            k = np.minimum((u[~is_c, None] * cdf[:, -1:] >= cdf).sum(axis=1), self.tree.num_actions - 1)
            out[~is_c] = self._children[pn, k]
        return out

    def _finish_iteration(self) -> None:
        if self.options.discount is not None:
            pos, neg, avg = _discount_factors(self.iterations, self.options.discount)
            self.regrets *= np.where(self.regrets > 0, pos, neg)
            self.cumulative_policy *= avg

    # ------------------------------------------------------------------ external sampling
    def _external(self, player: int) -> None:
        tree, A = self.tree, self.tree.num_actions
        sigma = self.current_policy_probs()
        B = self.options.batch
        frontier = np.zeros(B, dtype=np.int64)          # history id of each (sample, history) pair of a level
        levels = []                                     # per level: its histories and the edges to the next
        opp_infosets = []
        while len(frontier):
            self.nodes_touched += len(frontier)
            actor = tree.actor[frontier]
            mine = np.flatnonzero(actor == player)
            other = np.flatnonzero((actor != player) & (actor != TERMINAL))
            kids = self._children[frontier[mine]]
            r, a = np.nonzero(kids >= 0)                # every legal action of the updating player
            infos = tree.infoset[frontier[mine]]
            sampled = self._sample_children(frontier[other], sigma)
            opp_infosets.append(tree.infoset[frontier[other[actor[other] >= 0]]])
            child = np.concatenate([kids[r, a], sampled])
            parent_pos = np.concatenate([mine[r], other])
            weight = np.concatenate([sigma[infos[r], a], np.ones(len(other))])
            levels.append((frontier, parent_pos, weight, len(r), infos[r] * A + a))
            frontier = child
        # values bottom up: v(h) = payoff at terminals, else the weighted sum over its sampled-tree children
        v_next = np.zeros(0)
        sa_all, adv_all = [], []
        for nodes, parent_pos, weight, n_mine, sa in reversed(levels):
            v = self._payoff[nodes, player].copy()
            if len(parent_pos):
                v += np.bincount(parent_pos, weight * v_next, minlength=len(nodes))
                sa_all.append(sa)
                adv_all.append(v_next[:n_mine] - v[parent_pos[:n_mine]])
            v_next = v
        if sa_all:
            self.regrets += np.bincount(np.concatenate(sa_all), np.concatenate(adv_all),
                                        minlength=self.regrets.size).reshape(self.regrets.shape)
        counts = np.bincount(np.concatenate(opp_infosets), minlength=tree.num_infostates)
        self.cumulative_policy += (self._weight() * counts)[:, None] * sigma

    # ------------------------------------------------------------------ outcome sampling
    def _outcome(self, player: int) -> None:
        tree, A, eps = self.tree, self.tree.num_actions, self.options.exploration
        sigma = self.current_policy_probs()
        uniform = tree.uniform_probs()
        sample_probs = sigma.copy()
        mine_rows = tree.player_infostates(player)
        sample_probs[mine_rows] = eps * uniform[mine_rows] + (1.0 - eps) * sigma[mine_rows]
        B = self.options.batch
        node = np.zeros(B, dtype=np.int64)
        q_all = np.ones(B)       # probability the sampler reached the current history (all players and chance)
        q_mine = np.ones(B)      # the updating player's part of it
        pi_mine = np.ones(B)     # the updating player's own reach under sigma
        steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        alive = np.arange(B)
        while len(alive):
            self.nodes_touched += len(alive)
            n = node[alive]
            actor = tree.actor[n]
            going = actor != TERMINAL
            alive, n, actor = alive[going], n[going], actor[going]
            if not len(alive):
                break
            child = self._sample_children(n, sample_probs)
            a = tree.action[child]
            is_player = actor >= 0
            p_sample = tree.chance_prob[child].copy()
            p_sample[is_player] = sample_probs[tree.infoset[n[is_player]], a[is_player]]
            mine = actor == player
            if mine.any():
                k = alive[mine]
                infos = tree.infoset[n[mine]]
                steps.append((k, infos, a[mine], sigma[infos, a[mine]], pi_mine[k].copy(), q_all[k].copy()))
                pi_mine[k] *= sigma[infos, a[mine]]
                q_mine[k] *= p_sample[mine]
            q_all[alive] *= p_sample
            node[alive] = child
        u = self._payoff[node, player]
        W = u / q_mine
        tail = np.ones(B)        # pi_i(z | h) for the histories walked back so far
        reg = np.zeros(self.regrets.size)
        avg = np.zeros(self.regrets.size)
        w_t = self._weight()
        for k, infos, a, s_a, pi_h, q_h in reversed(steps):
            tail_after = tail[k]                       # pi_i(z | h a*)
            tail[k] = tail_after * s_a                 # pi_i(z | h)
            base = -W[k] * tail[k]
            rows = infos[:, None] * A + np.arange(A)[None, :]
            terms = np.where(tree.legal[infos], base[:, None], 0.0)
            terms[np.arange(len(k)), a] += W[k] * tail_after
            reg += np.bincount(rows.ravel(), terms.ravel(), minlength=reg.size)
            avg += np.bincount(rows.ravel(), ((w_t * pi_h / q_h)[:, None] * sigma[infos]).ravel(), minlength=avg.size)
        self.regrets += reg.reshape(self.regrets.shape)
        self.cumulative_policy += avg.reshape(self.cumulative_policy.shape)

    # ------------------------------------------------------------------ driver
    def iteration(self) -> None:
        """One iteration: ``batch`` samples for each player in turn, then discounting if configured."""
        self.iterations += 1
        walk = self._external if self.options.sampling == "external" else self._outcome
        for player in range(self.tree.num_players):
            walk(player)
        self._finish_iteration()

    def run(self, iterations: int) -> "MCCFRSolver":
        for _ in range(iterations):
            self.iteration()
        return self

    def average_policy(self) -> TabularPolicy:
        return TabularPolicy(self.tree, normalize_average(self.tree, self.cumulative_policy))

    def current_policy(self) -> TabularPolicy:
        return TabularPolicy(self.tree, self.current_policy_probs())

    def average_policy_dict(self) -> dict[str, np.ndarray]:
        """Information-state string -> average probabilities over the game's actions."""
        probs = normalize_average(self.tree, self.cumulative_policy)
        return {s: probs[j] for j, s in enumerate(self.tree.infostates)}

    def state_dict(self) -> dict:
        return {"regrets": self.regrets.copy(), "cumulative_policy": self.cumulative_policy.copy(),
                "iterations": int(self.iterations), "nodes_touched": int(self.nodes_touched),
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        for key in ("regrets", "cumulative_policy"):
            arr = np.asarray(state[key], dtype=np.float64)
            if arr.shape != self.regrets.shape:
                raise ValueError(f"checkpoint field '{key}': expected shape {self.regrets.shape}, got {arr.shape}")
        self.regrets = np.array(state["regrets"], dtype=np.float64)
        self.cumulative_policy = np.array(state["cumulative_policy"], dtype=np.float64)
        self.iterations = int(state["iterations"])
        self.nodes_touched = int(state["nodes_touched"])
        self.rng.bit_generator.state = state["rng"]


class LazyMCCFRSolver:
    """External- or outcome-sampling MCCFR walking :class:`~fedarena.envs.efg.State` objects, one sample per
    player per iteration, with regrets and average-policy numerators in dictionaries keyed by
    information-state strings (rows over the game's ``num_distinct_actions``). Nothing is enumerated, so any
    game that can be played can be run; memory grows with the information states met."""

    def __init__(self, game: Game, options: MCCFROptions = MCCFROptions(), seed: int = 0) -> None:
        if options.batch != 1:
            raise ValueError(f"batch: the lazy solver draws one sample per player per iteration, got {options.batch}")
        self.game, self.options = game, options
        self.rng = np.random.default_rng(seed)
        self.regrets: dict[str, np.ndarray] = {}
        self.cumulative_policy: dict[str, np.ndarray] = {}
        self.legal: dict[str, np.ndarray] = {}
        self.iterations = 0
        self.nodes_touched = 0
        self.underflows = 0      # outcome-sampling episodes skipped: their sampling probability underflowed to 0

    def _policy(self, key: str, legal: list[int]) -> np.ndarray:
        if key not in self.regrets:
            A = self.game.num_distinct_actions
            self.regrets[key], self.cumulative_policy[key] = np.zeros(A), np.zeros(A)
            mask = np.zeros(A, dtype=bool)
            mask[legal] = True
            self.legal[key] = mask
        pos = np.where(self.legal[key], np.maximum(self.regrets[key], 0.0), 0.0)
        total = pos.sum()
        return pos / total if total > 0 else self.legal[key] / self.legal[key].sum()

    def _weight(self) -> float:
        return float(self.iterations) if self.options.averaging == "linear" else 1.0

    def _sample(self, probs: np.ndarray) -> int:
        return int(np.searchsorted(np.cumsum(probs), self.rng.random() * probs.sum(), side="right"))

    def _external(self, state: Any, player: int) -> float:
        self.nodes_touched += 1
        p = state.current_player()
        if p == TERMINAL:
            return float(state.returns()[player])
        if p == CHANCE:
            outcomes = state.chance_outcomes()
            k = self._sample(np.array([q for _, q in outcomes]))
            return self._external(state.child(outcomes[min(k, len(outcomes) - 1)][0]), player)
        legal = state.legal_actions()
        key = state.information_state_string(p)
        sigma = self._policy(key, legal)
        if p != player:
            self.cumulative_policy[key] += self._weight() * sigma
            a = min(self._sample(sigma), len(sigma) - 1)
            return self._external(state.child(a), player)
        values = np.zeros(len(sigma))
        for a in legal:
            values[a] = self._external(state.child(a), player)
        v = float(sigma @ values)
        self.regrets[key][legal] += values[legal] - v
        return v

    def _outcome(self, state: Any, player: int, pi_mine: float, q_all: float, q_mine: float
                 ) -> tuple[float, float]:
        """Returns ``(W, pi_i(z | h))`` for the sampled terminal ``z``."""
        self.nodes_touched += 1
        p = state.current_player()
        if p == TERMINAL:
            if q_mine == 0.0 or q_all == 0.0:   # the sampling probability underflowed (games of hundreds of moves)
                self.underflows += 1
                return 0.0, 0.0                 # the episode updates nothing
            return float(state.returns()[player]) / q_mine, 1.0
        if p == CHANCE:
            outcomes = state.chance_outcomes()
            probs = np.array([q for _, q in outcomes])
            k = min(self._sample(probs), len(outcomes) - 1)
            return self._outcome(state.child(outcomes[k][0]), player, pi_mine, q_all * probs[k], q_mine)
        legal = state.legal_actions()
        key = state.information_state_string(p)
        sigma = self._policy(key, legal)
        if p != player:
            a = min(self._sample(sigma), len(sigma) - 1)
            return self._outcome(state.child(a), player, pi_mine, q_all * sigma[a], q_mine)
        eps = self.options.exploration
        sample = eps * self.legal[key] / self.legal[key].sum() + (1.0 - eps) * sigma
        a = min(self._sample(sample), len(sample) - 1)
        W, tail = self._outcome(state.child(a), player, pi_mine * sigma[a], q_all * sample[a], q_mine * sample[a])
        r = np.where(self.legal[key], -W * tail * sigma[a], 0.0)
        r[a] += W * tail
        self.regrets[key] += r
        if q_all > 0.0:
            self.cumulative_policy[key] += self._weight() * pi_mine / q_all * sigma
        return W, tail * sigma[a]

    def iteration(self) -> None:
        self.iterations += 1
        for player in range(self.game.num_players):
            if self.options.sampling == "external":
                self._external(self.game.new_initial_state(), player)
            else:
                self._outcome(self.game.new_initial_state(), player, 1.0, 1.0, 1.0)
        if self.options.discount is not None:
            pos, neg, avg = _discount_factors(self.iterations, self.options.discount)
            for key, r in self.regrets.items():
                r *= np.where(r > 0, pos, neg)
                self.cumulative_policy[key] *= avg

    def run(self, iterations: int) -> "LazyMCCFRSolver":
        for _ in range(iterations):
            self.iteration()
        return self

    def average_policy_dict(self) -> dict[str, np.ndarray]:
        """Information-state string -> average probabilities over the game's actions (the states met)."""
        out = {}
        for key, s in self.cumulative_policy.items():
            total = s.sum()
            out[key] = s / total if total > 0 else self.legal[key] / self.legal[key].sum()
        return out
