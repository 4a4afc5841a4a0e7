"""Meta-solvers: from an empirical payoff table of two populations to a mixed strategy over each population
(Lanctot et al., 2017, "A unified game-theoretic approach to multiagent reinforcement learning", sec. 3).

- ``nash``: exact Nash equilibrium of a two-player zero-sum table by linear programming (von Neumann's
  minimax theorem; Shoham & Leyton-Brown, *Multiagent Systems*, sec. 4.1);
- ``prd``: projected replicator dynamics (Lanctot et al., 2017, sec. 3.2), replicator steps projected onto
  the simplex with every probability at least ``gamma / K``, strategies averaged over the run;
- ``regret_matching``: the average strategies of both players running regret matching against each other
  (Hart & Mas-Colell, 2000);
- ``uniform``: every policy equally (fictitious self-play);
- ``last``: only the newest policy (self-play / iterated best response).

A solver is ``solver(payoffs) -> [sigma_0, sigma_1]`` with ``payoffs[p, i, j]`` player ``p``'s payoff when
row policy ``i`` meets column policy ``j``. :func:`get_meta_solver` looks one up by name.

General-sum and n-player tables: ``prd`` runs the replicator dynamics of every player on its own payoff
table (``payoffs[p, i_0, ..., i_{n-1}]`` for ``n`` players; in two-player general-sum games that is both
tables, not their difference), and ``uniform`` / ``last`` take any number of players. ``nash`` needs a
two-player zero-sum table and ``regret_matching`` two players; they say so in one line otherwise.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

MetaSolver = Callable[[np.ndarray], list]


def _check(payoffs: np.ndarray, n_players: bool = False) -> np.ndarray:
    p = np.asarray(payoffs, dtype=np.float64)
    if n_players:
        if p.ndim < 3 or p.shape[0] != p.ndim - 1 or min(p.shape[1:]) < 1:
            raise ValueError(f"payoffs: expected shape (2, rows, cols) or (n, K_0, ..., K_n-1) for n players, "
                             f"got {p.shape}")
    elif p.ndim != 3 or p.shape[0] != 2 or p.shape[1] < 1 or p.shape[2] < 1:
        hint = " (this meta-solver is for two players; use prd or uniform)" if p.ndim > 3 else ""
        raise ValueError(f"payoffs: expected shape (2, rows, cols), got {p.shape}{hint}")
    if not np.all(np.isfinite(p)):
        raise ValueError("payoffs: every entry must be a finite number")
    return p


def zero_sum_nash(payoffs: np.ndarray) -> list[np.ndarray]:
    """Maximin strategies of both players of a two-player zero-sum table (an exact Nash equilibrium).

    Solves ``max v s.t. x^T A >= v, sum x = 1, x >= 0`` for the row player and the dual problem for the
    column player with HiGHS at tight tolerances."""
    p = _check(payoffs)
    scale = max(1.0, float(np.abs(p).max()))
    if not np.allclose(p[0] + p[1], 0.0, atol=1e-9 * scale):
        raise ValueError("payoffs: the 'nash' meta-solver needs a zero-sum table (payoffs[0] == -payoffs[1])")
    return [_maximin(p[0] / scale), _maximin(-p[0].T / scale)]


def _maximin(A: np.ndarray) -> np.ndarray:
    from scipy.optimize import linprog  # imported here: scipy.optimize is slow to import

    m, n = A.shape
    # variables (x_1..x_m, v); minimize -v; constraints v - x^T A_j <= 0; sum x = 1
    c = np.zeros(m + 1)
    c[-1] = -1.0
    A_ub = np.hstack([-A.T, np.ones((n, 1))])
    A_eq = np.zeros((1, m + 1))
    A_eq[0, :m] = 1.0
    res = linprog(c, A_ub=A_ub, b_ub=np.zeros(n), A_eq=A_eq, b_eq=[1.0],
                  bounds=[(0, None)] * m + [(None, None)], method="highs",
                  options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10})
    if res.status != 0:
        raise RuntimeError(f"nash meta-solver: linear program failed: {res.message}")
    x = np.maximum(res.x[:m], 0.0)
    return x / x.sum()


def _project_simplex(y: np.ndarray, floor: float) -> np.ndarray:
    """Euclidean projection of ``y`` onto ``{x : x_i >= floor, sum x = 1}`` (Duchi et al., 2008)."""
    if y.min() >= floor:  # replicator steps keep the sum at one; most steps stay inside
        return y / y.sum()
    k = len(y)
    mass = 1.0 - k * floor
    z = y - floor
    u = np.sort(z)[::-1]
    css = np.cumsum(u) - mass
    idx = np.arange(1, k + 1)
    rho = np.nonzero(u - css / idx > 0)[0][-1]
    theta = css[rho] / (rho + 1)
    return np.maximum(z - theta, 0.0) + floor


def projected_replicator_dynamics(payoffs: np.ndarray, iterations: int = 5000, step: float = 1e-2,
                                  gamma: float = 1e-6, average_last: float = 1.0) -> list[np.ndarray]:
    """PRD from uniform strategies; returns the average of the last ``average_last`` fraction of steps
    (by default all of them: the time average converges in zero-sum tables where the iterates cycle).
    Any number of players: each player's replicator step uses its own table."""
    p = _check(payoffs, n_players=True)
    if p.shape[0] != 2:
        return _prd_n(p, iterations, step, gamma, average_last)
    A, B = p[0], p[1]
    x = np.full(A.shape[0], 1.0 / A.shape[0])
    y = np.full(A.shape[1], 1.0 / A.shape[1])
    start = int(iterations * (1.0 - average_last))
    sx, sy, n = np.zeros_like(x), np.zeros_like(y), 0
    fx, fy = gamma / len(x), gamma / len(y)
    for t in range(iterations):
        ux, uy = A @ y, x @ B
        x, y = (_project_simplex(x + step * x * (ux - x @ ux), fx),
                _project_simplex(y + step * y * (uy - y @ uy), fy))
        if t >= start:
            sx += x
            sy += y
            n += 1
    return [sx / n, sy / n]


