"""One league iteration in one process (no Ray): every learning player draws its opponents from the league
manager, plays a batch of games on its own environments, makes one PPO update from its moves, reports
results and steps, and snapshots (and maybe resets) when its role says so. The Ray execution
(:mod:`fedarena.marl.league.ray_execution`) runs the same steps in actors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedarena.marl.league.agent import BoardAgent, BoardLearner
from fedarena.marl.league.games import LeagueGame
from fedarena.marl.league.manager import LeagueManager
from fedarena.marl.league.roles import MAIN


@dataclass
class RoleThroughput:
    """Work done by the learners of one role: env transitions, learner moves, games, updates, busy seconds."""

    env_steps: int = 0
    moves: int = 0
    games: int = 0
    updates: int = 0
    seconds: float = 0.0

    def rates(self) -> dict[str, float]:
        s = max(self.seconds, 1e-9)
        return {"env_steps_per_s": self.env_steps / s, "updates_per_s": self.updates / s, "games_per_s": self.games / s}

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class IterationResult:
    """What one learner did in one iteration."""

    learner: int
    moves: int
    games: int
    env_steps: int
    results: list[tuple[int, int]]
    metrics: dict[str, float]
    branches: dict[str, int]
    seconds: float
    snapshot: str | None = None
    reset: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def learner_seed(seed: int, learner: int, version: int) -> int:
    return int(np.random.SeedSequence([seed, 101, learner, version]).generate_state(1)[0])


def with_references(ids: list, probs: np.ndarray, references: tuple[tuple[str, float], ...]) -> tuple[list, np.ndarray]:
    """Mix fixed shares of scripted reference opponents (by name) into a match distribution over league ids."""
    if not references:
        return list(ids), probs
    shares = np.array([s for _, s in references], dtype=np.float64)
    return list(ids) + [n for n, _ in references], np.concatenate([probs * (1.0 - shares.sum()), shares])


def split_results(ids: list, results: list[tuple[int, float]]) -> tuple[list[tuple[int, int]], dict[str, list[int]]]:
    """Results by league id, and results against scripted references (not league players) by name."""
    league, refs = [], {}
    for k, r in results:
        if isinstance(ids[k], str):
            refs.setdefault(ids[k], []).append(int(round(r)))
        else:
            league.append((ids[k], int(round(r))))
    return league, refs


def train_step(game: LeagueGame, agent: BoardAgent, learner: BoardLearner, env, opponents: list, probs: np.ndarray,
               ids: list, num_games: int, rng: np.random.Generator
               ) -> tuple[list[tuple[int, int]], dict[str, list[int]], int, int, dict]:
    """Play ``num_games`` against ``opponents`` and update once; returns (results by league id, results by
    reference name, moves, env steps, update metrics). Shared by the in-process league and the Ray learners."""
    before = env.env_steps
    traj, results = game.play(agent, env, learner.params, opponents, probs, num_games, rng)
    metrics = learner.update(traj)
    league, refs = split_results(ids, results)
    return league, refs, len(traj), env.env_steps - before, metrics


def evaluate_snapshot(game: LeagueGame, agent: BoardAgent, env, params_of, new: int, others: list[int],
                      num_games: int, rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """The evaluator: ``num_games`` games of a new frozen player against each other frozen player (random
    seats), as ``(home, away, result)`` for the payoff table. Frozen players never meet in training, so
    without this their part of the table stays at its 0.5 prior and a meta-solver over them sees no game."""
    out = []
    for j in others:
        _, results = game.play(agent, env, params_of(new), [params_of(j)], np.ones(1), num_games, rng, collect=False)
        out.extend((new, j, int(round(r))) for _, r in results)
    return out


def iteration_seq(completed: int, batches: int, k: int) -> int:
    """Sequence number of batch ``k`` (of ``batches`` per iteration) of a learner in iteration ``completed + 1``:
    1, 2, ... over the run, the same for a replay of the same batch, so the manager counts a report once."""
    return completed * batches + k + 1


class LocalLeague:
    """The league's learners, their environments and the manager, stepped in one process."""

    def __init__(self, game: LeagueGame, agent: BoardAgent, manager: LeagueManager, num_envs: int,
                 games_per_iteration: int, seed: int, references: tuple[tuple[str, float], ...] = (),
                 evaluator_games: int = 0, main_batches: int = 1) -> None:
        self.game, self.agent, self.manager = game, agent, manager
        self.references = tuple(references)
        self.evaluator_games = evaluator_games
        self.main_batches = main_batches
        self.completed = 0   # iterations done (sequence numbers of the learners' reports derive from it)
        self.eval_env = game.make_env(min(num_envs, max(1, evaluator_games)), learner_seed(seed, 0, 1 << 23))
        self.eval_rng = np.random.default_rng(learner_seed(seed, 0, 1 << 24))
        self.reference_players = {n: game.reference(n) for n, _ in self.references}
        self.num_envs, self.games_per_iteration, self.seed = num_envs, games_per_iteration, seed
        init = manager.initial_params()
        self.learners: dict[int, BoardLearner] = {
            i: agent.learner(dict(init), learner_seed(seed, i, 0)) for i in manager.learners}
        self.envs = {i: game.make_env(num_envs, learner_seed(seed, i, 1 << 20)) for i in manager.learners}
        self.rngs = {i: np.random.default_rng(learner_seed(seed, i, 1 << 21)) for i in manager.learners}
        self.throughput = {manager.role(i): RoleThroughput() for i in manager.learners}

    def batches(self, i: int) -> int:
        """PPO batches learner ``i`` plays and learns from per iteration."""
        return self.main_batches if self.manager.role(i) == MAIN else 1

    def opponents(self, ids: list[int]) -> list:
        return [self.learners[i].params if self.manager.players[i].learning else self.manager.frozen_params(i)
                for i in ids]

    def step_learner(self, i: int, seq: int) -> IterationResult:
        t0 = time.perf_counter()
        ids, probs, branches = self.manager.get_matches(i, self.games_per_iteration)
        opponents = self.opponents(ids)
        if self.manager.role(i) == MAIN:
            ids, probs = with_references(ids, probs, self.references)
            opponents += [self.reference_players[n] for n, _ in self.references]
        results, refs, moves, env_steps, metrics = train_step(self.game, self.agent, self.learners[i], self.envs[i],
                                                              opponents, probs, ids, self.games_per_iteration,
                                                              self.rngs[i])
        self.manager.finish_iteration(i, seq, moves, results)
        out = IterationResult(i, moves, len(results), env_steps, results, metrics, branches, 0.0,
                              extra={"references": refs})
        ev = self.manager.maybe_snapshot(i, self.learners[i].params)
        if self.evaluator_games:
            t_eval = time.perf_counter()
            for new, others in self.manager.pending_evaluations(i):
                self.manager.report_evaluation(new, evaluate_snapshot(
                    self.game, self.agent, self.eval_env, self.manager.frozen_params, new, others,
                    self.evaluator_games, self.eval_rng))
            out.extra["evaluator_seconds"] = time.perf_counter() - t_eval
            t0 += out.extra["evaluator_seconds"]     # the role's throughput counts its own work only
        if ev is not None:
            out.snapshot, out.reset = ev.record.name, ev.reset
            if ev.reset:
                version = self.manager.versions[i]
                self.learners[i] = self.agent.learner(dict(self.manager.initial_params()),
                                                      learner_seed(self.seed, i, version))
        out.seconds = time.perf_counter() - t0
        tp = self.throughput[self.manager.role(i)]
        tp.env_steps += env_steps
        tp.moves += moves
        tp.games += len(results) + sum(len(v) for v in refs.values())
        tp.updates += 1
        tp.seconds += out.seconds
        return out

    def iteration(self) -> list[IterationResult]:
        """One iteration: every learner plays and learns from its batches (main agents ``main_batches``)."""
        out = [self.step_learner(i, iteration_seq(self.completed, self.batches(i), k))
               for i in self.manager.learners for k in range(self.batches(i))]
        self.completed += 1
        return out

    def learner_params(self, i: int) -> dict[str, np.ndarray]:
        return self.learners[i].params

    def view(self) -> LeagueManager:
        return self.manager

    def shutdown(self) -> None:
        pass

    # -- state
    def state_dict(self) -> dict[str, Any]:
        return {"manager": self.manager.state_dict(),
                "learners": {str(i): l.state_dict() for i, l in self.learners.items()},
                "rngs": {str(i): r.bit_generator.state for i, r in self.rngs.items()},
                "eval_rng": self.eval_rng.bit_generator.state, "completed": self.completed,
                "env_steps": {str(i): e.env_steps for i, e in self.envs.items()},
                "throughput": {k: v.to_json() for k, v in self.throughput.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, d in state["learners"].items():
            self.learners[int(k)].load_state_dict(d)
        for k, s in state["rngs"].items():
            self.rngs[int(k)].bit_generator.state = s
        self.eval_rng.bit_generator.state = state["eval_rng"]
        self.completed = int(state.get("completed", 0))
        for k, n in state["env_steps"].items():
            self.envs[int(k)].env_steps = int(n)
        for k, d in state["throughput"].items():
            self.throughput[k] = RoleThroughput(**d)
