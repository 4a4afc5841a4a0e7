"""A game's history tree compiled once into level-ordered numpy arrays, for vectorized tree walks.

Every algorithm of this package (expected returns, best response, CFR+, XFP, PSRO payoffs) walks the
tree one depth level at a time: reach probabilities go down a level with one gather and one multiply,
values come up a level with one ``bincount``, and the histories of one level -- every private deal and
every public betting sequence at that depth -- are handled together. This is the range-based walk
over the public tree (Johanson et al., 2011, "Accelerating best response calculation in large
extensive games"), flattened: the private-information ranges of all public states of a level sit side by
side in one array, so nothing loops over histories in Python after compilation.

Requirements checked at compilation: a finite tree; every history of an information state at the same
depth, with the same player to act and the same legal actions; and perfect recall (Kuhn, 1953; Osborne &
Rubinstein, def. 203.3): all histories of an information state of player ``i`` share ``i``'s own past --
the sequence of (information state, action) pairs ``i`` went through. Imperfect-recall games (e.g.
OpenSpiel's ``liars_dice_ir``) are refused with :class:`ImperfectRecallError` naming an information
state, because the walks here (best responses, CFR, realization weights) are only correct with perfect
recall.

Size bound: compiling enumerates every history (about 0.7 KB each), so :func:`game_tree` first estimates the
tree with Knuth's estimator and refuses a game above ``max_tree_nodes`` (default
:data:`fedarena.envs.efg.DEFAULT_MAX_TREE_NODES`, or ``$FEDARENA_MAX_TREE_NODES``) with a one-line
:class:`~fedarena.envs.efg.TreeTooLargeError` that names the sampled method to use instead; the compilation
itself also stops at the bound, because the estimator can underestimate deep, rarely reached subtrees.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from fedarena.envs.efg import CHANCE, TERMINAL, Game, check_tree_size, max_tree_nodes, tree_too_large


class ImperfectRecallError(ValueError):
    """The game forgets a player's own past: two histories of one information state disagree on it."""


@dataclass(frozen=True, eq=False)
class Level:
    """The arrays of one depth level ``d`` (nodes ``[start, stop)``, non-terminals ``[start, inner)``)."""

    start: int
    inner: int
    stop: int
    child_start: int            # children of this level's non-terminals are nodes [child_start, child_stop)
    child_stop: int
    child_parent_local: np.ndarray   # parent of each child, minus ``start``
    parent_ids: np.ndarray           # parent of each node of this level (absolute ids)
    # per player p: the p-nodes of this level, the information states they belong to, and their children
    player_nodes: tuple[np.ndarray, ...]
    player_infosets: tuple[np.ndarray, ...]        # global ids of the information states of this level
    player_node_local_infoset: tuple[np.ndarray, ...]
    player_children: tuple[np.ndarray, ...]        # (n_p_nodes, A) child node ids, -1 for illegal actions
    player_edges: tuple[np.ndarray, ...]           # children (next level) reached by a move of player p
    player_edge_local_sa: tuple[np.ndarray, ...]   # local infoset * A + action of each such edge


