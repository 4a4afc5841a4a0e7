"""Batched RL views of an extensive-form :class:`~fedarena.envs.efg.Game`: many games stepped as numpy arrays.

The game's history tree is enumerated once into flat tables (:func:`compile_tables`): per history the
player to move, its information state, the child reached by each action, the chance outcomes' children and
cumulative probabilities, and the payoffs at terminals; per information state the tensor a network reads
(``information_state_tensor`` by default, or ``observation_tensor``), the legal-action mask and the string.
A batch of games is then an array of history ids: one step of ``B`` games is one gather in the child table,
chance is sampled for all games at once, and finished games restart in place (same-step auto-reset).

- :class:`VectorGame`: every player's turn exposed (for self-play learners such as NFSP): who is to move in
  each game, their observations and legal masks, ``step(games, actions)``.
- :class:`ResponseEnv`: the single-agent view of one player, the others played by fixed policies (tabular,
  or callables ``fn(observations, legal_mask) -> probabilities``; a callable may wrap a network that keeps
  learning) or by a population mixed by weights, one member sampled per player per episode, as in PSRO's
  response to a meta-strategy (Lanctot et al., 2017). It follows the vector-environment contract of
  :mod:`fedarena.envs.vector` (``reset``, ``step -> VecStep`` with ``final_obs``) and adds legal masks.

The tables need the whole tree in memory, so they suit games up to about a million histories (Kuhn: 58,
Leduc: 9,457); a game whose estimated tree is above ``max_tree_nodes`` (:func:`fedarena.envs.efg.max_tree_nodes`)
is refused with a one-line :class:`~fedarena.envs.efg.TreeTooLargeError`, and compilation stops at the bound.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np

from fedarena.envs.classic_control import VecStep
from fedarena.envs.efg import (CHANCE, TERMINAL, Game, IllegalActionError, check_tree_size, max_tree_nodes,
                               tree_too_large)

TENSOR_KINDS = ("information_state", "observation")


@dataclass(frozen=True, eq=False)
class GameTables:
    """The flat tables of a game's history tree (node 0 is the empty history)."""

    game: Game
    num_players: int
    num_actions: int
    actor: np.ndarray            # (N,) player to move, CHANCE or TERMINAL
    infostate: np.ndarray        # (N,) information state id of the player to move, -1 elsewhere
    children: np.ndarray         # (N, A) child per action at player nodes, -1 for illegal actions / other nodes
    chance_children: np.ndarray  # (N, C) children at chance nodes, padded with -1
    chance_cdf: np.ndarray       # (N, C) cumulative outcome probabilities at chance nodes (padded with 1)
    returns: np.ndarray          # (N, P) payoffs at terminal histories, zeros elsewhere
    infostates: tuple[str, ...]  # (S,) information state strings
    infostate_index: dict[str, int]
    infostate_player: np.ndarray  # (S,)
    legal: np.ndarray             # (S, A) bool
    tensors: np.ndarray           # (S, D) float32, the tensor kind chosen at compilation
    tensor_kind: str

    @property
    def num_nodes(self) -> int:
        return len(self.actor)

    @property
    def tensor_size(self) -> int:
        return int(self.tensors.shape[1])

    def rows_of(self, infostates: Sequence[str]) -> np.ndarray:
        """The table rows of information-state strings (a ``KeyError`` names an unknown one)."""
        try:
            return np.array([self.infostate_index[s] for s in infostates], dtype=np.int64)
        except KeyError as e:
            raise KeyError(f"information state {e.args[0]!r} is not one of {self.game.name}") from None


def _tensor(state: Any, player: int, kind: str, game: Game) -> np.ndarray:
    fn = getattr(state, f"{kind}_tensor", None)
    if fn is None:
        raise ValueError(f"game {game.name}: its states have no {kind}_tensor(); an RL view needs one")
    return np.asarray(fn(player), dtype=np.float32).reshape(-1)


_METHOD = "building the batched game tables (NFSP, RL oracles, approximate exploitability)"
_ALTERNATIVE = "sampled CFR (the mccfr kind) or the PettingZoo adapter (GameAECEnv) instead, which walk the game lazily"


