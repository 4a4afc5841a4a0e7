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
  sums their regret and average updates (``batch=1`` is the textbook one-sample iteration); the samples are
  walked together as per-history counts split by multinomial draws, one depth level at a time (see the class).
- :class:`LazyMCCFRSolver` walks :class:`~fedarena.envs.efg.State` objects one sample at a time with a
  dictionary keyed by information-state strings, so it runs on games whose trees are too large to compile
  (chess, oshi_zumo, 3-player Leduc); only the information states it meets take memory. Its walks use an
  explicit stack, and two bounds keep it finite: histories per iteration (external sampling explores every action
  of the updating player, so one iteration of chess or oshi_zumo is astronomically large;
  :func:`check_external_traversal` refuses such games beforehand from Knuth's estimate) and information states
  stored.

Both count the histories they touch (``nodes_touched``), the cost measure of Lanctot et al. (2009).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from fedarena.envs.efg import CHANCE, TERMINAL, Game, TreeSizeEstimate
from fedarena.marl.cfr import normalize_average, regret_matching
from fedarena.marl.game_tree import GameTree, game_tree
from fedarena.marl.policy import TabularPolicy
from fedarena.marl.tree_walk import player_reach

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
    """External- or outcome-sampling MCCFR on the compiled tree of ``game``; call :meth:`iteration`.

    The ``batch`` samples of one player's update are walked as counts: ``m(h)``, how many samples pass through
    history ``h``, goes down one level at a time -- copied to every child at the updating player's histories
    under external sampling, split by one multinomial draw over the sampling probabilities everywhere else --
    which has exactly the distribution of ``batch`` independent samples. Every update is linear in the samples,
    so their sum comes up as one value per history: ``X(z) = m(z) u_i(z) / q_i(z)`` at terminals (``q_i = 1``
    under external sampling), ``X(h) = sum_a sigma(I, a) X(h a)`` at the updating player's histories and the plain
    sum of the children elsewhere; the summed regret is ``X(h a) - X(h)`` (the formulas of the module docstring,
    summed over the samples through ``h``). The cost of one update is a few array operations per depth level,
    whatever ``batch`` is; ``nodes_touched`` counts sample-history pairs, ``sum_h m(h)``, as ``batch`` separate
    walks would touch.
    """

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
        self._player_nodes = [np.flatnonzero(tree.actor == p) for p in range(P)]
        # per level: its chance histories, their children by outcome (-1 padded) and outcome probabilities
        self._chance = []
        for lv in tree.levels:
            nodes = lv.start + np.flatnonzero(tree.actor[lv.start:lv.inner] == CHANCE)
            kids = lv.child_start + np.flatnonzero(np.isin(tree.parent[lv.child_start:lv.child_stop], nodes))
            kids = kids[np.lexsort((kids, tree.parent[kids]))]      # grouped by parent, outcomes in order
            row = np.searchsorted(nodes, tree.parent[kids])
            first = np.searchsorted(row, np.arange(len(nodes)))
            col = np.arange(len(kids)) - first[row]
            width = int(col.max()) + 1 if len(kids) else 1
            children = -np.ones((len(nodes), width), dtype=np.int64)
            probs = np.zeros((len(nodes), width))
            children[row, col] = kids
            probs[row, col] = tree.chance_prob[kids]
            self._chance.append((nodes, children, probs / np.maximum(probs.sum(axis=1, keepdims=True), 1e-300)))
        self._payoff = np.zeros((N, P))
        self._payoff[tree.terminals] = tree.utilities

    # ------------------------------------------------------------------ shared pieces
    def current_policy_probs(self) -> np.ndarray:
        return regret_matching(self.tree, self.regrets)

    def _weight(self) -> float:
        return float(self.iterations) if self.options.averaging == "linear" else 1.0

    def _draw(self, nodes: np.ndarray, counts: np.ndarray, probs: np.ndarray) -> np.ndarray:
        """How many of the ``counts[k]`` samples at ``nodes[k]`` take each column of ``probs[k]`` (multinomial)."""
        return self.rng.multinomial(counts, probs / probs.sum(axis=1, keepdims=True))

    def _split(self, m: np.ndarray, nodes: np.ndarray, children: np.ndarray, probs: np.ndarray) -> None:
        live = m[nodes] > 0
        if not live.any():
            return
        drawn = self._draw(nodes[live], m[nodes[live]], probs[live])
        kids = children[live]
        ok = kids >= 0
        m[kids[ok]] = drawn[ok]

    def _walk(self, player: int, sigma: np.ndarray, sample: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Counts ``m`` down the tree: ``sample`` is the updating player's sampling policy (outcome sampling) or
        ``None`` (external sampling: all its actions). Returns ``(m, q_i)``, ``q_i`` the updating player's
        sampling probability of reaching each history (ones under external sampling)."""
        tree = self.tree
        m = np.zeros(tree.num_nodes, dtype=np.int64)
        m[0] = self.options.batch
        q_i = np.ones(tree.num_nodes)
        for lv, (c_nodes, c_children, c_probs) in zip(tree.levels[:-1], self._chance):
            if sample is not None:
                q_i[lv.child_start:lv.child_stop] = q_i[tree.parent[lv.child_start:lv.child_stop]]
            self._split(m, c_nodes, c_children, c_probs)
            for p in range(tree.num_players):
                nodes, children = lv.player_nodes[p], lv.player_children[p]
                if not len(nodes):
                    continue
                rows = tree.infoset[nodes]
                if p != player:
                    self._split(m, nodes, children, sigma[rows])
                    continue
                ok = children >= 0
                if sample is None:
                    m[children[ok]] = np.broadcast_to(m[nodes][:, None], children.shape)[ok]
                else:
                    q_i[children[ok]] *= sample[rows][ok]
                    self._split(m, nodes, children, sample[rows])
        return m, q_i

    def _values(self, player: int, sigma: np.ndarray, leaf: np.ndarray) -> np.ndarray:
        """``X`` bottom up from the terminal values ``leaf`` (per history; zero elsewhere)."""
        tree = self.tree
        w = np.ones(tree.num_nodes)
        w[tree.player_edge_nodes[player]] = sigma.reshape(-1)[tree.player_edge_sa[player]]
        X = leaf
        for lv in reversed(tree.levels[:-1]):
            c0, c1 = lv.child_start, lv.child_stop
            X[lv.start:lv.inner] = np.bincount(lv.child_parent_local, w[c0:c1] * X[c0:c1],
                                               minlength=lv.inner - lv.start)
        return X

    def _update_regrets(self, player: int, X: np.ndarray) -> None:
        tree = self.tree
        edges = tree.player_edge_nodes[player]
        self.regrets += np.bincount(tree.player_edge_sa[player], X[edges] - X[tree.parent[edges]],
                                    minlength=self.regrets.size).reshape(self.regrets.shape)

    def _finish_iteration(self) -> None:
        if self.options.discount is not None:
            pos, neg, avg = _discount_factors(self.iterations, self.options.discount)
            self.regrets *= np.where(self.regrets > 0, pos, neg)
            self.cumulative_policy *= avg

    # ------------------------------------------------------------------ the two samplings
    def sampled_regrets(self, player: int, sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One external-sampling update of ``batch`` samples against the profile ``sigma`` (rows over the
        information states), without changing the solver's tables: ``(regrets, visits)``, the summed sampled
        regrets ``(S, A)`` and how many samples reached each information state (every player's)."""
        tree = self.tree
        m, _ = self._walk(player, sigma, None)
        self.nodes_touched += int(m.sum())
        leaf = np.zeros(tree.num_nodes)
        leaf[tree.terminals] = m[tree.terminals] * tree.utilities[:, player]
        X = self._values(player, sigma, leaf)
        edges = tree.player_edge_nodes[player]
        regrets = np.bincount(tree.player_edge_sa[player], X[edges] - X[tree.parent[edges]],
                              minlength=self.regrets.size).reshape(self.regrets.shape)
        visits = np.zeros(tree.num_infostates)
        for q in range(tree.num_players):
            nodes = self._player_nodes[q]
            visits += np.bincount(tree.infoset[nodes], m[nodes], minlength=tree.num_infostates)
        return regrets, visits

    def _external(self, player: int) -> None:
        tree = self.tree
        sigma = self.current_policy_probs()
        regrets, visits = self.sampled_regrets(player, sigma)
        self.regrets += regrets
        counts = np.where(tree.infostate_player != player, visits, 0.0)
        self.cumulative_policy += (self._weight() * counts)[:, None] * sigma

    def _outcome(self, player: int) -> None:
        tree, eps = self.tree, self.options.exploration
        sigma = self.current_policy_probs()
        rows = tree.player_infostates(player)
        sample = sigma.copy()
        sample[rows] = eps * tree.uniform_probs()[rows] + (1.0 - eps) * sigma[rows]
        m, q_i = self._walk(player, sigma, sample)
        self.nodes_touched += int(m.sum())
        leaf = np.zeros(tree.num_nodes)
        leaf[tree.terminals] = m[tree.terminals] * tree.utilities[:, player] / q_i[tree.terminals]
        X = self._values(player, sigma, leaf)
        # the regret terms are X(h a) - X(h) only at histories some sample reached
        reached = np.zeros(tree.num_nodes)
        edges = tree.player_edge_nodes[player]
        reached[edges] = m[tree.parent[edges]] > 0
        self.regrets += np.bincount(tree.player_edge_sa[player], reached[edges] * (X[edges] - X[tree.parent[edges]]),
                                    minlength=self.regrets.size).reshape(self.regrets.shape)
        # average: m(h) pi_i(h) / q(h) sigma(I), q(h) = q_i(h) * (the others' and chance's reach of h)
        nodes = self._player_nodes[player]
        reach = player_reach(tree, sigma)
        others = tree.chance_reach[nodes] * np.prod(np.delete(reach[:, nodes], player, axis=0), axis=0)
        weight = np.where(m[nodes] > 0, m[nodes] * reach[player, nodes] / np.maximum(q_i[nodes] * others, 1e-300), 0.0)
        per_infoset = np.bincount(tree.infoset[nodes], weight, minlength=tree.num_infostates)
        self.cumulative_policy += (self._weight() * per_infoset)[:, None] * sigma

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


DEFAULT_MAX_TRAVERSAL_NODES = 1_000_000
"""Histories one iteration of :class:`LazyMCCFRSolver` may touch (all players' walks together). The lazy walk
touched 1.1e4 (chess) to 3.1e4 (3-player Leduc) histories a second on a loaded 2-core machine, so the default caps
an iteration at a minute or two, not hours."""

DEFAULT_MAX_INFOSTATES = 150_000
"""Information states :class:`LazyMCCFRSolver` may store. Measured with ``tracemalloc`` (bytes of the tables per
information state, key string included): 531 on 3-player Leduc, 623 on oshi_zumo, 2,059 on chess (its keys are
the move history). Writing or reading a checkpoint (:meth:`LazyMCCFRSolver.state_dict`) costs several times the
tables (chess, 135,000 information states: peak resident memory 1.01 GB writing it, 1.22 GB resuming from it), so
the default keeps a chess run, the worst of these, near 1.2 GB at its peak."""


class LazyWalkLimitError(RuntimeError):
    """The lazy walk refusing or stopping a run: one external-sampling iteration estimated (or found) above its
    node budget, or more information states than may be stored. One line naming the game, the number, the bound
    and what to do; a user error (CLI exit status 2)."""

    user_error = True


def estimate_external_traversal(game: Game, probes: int = 256, seed: int = 0, stop_above: float | None = None
                                ) -> TreeSizeEstimate:
    """Knuth's (1975) estimate of the histories one external-sampling iteration touches (every player's sampled
    tree, summed). The sampled tree of player ``i`` has one child at chance nodes and at the other players'
    histories and all children at ``i``'s own, so a random playout (chance by its probabilities, every player
    uniformly, as the first iteration's policies are) with ``i``'s branching factors ``b_0, b_1, ...`` along it
    estimates ``1 + b_0 + b_0 b_1 + ...`` (the other players' histories count with branching factor 1); one
    playout serves every player. With ``stop_above``, stops as soon as the playouts so far prove the mean
    exceeds it (a lower bound is returned). Costs ``probes`` playouts."""
    rng = np.random.default_rng(seed)
    limit = float("inf") if stop_above is None else float(stop_above) * probes
    total = 0.0
    for k in range(probes):
        s = game.new_initial_state()
        weight = np.ones(game.num_players)
        est = float(game.num_players)
        while True:
            p = s.current_player()
            if p == TERMINAL:
                break
            if p == CHANCE:
                outcomes = s.chance_outcomes()
                probs = np.array([q for _, q in outcomes])
                j = min(int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum(), side="right")),
                        len(outcomes) - 1)
                s._apply(int(outcomes[j][0]))
            else:
                legal = s.legal_actions()
                weight[p] *= len(legal)
                s._apply(int(legal[int(rng.integers(len(legal)))]))
            est += float(weight.sum())
            if total + est > limit:
                return TreeSizeEstimate((total + est) / probes, k + 1, probes, lower_bound=True)
        total += est
    return TreeSizeEstimate(total / probes, probes, probes)