@dataclass(frozen=True, eq=False)
class GameTree:
    """The compiled tree of ``game``. Nodes are numbered breadth first; see :class:`Level`."""

    game: Game
    num_players: int
    num_actions: int
    parent: np.ndarray          # (N,) parent node, -1 at the root
    action: np.ndarray          # (N,) action (or chance outcome) leading to the node, -1 at the root
    actor: np.ndarray           # (N,) player to move, CHANCE or TERMINAL
    infoset: np.ndarray         # (N,) information state id at player nodes, -1 elsewhere
    chance_prob: np.ndarray     # (N,) probability of the chance move into the node, 1 otherwise
    chance_reach: np.ndarray    # (N,) product of chance probabilities on the path to the node
    levels: tuple[Level, ...]
    terminals: np.ndarray       # (T,) node ids of terminal histories
    utilities: np.ndarray       # (T, num_players) payoffs at the terminals
    infostates: tuple[str, ...]  # (S,) information state strings
    infostate_index: dict[str, int]
    infostate_player: np.ndarray  # (S,)
    infostate_level: np.ndarray   # (S,)
    infostate_node: np.ndarray    # (S,) one history of each information state
    legal: np.ndarray             # (S, A) bool
    edge_nodes: np.ndarray        # nodes entered by a player's move
    edge_sa: np.ndarray           # infoset * A + action of those moves
    edge_player: np.ndarray       # who moved
    player_edge_nodes: tuple[np.ndarray, ...] = ()   # per player: the nodes entered by that player's moves
    player_edge_sa: tuple[np.ndarray, ...] = ()      # per player: infoset * A + action of those moves

    @property
    def num_nodes(self) -> int:
        return len(self.parent)

    @property
    def num_infostates(self) -> int:
        return len(self.infostates)

    def player_infostates(self, player: int) -> np.ndarray:
        return np.flatnonzero(self.infostate_player == player)

    def uniform_probs(self) -> np.ndarray:
        return self.legal / self.legal.sum(axis=1, keepdims=True)


