"""The league manager: the league's players and roles, matchmaking, game results (payoff table and
ratings) and snapshots (Vinyals et al., 2019, pseudocode ``League``; the model store, evaluator and
selector of the MARL system figure). It holds no network code and no environment: learners ask it for
opponents, report results and steps, and offer their weights for a snapshot; its whole state is plain
JSON values and numpy arrays (:meth:`state_dict` / :meth:`from_state`) for checkpoints and resume.

Composition as AlphaStar: ``main_agents`` main agents, ``main_exploiters`` main exploiters and
``league_exploiters`` league exploiters, all starting from the same initial weights (random, or the
imitation stage's); every main agent's initial weights are the league's first frozen player.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from fedarena.marl.league.payoff import Payoff
from fedarena.marl.league.ratings import Ratings
from fedarena.marl.league.roles import (LEAGUE_EXPLOITER, MAIN, MAIN_EXPLOITER, Match, PlayerRecord, RoleConfig,
                                        make_role, ready_to_snapshot)
from fedarena.marl.league.selector import league_mixture
from fedarena.marl.league.store import SnapshotRef, SnapshotStore, snapshot_name

INITIAL = "initial"


@dataclass(frozen=True)
class SnapshotEvent:
    """A learning player added ``record`` (a frozen copy of itself) and, when ``reset``, restarts from the
    initial weights."""

    record: PlayerRecord
    reset: bool


class LeagueManager:
    def __init__(self, roles: RoleConfig, store: SnapshotStore, initial_params: dict[str, np.ndarray] | None,
                 seed: int, payoff_decay: float = 0.99, draw_probability: float = 0.1, *, _restore: bool = False):
        self.roles_config = roles
        self.store = store
        self.payoff = Payoff(payoff_decay)
        self.ratings = Ratings(draw_probability)
        self.players: list[PlayerRecord] = []
        self.rng = np.random.default_rng(seed)
        self.steps: dict[int, int] = {}
        self.snapshot_steps: dict[int, int] = {}
        self.versions: dict[int, int] = {}
        self.checksums: dict[str, str] = {}
        self.games = 0
        self.reported: dict[int, int] = {}   # per learner: sequence number of its last counted iteration report
        self.evaluated: set[int] = set()     # frozen players whose evaluator games are in the payoff table
        self._roles = {name: make_role(name, roles) for name in (MAIN, MAIN_EXPLOITER, LEAGUE_EXPLOITER)}
        self._cache: dict[str, dict[str, np.ndarray]] = {}
        if _restore:
            return
        if initial_params is None:
            raise ValueError("initial_params: a new league needs the initial weights")
        self._save(INITIAL, 0, initial_params, role="initial", parent=None, step=0)
        counts = ((MAIN, roles.main_agents), (MAIN_EXPLOITER, roles.main_exploiters),
                  (LEAGUE_EXPLOITER, roles.league_exploiters))
        for role, n in counts:
            for k in range(n):
                self._add(PlayerRecord(len(self.players), f"{role}-{k}", role, True))
        for p in list(self.players):
            self.steps[p.id] = self.snapshot_steps[p.id] = self.versions[p.id] = 0
        for p in [p for p in self.players if p.role == MAIN]:
            self._snapshot(p.id, initial_params)

    # -- players
    def _add(self, record: PlayerRecord) -> PlayerRecord:
        assert record.id == self.payoff.add_player() == len(self.players)
        self.players.append(record)
        self.ratings.add(record.id)
        return record

    def _save(self, player: str, version: int, params, **info) -> SnapshotRef:
        ref = self.store.save(player, version, params, **info)
        self.checksums[ref.name] = ref.sha256
        return ref

    def _snapshot(self, learner: int, params: dict[str, np.ndarray]) -> PlayerRecord:
        p = self.players[learner]
        self.versions[learner] += 1
        # resume sets aside the snapshots written after its checkpoint (SnapshotStore.set_aside), so a name is
        # taken here only in a store something else also writes to; the league then numbers past it
        while (self.store.root / snapshot_name(p.name, self.versions[learner])).exists():
            self.versions[learner] += 1
        ref = self._save(p.name, self.versions[learner], params, role=p.role, parent=p.name, step=self.steps[learner])
        self.snapshot_steps[learner] = self.steps[learner]
        return self._add(PlayerRecord(len(self.players), ref.name, p.role, False, learner, ref.name,
                                      self.steps[learner]))

    def latest_snapshot(self, learner: int) -> PlayerRecord | None:
        """The newest frozen copy of ``learner`` (what a restarted learner resumes from), if any."""
        snaps = [p for p in self.players if not p.learning and p.parent == learner]
        return snaps[-1] if snaps else None

    @property
    def learners(self) -> list[int]:
        return [p.id for p in self.players if p.learning]

    @property
    def frozen(self) -> list[int]:
        return [p.id for p in self.players if not p.learning]

    def role(self, player: int) -> str:
        return self.players[player].role

    # -- matchmaking and results
    def get_match(self, learner: int) -> Match:
        p = self.players[learner]
        if not p.learning:
            raise ValueError(f"learner: player {learner} ({p.name}) is frozen")
        return self._roles[p.role].get_match(learner, self, self.rng)

    def get_matches(self, learner: int, n: int) -> tuple[list[int], np.ndarray, dict[str, int]]:
        """``n`` matches at once: the distinct opponents, the share of the ``n`` draws each got, and the
        number of draws per branch (for the report)."""
        draws = [self.get_match(learner) for _ in range(n)]
        ids = sorted({m.opponent for m in draws})
        counts = np.array([sum(m.opponent == i for m in draws) for i in ids], dtype=np.float64)
        branches: dict[str, int] = {}
        for m in draws:
            branches[m.branch] = branches.get(m.branch, 0) + 1
        return ids, counts / counts.sum(), branches

    def report(self, home: int, away: int, result: int) -> None:
        """One finished game; ``result`` is +1 / 0 / -1 for ``home``."""
        self.payoff.update(home, away, result)
        self.ratings.update(home, away, result)
        self.games += 1

    def report_many(self, home: int, results: Sequence[tuple[int, int]]) -> None:
        for away, result in results:
            self.report(home, int(away), int(result))

    def add_steps(self, learner: int, n: int) -> None:
        self.steps[learner] += int(n)

    def finish_iteration(self, learner: int, seq: int, moves: int, results: Sequence[tuple[int, int]]) -> bool:
        """Count one iteration's steps and games of ``learner`` once: a report whose sequence number ``seq`` is
        not above the learner's last counted one (the same iteration replayed after a crash between reporting
        and snapshotting, or a retried call) is ignored. Returns whether it was counted."""
        seq = int(seq)
        if seq <= self.reported.get(learner, 0):
            return False
        self.reported[learner] = seq
        self.add_steps(learner, moves)
        self.report_many(learner, results)
        return True

    def pending_evaluations(self, learner: int) -> list[tuple[int, list[int]]]:
        """The evaluator's work for ``learner``: each of its snapshots whose games are not yet in the payoff
        table, with its opponents: every frozen player that joined the league before it (a later one plays it
        when that one is evaluated, so every pair of frozen players is evaluated once)."""
        return [(p.id, [j for j in self.frozen if j < p.id]) for p in self.players
                if not p.learning and p.parent == learner and p.id not in self.evaluated]

    def report_evaluation(self, player: int, results: Sequence[tuple[int, int, int]]) -> bool:
        """The evaluator's ``(home, away, result)`` games of frozen ``player``, counted once per player (a
        replayed evaluation is ignored). Returns whether they were counted."""
        if player in self.evaluated:
            return False
        self.evaluated.add(int(player))
        for home, away, r in results:
            self.report(int(home), int(away), int(r))
        return True

    def snapshot_due(self, learner: int) -> bool:
        """AlphaStar's ``ready_to_checkpoint`` for this learner now."""
        role = self._roles[self.players[learner].role]
        return ready_to_snapshot(role, learner, self, self.steps[learner] - self.snapshot_steps[learner])

    def take_snapshot(self, learner: int, params: dict[str, np.ndarray]) -> SnapshotEvent:
        """AlphaStar's ``checkpoint``: store a frozen copy and say whether the role resets the learner."""
        record = self._snapshot(learner, params)
        return SnapshotEvent(record, self._roles[self.players[learner].role].resets(self.rng))

    def maybe_snapshot(self, learner: int, params: dict[str, np.ndarray]) -> SnapshotEvent | None:
        """:meth:`take_snapshot` if :meth:`snapshot_due`."""
        return self.take_snapshot(learner, params) if self.snapshot_due(learner) else None

    # -- weights
    def frozen_params(self, player: int) -> dict[str, np.ndarray]:
        p = self.players[player]
        if p.learning or p.snapshot is None:
            raise ValueError(f"player: {p.name} is a learning player; its weights live in its learner")
        return self._load(p.snapshot)

    def initial_params(self) -> dict[str, np.ndarray]:
        return self._load(snapshot_name(INITIAL, 0))

    def _load(self, name: str) -> dict[str, np.ndarray]:
        if name not in self._cache:
            self._cache[name] = self.store.load(name, self.checksums.get(name))
        return self._cache[name]

    # -- evaluation
    def nash_mixture(self, ids: Sequence[int] | None = None, solver: str = "nash") -> tuple[list[int], np.ndarray]:
        ids = list(self.frozen if ids is None else ids)
        return ids, league_mixture(self.payoff, ids, solver)

    def ratings_table(self) -> dict[str, dict[str, float]]:
        return {self.players[i].name: r for i, r in self.ratings.table().items()}

    # -- state
    def state_dict(self) -> dict[str, Any]:
        ids = [p.id for p in self.players]
        return {"players": [p.to_json() for p in self.players], "payoff": self.payoff.state_dict(),
                "ratings": self.ratings.state_dict(), "rng": self.rng.bit_generator.state,
                "steps": [self.steps.get(i, 0) for i in ids], "snapshot_steps": [self.snapshot_steps.get(i, 0) for i in ids],
                "versions": [self.versions.get(i, 0) for i in ids], "checksums": dict(self.checksums),
                "games": self.games, "reported": [self.reported.get(i, 0) for i in ids],
                "evaluated": sorted(self.evaluated)}

    @classmethod
    def from_state(cls, state: dict[str, Any], roles: RoleConfig, store: SnapshotStore,
                   verify: bool = True) -> "LeagueManager":
        """Rebuild a manager; with ``verify`` every recorded snapshot is loaded and its checksum checked."""
        m = cls(roles, store, None, 0, float(state["payoff"]["decay"]),
                float(state["ratings"]["draw_probability"]), _restore=True)
        m.players = [PlayerRecord.from_json(d) for d in state["players"]]
        m.payoff = Payoff.from_state(state["payoff"])
        m.ratings = Ratings.from_state(state["ratings"])
        m.rng.bit_generator.state = state["rng"]
        learners = [p.id for p in m.players if p.learning]
        m.steps = {i: int(state["steps"][i]) for i in learners}
        m.snapshot_steps = {i: int(state["snapshot_steps"][i]) for i in learners}
        m.versions = {i: int(state["versions"][i]) for i in learners}
        m.checksums = {str(k): str(v) for k, v in state["checksums"].items()}
        m.games = int(state["games"])
        m.reported = {i: int(state.get("reported", [0] * len(m.players))[i]) for i in learners}
        m.evaluated = {int(i) for i in state.get("evaluated", [])}
        if m.payoff.num_players != len(m.players):
            raise ValueError(f"league state: payoff table has {m.payoff.num_players} players, the roster {len(m.players)}")
        for name in m.checksums if verify else ():   # every recorded snapshot must still be in the store, intact
            m._load(name)
        return m
