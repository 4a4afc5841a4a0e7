"""Ratings of league players from their game results, through rating libraries (nothing hand-written):

- TrueSkill (Herbrich, Minka, Graepel, 2006) with the ``trueskill`` package (draws via its
  ``draw_probability``); reported as ``mu``, ``sigma`` and the conservative ``mu - 3 sigma``.
- Elo: Elo's model is the logistic (Bradley-Terry) model ``P(A beats B) = 1 / (1 + 10^((R_B - R_A) / 400))``.
  No maintained Elo package handles draws (``elo`` is from 2017 and ``elo-grad`` takes win/loss only), so
  Elo ratings come from ``openskill``'s ``BradleyTerryFull`` (Weng & Lin, 2011: Bayesian online updates
  of the Bradley-Terry model, draws as tied ranks) on the Elo scale: ``mu = 1500`` and
  ``beta = 400 / (ln 10 sqrt 2)``, so that openskill's win probability ``1 / (1 + exp(-(mu_A - mu_B) / c))``
  with ``c = sqrt(2 beta^2 + sigma_A^2 + sigma_B^2)`` is Elo's 400-point formula once the sigmas are small.
"""

from __future__ import annotations

import math
from typing import Any

import trueskill
from openskill.models import BradleyTerryFull

ELO_MU = 1500.0
ELO_SIGMA = 350.0
ELO_BETA = 400.0 / (math.log(10.0) * math.sqrt(2.0))


class Ratings:
    """Elo-scale and TrueSkill ratings of players keyed by integer id."""

    def __init__(self, draw_probability: float = 0.1) -> None:
        if not 0.0 <= draw_probability < 1.0:
            raise ValueError(f"draw_probability: expected a number in [0, 1), got {draw_probability}")
        self.draw_probability = float(draw_probability)
        self._ts = trueskill.TrueSkill(draw_probability=self.draw_probability)
        self._bt = BradleyTerryFull(mu=ELO_MU, sigma=ELO_SIGMA, beta=ELO_BETA)
        self._trueskill: dict[int, trueskill.Rating] = {}
        self._elo: dict[int, Any] = {}

    def add(self, player: int) -> None:
        if player not in self._trueskill:
            self._trueskill[player] = self._ts.create_rating()
            self._elo[player] = self._bt.rating(name=str(player))

    def update(self, home: int, away: int, result: int) -> None:
        """One game; ``result`` is +1 / 0 / -1 for ``home``."""
        if result not in (1, 0, -1):
            raise ValueError(f"result: expected +1, 0 or -1, got {result!r}")
        self.add(home)
        self.add(away)
        a, b = self._trueskill[home], self._trueskill[away]
        if result == -1:
            b, a = trueskill.rate_1vs1(b, a, env=self._ts)
        else:
            a, b = trueskill.rate_1vs1(a, b, drawn=result == 0, env=self._ts)
        self._trueskill[home], self._trueskill[away] = a, b
        ranks = {1: [0, 1], 0: [0, 0], -1: [1, 0]}[result]
        [[ea], [eb]] = self._bt.rate([[self._elo[home]], [self._elo[away]]], ranks=ranks)
        self._elo[home], self._elo[away] = ea, eb

    def elo(self, player: int) -> float:
        self.add(player)
        return float(self._elo[player].mu)

    def trueskill(self, player: int) -> tuple[float, float]:
        self.add(player)
        r = self._trueskill[player]
        return float(r.mu), float(r.sigma)

    def table(self) -> dict[int, dict[str, float]]:
        out = {}
        for p in sorted(self._trueskill):
            mu, sigma = self.trueskill(p)
            out[p] = {"elo": self.elo(p), "elo_sigma": float(self._elo[p].sigma), "trueskill_mu": mu,
                      "trueskill_sigma": sigma, "trueskill_conservative": mu - 3.0 * sigma}
        return out

    def state_dict(self) -> dict[str, Any]:
        ids = sorted(self._trueskill)
        return {"draw_probability": self.draw_probability, "ids": ids,
                "trueskill": [[self._trueskill[i].mu, self._trueskill[i].sigma] for i in ids],
                "elo": [[float(self._elo[i].mu), float(self._elo[i].sigma)] for i in ids]}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Ratings":
        r = cls(float(state["draw_probability"]))
        for i, (tm, ts), (em, es) in zip(state["ids"], state["trueskill"], state["elo"]):
            r._trueskill[int(i)] = r._ts.create_rating(mu=float(tm), sigma=float(ts))
            r._elo[int(i)] = r._bt.rating(mu=float(em), sigma=float(es), name=str(i))
        return r
