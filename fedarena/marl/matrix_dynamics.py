"""Self-play and fictitious play on two-player matrix games, and the experiment that compares them.

Self-play here is iterated best response: each iteration one player (alternating) replaces its strategy by a
best response to the other's current strategy; on rock-paper-scissors it cycles among pure strategies.
Fictitious play (Brown, 1951; Robinson, 1951) has both players best-respond, simultaneously, to the opponent's
empirical average strategy; in two-player zero-sum games the averages converge to a Nash equilibrium.
NashConv is the sum over players of what a best response gains over the profile; exploitability is
NashConv / 2 (the convention of Lanctot et al., 2017).

The report states which dynamic's *average* strategy approaches the equilibrium. On biased rock-paper-scissors
(the quickstart) self-play's best responses still cycle rock -> paper -> scissors, spending equal time on each,
so its average stays at (1/3, 1/3, 1/3), which is not the equilibrium (1/16, 10/16, 5/16): its exploitability
stays near 8.3. Fictitious play's average converges to the equilibrium. (On plain rock-paper-scissors the even
cycle's average *is* the equilibrium, which is why it is not the quickstart.) For zero-sum games the summary
gives the equilibrium (a linear program, :func:`fedarena.marl.meta_solvers.zero_sum_nash`) and each average's
L1 distance to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

import numpy as np

from fedarena.envs.matrix import MatrixGame, load_matrix_game, matrix_game_from_table
from fedarena.marl.meta_solvers import zero_sum_nash
from fedarena.platform.errors import ConfigError
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop

Algorithm = Literal["selfplay", "fictitious_play"]


def best_response(game: MatrixGame, player: int, opponent_strategy: np.ndarray) -> int:
    """Index of a pure best response; ties go to the lowest action index."""
    values = game.action_values(player, opponent_strategy)
    return int(np.flatnonzero(values >= values.max() - 1e-12 * max(1.0, abs(values.max())))[0])


def nash_conv(game: MatrixGame, strategies: Sequence[np.ndarray]) -> float:
    """Sum over players of (best-response value - value) against the other's strategy."""
    x, y = strategies
    value = game.expected_payoffs(x, y)
    br0 = game.action_values(0, y).max()
    br1 = game.action_values(1, x).max()
    return float(br0 - value[0] + br1 - value[1])


def exploitability(game: MatrixGame, strategies: Sequence[np.ndarray]) -> float:
    return nash_conv(game, strategies) / 2.0


@dataclass
class Dynamics:
    """State of one learning dynamic: current pure actions and counts of the actions played so far."""

    algorithm: str
    current: list[int]
    counts: list[np.ndarray]
    iteration: int = 0

    @classmethod
    def start(cls, algorithm: str, game: MatrixGame, initial_actions: Sequence[int]) -> "Dynamics":
        counts = [np.zeros(n, dtype=np.int64) for n in game.num_actions]
        for p in range(2):
            counts[p][initial_actions[p]] += 1
        return cls(algorithm, list(initial_actions), counts)

    def step(self, game: MatrixGame) -> None:
        """One iteration of the dynamic (iteration numbers start at 1; iteration 0 is the initial play)."""
        self.iteration += 1
        if self.algorithm == "selfplay":
            p = (self.iteration - 1) % 2
            opponent = np.eye(game.num_actions[1 - p])[self.current[1 - p]]
            self.current[p] = best_response(game, p, opponent)
        else:  # fictitious play: both respond to the opponent's empirical average (counts give exact ties)
            self.current = [best_response(game, p, self.counts[1 - p].astype(np.float64)) for p in range(2)]
        for p in range(2):
            self.counts[p][self.current[p]] += 1

    def current_strategies(self, game: MatrixGame) -> list[np.ndarray]:
        return [np.eye(game.num_actions[p])[self.current[p]] for p in range(2)]

    def average_strategies(self) -> list[np.ndarray]:
        return [c / c.sum() for c in self.counts]

    def state(self) -> dict[str, Any]:
        return {"current": list(self.current), "counts": list(self.counts), "iteration": self.iteration}

    @classmethod
    def from_state(cls, algorithm: str, state: dict[str, Any]) -> "Dynamics":
        return cls(algorithm, [int(a) for a in state["current"]], [np.asarray(c) for c in state["counts"]],
                   int(state["iteration"]))


# ----------------------------------------------------------------------------- the experiment