def check_external_traversal(game: Game, max_nodes: int = DEFAULT_MAX_TRAVERSAL_NODES) -> TreeSizeEstimate:
    """Refuse (:class:`LazyWalkLimitError`) external sampling on a game where one iteration is estimated
    (:func:`estimate_external_traversal`) above ``max_nodes`` histories; returns the estimate."""
    est = estimate_external_traversal(game, stop_above=max_nodes)
    if est.histories > max_nodes:
        raise LazyWalkLimitError(
            f"game {game.name}: one external-sampling MCCFR iteration walks every action of the updating player, "
            f"estimated at {est}, above max_traversal_nodes={max_nodes:,}; use sampling: outcome")
    return est


class LazyMCCFRSolver:
    """External- or outcome-sampling MCCFR walking :class:`~fedarena.envs.efg.State` objects, one sample per
    player per iteration, with its tables in a dictionary keyed by information-state strings. Nothing is
    enumerated, so any game that can be played can be run; memory grows with the information states met.

    The walks are loops over an explicit stack (a game of thousands of moves does not reach Python's recursion
    limit); chance and the other players' moves are applied to one state in place, only the updating player's
    histories are copied under external sampling. Each information state keeps ``(regrets, average numerator)``
    as one ``(2, n)`` array over its ``n`` legal actions and the legal actions themselves (see
    :data:`DEFAULT_MAX_INFOSTATES` for the measured bytes), not rows over the game's ``num_distinct_actions``
    (4674 in chess). Two bounds keep a run finite: ``max_traversal_nodes`` histories per
    iteration and ``max_infostates`` information states stored; either raises :class:`LazyWalkLimitError`."""

    def __init__(self, game: Game, options: MCCFROptions = MCCFROptions(), seed: int = 0,
                 max_traversal_nodes: int = DEFAULT_MAX_TRAVERSAL_NODES,
                 max_infostates: int = DEFAULT_MAX_INFOSTATES) -> None:
        if options.batch != 1:
            raise ValueError(f"batch: the lazy solver draws one sample per player per iteration, got {options.batch}")
        for name, value in (("max_traversal_nodes", max_traversal_nodes), ("max_infostates", max_infostates)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive whole number, got {value!r}")
        self.game, self.options = game, options
        self.max_traversal_nodes, self.max_infostates = max_traversal_nodes, max_infostates
        self.rng = np.random.default_rng(seed)
        self.tables: dict[str, np.ndarray] = {}      # key -> (2, n): regrets, average-policy numerator
        self.legal: dict[str, np.ndarray] = {}       # key -> the n legal actions
        self.iterations = 0
        self.nodes_touched = 0
        self.underflows = 0      # outcome-sampling episodes whose sampling probability underflowed to 0
        self._budget = 0

    @property
    def num_infostates(self) -> int:
        return len(self.tables)

    def _table(self, key: str, legal: list[int]) -> np.ndarray:
        table = self.tables.get(key)
        if table is None:
            if len(self.tables) >= self.max_infostates:
                raise LazyWalkLimitError(
                    f"game {self.game.name}: the lazy MCCFR walk met more than max_infostates={self.max_infostates:,}"
                    f" information states (iteration {self.iterations}); raise max_infostates if memory allows")
            table = self.tables[key] = np.zeros((2, len(legal)))
            self.legal[key] = np.asarray(legal, dtype=np.int64)
        return table

    @staticmethod
    def _regret_matching(regrets: np.ndarray) -> np.ndarray:
        pos = np.maximum(regrets, 0.0)
        total = pos.sum()
        return pos / total if total > 0 else np.full(len(regrets), 1.0 / len(regrets))

    def _weight(self) -> float:
        return float(self.iterations) if self.options.averaging == "linear" else 1.0

    def _sample(self, probs: np.ndarray) -> int:
        k = int(np.searchsorted(np.cumsum(probs), self.rng.random() * probs.sum(), side="right"))
        return min(k, len(probs) - 1)

    def _touch(self) -> None:
        self.nodes_touched += 1
        self._budget -= 1
        if self._budget < 0:
            hint = "; use sampling: outcome" if self.options.sampling == "external" else ""
            raise LazyWalkLimitError(
                f"game {self.game.name}: one {self.options.sampling}-sampling MCCFR iteration touched more than "
                f"max_traversal_nodes={self.max_traversal_nodes:,} histories{hint}")

    def _chance(self, state: Any) -> tuple[int, float]:
        outcomes = state.chance_outcomes()
        probs = np.array([q for _, q in outcomes])
        k = self._sample(probs)
        return int(outcomes[k][0]), float(probs[k])

    def _external(self, player: int) -> float:
        """One external-sampling walk for ``player`` (depth first, explicit stack); its root value."""
        w = self._weight()
        stack: list[list[Any]] = []      # the updating player's histories: [state, table, sigma, values, next]
        state = self.game.new_initial_state()
        while True:
            while True:                  # down to a terminal or a history of the updating player
                self._touch()
                p = state.current_player()
                if p == TERMINAL:
                    value = float(state.returns()[player])
                    break
                if p == CHANCE:
                    state._apply(self._chance(state)[0])
                    continue
                legal = state.legal_actions()
                table = self._table(state.information_state_string(p), legal)
                sigma = self._regret_matching(table[0])
                if p != player:
                    table[1] += w * sigma
                    state._apply(int(legal[self._sample(sigma)]))
                    continue
                stack.append([state, table, sigma, np.zeros(len(legal)), 1, legal])
                state = state.clone() if len(legal) > 1 else state
                state._apply(int(legal[0]))
            while stack:                 # up: hand the value to the parent; the next child or the parent's value
                frame = stack[-1]
                parent, table, sigma, values, k, legal = frame
                values[k - 1] = value
                if k < len(legal):
                    frame[4] = k + 1
                    state = parent.clone() if k + 1 < len(legal) else parent   # the last child reuses the parent
                    state._apply(int(legal[k]))
                    break
                stack.pop()
                value = float(sigma @ values)
                table[0] += values - value
            else:
                return value

    def _outcome(self, player: int) -> None:
        """One outcome-sampling episode for ``player``: down one sampled path, then the updates back up it."""
        w, eps = self._weight(), self.options.exploration
        path: list[tuple[np.ndarray, int, np.ndarray, float, float]] = []   # table, a*, sigma, pi_i(h), q(h)
        pi_mine = q_all = q_mine = 1.0
        state = self.game.new_initial_state()
        while True:
            self._touch()
            p = state.current_player()
            if p == TERMINAL:
                break
            if p == CHANCE:
                outcome, prob = self._chance(state)
                q_all *= prob
                state._apply(outcome)
                continue
            legal = state.legal_actions()
            table = self._table(state.information_state_string(p), legal)
            sigma = self._regret_matching(table[0])
            if p != player:
                k = self._sample(sigma)
                q_all *= sigma[k]
            else:
                sample = eps / len(legal) + (1.0 - eps) * sigma
                k = self._sample(sample)
                path.append((table, k, sigma, pi_mine, q_all))
                pi_mine *= sigma[k]
                q_all *= sample[k]
                q_mine *= sample[k]
            state._apply(int(legal[k]))
        if q_mine == 0.0 or q_all == 0.0:   # the sampling probability underflowed (games of hundreds of moves):
            self.underflows += 1            # no regret update from this episode
            W, tail = 0.0, 0.0
        else:
            W, tail = float(state.returns()[player]) / q_mine, 1.0
        for table, k, sigma, pi_h, q_h in reversed(path):
            table[0] -= W * tail * sigma[k]
            table[0, k] += W * tail
            if q_h > 0.0:
                table[1] += w * pi_h / q_h * sigma
            tail *= sigma[k]

    def iteration(self) -> None:
        """One iteration: one walk per player in turn (together at most ``max_traversal_nodes`` histories), then
        discounting if configured."""
        self.iterations += 1
        self._budget = self.max_traversal_nodes
        for player in range(self.game.num_players):
            if self.options.sampling == "external":
                self._external(player)
            else:
                self._outcome(player)
        if self.options.discount is not None:
            pos, neg, avg = _discount_factors(self.iterations, self.options.discount)
            for table in self.tables.values():
                table[0] *= np.where(table[0] > 0, pos, neg)
                table[1] *= avg

    def run(self, iterations: int) -> "LazyMCCFRSolver":
        for _ in range(iterations):
            self.iteration()
        return self

    def state_dict(self) -> dict:
        """The tables packed into flat arrays (the checkpoint form: arrays and JSON scalars): ``keys`` the UTF-8
        bytes of the information-state strings cut at ``key_ends``, ``legal`` and ``tables`` (regrets, then the
        average numerator) over each state's legal actions cut at ``legal_ends``."""
        raw = "".join(self.tables).encode("utf-8")     # one copy of the keys (chess: most of the bytes)
        legal = list(self.legal.values())
        return {"keys": np.frombuffer(raw, dtype=np.uint8),
                "key_ends": np.cumsum([len(k.encode("utf-8")) for k in self.tables], dtype=np.int64),
                "legal": np.concatenate(legal) if legal else np.zeros(0, dtype=np.int64),
                "legal_ends": np.cumsum([len(a) for a in legal], dtype=np.int64),
                "tables": np.concatenate([t for t in self.tables.values()], axis=1) if legal else np.zeros((2, 0)),
                "iterations": int(self.iterations), "nodes_touched": int(self.nodes_touched),
                "underflows": int(self.underflows), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s form; inconsistent arrays raise a one-line ``ValueError`` naming the field."""
        raw = np.asarray(state["keys"], dtype=np.uint8).tobytes()
        key_ends, legal_ends = (np.asarray(state[f], dtype=np.int64) for f in ("key_ends", "legal_ends"))
        legal, tables = np.asarray(state["legal"], dtype=np.int64), np.asarray(state["tables"], dtype=np.float64)
        if len(key_ends) != len(legal_ends) or (len(key_ends) and key_ends[-1] != len(raw)):
            raise ValueError("checkpoint field 'key_ends': does not match 'keys' and 'legal_ends'")
        if tables.shape != (2, len(legal)) or (len(legal_ends) and legal_ends[-1] != len(legal)):
            raise ValueError(f"checkpoint field 'tables': expected shape (2, {len(legal)}), got {tables.shape}")
        if len(legal) and (legal.min() < 0 or legal.max() >= self.game.num_distinct_actions):
            raise ValueError("checkpoint field 'legal': actions outside the game's")
        if len(key_ends) > self.max_infostates:
            raise ValueError(f"checkpoint: {len(key_ends):,} information states, above max_infostates="
                             f"{self.max_infostates:,}")
        self.tables, self.legal = {}, {}
        k0 = a0 = 0
        for k1, a1 in zip(key_ends.tolist(), legal_ends.tolist()):
            key = raw[k0:k1].decode("utf-8")
            self.tables[key] = tables[:, a0:a1].copy()
            self.legal[key] = legal[a0:a1].copy()
            k0, a0 = k1, a1
        self.iterations = int(state["iterations"])
        self.nodes_touched = int(state["nodes_touched"])
        self.underflows = int(state["underflows"])
        self.rng.bit_generator.state = state["rng"]

    def average_policy_rows(self) -> Iterator[tuple[str, np.ndarray]]:
        """``(information-state string, average probabilities over the game's actions)`` for the states met, one
        row at a time (a row of chess has 4674 entries)."""
        A = self.game.num_distinct_actions
        for key, table in self.tables.items():
            legal, s = self.legal[key], table[1]
            row = np.zeros(A)
            total = s.sum()
            row[legal] = s / total if total > 0 else 1.0 / len(legal)
            yield key, row

    def average_policy_dict(self) -> dict[str, np.ndarray]:
        """Information-state string -> average probabilities over the game's actions (the states met)."""
        return dict(self.average_policy_rows())
