"""The vectorized tree walks everything else is built from: reach probabilities down the tree and
expected values up the tree, one depth level (all private deals of all public states at that depth) per
numpy operation (Zinkevich et al., 2007, sec. 3, for reach-weighted counterfactual values;
Johanson et al., 2011, for walking ranges instead of single histories).

``probs`` is a policy array of shape ``(num_infostates, num_actions)``; reach and value arrays are
indexed by node id of the compiled :class:`~fedarena.marl.game_tree.GameTree`.
"""

from __future__ import annotations

import numpy as np

from fedarena.marl.game_tree import GameTree


def edge_weights(tree: GameTree, probs: np.ndarray) -> np.ndarray:
    """``(N,)`` probability of the move into each node: the chance probability or the mover's policy."""
    w = tree.chance_prob.copy()
    w[tree.edge_nodes] = probs.reshape(-1)[tree.edge_sa]
    return w


def player_reach(tree: GameTree, probs: np.ndarray, players: tuple[int, ...] | None = None) -> np.ndarray:
    """``(..., len(players), N)``: each player's own contribution to the probability of reaching each node.
    ``probs`` may carry leading batch dimensions (several policies walked together)."""
    players = tuple(range(tree.num_players)) if players is None else tuple(players)
    batch = probs.shape[:-2]
    flat = probs.reshape(batch + (-1,))
    if not batch:  # one policy: 1-D walks per player are the cheapest gathers
        out = np.ones((len(players), tree.num_nodes))
        for k, p in enumerate(players):
            w = np.ones(tree.num_nodes)
            w[tree.player_edge_nodes[p]] = flat[tree.player_edge_sa[p]]
            r = out[k]
            for lv in tree.levels[1:]:
                np.multiply(r[lv.parent_ids], w[lv.start:lv.stop], out=r[lv.start:lv.stop])
        return out
    W = np.ones(batch + (len(players), tree.num_nodes))
    for k, p in enumerate(players):
        W[..., k, tree.player_edge_nodes[p]] = flat[..., tree.player_edge_sa[p]]
    R = np.ones_like(W)
    for lv in tree.levels[1:]:
        np.multiply(R[..., lv.parent_ids], W[..., lv.start:lv.stop], out=R[..., lv.start:lv.stop])
    return R


def own_reach(tree: GameTree, probs: np.ndarray, player: int) -> np.ndarray:
    """``(N,)`` the reach of ``player``'s own moves only."""
    return player_reach(tree, probs, (player,))[0]


def node_values(tree: GameTree, weights: np.ndarray, player: int, fixed: dict | None = None) -> np.ndarray:
    """``(N,)`` expected payoff of ``player`` at every node when play below follows ``weights``
    (the output of :func:`edge_weights`)."""
    v = np.zeros(tree.num_nodes)
    v[tree.terminals] = tree.utilities[:, player]
    wv = np.empty(tree.num_nodes)
    for lv in reversed(tree.levels[:-1]):
        c0, c1 = lv.child_start, lv.child_stop
        np.multiply(weights[c0:c1], v[c0:c1], out=wv[c0:c1])
        v[lv.start:lv.inner] = np.bincount(lv.child_parent_local, wv[c0:c1], minlength=lv.inner - lv.start)
    return v


def terminal_reach(tree: GameTree, probs: np.ndarray, player: int) -> np.ndarray:
    """``(T,)`` ``player``'s own reach of each terminal history."""
    return own_reach(tree, probs, player)[tree.terminals]


def expected_returns_from_reach(tree: GameTree, terminal_reaches: list[np.ndarray]) -> np.ndarray:
    """``(P,)`` expected payoffs given every player's terminal reach."""
    r = tree.chance_reach[tree.terminals].copy()
    for tr in terminal_reaches:
        r = r * tr
    return r @ tree.utilities