def _compile(game: Game, tensor_kind: str, max_nodes: int) -> GameTables:
    if tensor_kind not in TENSOR_KINDS:
        raise ValueError(f"tensor: expected one of {TENSOR_KINDS}, got '{tensor_kind}'")
    P, A = game.num_players, game.num_distinct_actions
    actor: list[int] = []
    infostate: list[int] = []
    kids: list[list[int]] = []
    chance: list[list[tuple[int, float]]] = []
    rets: dict[int, np.ndarray] = {}
    names: list[str] = []
    index: dict[str, int] = {}
    owner: list[int] = []
    legal_rows: list[list[int]] = []
    tensors: list[np.ndarray] = []
    states = [game.new_initial_state()]
    parent_slot: list[tuple[int, int, int]] = [(-1, -1, 0)]   # (parent node, kind 0=player 1=chance, slot)
    head = 0
    while head < len(states):             # breadth first; node ids are the positions in ``states``
        s = states[head]
        node = head
        head += 1
        if len(states) > max_nodes:
            raise tree_too_large(game, f"more than {max_nodes:,} histories (counted while compiling)", max_nodes,
                                 _METHOD, _ALTERNATIVE)
        p = s.current_player()
        actor.append(p)
        kids.append([])
        chance.append([])
        if p == TERMINAL:
            infostate.append(-1)
            rets[node] = np.asarray(s.returns(), dtype=np.float64)
            continue
        if p == CHANCE:
            infostate.append(-1)
            for a, q in s.chance_outcomes():
                chance[node].append((len(states), float(q)))
                states.append(s.child(a))
            continue
        key = s.information_state_string(p)
        j = index.get(key)
        legal = s.legal_actions()
        if j is None:
            j = index[key] = len(names)
            names.append(key)
            owner.append(p)
            legal_rows.append(legal)
            tensors.append(_tensor(s, p, tensor_kind, game))
        elif legal_rows[j] != legal:
            raise ValueError(f"game {game.name}: information state '{key}' has histories with different legal actions")
        infostate.append(j)
        row = [-1] * A
        for a in legal:
            row[a] = len(states)
            states.append(s.child(a))
        kids[node] = row
        states[node] = None  # free the state object; its children are queued
    N = len(actor)
    children = -np.ones((N, A), dtype=np.int64)
    C = max(1, max(len(c) for c in chance))
    chance_children = -np.ones((N, C), dtype=np.int64)
    chance_cdf = np.ones((N, C), dtype=np.float64)
    for n in range(N):
        if kids[n]:
            children[n] = kids[n]
        if chance[n]:
            ids, qs = zip(*chance[n])
            chance_children[n, :len(ids)] = ids
            cdf = np.cumsum(qs)
            chance_cdf[n, :len(ids)] = cdf / cdf[-1]
    returns = np.zeros((N, P))
    for n, r in rets.items():
        if r.shape != (P,):
            raise ValueError(f"game {game.name}: returns() has shape {r.shape}, expected ({P},)")
        returns[n] = r
    legal = np.zeros((len(names), A), dtype=bool)
    for j, la in enumerate(legal_rows):
        legal[j, la] = True
    sizes = {t.shape for t in tensors}
    if len(sizes) > 1:
        raise ValueError(f"game {game.name}: {tensor_kind}_tensor() sizes differ between states: {sorted(sizes)}")
    arrays = dict(actor=np.asarray(actor, dtype=np.int64), infostate=np.asarray(infostate, dtype=np.int64),
                  children=children, chance_children=chance_children, chance_cdf=chance_cdf, returns=returns,
                  infostate_player=np.asarray(owner, dtype=np.int64), legal=legal,
                  tensors=np.stack(tensors).astype(np.float32))
    for a in arrays.values():
        a.setflags(write=False)
    return GameTables(game=game, num_players=P, num_actions=A, infostates=tuple(names), infostate_index=index,
                      tensor_kind=tensor_kind, **arrays)


@functools.lru_cache(maxsize=16)
def _cached(game: Game, tensor_kind: str, max_nodes: int) -> GameTables:
    check_tree_size(game, max_nodes, _METHOD, _ALTERNATIVE)
    return _compile(game, tensor_kind, max_nodes)


def compile_tables(game: Game | GameTables, tensor: str = "information_state", max_nodes: int | None = None
                   ) -> GameTables:
    """The tables of ``game`` (kept in a small cache per game value and tensor kind); a game above
    ``max_nodes`` histories (default :func:`~fedarena.envs.efg.max_tree_nodes`) raises ``TreeTooLargeError``."""
    if isinstance(game, GameTables):
        if game.tensor_kind != tensor:
            return compile_tables(game.game, tensor, max_nodes)
        return game
    bound = max_tree_nodes(max_nodes)
    try:
        hash(game)
    except TypeError:  # an unhashable game object
        check_tree_size(game, bound, _METHOD, _ALTERNATIVE)
        return _compile(game, tensor, bound)
    return _cached(game, tensor, bound)