def _build(game: Game, max_nodes: int) -> GameTree:
    P, A = game.num_players, game.num_distinct_actions
    parent, action, actor, infoset, cprob = [-1], [-1], [], [], [1.0]
    infostates: list[str] = []
    index: dict[str, int] = {}
    is_player: list[int] = []
    is_level: list[int] = []
    is_legal: list[list[int]] = []
    is_node: list[int] = []
    utilities: dict[int, np.ndarray] = {}
    level_bounds: list[tuple[int, int, int]] = []

    conflict: str | None = None  # reported after the perfect-recall check, which names the likelier cause
    frontier = [game.new_initial_state()]
    depth = 0
    while frontier:
        # put non-terminals first within the level
        inner = [s for s in frontier if not s.is_terminal()]
        terms = [s for s in frontier if s.is_terminal()]
        start = len(actor)
        ordered = inner + terms
        if depth > 0:  # reorder the already-appended parent/action/prob of this level to match
            pos = {id(s): k for k, s in enumerate(frontier)}
            perm = [pos[id(s)] for s in ordered]
            for arr in (parent, action, cprob):
                seg = arr[start:]
                arr[start:] = [seg[k] for k in perm]
        frontier = ordered
        nxt = []
        for k, s in enumerate(frontier):
            if len(parent) > max_nodes:
                raise tree_too_large(game, f"more than {max_nodes:,} histories (counted while compiling)",
                                     max_nodes, "compiling the game tree", SAMPLED_ALTERNATIVE)
            node = start + k
            p = s.current_player()
            actor.append(p)
            if p == TERMINAL:
                infoset.append(-1)
                r = np.asarray(s.returns(), dtype=np.float64)
                if r.shape != (P,):
                    raise ValueError(f"game {game.name}: returns() has shape {r.shape}, expected ({P},)")
                utilities[node] = r
                continue
            if p == CHANCE:
                infoset.append(-1)
                outcomes = s.chance_outcomes()
                total = sum(q for _, q in outcomes)
                if abs(total - 1.0) > 1e-9 or any(q < 0 for _, q in outcomes):
                    raise ValueError(f"game {game.name}: chance probabilities at {s.history()} sum to {total}")
                for a, q in outcomes:
                    nxt.append(s.child(a))
                    parent.append(node), action.append(a), cprob.append(q)
                continue
            if not 0 <= p < P:
                raise ValueError(f"game {game.name}: current_player() = {p} at history {s.history()}")
            key = s.information_state_string(p)
            legal = s.legal_actions()
            if not legal or min(legal) < 0 or max(legal) >= A:
                raise ValueError(f"game {game.name}: legal actions {legal} at '{key}' outside 0..{A - 1}")
            j = index.get(key)
            if j is None:
                j = index[key] = len(infostates)
                infostates.append(key)
                is_player.append(p), is_level.append(depth), is_legal.append(legal), is_node.append(node)
            elif conflict is None and (is_player[j] != p or is_level[j] != depth or is_legal[j] != legal):
                conflict = (f"game {game.name}: information state '{key}' has histories with different players, "
                            "depths or legal actions; the vectorized tree needs them equal")
            infoset.append(j)
            for a in legal:
                nxt.append(s.child(a))
                parent.append(node), action.append(a), cprob.append(1.0)
        level_bounds.append((start, start + len(inner), start + len(frontier)))
        frontier = nxt
        depth += 1

    parent_a = np.asarray(parent, dtype=np.int64)
    action_a = np.asarray(action, dtype=np.int64)
    actor_a = np.asarray(actor, dtype=np.int64)
    infoset_a = np.asarray(infoset, dtype=np.int64)
    cprob_a = np.asarray(cprob, dtype=np.float64)
    N, S = len(actor_a), len(infostates)
    chance_reach = np.ones(N)
    for (s0, _, s1) in level_bounds[1:]:
        chance_reach[s0:s1] = chance_reach[parent_a[s0:s1]] * cprob_a[s0:s1]
    legal_m = np.zeros((S, A), dtype=bool)
    for j, la in enumerate(is_legal):
        legal_m[j, la] = True
    is_edge = np.zeros(N, dtype=bool)
    is_edge[1:] = actor_a[parent_a[1:]] >= 0
    edge_nodes = np.flatnonzero(is_edge)
    edge_sa = infoset_a[parent_a[edge_nodes]] * A + action_a[edge_nodes]
    edge_player = actor_a[parent_a[edge_nodes]]

    _check_perfect_recall(game, P, A, level_bounds, parent_a, action_a, actor_a, infoset_a, infostates)
    if conflict is not None:
        raise ValueError(conflict)

    levels = []
    for d, (s0, m, s1) in enumerate(level_bounds):
        c0, c1 = (level_bounds[d + 1][0], level_bounds[d + 1][2]) if d + 1 < len(level_bounds) else (s1, s1)
        kids = np.arange(c0, c1)
        kid_parent = parent_a[kids]
        pn, pi, pli, pc, pe, pes = [], [], [], [], [], []
        for p in range(P):
            nodes = s0 + np.flatnonzero(actor_a[s0:m] == p)
            gl = infoset_a[nodes]
            uniq, local = np.unique(gl, return_inverse=True)
            children = -np.ones((len(nodes), A), dtype=np.int64)
            emask = actor_a[kid_parent] == p
            edges = kids[emask]
            if len(nodes):
                row = np.searchsorted(nodes, parent_a[edges])
                children[row, action_a[edges]] = edges
                local_sa = local[row] * A + action_a[edges]
            else:
                local_sa = np.zeros(0, dtype=np.int64)
            pn.append(nodes), pi.append(uniq), pli.append(local.astype(np.int64)), pc.append(children)
            pe.append(edges), pes.append(local_sa.astype(np.int64))
        levels.append(Level(s0, m, s1, c0, c1, (kid_parent - s0).astype(np.int64), parent_a[s0:s1].copy(),
                            tuple(pn), tuple(pi), tuple(pli), tuple(pc), tuple(pe), tuple(pes)))

    terminals = np.flatnonzero(actor_a == TERMINAL)
    utils = np.stack([utilities[int(t)] for t in terminals])
    for arr in (parent_a, action_a, actor_a, infoset_a, cprob_a, chance_reach, legal_m, terminals, utils):
        arr.setflags(write=False)
    return GameTree(
        game=game, num_players=P, num_actions=A, parent=parent_a, action=action_a, actor=actor_a,
        infoset=infoset_a, chance_prob=cprob_a, chance_reach=chance_reach, levels=tuple(levels),
        terminals=terminals, utilities=utils, infostates=tuple(infostates), infostate_index=index,
        infostate_player=np.asarray(is_player, dtype=np.int64), infostate_level=np.asarray(is_level, dtype=np.int64),
        infostate_node=np.asarray(is_node, dtype=np.int64), legal=legal_m,
        edge_nodes=edge_nodes, edge_sa=edge_sa, edge_player=edge_player,
        player_edge_nodes=tuple(edge_nodes[edge_player == p] for p in range(P)),
        player_edge_sa=tuple(edge_sa[edge_player == p] for p in range(P)),
    )


