"""AlphaStar's league roles (Vinyals et al., 2019, Methods "League composition" and the pseudocode's
``MainPlayer``, ``MainExploiter``, ``LeagueExploiter``): whom each learning player plays next, when it
adds a frozen snapshot of itself to the league, and whether it then resets to its initial weights.

- Main agents: with probability ``pfsp_share`` (0.5) PFSP (``squared``) against every frozen player; with
  ``verification_share`` (0.15) a check, first of main exploiters' snapshots it beats less than
  ``exploiter_check_win_rate`` (0.3), then of its own past snapshots it has forgotten how to beat (win rate
  below ``forgetting_win_rate``, 0.7, after the monotonic suffix is dropped); otherwise self-play against a
  main agent, or, when it wins less than ``selfplay_min_win_rate`` (0.3) against it, PFSP (``variance``)
  over that agent's snapshots as a curriculum. Never reset.
- Main exploiters: the current main agents; when they beat one less than ``main_exploiter_min_win_rate``
  (0.1), PFSP (``variance``) over its snapshots. Reset to the initial weights at every snapshot.
- League exploiters: PFSP (``linear_capped``) over every frozen player. Reset with probability
  ``league_exploiter_reset_prob`` (0.25) at a snapshot.

Snapshot rule for all roles: not before ``snapshot_min_steps`` (2e9 in AlphaStar) env steps since the last
snapshot; then when the player beats every opponent of its role's reference set with win rate above
``snapshot_win_rate`` (0.7), or after ``snapshot_max_steps`` (4e9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from fedarena.marl.league.payoff import Payoff
from fedarena.marl.league.selector import check_method, select
from fedarena.platform.experiment import param

MAIN, MAIN_EXPLOITER, LEAGUE_EXPLOITER = "main", "main_exploiter", "league_exploiter"
ROLES = (MAIN, MAIN_EXPLOITER, LEAGUE_EXPLOITER)


@dataclass(frozen=True)
class RoleConfig:
    """League composition, matchmaking shares and snapshot rules; defaults are AlphaStar's."""

    main_agents: int = param(1, "number of main agents")
    main_exploiters: int = param(1, "number of main exploiters")
    league_exploiters: int = param(2, "number of league exploiters")
    pfsp_share: float = param(0.5, "main agents: share of matches that are PFSP against all frozen players")
    verification_share: float = param(0.15, "main agents: share of matches that check exploiters and forgotten snapshots")
    selfplay_min_win_rate: float = param(0.3, "main agents: below this win rate against a main agent, play its snapshots instead")
    exploiter_check_win_rate: float = param(0.3, "main agents: exploiter snapshots beaten less than this are played")
    forgetting_win_rate: float = param(0.7, "main agents: own past snapshots beaten less than this are played")
    main_exploiter_min_win_rate: float = param(0.1, "main exploiters: below this win rate against a main agent, play its snapshots")
    main_weighting: str = param("squared", "PFSP weighting (or a PSRO meta-solver, e.g. nash) of the main agents' PFSP and verification branches")
    curriculum_weighting: str = param("variance", "PFSP weighting of the curriculum branches (snapshots of a too-strong main agent)")
    league_exploiter_weighting: str = param("linear_capped", "PFSP weighting of the league exploiters")
    snapshot_min_steps: int = param(2_000_000_000, "env steps since the last snapshot before a player may snapshot")
    snapshot_max_steps: int = param(4_000_000_000, "env steps after which a player snapshots regardless of win rates")
    snapshot_win_rate: float = param(0.7, "snapshot early when beating every reference opponent with more than this")
    league_exploiter_reset_prob: float = param(0.25, "league exploiters: probability of resetting to initial weights at a snapshot")

    def __post_init__(self) -> None:
        if self.main_agents < 1:
            raise ValueError(f"main_agents: must be >= 1, got {self.main_agents}")
        for name in ("main_exploiters", "league_exploiters"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("pfsp_share", "verification_share", "selfplay_min_win_rate", "exploiter_check_win_rate",
                     "forgetting_win_rate", "main_exploiter_min_win_rate", "snapshot_win_rate",
                     "league_exploiter_reset_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: expected a number in [0, 1], got {getattr(self, name)}")
        if self.pfsp_share + self.verification_share > 1.0:
            raise ValueError("pfsp_share, verification_share: their sum must be <= 1")
        for name in ("main_weighting", "curriculum_weighting", "league_exploiter_weighting"):
            check_method(getattr(self, name), name)
        if not 0 <= self.snapshot_min_steps <= self.snapshot_max_steps:
            raise ValueError("snapshot_min_steps, snapshot_max_steps: need 0 <= min <= max")


@dataclass(frozen=True)
class PlayerRecord:
    """One player of the league: a learning player (``learning``) or a frozen snapshot of ``parent``."""

    id: int
    name: str
    role: str
    learning: bool
    parent: int | None = None
    snapshot: str | None = None
    step: int = 0

    def to_json(self) -> dict:
        return {"id": self.id, "name": self.name, "role": self.role, "learning": self.learning,
                "parent": self.parent, "snapshot": self.snapshot, "step": self.step}

    @classmethod
    def from_json(cls, d: dict) -> "PlayerRecord":
        return cls(int(d["id"]), str(d["name"]), str(d["role"]), bool(d["learning"]),
                   None if d["parent"] is None else int(d["parent"]), d["snapshot"], int(d["step"]))


@dataclass(frozen=True)
class Match:
    """An opponent for a learning player; ``frozen`` is False when it is a learning player (self-play)."""

    opponent: int
    frozen: bool
    branch: str


class LeagueView(Protocol):
    payoff: Payoff
    players: list[PlayerRecord]


def historical(league: LeagueView, parents: Sequence[int] | None = None) -> list[int]:
    """Frozen players, optionally only the snapshots of ``parents``."""
    return [p.id for p in league.players
            if not p.learning and (parents is None or p.parent in parents)]


def learning(league: LeagueView, role: str) -> list[int]:
    return [p.id for p in league.players if p.learning and p.role == role]


def remove_monotonic_suffix(win_rates: np.ndarray, ids: list[int]) -> tuple[np.ndarray, list[int]]:
    """Drop the trailing run of snapshots whose win rates only fall with age (the pseudocode's helper): keeps
    ``[:i + 1]`` for the last ``i`` with ``win_rates[i - 1] < win_rates[i]``, nothing if there is none."""
    for i in range(len(win_rates) - 1, 0, -1):
        if win_rates[i - 1] < win_rates[i]:
            return win_rates[:i + 1], ids[:i + 1]
    return np.array([]), []


def _draw(ids: list[int], probs: np.ndarray, rng: np.random.Generator) -> int:
    return ids[int(rng.choice(len(ids), p=probs))]


class MainAgent:
    name = MAIN

    def __init__(self, config: RoleConfig) -> None:
        self.config = config

    def _pfsp_branch(self, me: int, league: LeagueView, rng: np.random.Generator) -> Match:
        hist = historical(league)
        w = select(self.config.main_weighting, league.payoff, me, hist)
        return Match(_draw(hist, w, rng), True, "pfsp")

    def _selfplay_branch(self, me: int, opponent: int, league: LeagueView, rng: np.random.Generator) -> Match:
        if league.payoff.win_rate(me, opponent) > self.config.selfplay_min_win_rate:
            return Match(opponent, False, "selfplay")
        hist = historical(league, [opponent])
        w = select(self.config.curriculum_weighting, league.payoff, me, hist)
        return Match(_draw(hist, w, rng), True, "selfplay_curriculum")

    def _verification_branch(self, me: int, opponent: int, league: LeagueView,
                             rng: np.random.Generator) -> Match | None:
        exploiters = learning(league, MAIN_EXPLOITER)
        exp_hist = historical(league, exploiters)
        rates = league.payoff.win_rates(me, exp_hist)
        if len(rates) and rates.min() < self.config.exploiter_check_win_rate:
            return Match(_draw(exp_hist, select(self.config.main_weighting, league.payoff, me, exp_hist), rng), True, "verify_exploiters")
        hist = historical(league, [opponent])
        rates, hist = remove_monotonic_suffix(league.payoff.win_rates(me, hist), hist)
        if len(rates) and rates.min() < self.config.forgetting_win_rate:
            return Match(_draw(hist, select(self.config.main_weighting, league.payoff, me, hist), rng), True, "verify_forgetting")
        return None

    def get_match(self, me: int, league: LeagueView, rng: np.random.Generator) -> Match:
        coin = rng.random()
        if coin < self.config.pfsp_share:
            return self._pfsp_branch(me, league, rng)
        mains = learning(league, MAIN)
        opponent = mains[int(rng.integers(len(mains)))]
        if coin < self.config.pfsp_share + self.config.verification_share:
            m = self._verification_branch(me, opponent, league, rng)
            if m is not None:
                return m
        return self._selfplay_branch(me, opponent, league, rng)

    def reference(self, me: int, league: LeagueView) -> list[int]:
        return historical(league)

    def resets(self, rng: np.random.Generator) -> bool:
        return False


class MainExploiter:
    name = MAIN_EXPLOITER

    def __init__(self, config: RoleConfig) -> None:
        self.config = config

    def get_match(self, me: int, league: LeagueView, rng: np.random.Generator) -> Match:
        mains = learning(league, MAIN)
        opponent = mains[int(rng.integers(len(mains)))]
        if league.payoff.win_rate(me, opponent) > self.config.main_exploiter_min_win_rate:
            return Match(opponent, False, "main")
        hist = historical(league, [opponent])
        w = select(self.config.curriculum_weighting, league.payoff, me, hist)
        return Match(_draw(hist, w, rng), True, "main_curriculum")

    def reference(self, me: int, league: LeagueView) -> list[int]:
        return learning(league, MAIN)

    def resets(self, rng: np.random.Generator) -> bool:
        return True


class LeagueExploiter:
    name = LEAGUE_EXPLOITER

    def __init__(self, config: RoleConfig) -> None:
        self.config = config

    def get_match(self, me: int, league: LeagueView, rng: np.random.Generator) -> Match:
        hist = historical(league)
        w = select(self.config.league_exploiter_weighting, league.payoff, me, hist)
        return Match(_draw(hist, w, rng), True, "pfsp")

    def reference(self, me: int, league: LeagueView) -> list[int]:
        return historical(league)

    def resets(self, rng: np.random.Generator) -> bool:
        return bool(rng.random() < self.config.league_exploiter_reset_prob)


def make_role(name: str, config: RoleConfig) -> MainAgent | MainExploiter | LeagueExploiter:
    return {MAIN: MainAgent, MAIN_EXPLOITER: MainExploiter, LEAGUE_EXPLOITER: LeagueExploiter}[name](config)


def ready_to_snapshot(role, me: int, league: LeagueView, steps_since: int) -> bool:
    """AlphaStar's ``ready_to_checkpoint``: at least ``snapshot_min_steps``, then a win rate above
    ``snapshot_win_rate`` against every reference opponent of the role, or ``snapshot_max_steps``."""
    cfg = role.config
    if steps_since < cfg.snapshot_min_steps:
        return False
    if steps_since > cfg.snapshot_max_steps:
        return True
    ref = [i for i in role.reference(me, league) if i != me]
    rates = league.payoff.win_rates(me, ref)
    return bool(len(rates) and rates.min() > cfg.snapshot_win_rate)