@dataclass(frozen=True)
class MatrixDynamicsConfig(ExperimentConfig):
    game: str = param("rock_paper_scissors", "matrix game by name (ignored when `payoffs` is given)")
    payoffs: list | None = param(None, "payoff table: [row_matrix, col_matrix], or one matrix for zero-sum")
    algorithms: list[Algorithm] = param(doc="dynamics to run side by side",
                                        factory=lambda: ["selfplay", "fictitious_play"])
    iterations: int = param(1000, "number of iterations")
    initial_actions: list[int] = param(doc="pure action each player starts with", factory=lambda: [0, 0])

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"iterations: must be at least 1, got {self.iterations}")
        if len(self.initial_actions) != 2:
            raise ValueError(f"initial_actions: expected two actions (one per player), got {self.initial_actions}")
        if not self.algorithms:
            raise ValueError("algorithms: give at least one of selfplay, fictitious_play")
        try:
            game = make_game(self)
        except (KeyError, ValueError) as e:
            raise ValueError(str(e).strip("'\"")) from None
        for p in range(2):
            if not 0 <= self.initial_actions[p] < game.num_actions[p]:
                raise ValueError(f"initial_actions[{p}]: action {self.initial_actions[p]} is outside "
                                 f"0..{game.num_actions[p] - 1} of {game.name}")


def make_game(cfg: MatrixDynamicsConfig) -> MatrixGame:
    return matrix_game_from_table(cfg.payoffs) if cfg.payoffs is not None else load_matrix_game(cfg.game)


def _record(game: MatrixGame, dyn: Dynamics) -> dict[str, Any]:
    cur, avg = dyn.current_strategies(game), dyn.average_strategies()
    a = dyn.algorithm
    return {
        f"{a}/nash_conv_current": nash_conv(game, cur),
        f"{a}/nash_conv_average": nash_conv(game, avg),
        f"{a}/exploitability_current": exploitability(game, cur),
        f"{a}/exploitability_average": exploitability(game, avg),
        f"{a}/p0_current": cur[0], f"{a}/p1_current": cur[1],
        f"{a}/p0_average": avg[0], f"{a}/p1_average": avg[1],
    }


def run(cfg: MatrixDynamicsConfig, run) -> dict[str, Any]:
    return run_loop(run, _DynamicsSteps(cfg))


class _DynamicsSteps:
    """The dynamics side by side under :func:`~fedarena.platform.loop.run_loop`: a step is one iteration of each."""

    def __init__(self, cfg: MatrixDynamicsConfig):
        self.cfg, self.game = cfg, make_game(cfg)
        self.dyns: list[Dynamics] = []
        self.it, self.desc, self.total = 0, self.game.name, cfg.iterations

    def _row(self) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for d in self.dyns:
            row.update(_record(self.game, d))
        return row

    def init(self) -> dict[str, Any]:
        self.dyns = [Dynamics.start(a, self.game, self.cfg.initial_actions) for a in self.cfg.algorithms]
        return self._row()

    def load(self, step: int, state: dict[str, Any]) -> None:
        missing = [a for a in self.cfg.algorithms if a not in state]
        if missing:
            raise ConfigError(f"algorithms: the checkpoint (step {step}) holds no state of {', '.join(missing)}; "
                              f"resume with algorithms={sorted(state)}")
        self.it = step
        self.dyns = [Dynamics.from_state(a, state[a]) for a in self.cfg.algorithms]

    def state(self) -> dict[str, Any]:
        return {d.algorithm: d.state() for d in self.dyns}

    def done(self) -> bool:
        return self.it >= self.cfg.iterations

    def units(self) -> int:
        return self.it

    def step(self, step: int) -> dict[str, Any]:
        for d in self.dyns:
            d.step(self.game)
        self.it = step
        return self._row()

    def summary(self) -> dict[str, Any]:
        game, row = self.game, self._row()
        summary: dict[str, Any] = {"game": game.name, "iterations": self.it}
        nash = zero_sum_nash(game.payoffs) if game.is_zero_sum else None
        if nash is not None:
            summary["nash_p0"] = [round(float(x), 6) for x in nash[0]]
        for d in self.dyns:
            summary[f"{d.algorithm}/exploitability_current"] = row[f"{d.algorithm}/exploitability_current"]
            summary[f"{d.algorithm}/exploitability_average"] = row[f"{d.algorithm}/exploitability_average"]
            summary[f"{d.algorithm}/p0_average"] = [round(float(x), 6) for x in d.average_strategies()[0]]
            if nash is not None:
                summary[f"{d.algorithm}/p0_average_distance_to_nash"] = float(
                    np.abs(d.average_strategies()[0] - nash[0]).sum())
        summary["lesson"] = lesson(summary, [d.algorithm for d in self.dyns])
        return summary