# ----------------------------------------------------------------------------- multi-agent batch


class VectorGame:
    """``num_games`` copies of a game, each always at a history where a player is to move (chance is
    sampled as soon as it is reached; a finished game restarts at once)."""

    def __init__(self, game: Game | GameTables, num_games: int, seed: int | np.random.Generator | None = None,
                 tensor: str = "information_state") -> None:
        if int(num_games) < 1:
            raise ValueError(f"num_games: must be >= 1, got {num_games}")
        self.tables = compile_tables(game, tensor)
        self.num_games = int(num_games)
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self.nodes = np.zeros(self.num_games, dtype=np.int64)
        self.episodes = 0
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.nodes[:] = 0
        self._settle(np.arange(self.num_games))

    def _settle(self, games: np.ndarray) -> None:
        """Sample chance at ``games`` until each is at a player node or a terminal."""
        t = self.tables
        g = games[t.actor[self.nodes[games]] == CHANCE]
        while len(g):
            n = self.nodes[g]
            u = self.rng.random(len(g))
            k = (u[:, None] >= t.chance_cdf[n]).sum(axis=1)
            self.nodes[g] = t.chance_children[n, np.minimum(k, t.chance_children.shape[1] - 1)]
            g = g[t.actor[self.nodes[g]] == CHANCE]

    # -- what the players see
    def current_player(self) -> np.ndarray:
        """``(num_games,)`` the player to move in each game."""
        return self.tables.actor[self.nodes]

    def infostate_ids(self, games: np.ndarray) -> np.ndarray:
        return self.tables.infostate[self.nodes[games]]

    def observations(self, games: np.ndarray) -> np.ndarray:
        """``(len(games), D)`` tensors of the player to move in ``games``."""
        return self.tables.tensors[self.infostate_ids(games)]

    def legal_mask(self, games: np.ndarray) -> np.ndarray:
        return self.tables.legal[self.infostate_ids(games)]

    # -- moving
    def step(self, games: np.ndarray, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Apply ``actions`` (one per game in ``games``, each at a player node). Returns the games that
        ended (a subset of ``games``) and their payoffs ``(n_ended, num_players)``; they have restarted."""
        t = self.tables
        games = np.asarray(games, dtype=np.int64)
        actions = np.asarray(actions, dtype=np.int64)
        if actions.shape != games.shape:
            raise ValueError(f"actions: expected shape {games.shape} (one per game), got {actions.shape}")
        n = self.nodes[games]
        if (t.actor[n] < 0).any():
            raise ValueError("games: some are not at a player's turn")
        ok = (actions >= 0) & (actions < t.num_actions)
        nxt = np.where(ok, t.children[n, np.clip(actions, 0, t.num_actions - 1)], -1)
        if (nxt < 0).any():
            k = int(np.argmax(nxt < 0))
            s = t.infostate[n[k]]
            raise IllegalActionError(f"action {int(actions[k])}: not legal at '{t.infostates[s]}' (game {int(games[k])}); "
                                     f"legal: {np.flatnonzero(t.legal[s]).tolist()}")
        self.nodes[games] = nxt
        self._settle(games)
        ended = games[t.actor[self.nodes[games]] == TERMINAL]
        payoffs = t.returns[self.nodes[ended]]
        if len(ended):
            self.episodes += len(ended)
            self.nodes[ended] = 0
            self._settle(ended)
        return ended, payoffs


# ----------------------------------------------------------------------------- fixed opponents

PolicyFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``fn(observations (n, D), legal_mask (n, A)) -> probabilities (n, A)`` over the game's actions."""

OpponentSpec = Union[PolicyFn, np.ndarray, Mapping[str, Any], Any]


def _table_of(tables: GameTables, policy: Any, name: str) -> np.ndarray:
    """``(S, A)`` probabilities from a tabular policy: an array in the tables' row order, a mapping from
    information-state string to probabilities, or an object with ``infostates`` and ``probs`` (a
    :class:`fedarena.marl.policy.TabularPolicy`)."""
    S, A = len(tables.infostates), tables.num_actions
    if hasattr(policy, "infostates") and hasattr(policy, "probs"):
        probs = np.asarray(policy.probs, dtype=np.float64)
        if probs.ndim != 2 or probs.shape[1] != A or probs.shape[0] != len(policy.infostates):
            raise ValueError(f"{name}: policy table has shape {probs.shape}, expected (information states, {A})")
        index = {s: i for i, s in enumerate(policy.infostates)}
        missing = [s for s in tables.infostates if s not in index]
        if missing:
            raise ValueError(f"{name}: the policy has no row for information state '{missing[0]}'")
        return probs[[index[s] for s in tables.infostates]]
    if isinstance(policy, np.ndarray):
        if policy.shape != (S, A):
            raise ValueError(f"{name}: expected a policy array of shape {(S, A)} (information states x actions), "
                             f"got {policy.shape}")
        return np.asarray(policy, dtype=np.float64)
    if isinstance(policy, Mapping):
        out = np.zeros((S, A))
        for j, s in enumerate(tables.infostates):
            if s not in policy:
                raise ValueError(f"{name}: the policy has no entry for information state '{s}'")
            v = np.asarray(policy[s], dtype=np.float64).reshape(-1)
            legal = np.flatnonzero(tables.legal[j])
            if len(v) == A:
                out[j] = v
            elif len(v) == len(legal):
                out[j, legal] = v
            else:
                raise ValueError(f"{name}['{s}']: expected {A} probabilities, got {len(v)}")
        return out
    raise TypeError(f"{name}: expected a callable, a policy array, a dict or a tabular policy, "
                    f"got {type(policy).__name__}")


class Population:
    """Policies of one player mixed by ``weights``: each episode plays one member drawn from the weights."""

    def __init__(self, policies: Sequence[OpponentSpec], weights: Sequence[float] | None = None) -> None:
        if not policies:
            raise ValueError("policies: a population needs at least one policy")
        w = np.full(len(policies), 1.0 / len(policies)) if weights is None else np.asarray(weights, dtype=np.float64)
        if w.shape != (len(policies),) or not np.isfinite(w).all() or (w < 0).any() or abs(w.sum() - 1) > 1e-6:
            raise ValueError(f"weights: expected a probability vector over {len(policies)} policies, got {np.ravel(w).tolist()}")
        self.policies = list(policies)
        self.weights = w / w.sum()


class _Opponent:
    """One non-learning player's behaviour inside :class:`ResponseEnv` (tables precomputed where tabular)."""

    def __init__(self, tables: GameTables, spec: OpponentSpec, player: int) -> None:
        pop = spec if isinstance(spec, Population) else Population([spec])
        self.weights = pop.weights
        self.tabular: list[np.ndarray | None] = []
        self.fns: list[PolicyFn | None] = []
        for k, pol in enumerate(pop.policies):
            name = f"opponents[{player}][{k}]"
            if callable(pol) and not hasattr(pol, "probs"):
                self.tabular.append(None)
                self.fns.append(pol)
            else:
                table = _table_of(tables, pol, name)
                rows = tables.infostate_player == player
                sub = table[rows]
                if (sub < 0).any() or (sub * ~tables.legal[rows] > 1e-12).any() or \
                        (np.abs(sub.sum(axis=1) - 1) > 1e-6).any():
                    raise ValueError(f"{name}: not a probability distribution over the legal actions at every "
                                     f"information state of player {player}")
                self.tabular.append(np.cumsum(table, axis=1))
                self.fns.append(None)

    def act(self, tables: GameTables, members: np.ndarray, states: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = np.zeros(len(states), dtype=np.int64)
        for k in np.unique(members):
            sel = np.flatnonzero(members == k)
            s = states[sel]
            if self.tabular[k] is not None:
                cdf = self.tabular[k][s]
            else:
                probs = np.asarray(self.fns[k](tables.tensors[s], tables.legal[s]), dtype=np.float64)
                if probs.shape != (len(s), tables.num_actions):
                    raise ValueError(f"opponent policy returned shape {probs.shape}, "
                                     f"expected {(len(s), tables.num_actions)}")
                probs = np.where(tables.legal[s], np.maximum(probs, 0.0), 0.0)
                total = probs.sum(axis=1, keepdims=True)
                probs = np.where(total > 0, probs / np.where(total > 0, total, 1), tables.legal[s] / tables.legal[s].sum(1, keepdims=True))
                cdf = np.cumsum(probs, axis=1)
            u = rng.random(len(s))[:, None] * cdf[:, -1:]
            a = (u >= cdf).sum(axis=1)
            # never an illegal action through floating-point ties at the top of the cdf
            legal = tables.legal[s]
            bad = ~legal[np.arange(len(s)), np.minimum(a, tables.num_actions - 1)]
            if bad.any():
                a[bad] = tables.num_actions - 1 - np.argmax(legal[bad][:, ::-1], axis=1)
            out[sel] = np.minimum(a, tables.num_actions - 1)
        return out


class ResponseEnv:
    """Player ``player``'s RL view of ``num_envs`` batched games; the other players are ``opponents``
    (``{player: spec}``: a tabular policy, a callable :data:`PolicyFn` or a :class:`Population`).

    ``reset() -> obs (B, D)``; ``step(actions) -> VecStep``: the learner's actions are applied, the
    opponents and chance move until the learner is to act again or the game ends; the reward is the
    learner's payoff at the end (0 before), ``terminated`` marks the end and ``final_obs`` the last
    observation (the finished game has restarted in ``obs``). ``legal_mask`` is the learner's mask at
    ``obs``. Episodes whose learner never moves (possible in some games) are played through silently."""

    def __init__(self, game: Game | GameTables, player: int, opponents: Mapping[int, OpponentSpec], num_envs: int,
                 seed: int | np.random.Generator | None = None, tensor: str = "information_state") -> None:
        self.batch = VectorGame(game, num_envs, seed=seed, tensor=tensor)
        t = self.tables = self.batch.tables
        if not 0 <= player < t.num_players:
            raise ValueError(f"player: expected 0..{t.num_players - 1}, got {player}")
        others = set(range(t.num_players)) - {player}
        if set(opponents) != others:
            raise ValueError(f"opponents: expected a policy for each of players {sorted(others)}, got {sorted(opponents)}")
        self.player = int(player)
        self.num_envs = int(num_envs)
        self.opponents = {p: _Opponent(t, spec, p) for p, spec in opponents.items()}
        self.members = {p: np.zeros(self.num_envs, dtype=np.int64) for p in self.opponents}
        self.rng = self.batch.rng
        self.episode_returns: list[float] = []
        self._returns_pending = np.zeros(self.num_envs)
        self._obs = np.zeros((self.num_envs, t.tensor_size), dtype=np.float32)

    @property
    def observation_space(self) -> Any:
        from gymnasium import spaces

        return spaces.Box(-np.inf, np.inf, shape=(self.tables.tensor_size,), dtype=np.float32)

    @property
    def action_space(self) -> Any:
        from gymnasium import spaces

        return spaces.Discrete(self.tables.num_actions)

    @property
    def legal_mask(self) -> np.ndarray:
        return self.tables.legal[self.batch.infostate_ids(np.arange(self.num_envs))]

    def _draw_members(self, games: np.ndarray) -> None:
        for p, opp in self.opponents.items():
            self.members[p][games] = self.rng.choice(len(opp.weights), size=len(games), p=opp.weights)

    def _advance(self, games: np.ndarray, finished: np.ndarray, final_payoff: np.ndarray) -> None:
        """Let opponents move in ``games`` until the learner is to act; record games that end on the way."""
        b = self.batch
        pending = games
        while len(pending):
            cur = b.current_player()[pending]
            theirs = pending[cur != self.player]
            if not len(theirs):
                break
            who = b.current_player()[theirs]
            for p in np.unique(who):
                g = theirs[who == p]
                acts = self.opponents[int(p)].act(self.tables, self.members[int(p)][g], b.infostate_ids(g), self.rng)
                ended, pay = b.step(g, acts)
                if len(ended):
                    first = ~finished[ended]
                    final_payoff[ended[first]] = pay[first, self.player]
                    finished[ended] = True
                    self._draw_members(ended)
            pending = theirs

    def reset(self, seed: int | None = None) -> np.ndarray:
        self.batch.reset(seed)
        if seed is not None:
            self.rng = self.batch.rng
        allg = np.arange(self.num_envs)
        self._draw_members(allg)
        self._advance(allg, np.zeros(self.num_envs, dtype=bool), np.zeros(self.num_envs))
        return self.batch.observations(allg)

    def step(self, actions: np.ndarray) -> VecStep:
        b = self.batch
        allg = np.arange(self.num_envs)
        actions = np.asarray(actions, dtype=np.int64).reshape(-1)
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions: expected shape ({self.num_envs},), got {actions.shape}")
        final_obs = b.observations(allg)
        finished = np.zeros(self.num_envs, dtype=bool)
        payoff = np.zeros(self.num_envs)
        ended, pay = b.step(allg, actions)
        if len(ended):
            finished[ended] = True
            payoff[ended] = pay[:, self.player]
            self._draw_members(ended)
        self._advance(allg, finished, payoff)
        obs = b.observations(allg)
        final_obs = np.where(finished[:, None], final_obs, obs)  # a terminal has no tensor: keep the last one
        for r in payoff[finished]:
            self.episode_returns.append(float(r))
        return VecStep(obs=obs, reward=payoff.astype(np.float32), terminated=finished,
                       truncated=np.zeros(self.num_envs, dtype=bool), final_obs=final_obs)
