"""Policy-Space Response Oracles, PSRO (Lanctot et al., 2017, "A unified game-theoretic approach to
multiagent reinforcement learning", Algorithm 1), for two-player and n-player games.

Each player keeps a population of policies. The empirical game holds the expected payoff of every pair
of population members -- computed exactly from the compiled tree, or estimated from sampled play when
``sample_episodes > 0`` (seeded). A meta-solver (:mod:`fedarena.marl.meta_solvers`) turns the empirical
game into a mixed strategy per population; each iteration an oracle answers the opponent's mixture with
a new policy, which joins the population. With the ``last`` meta-solver this is self-play (iterated best
response); with ``uniform`` it is fictitious self-play; with ``nash`` it is the double oracle method.

An oracle is ``oracle(game, player, opponent_policies, opponent_weights) -> TabularPolicy`` (only the rows
of ``player`` matter). :func:`exact_best_response_oracle` is the exact one; learned best responses (RL,
:mod:`fedarena.marl.rl_oracles`) implement the same call. In a two-player game the opponent policies are the
other player's population and the weights its meta-strategy. With more players, the others' populations
are first mixed player by player (realization weights), and the oracle gets that one joint behavioural
policy with weight 1 -- the same play as every opponent independently drawing a member of its population.

Beyond two-player zero-sum: the meta-game of ``n`` players is the tensor ``payoffs[p, i_0, ..., i_{n-1}]``.
Two-player general-sum games use a general-sum meta-solver -- ``prd`` (projected replicator dynamics, each
player on its own table; Lanctot et al., 2017, sec. 3.2), ``regret_matching`` (average strategies of both
players' regret matching; a coarse correlated equilibrium in the limit, Hart & Mas-Colell, 2000) or the
``uniform`` / ``last`` heuristics; games with more than two players take ``prd``, ``uniform`` or ``last``.
Asking for ``nash`` (a zero-sum LP) in a general-sum game, or a two-player solver with more players, is a
one-line ``ValueError`` at construction. Exploitability is NashConv / n in every case.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from fedarena.envs.efg import Game
from fedarena.marl.best_response import best_response
from fedarena.marl.exploitability import exploitability
from fedarena.marl.game_tree import SAMPLED_ALTERNATIVE, GameTree, game_tree
from fedarena.marl.meta_solvers import MetaSolver, get_meta_solver
from fedarena.marl.policy import PolicyLike, TabularPolicy, as_policy, check_policy_batch, uniform_policy
from fedarena.marl.tree_walk import terminal_reach
from fedarena.marl.xfp import mix_realization

Oracle = Callable[[Game, int, Sequence[TabularPolicy], np.ndarray], TabularPolicy]


def _check_mixture(policies: Sequence[TabularPolicy], weights: np.ndarray) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) != len(policies) or len(w) == 0:
        raise ValueError(f"opponent_weights: expected one weight per opponent policy ({len(policies)}), "
                         f"got shape {w.shape}")
    if not np.all(np.isfinite(w)) or (w < 0).any() or abs(w.sum() - 1.0) > 1e-6:
        raise ValueError(f"opponent_weights: expected a probability vector, got {w.tolist()}")
    return w


def _stack(tree: GameTree, policies: Sequence[PolicyLike], players: tuple[int, ...] | None) -> np.ndarray:
    arrays = [p.probs if isinstance(p, TabularPolicy) and p.tree.infostates == tree.infostates
              else as_policy(tree, p, players=players).probs for p in policies]
    stacked = np.stack(arrays) if arrays else np.zeros((0,) + tree.legal.shape)
    check_policy_batch(tree, stacked, players, name="opponent_policies")
    return stacked


def mixture_policy(game: Game | GameTree, policies: Sequence[PolicyLike], weights: np.ndarray,
                   players: tuple[int, ...] | None = None) -> TabularPolicy:
    """The behavioural policy that plays like picking ``policies[k]`` with probability ``weights[k]`` once
    at the start of the game (per player; Kuhn's theorem via realization weights). With ``players``,
    only their rows are validated and meaningful."""
    tree = game_tree(game)
    w = _check_mixture(policies, weights)
    return TabularPolicy(tree, mix_realization(tree, _stack(tree, policies, players), w))


def exact_best_response_oracle(game: Game | GameTree, player: int, opponent_policies: Sequence[TabularPolicy],
                               opponent_weights: np.ndarray) -> TabularPolicy:
    """An exact best response of ``player`` to the opponent's mixture (ties to the lowest action)."""
    tree = game_tree(game)
    others = tuple(p for p in range(tree.num_players) if p != player)
    mix = mixture_policy(tree, opponent_policies, opponent_weights, players=others)
    return best_response(tree, mix, player).policy


TWO_PLAYER_SOLVERS = ("nash", "regret_matching")
GENERAL_SUM_SOLVERS = ("prd", "regret_matching", "uniform", "last")


def _is_zero_sum(tree: GameTree) -> bool:
    u = tree.utilities
    return bool(np.allclose(u.sum(axis=1), 0.0, atol=1e-9 * max(1.0, float(np.abs(u).max()))))


def check_meta_solver(game: Game | GameTree, meta_solver: str) -> None:
    """A one-line ``ValueError`` when the named meta-solver cannot solve ``game``'s meta-games (for config
    validation: ``nash`` needs a zero-sum game, ``nash`` / ``regret_matching`` need two players)."""
    tree = game_tree(game, method="PSRO (exact payoffs and best responses)", alternative=SAMPLED_ALTERNATIVE)
    n = tree.num_players
    get_meta_solver(meta_solver)
    if meta_solver in TWO_PLAYER_SOLVERS and n != 2:
        raise ValueError(f"meta_solver: '{meta_solver}' is for two-player meta-games and {tree.game.name} has "
                         f"{n} players; use prd, uniform or last")
    if meta_solver == "nash" and not _is_zero_sum(tree):
        raise ValueError(f"meta_solver: 'nash' solves zero-sum meta-games and {tree.game.name} is general-sum; "
                         f"use {', '.join(GENERAL_SUM_SOLVERS)}")


class PSRO:
    """PSRO on ``game`` (two or more players); call :meth:`iteration` repeatedly, read :meth:`exploitability`."""

    def __init__(self, game: Game | GameTree, meta_solver: str | MetaSolver = "nash",
                 oracle: Oracle = exact_best_response_oracle, initial_policy: PolicyLike | None = None,
                 sample_episodes: int = 0, seed: int | np.random.Generator | None = None) -> None:
        self.tree = tree = game_tree(game, method="PSRO (exact payoffs and best responses)",
                                      alternative=SAMPLED_ALTERNATIVE)
        n = self.num_players = tree.num_players
        if isinstance(meta_solver, str):
            check_meta_solver(tree, meta_solver)
        if sample_episodes < 0:
            raise ValueError(f"sample_episodes: expected >= 0 (0 = exact payoffs), got {sample_episodes}")
        if sample_episodes > 0 and seed is None:
            raise ValueError("seed: sampled payoffs (sample_episodes > 0) need a seed or a numpy Generator")
        self.meta_solver = get_meta_solver(meta_solver) if isinstance(meta_solver, str) else meta_solver
        self.oracle = oracle
        self.sample_episodes = int(sample_episodes)
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        first = uniform_policy(tree) if initial_policy is None else as_policy(tree, initial_policy)
        self.populations: list[list[TabularPolicy]] = [[first] for _ in range(n)]
        self._reach: list[list[np.ndarray]] = [[terminal_reach(tree, first.probs, p)] for p in range(n)]
        self.meta_game = np.zeros((n,) + (0,) * n)
        self._extend_meta_game()
        self.meta_strategies = self.meta_solver(self.meta_game)
        self.iterations = 0

    # ------------------------------------------------------------------ empirical game
    def _sampled_entry(self, r0: np.ndarray, r1: np.ndarray) -> np.ndarray:
        """Mean payoffs of ``sample_episodes`` plays, each a terminal history drawn from its exact probability
        ``chance(z) x_0(z) x_1(z)`` under the two policies (the same distribution as playing them out)."""
        tree = self.tree
        prob = tree.chance_reach[tree.terminals] * r0 * r1
        z = self.rng.choice(len(prob), size=self.sample_episodes, p=prob / prob.sum())
        return tree.utilities[z].mean(axis=0)

    def _extend_meta_game(self) -> None:
        """Fill the entries of the newest population members (exactly: one matrix product per new row or
        column, ``sum_z chance(z) u(z) x_0(z) x_1(z)``; or by sampling ``sample_episodes`` plays)."""
        if self.num_players != 2:
            return self._extend_meta_game_n()
        old = self.meta_game
        k0, k1 = len(self.populations[0]), len(self.populations[1])
        o0, o1 = old.shape[1], old.shape[2]
        new = np.zeros((2, k0, k1))
        new[:, :o0, :o1] = old
        R0, R1 = np.stack(self._reach[0]), np.stack(self._reach[1])
        if self.sample_episodes == 0:
            cu = self.tree.chance_reach[self.tree.terminals][:, None] * self.tree.utilities   # (T, 2)
            for p in range(2):
                weighted = R0 * cu[:, p]
                new[p, o0:, :] = weighted[o0:] @ R1.T
                new[p, :o0, o1:] = weighted[:o0] @ R1[o1:].T
        else:
            for i in range(k0):
                for j in range(k1):
                    if i >= o0 or j >= o1:
                        new[:, i, j] = self._sampled_entry(R0[i], R1[j])
        self.meta_game = new

    def _extend_meta_game_n(self) -> None:
        """n players: ``payoffs[p, i_0, ..., i_{n-1}] = sum_z chance(z) u_p(z) prod_q x_q^{i_q}(z)``, new entries only
        (exact), or the mean of ``sample_episodes`` plays per new entry."""
        n, old = self.num_players, self.meta_game
        sizes = tuple(len(pop) for pop in self.populations)
        new = np.zeros((n,) + sizes)
        new[(slice(None),) + tuple(slice(0, k) for k in old.shape[1:])] = old
        R = [np.stack(r) for r in self._reach]
        fresh = np.ones(sizes, dtype=bool)
        fresh[tuple(slice(0, k) for k in old.shape[1:])] = False
        if self.sample_episodes == 0:
            cu = self.tree.chance_reach[self.tree.terminals][:, None] * self.tree.utilities   # (T, n)
            letters = "abcdefghijklmnop"[:n]
            expr = "zp," + ",".join(f"{c}z" for c in letters) + "->p" + letters
            full = np.einsum(expr, cu, *R, optimize=True)
            new[:, fresh] = full[:, fresh]
        else:
            for idx in zip(*np.nonzero(fresh)):
                r = [R[q][idx[q]] for q in range(n)]
                new[(slice(None),) + tuple(idx)] = self._sampled_entry_n(r)
        self.meta_game = new

    def _sampled_entry_n(self, reaches: list[np.ndarray]) -> np.ndarray:
        tree = self.tree
        prob = tree.chance_reach[tree.terminals] * np.prod(reaches, axis=0)
        z = self.rng.choice(len(prob), size=self.sample_episodes, p=prob / prob.sum())
        return tree.utilities[z].mean(axis=0)

    def _opponents_of(self, player: int) -> tuple[list[TabularPolicy], np.ndarray]:
        sigma = self.meta_strategies
        if self.num_players == 2:
            return self.populations[1 - player], sigma[1 - player]
        probs = np.zeros_like(self.tree.uniform_probs())
        for q in range(self.num_players):
            stacked = np.stack([pol.probs for pol in self.populations[q]])
            rows = self.tree.infostate_player == q
            probs[rows] = (mix_realization(self.tree, stacked, sigma[q]) if q != player else self.tree.uniform_probs())[rows]
        return [TabularPolicy(self.tree, probs)], np.ones(1)

    # ------------------------------------------------------------------ iterations
    def iteration(self) -> None:
        """Add one oracle response per player to the mixtures of the current meta-strategies."""
        n = self.num_players
        new = [self.oracle(self.tree.game, i, *self._opponents_of(i)) for i in range(n)]
        for i in range(n):
            pol = as_policy(self.tree, new[i], players=(i,))
            self.populations[i].append(pol)
            self._reach[i].append(terminal_reach(self.tree, pol.probs, i))
        self._extend_meta_game()
        self.meta_strategies = self.meta_solver(self.meta_game)
        self.iterations += 1

    def joint_policy(self) -> TabularPolicy:
        """Each player's population mixed by its meta-strategy, as one behavioural policy."""
        probs = np.zeros_like(self.tree.uniform_probs())
        for p in range(self.num_players):
            stacked = np.stack([pol.probs for pol in self.populations[p]])
            mix = mix_realization(self.tree, stacked, self.meta_strategies[p])
            rows = self.tree.infostate_player == p
            probs[rows] = mix[rows]
        return TabularPolicy(self.tree, probs)

    def exploitability(self) -> float:
        return exploitability(self.tree, self.joint_policy())

    def run(self, iterations: int) -> "PSRO":
        for _ in range(iterations):
            self.iteration()
        return self

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"populations": [[p.probs.copy() for p in pop] for pop in self.populations],
                "meta_game": self.meta_game.copy(), "iterations": int(self.iterations),
                "rng": self.rng.bit_generator.state}

    def _checked_probs(self, probs) -> np.ndarray:
        p = np.asarray(probs, dtype=np.float64)
        if p.shape != self.tree.legal.shape:
            raise ValueError(f"checkpoint field 'populations': policy shape {p.shape}, expected {self.tree.legal.shape}")
        return p

    def load_state_dict(self, state: dict) -> None:
        self.populations = [[TabularPolicy(self.tree, self._checked_probs(p)) for p in pop]
                            for pop in state["populations"]]
        self._reach = [[terminal_reach(self.tree, p.probs, i) for p in pop] for i, pop in enumerate(self.populations)]
        mg = np.asarray(state["meta_game"], dtype=np.float64)
        if len(self.populations) != self.num_players or \
                mg.shape != (self.num_players,) + tuple(len(pop) for pop in self.populations):
            raise ValueError(f"checkpoint field 'meta_game': shape {mg.shape} does not match the populations")
        self.meta_game = mg
        self.iterations = int(state["iterations"])
        self.rng.bit_generator.state = state["rng"]
        self.meta_strategies = self.meta_solver(self.meta_game)


def self_play(game: Game, **kwargs) -> PSRO:
    """Self-play (iterated best response to the opponent's newest policy) as PSRO with the ``last`` meta-solver."""
    return PSRO(game, meta_solver="last", **kwargs)


def fictitious_self_play(game: Game, **kwargs) -> PSRO:
    """Fictitious self-play (best response to the uniform mixture of all past policies) as PSRO with ``uniform``."""
    return PSRO(game, meta_solver="uniform", **kwargs)