def lesson(summary: dict[str, Any], algorithms: Sequence[str]) -> str:
    """One sentence, computed from the numbers, saying whose average strategy is least exploitable."""
    expl = {a: float(summary[f"{a}/exploitability_average"]) for a in algorithms}
    ranked = sorted(expl, key=expl.get)
    parts = [f"{a} average exploitability {expl[a]:.3g}" for a in ranked]
    text = f"after {summary['iterations']} iterations on {summary['game']}: " + ", ".join(parts)
    if len(ranked) > 1 and expl[ranked[-1]] > 10 * max(expl[ranked[0]], 1e-12):
        text += f"; {ranked[0]}'s average approaches the equilibrium, {ranked[-1]}'s does not"
    return text


def plots(rows, cfg: MatrixDynamicsConfig, report_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    game = make_game(cfg)
    paths = []
    steps = np.array([r["step"] for r in rows])
    colors = {"selfplay": "tab:red", "fictitious_play": "tab:blue"}
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    final = {}
    curves = {(a, which): np.array([r[f"{a}/exploitability_{which}"] for r in rows], dtype=float)
              for a in cfg.algorithms for which in ("current", "average")}
    # log axes start at the first positive value and zeros are not drawn; a game where every strategy played is
    # already an equilibrium (all values 0, e.g. both players starting at defect) is drawn on a linear axis
    log_y = any(((steps > 0) & (y > 0)).any() for y in curves.values())
    for a in cfg.algorithms:
        for which, style, lw in (("current", "--", 2.6 if a == "selfplay" else 1.2), ("average", "-", 1.4)):
            y = curves[a, which]
            keep = (steps > 0) & (y > 0) if log_y else steps > 0
            ax.plot(steps[keep], y[keep], style, color=colors.get(a), lw=lw,
                    label=f"{a} ({which} strategy)", zorder=3 if which == "current" and a == "selfplay" else 2)
            if which == "average":
                final[a] = y[-1]
    ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("exploitability (NashConv / 2)")
    ranked = sorted(final, key=final.get)
    verdict = (f"\n{ranked[0]}'s average converges, {ranked[-1]}'s stays exploitable"
               if len(ranked) > 1 and final[ranked[-1]] > 10 * max(final[ranked[0]], 1e-12) else "")
    ax.set_title(f"Exploitability on {game.name}{verdict}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(f"{report_dir}/exploitability.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    n = game.num_actions[0]
    fig, axes = plt.subplots(1, len(cfg.algorithms), figsize=(5.2 * len(cfg.algorithms), 4.6), squeeze=False)
    for ax, a in zip(axes[0], cfg.algorithms):
        avg = np.array([r[f"{a}/p0_average"] for r in rows], dtype=float)
        cur = np.array([r[f"{a}/p0_current"] for r in rows], dtype=float)
        if n == 3:  # barycentric projection onto the 2-simplex
            corners = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, np.sqrt(3) / 2]])
            tri = np.vstack([corners, corners[:1]])
            ax.plot(tri[:, 0], tri[:, 1], color="k", lw=0.8)
            for c, name in zip(corners, game.row_actions):
                ax.annotate(name, c, textcoords="offset points", xytext=(0, -12 if c[1] == 0 else 5), ha="center")
            pa, pc = avg @ corners, cur @ corners
            if game.is_zero_sum:
                eq = zero_sum_nash(game.payoffs)[0] @ corners
                ax.plot(*eq, "D", color="tab:green", ms=9, mfc="none", mew=2, label="Nash equilibrium", zorder=5)
            tail = pc[-13:]
            ax.plot(tail[:, 0], tail[:, 1], "-o", color="tab:red", ms=7, lw=2.0, alpha=0.35,
                    label="current strategy (last 12 iterations)")
            ax.plot(pa[:, 0], pa[:, 1], "-", color=colors.get(a), lw=1.0, label="average strategy")
            ax.plot(*pa[-1], "*", color="k", ms=10, label="final average")
            ax.set_aspect("equal")
            ax.axis("off")
        else:
            for i in range(n):
                ax.plot(steps[steps > 0], avg[steps > 0, i], label=f"P({game.row_actions[i]})")
            ax.set_xscale("log")
            ax.set_xlabel("iteration")
            ax.set_ylabel("player 0 average strategy")
            ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{a}: player 0 strategy")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.02) if n == 3 else None)
    fig.suptitle(f"Player 0's strategy on {game.name}", fontsize=11)
    fig.tight_layout()
    paths.append(f"{report_dir}/strategies.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")  # legends placed below the simplex stay in the figure
    plt.close(fig)
    return paths


EXPERIMENT = Experiment(
    config=MatrixDynamicsConfig, run=run, plots=plots,
    summary_keys=tuple(f"{a}/exploitability_{w}" for a in ("selfplay", "fictitious_play") for w in ("current", "average")),
)