def _check_perfect_recall(game: Game, P: int, A: int, level_bounds: list[tuple[int, int, int]],
                          parent: np.ndarray, action: np.ndarray, actor: np.ndarray, infoset: np.ndarray,
                          infostates: list[str]) -> None:
    """Number each player's own (information state, action) sequence at every node, one level at a time
    (a new number for each distinct (parent sequence, move) pair), and require one number per information
    state of that player."""
    N, S = len(parent), max(len(infostates), 1)
    for p in range(P):
        seq = np.zeros(N, dtype=np.int64)  # 0: the empty sequence
        next_id = 1
        for (s0, _, s1) in level_bounds[1:]:
            par = parent[s0:s1]
            seq[s0:s1] = seq[par]
            moved = np.flatnonzero(actor[par] == p)
            if len(moved):
                keys = seq[par[moved]] * (S * A) + infoset[par[moved]] * A + action[s0 + moved]
                uniq, inv = np.unique(keys, return_inverse=True)
                seq[s0 + moved] = next_id + inv.ravel()
                next_id += len(uniq)
        nodes = np.flatnonzero(actor == p)
        ref = np.full(S, -1, dtype=np.int64)
        ref[infoset[nodes]] = seq[nodes]
        bad = np.flatnonzero(seq[nodes] != ref[infoset[nodes]])
        if len(bad) == 0:
            continue
        h1 = int(nodes[bad[0]])
        j = int(infoset[h1])
        h2 = int(nodes[np.flatnonzero((infoset[nodes] == j) & (seq[nodes] == ref[j]))[0]])

        def own_past(node: int) -> tuple[list[int], list[tuple[str, int]]]:
            path, own = [], []
            while parent[node] >= 0:
                path.append(int(action[node]))
                if actor[parent[node]] == p:
                    own.append((infostates[infoset[parent[node]]], int(action[node])))
                node = int(parent[node])
            return path[::-1], own[::-1]

        (p1, o1), (p2, o2) = own_past(h2), own_past(h1)
        raise ImperfectRecallError(
            f"game {game.name}: imperfect recall at information state {infostates[j]!r} of player {p}: "
            f"histories {p1} and {p2} disagree on the player's own past (information state, action) sequence "
            f"({[a for _, a in o1]} vs {[a for _, a in o2]}); exact best responses and CFR need perfect recall")


SAMPLED_ALTERNATIVE = "sampled CFR instead (the mccfr kind walks the game lazily)"
"""What the size-bound errors of the equilibrium solvers (CFR, XFP, PSRO, NFSP's tables) point to."""

EXPLOITABILITY_ALTERNATIVE = ("a sampled solver instead (the mccfr kind walks the game lazily and skips "
                              "exact exploitability above the bound)")
"""What the size-bound errors of exact best responses and exploitability point to."""


@functools.lru_cache(maxsize=32)
def _cached(game: Game, max_nodes: int) -> GameTree:
    return _build(game, max_nodes)


@functools.lru_cache(maxsize=64)
def _checked(game: Game, max_nodes: int, method: str, alternative: str) -> None:
    check_tree_size(game, max_nodes, method, alternative)


def game_tree(game: Game | GameTree, *, max_nodes: int | None = None, method: str = "the exact solver",
              alternative: str = SAMPLED_ALTERNATIVE) -> GameTree:
    """The compiled tree of ``game`` (compiled once per game value and kept in a small cache). A game whose
    estimated tree is above ``max_nodes`` (default: :func:`fedarena.envs.efg.max_tree_nodes`) raises
    :class:`~fedarena.envs.efg.TreeTooLargeError`, naming ``method`` and the ``alternative`` to use."""
    if isinstance(game, GameTree):
        return game
    bound = max_tree_nodes(max_nodes)
    try:
        hash(game)
    except TypeError:  # unhashable game object
        check_tree_size(game, bound, method, alternative)
        return _build(game, bound)
    _checked(game, bound, method, alternative)
    return _cached(game, bound)
