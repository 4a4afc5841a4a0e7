"""Exact expected returns and exact best responses in extensive-form games.

A best response of player ``i`` to the others' behavioural strategies maximizes, at each information
state ``I``, the counterfactual value ``sum_{h in I} pi_{-i}(h) v_i(h a)`` of each action ``a``, walking
the tree bottom up so that deeper choices are already best responses (Johanson et al., 2011; Lanctot,
2013, PhD thesis, sec. 2.2). Ties go to the lowest action. All histories of one depth level are handled
by a few numpy operations (see :mod:`fedarena.marl.tree_walk`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedarena.envs.efg import Game
from fedarena.marl.game_tree import EXPLOITABILITY_ALTERNATIVE, GameTree, game_tree
from fedarena.marl.policy import PolicyLike, TabularPolicy, as_policy
from fedarena.marl.tree_walk import edge_weights, expected_returns_from_reach, player_reach

TIE_TOLERANCE = 1e-12
"""Action values within this (relative) distance of the best count as tied; the lowest such action wins."""


@dataclass(frozen=True)
class BestResponse:
    """A pure best response of ``player``: ``policy`` (its rows are one-hot for ``player``) and its ``value``."""

    player: int
    value: float
    policy: TabularPolicy
    actions: dict[str, int]


def expected_returns(game: Game | GameTree, policy: PolicyLike) -> np.ndarray:
    """Every player's exact expected payoff when all play ``policy``, shape ``(num_players,)``."""
    tree = game_tree(game)
    pol = as_policy(tree, policy)
    R = player_reach(tree, pol.probs)
    return expected_returns_from_reach(tree, [R[p, tree.terminals] for p in range(tree.num_players)])


def best_response_to_reach(tree: GameTree, player: int, probs: np.ndarray, opponent_reach: np.ndarray
                           ) -> tuple[float, np.ndarray]:
    """Core best response. ``opponent_reach``: ``(N,)`` product of the other players' reach (chance
    excluded) under the profile being answered; ``probs`` gives the others' moves below each node (used
    for the values of their nodes; rows of ``player`` are ignored). Returns the value of the best response
    and, per information state of ``player``, the chosen action (``-1`` elsewhere)."""
    A = tree.num_actions
    w = edge_weights(tree, probs)
    cf = tree.chance_reach * opponent_reach
    v = np.zeros(tree.num_nodes)
    v[tree.terminals] = tree.utilities[:, player]
    choice = -np.ones(tree.num_infostates, dtype=np.int64)
    for lv in reversed(tree.levels[:-1]):
        c0, c1 = lv.child_start, lv.child_stop
        v[lv.start:lv.inner] = np.bincount(lv.child_parent_local, w[c0:c1] * v[c0:c1],
                                           minlength=lv.inner - lv.start)
        nodes = lv.player_nodes[player]
        if len(nodes) == 0:
            continue
        edges = lv.player_edges[player]
        n_local = len(lv.player_infosets[player])
        q = np.bincount(lv.player_edge_local_sa[player], cf[tree.parent[edges]] * v[edges],
                        minlength=n_local * A).reshape(n_local, A)
        legal = tree.legal[lv.player_infosets[player]]
        q = np.where(legal, q, -np.inf)
        best = q.max(axis=1, keepdims=True)
        tol = TIE_TOLERANCE * np.maximum(1.0, np.abs(best))
        a_star = np.argmax(q >= best - tol, axis=1)
        choice[lv.player_infosets[player]] = a_star
        local = lv.player_node_local_infoset[player]
        v[nodes] = v[lv.player_children[player][np.arange(len(nodes)), a_star[local]]]
    return float(v[0]), choice


def best_response(game: Game | GameTree, policy: PolicyLike, player: int) -> BestResponse:
    """Exact best response of ``player`` to the other players' part of ``policy``."""
    tree = game_tree(game, method="the exact best response", alternative=EXPLOITABILITY_ALTERNATIVE)
    if not 0 <= player < tree.num_players:
        raise ValueError(f"player: expected 0..{tree.num_players - 1}, got {player}")
    others = tuple(p for p in range(tree.num_players) if p != player)
    pol = as_policy(tree, policy, players=others)
    R = player_reach(tree, pol.probs, others)
    value, choice = best_response_to_reach(tree, player, pol.probs, np.prod(R, axis=0))
    return BestResponse(player, value, pure_policy(tree, pol.probs, player, choice),
                        {tree.infostates[s]: int(choice[s]) for s in np.flatnonzero(choice >= 0)})


def pure_policy(tree: GameTree, base: np.ndarray, player: int, choice: np.ndarray) -> TabularPolicy:
    """``base`` with ``player``'s rows replaced by the one-hot actions in ``choice``."""
    p = np.array(base, dtype=np.float64, copy=True)
    rows = np.flatnonzero(tree.infostate_player == player)
    p[rows] = 0.0
    p[rows, choice[rows]] = 1.0
    return TabularPolicy(tree, p)


def best_response_values(tree: GameTree, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(br_values, on_policy_values)``, each ``(num_players,)``, for an already-valid policy array."""
    P = tree.num_players
    R = player_reach(tree, probs)
    on_policy = expected_returns_from_reach(tree, [R[p, tree.terminals] for p in range(P)])
    br = np.empty(P)
    for i in range(P):
        opp = np.prod(np.delete(R, i, axis=0), axis=0)
        br[i], _ = best_response_to_reach(tree, i, probs, opp)
    return br, on_policy
