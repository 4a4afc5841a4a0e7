"""Counterfactual regret minimization: CFR (Zinkevich et al., 2007) and CFR+ (Tammelin, 2014; Tammelin
et al., 2015), the reference equilibrium solvers; their average policy converges to a Nash equilibrium in
two-player zero-sum games.

Each iteration, for each player ``i`` in turn (alternating updates): counterfactual regrets
``r(I, a) += sum_{h in I} pi_{-i}(h) (v_i(h a) - v_i(h))`` and the average-policy numerator
``s(I, a) += w_t pi_i(I) sigma(I, a)``; the next policy is regret matching on ``r``. CFR+ clips the
cumulative regrets at zero after each update (regret matching+) and weights the average by ``w_t = t``
(linear averaging). These are the conventions of OpenSpiel's ``CFRSolver`` and ``CFRPlusSolver``.
The whole tree is updated with a few numpy operations per depth level (:mod:`fedarena.marl.tree_walk`).
"""

from __future__ import annotations

import numpy as np

from fedarena.envs.efg import Game
from fedarena.marl.game_tree import SAMPLED_ALTERNATIVE, GameTree, game_tree
from fedarena.marl.policy import TabularPolicy
from fedarena.marl.tree_walk import edge_weights, node_values, player_reach


def regret_matching(tree: GameTree, regrets: np.ndarray) -> np.ndarray:
    """Policy proportional to positive regrets; uniform over legal actions where none is positive."""
    pos = np.maximum(regrets, 0.0)
    total = pos.sum(axis=1, keepdims=True)
    uniform = tree.legal / tree.legal.sum(axis=1, keepdims=True)
    return np.where(total > 0, pos / np.where(total > 0, total, 1.0), uniform)


def normalize_average(tree: GameTree, cumulative: np.ndarray) -> np.ndarray:
    """The average policy from its numerator; uniform where an information state was never reached."""
    total = cumulative.sum(axis=1, keepdims=True)
    uniform = tree.legal / tree.legal.sum(axis=1, keepdims=True)
    return np.where(total > 0, cumulative / np.where(total > 0, total, 1.0), uniform)


class CFRSolver:
    """CFR (``plus=False``) or CFR+ (``plus=True``) on ``game``; call :meth:`iteration` repeatedly."""

    def __init__(self, game: Game | GameTree, *, plus: bool = True, linear_averaging: bool | None = None,
                 alternating: bool = True) -> None:
        self.tree = tree = game_tree(game, method="CFR", alternative=SAMPLED_ALTERNATIVE)
        self.plus = plus
        self.linear_averaging = plus if linear_averaging is None else linear_averaging
        self.alternating = alternating
        S, A = tree.num_infostates, tree.num_actions
        self.regrets = np.zeros((S, A))
        self.cumulative_policy = np.zeros((S, A))
        self.policy = tree.uniform_probs()
        self.iterations = 0
        self._edges = []
        for i in range(tree.num_players):
            m = tree.edge_player == i
            nodes = tree.edge_nodes[m]
            rows = tree.player_infostates(i)
            self._edges.append((nodes, tree.parent[nodes], tree.edge_sa[m], rows, tree.infostate_node[rows]))

    def _update(self, player: int, R: np.ndarray, v: np.ndarray) -> None:
        tree = self.tree
        nodes, parents, sa, rows, reps = self._edges[player]
        others = np.prod(np.delete(R[:, parents], player, axis=0), axis=0)
        cf = tree.chance_reach[parents] * others
        inst = np.bincount(sa, cf * (v[nodes] - v[parents]), minlength=self.regrets.size)
        self.regrets += inst.reshape(self.regrets.shape)
        weight = float(self.iterations) if self.linear_averaging else 1.0
        self.cumulative_policy[rows] += (weight * R[player, reps])[:, None] * self.policy[rows]
        if self.plus:
            np.maximum(self.regrets, 0.0, out=self.regrets)

    def iteration(self) -> None:
        """One CFR(+) iteration (both players)."""
        self.iterations += 1
        players = range(self.tree.num_players)
        if self.alternating:
            for i in players:
                R = player_reach(self.tree, self.policy)
                v = node_values(self.tree, edge_weights(self.tree, self.policy), i)
                self._update(i, R, v)
                self.policy = regret_matching(self.tree, self.regrets)
        else:
            R = player_reach(self.tree, self.policy)
            w = edge_weights(self.tree, self.policy)
            values = [node_values(self.tree, w, i) for i in players]
            for i in players:
                self._update(i, R, values[i])
            self.policy = regret_matching(self.tree, self.regrets)

    def run(self, iterations: int) -> "CFRSolver":
        for _ in range(iterations):
            self.iteration()
        return self

    def average_policy(self) -> TabularPolicy:
        return TabularPolicy(self.tree, normalize_average(self.tree, self.cumulative_policy))

    def current_policy(self) -> TabularPolicy:
        return TabularPolicy(self.tree, self.policy)

    # --- checkpoints: plain arrays and scalars
    def state_dict(self) -> dict:
        return {"regrets": self.regrets.copy(), "cumulative_policy": self.cumulative_policy.copy(),
                "policy": self.policy.copy(), "iterations": int(self.iterations)}

    def load_state_dict(self, state: dict) -> None:
        shape = self.regrets.shape
        for key in ("regrets", "cumulative_policy", "policy"):
            arr = np.asarray(state[key], dtype=np.float64)
            if arr.shape != shape:
                raise ValueError(f"checkpoint field '{key}': expected shape {shape}, got {arr.shape}")
        self.regrets = np.array(state["regrets"], dtype=np.float64)
        self.cumulative_policy = np.array(state["cumulative_policy"], dtype=np.float64)
        self.policy = np.array(state["policy"], dtype=np.float64)
        self.iterations = int(state["iterations"])