def _prd_n(p: np.ndarray, iterations: int, step: float, gamma: float, average_last: float) -> list[np.ndarray]:
    n = p.shape[0]
    xs = [np.full(k, 1.0 / k) for k in p.shape[1:]]
    sums = [np.zeros(k) for k in p.shape[1:]]
    start, count = int(iterations * (1.0 - average_last)), 0
    for t in range(iterations):
        new = []
        for i in range(n):
            u = p[i]
            for j in reversed(range(n)):   # contract the other players' axes with their strategies
                if j != i:
                    u = np.tensordot(u, xs[j], axes=([j], [0]))
            new.append(_project_simplex(xs[i] + step * xs[i] * (u - xs[i] @ u), gamma / len(xs[i])))
        xs = new
        if t >= start:
            for i in range(n):
                sums[i] += xs[i]
            count += 1
    return [s / count for s in sums]


def regret_matching_solver(payoffs: np.ndarray, iterations: int = 5000) -> list[np.ndarray]:
    """Average strategies of simultaneous regret matching by both players."""
    p = _check(payoffs)
    A, B = p[0], p[1]
    rx, ry = np.zeros(A.shape[0]), np.zeros(A.shape[1])
    sx, sy = np.zeros_like(rx), np.zeros_like(ry)
    for _ in range(iterations):
        x = _rm(rx)
        y = _rm(ry)
        sx += x
        sy += y
        ux, uy = A @ y, x @ B
        rx += ux - x @ ux
        ry += uy - y @ uy
    return [sx / sx.sum(), sy / sy.sum()]


def _rm(r: np.ndarray) -> np.ndarray:
    pos = np.maximum(r, 0.0)
    s = pos.sum()
    return pos / s if s > 0 else np.full(len(r), 1.0 / len(r))


def uniform_solver(payoffs: np.ndarray) -> list[np.ndarray]:
    p = _check(payoffs, n_players=True)
    return [np.full(k, 1.0 / k) for k in p.shape[1:]]


def last_solver(payoffs: np.ndarray) -> list[np.ndarray]:
    p = _check(payoffs, n_players=True)
    out = []
    for k in p.shape[1:]:
        s = np.zeros(k)
        s[-1] = 1.0
        out.append(s)
    return out


META_SOLVERS: dict[str, MetaSolver] = {
    "nash": zero_sum_nash,
    "prd": projected_replicator_dynamics,
    "regret_matching": regret_matching_solver,
    "uniform": uniform_solver,
    "last": last_solver,
}


def get_meta_solver(name: str) -> MetaSolver:
    if name not in META_SOLVERS:
        raise KeyError(f"meta_solver: unknown meta-solver '{name}'; known: {', '.join(sorted(META_SOLVERS))}")
    return META_SOLVERS[name]
