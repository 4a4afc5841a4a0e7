"""Experiment kind ``selfplay_ppo``: masked PPO self-play with a pool of past snapshots on a two-player
turn-based game.

``env_id`` ``pettingzoo.classic.tictactoe_v3`` or ``pettingzoo.classic.connect_four_v3`` (also without the
``pettingzoo.classic.`` prefix) runs :class:`~fedarena.marl.selfplay.BoardSelfPlay`: the league's ``BoardAgent``
(config section ``agent``) on numpy-batched boards with PettingZoo's rules, ``updates`` PPO updates of
``games_per_update`` games each, checkpointed every ``checkpoint.every`` updates and resumable
(``fedarena run --resume RUN_DIR``). Any other turn-based PettingZoo id, or ``game:<name>`` for a
fedarena/OpenSpiel game wrapped by :class:`~fedarena.envs.pettingzoo_adapters.GameAECEnv`, runs
:class:`~fedarena.marl.selfplay.SelfPlayPPO` (config section ``ppo``, ``env_steps`` learner moves), which has
no checkpoints.

Logged per PPO update: the learner's mean result against its self-play opponents, episodes, learner moves,
wall time, pool size, PPO diagnostics; every ``eval_every`` updates (and at the first and last) the win/draw/loss
rates against a uniformly random player and against the initial policy (snapshot 0) over ``eval_episodes``
games, and on tic-tac-toe against the minimax player plus the exact outcome probabilities of the greedy policy
against random and minimax (every game enumerated, :func:`~fedarena.marl.league.players.tictactoe_exact_results`).
The board backend evaluates the greedy policy, half the games from each seat; the PettingZoo backend samples the
policy from a random seat. The report plots these against episodes and wall time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fedarena.envs.pettingzoo_adapters import UnknownEnvError, make_env
from fedarena.envs.pettingzoo_batch import random_policy
from fedarena.marl.league.agent import AgentConfig
from fedarena.marl.selfplay import BoardSelfPlay, SelfPlayConfig, SelfPlayPPO, network_policy
from fedarena.platform.errors import RunError
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop
from fedarena.rl.ppo import PPOConfig

GAME_PREFIX = "game:"
BOARD_GAMES = {"tictactoe_v3": "tictactoe", "connect_four_v3": "connect_four"}


def board_game(env_id: str) -> str | None:
    """The :class:`~fedarena.envs.boardgames.BoardGameBatch` game of ``env_id``, or None for other envs."""
    name = env_id[len("pettingzoo.classic."):] if env_id.startswith("pettingzoo.classic.") else env_id
    return BOARD_GAMES.get(name)


def env_factory(env_id: str) -> Callable[[], Any]:
    """A constructor of the AEC env ``env_id`` (a PettingZoo id, or ``game:<fedarena/OpenSpiel game>``)."""
    if env_id.startswith(GAME_PREFIX):
        from fedarena.envs import load_game
        from fedarena.envs.pettingzoo_adapters import GameAECEnv

        game = load_game(env_id[len(GAME_PREFIX):])
        return lambda: GameAECEnv(game)
    make_env(env_id)  # raises UnknownEnvError early
    return lambda: make_env(env_id)


@dataclass(frozen=True)
class SelfPlayExperimentConfig(ExperimentConfig):
    env_id: str = param("pettingzoo.classic.tictactoe_v3", "turn-based PettingZoo env id, or game:<name> for a fedarena/OpenSpiel game")
    num_envs: int = param(16, "environment copies (boards)")
    updates: int = param(200, "board games: PPO updates")
    games_per_update: int = param(256, "board games: complete games per PPO update")
    agent: AgentConfig = param(doc="board games: the BoardAgent network and its PPO", factory=AgentConfig)
    env_steps: int = param(200_000, "other envs: learner moves (summed over copies)")
    ppo: PPOConfig = param(doc="other envs: PPO hyper-parameters (num_envs is set from the copies)", factory=PPOConfig)
    eval_every: int = param(10, "evaluate every this many PPO updates (and at the first and the last)")
    eval_episodes: int = param(200, "games per evaluation opponent")
    selfplay: SelfPlayConfig = param(doc="opponent sampling and snapshot pool", factory=SelfPlayConfig)

    def __post_init__(self) -> None:
        if board_game(self.env_id) is None:
            try:
                env_factory(self.env_id)
            except (UnknownEnvError, KeyError) as e:
                raise ValueError(str(e).strip("'\"")) from None
        for name in ("num_envs", "updates", "games_per_update", "env_steps", "eval_every", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")


def run_selfplay(cfg: SelfPlayExperimentConfig, run) -> dict[str, Any]:
    game = board_game(cfg.env_id)
    if game is not None:
        return run_board_selfplay(cfg, run, game)
    if run.resuming:
        raise RunError(f"--resume: the PettingZoo self-play backend ({cfg.env_id}) has no checkpoints; only "
                       f"{', '.join(BOARD_GAMES)} resume")
    return run_pettingzoo_selfplay(cfg, run)


def board_evaluation(sp: BoardSelfPlay, games: int, seed: int) -> dict[str, float]:
    """Greedy learner vs random, the initial policy and (tic-tac-toe) minimax, half the games from each seat;
    on tic-tac-toe also the exact outcome probabilities against random and minimax."""
    from fedarena.marl.league.players import evaluate, minimax_player, random_player, tictactoe_exact_results

    opponents: dict[str, Any] = {"vs_random": random_player(), "vs_initial": sp.initial_params}
    if sp.game == "tictactoe":
        opponents["vs_minimax"] = minimax_player()
    out: dict[str, float] = {}
    for name, opp in opponents.items():
        r = evaluate(sp.agent, sp.params, opp, sp.game, games, seed)
        out.update({f"{name}/win": r["win_rate"], f"{name}/draw": r["draw_rate"], f"{name}/loss": r["loss_rate"],
                    f"{name}/return": r["win_rate"] - r["loss_rate"]})
    if sp.game == "tictactoe":
        exact = tictactoe_exact_results(sp.agent, sp.params)
        for ref in ("random", "minimax"):
            for k in ("win", "draw", "loss"):
                out[f"exact_vs_{ref}/{k}"] = exact[f"{ref}_{k}"]
    return out


def run_board_selfplay(cfg: SelfPlayExperimentConfig, run, game: str) -> dict[str, Any]:
    return run_loop(run, _BoardSteps(cfg, game), eval_every=cfg.eval_every, eval_first=True)


class _BoardSteps:
    """Board-game self-play under :func:`~fedarena.platform.loop.run_loop`: a step is one PPO update on
    ``games_per_update`` self-play games; evaluations against random, the initial policy (and minimax)."""

    def __init__(self, cfg: SelfPlayExperimentConfig, game: str):
        self.cfg = cfg
        self.sp = BoardSelfPlay(game, cfg.num_envs, cfg.games_per_update, cfg.agent, cfg.selfplay, seed=cfg.seed)
        self.wall = 0.0
        self.last: dict[str, float] = {}
        self.desc, self.total = f"self-play {cfg.env_id}", cfg.updates

    def init(self) -> None:
        return None

    def load(self, step: int, state: dict[str, Any]) -> None:
        self.sp.load_state_dict(state["selfplay"])
        self.wall, self.last = float(state["wall"]), {k: float(v) for k, v in state["last_eval"].items()}
        if self.sp.updates != step:
            raise RunError(f"checkpoint of step {step} holds {self.sp.updates} updates")

    def state(self) -> dict[str, Any]:
        return {"selfplay": self.sp.state_dict(), "wall": self.wall, "last_eval": dict(self.last)}

    def done(self) -> bool:
        return self.sp.updates >= self.cfg.updates

    def units(self) -> int:
        return self.sp.updates

    def step(self, step: int) -> dict[str, Any]:
        sp = self.sp
        t0 = time.perf_counter()
        results, m = sp.iteration()
        self.wall += time.perf_counter() - t0
        return {"episodes": sp.episodes, "learner_moves": sp.learner_moves, "wall_time": self.wall,
                "pool_size": len(sp.pool), "selfplay_return": float(results.mean()),
                **{f"ppo/{k}": v for k, v in m.items()}}

    def evaluate(self, step: int) -> dict[str, float]:
        self.last = board_evaluation(self.sp, self.cfg.eval_episodes, seed=self.cfg.seed * 7919 + step)
        return self.last

    def summary(self) -> dict[str, Any]:
        sp = self.sp
        return {"env_id": self.cfg.env_id, "updates": sp.updates, "episodes": sp.episodes,
                "learner_moves": sp.learner_moves, "wall_seconds": self.wall, **self.last}


def run_pettingzoo_selfplay(cfg: SelfPlayExperimentConfig, run) -> dict[str, Any]:
    make = env_factory(cfg.env_id)
    sp = SelfPlayPPO(make, cfg.num_envs, cfg.ppo, cfg.selfplay, seed=cfg.seed, total_steps=cfg.env_steps)
    initial = network_policy(sp.ppo, sp.pool.snapshots[0].params, np.random.default_rng([cfg.seed, 7]))
    rand = random_policy(np.random.default_rng([cfg.seed, 8]))
    per_update = cfg.num_envs * sp.config.num_steps
    updates = -(-cfg.env_steps // per_update)
    wall = 0.0
    last: dict[str, float] = {}
    with run.progress(total=updates, desc=f"self-play {cfg.env_id}") as bar:
        for u in range(1, updates + 1):
            t0 = time.perf_counter()
            returns, m = sp.iteration()
            wall += time.perf_counter() - t0
            row: dict[str, Any] = {"episodes": sp.episodes, "learner_moves": sp.env_steps, "wall_time": wall,
                                   "pool_size": len(sp.pool), **{f"ppo/{k}": v for k, v in m.items()}}
            if len(returns):
                row["selfplay_return"] = float(returns.mean())
            if u % cfg.eval_every == 0 or u == updates or u == 1:
                for name, opp in (("vs_random", rand), ("vs_initial", initial)):
                    r = sp.evaluate(make, opp, cfg.eval_episodes, seed=cfg.seed * 7919 + u)
                    for k, v in r.items():
                        last[f"{name}/{k}"] = row[f"{name}/{k}"] = v
            run.log(u, **row)
            bar.update(1, win_vs_random=last.get("vs_random/win", float("nan")))
    return {"env_id": cfg.env_id, "updates": updates, "episodes": sp.episodes, "learner_moves": sp.env_steps,
            "wall_seconds": wall, **last}


def plots_selfplay(rows, cfg: SelfPlayExperimentConfig, report_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    ev = [r for r in rows if "vs_random/win" in r]
    for xkey, ax, xlabel in (("episodes", axes[0], "episodes"), ("wall_time", axes[1], "learner wall time (s)")):
        x = np.array([r[xkey] for r in ev], dtype=float)
        for name, style in (("vs_random", "-"), ("vs_initial", "--"), ("vs_minimax", ":")):
            if not ev or f"{name}/win" not in ev[0]:
                continue
            for outcome, color in (("win", "tab:green"), ("draw", "tab:gray"), ("loss", "tab:red")):
                ax.plot(x, [r[f"{name}/{outcome}"] for r in ev], style, color=color, lw=1.3,
                        label=f"{outcome} {name.replace('_', ' ')}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("rate")
        ax.set_ylim(-0.02, 1.02)
    sp = [r for r in rows if "selfplay_return" in r]
    axes[2].plot([r["episodes"] for r in sp], [r["selfplay_return"] for r in sp], lw=1.0, label="vs self-play opponents")
    axes[2].plot([r["episodes"] for r in ev], [r["vs_random/return"] for r in ev], "o-", ms=3, label="vs random")
    axes[2].set_xlabel("episodes")
    axes[2].set_ylabel("learner return")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    how = "greedy learner, both seats" if board_game(cfg.env_id) else "learner samples its policy, random seat"
    fig.suptitle(f"PPO self-play with a snapshot pool on {cfg.env_id} ({how})")
    fig.tight_layout()
    path = f"{report_dir}/selfplay.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


EXPERIMENT = Experiment(config=SelfPlayExperimentConfig, run=run_selfplay, plots=plots_selfplay)
