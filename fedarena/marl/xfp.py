"""Full-width extensive-form fictitious play, XFP (Heinrich, Lanctot & Silver, 2015, "Fictitious self-play
in extensive-form games", Algorithm 1 and Theorem 7).

Each iteration every player computes an exact best response ``beta_i`` to the others' average policies,
then each average policy moves toward its best response by ``alpha_k = 1 / (k + 1)`` in realization
weights (so the behavioural policy becomes the average of the mixed strategies):
``pi_{k+1}(I) = ((1 - alpha) x_pi(I) pi_k(I) + alpha x_beta(I) beta(I)) / ((1 - alpha) x_pi(I) + alpha x_beta(I))``
with ``x(I)`` the player's own reach of ``I``. Starting from uniform play, as OpenSpiel's ``XFPSolver``.
"""

from __future__ import annotations

import numpy as np

from fedarena.envs.efg import Game
from fedarena.marl.best_response import best_response_to_reach
from fedarena.marl.game_tree import SAMPLED_ALTERNATIVE, GameTree, game_tree
from fedarena.marl.policy import PolicyLike, TabularPolicy, as_policy
from fedarena.marl.tree_walk import player_reach


def mix_realization(tree: GameTree, probs: list[np.ndarray] | np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The behavioural policy equivalent to playing policy ``k`` with probability ``weights[k]`` (for each
    player separately; Kuhn's theorem): realization-weighted average of the rows, kept from ``probs[0]``
    where no policy of positive weight reaches an information state. All policies are walked together."""
    stacked = np.asarray(probs, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    keep = w > 0
    R = player_reach(tree, stacked[keep])                       # (K, P, N)
    x = w[keep, None] * R[:, tree.infostate_player, tree.infostate_node]   # (K, S) realization weights
    num = np.einsum("ks,ksa->sa", x, stacked[keep])
    den = x.sum(axis=0)
    out = stacked[0].copy()
    ok = den > 0
    out[ok] = num[ok] / den[ok, None]
    return out


class XFPSolver:
    """XFP on ``game`` from ``initial_policy`` (uniform by default); call :meth:`iteration` repeatedly."""

    def __init__(self, game: Game | GameTree, initial_policy: PolicyLike | None = None) -> None:
        self.tree = game_tree(game, method="XFP", alternative=SAMPLED_ALTERNATIVE)
        self.policy = (self.tree.uniform_probs() if initial_policy is None
                       else as_policy(self.tree, initial_policy).probs.copy())
        self.iterations = 0

    def best_responses(self, probs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One-hot best responses of every player to ``probs`` (default: the average) and their values."""
        tree = self.tree
        probs = self.policy if probs is None else probs
        R = player_reach(tree, probs)
        br = np.zeros_like(probs)
        values = np.empty(tree.num_players)
        for i in range(tree.num_players):
            opp = np.prod(np.delete(R, i, axis=0), axis=0)
            values[i], choice = best_response_to_reach(tree, i, probs, opp)
            rows = tree.player_infostates(i)
            br[rows, choice[rows]] = 1.0
        return br, values

    def iteration(self) -> np.ndarray:
        """One XFP iteration; returns the best-response values against the average *before* the update
        (their sum minus the average's value is the NashConv of that average)."""
        self.iterations += 1
        br, values = self.best_responses()
        alpha = 1.0 / (self.iterations + 1)
        self.policy = mix_realization(self.tree, [self.policy, br], np.array([1.0 - alpha, alpha]))
        return values

    def run(self, iterations: int) -> "XFPSolver":
        for _ in range(iterations):
            self.iteration()
        return self

    def average_policy(self) -> TabularPolicy:
        return TabularPolicy(self.tree, self.policy)

    def state_dict(self) -> dict:
        return {"policy": self.policy.copy(), "iterations": int(self.iterations)}

    def load_state_dict(self, state: dict) -> None:
        p = np.asarray(state["policy"], dtype=np.float64)
        if p.shape != self.policy.shape:
            raise ValueError(f"checkpoint field 'policy': expected shape {self.policy.shape}, got {p.shape}")
        self.policy = p.copy()
        self.iterations = int(state["iterations"])
