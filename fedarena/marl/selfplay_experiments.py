"""Experiment kind ``selfplay_ppo``: masked PPO self-play with a pool of past snapshots on a turn-based
PettingZoo game (``pettingzoo.classic.tictactoe_v3``, ``connect_four_v3``, or a fedarena game wrapped by
:class:`~fedarena.envs.pettingzoo_adapters.GameAECEnv` via ``game:<name>``).

Logged per PPO update: the learner's mean return against its self-play opponents, episodes, learner moves,
wall time, pool size, PPO diagnostics; every ``eval_every`` updates the win/draw/loss rates of the learner
(sampling its policy, random seat) against a uniformly random player and against the initial policy
(snapshot 0). The report plots these against episodes and wall time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fedarena.envs.pettingzoo_adapters import UnknownEnvError, make_env
from fedarena.envs.pettingzoo_batch import random_policy
from fedarena.marl.selfplay import SelfPlayConfig, SelfPlayPPO, network_policy
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.rl.ppo import PPOConfig

GAME_PREFIX = "game:"


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
    num_envs: int = param(16, "environment copies")
    env_steps: int = param(200_000, "learner moves (summed over copies)")
    eval_every: int = param(10, "evaluate every this many PPO updates (and at the end)")
    eval_episodes: int = param(200, "episodes per evaluation opponent")
    selfplay: SelfPlayConfig = param(doc="opponent sampling and snapshot pool", factory=SelfPlayConfig)
    ppo: PPOConfig = param(doc="PPO hyper-parameters (num_envs is set from the copies)", factory=PPOConfig)

    def __post_init__(self) -> None:
        try:
            env_factory(self.env_id)
        except (UnknownEnvError, KeyError) as e:
            raise ValueError(str(e).strip("'\"")) from None
        for name in ("num_envs", "env_steps", "eval_every", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")


def run_selfplay(cfg: SelfPlayExperimentConfig, run) -> dict[str, Any]:
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
        for name, style in (("vs_random", "-"), ("vs_initial", "--")):
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
    fig.suptitle(f"PPO self-play with a snapshot pool on {cfg.env_id} (learner samples its policy, random seat)")
    fig.tight_layout()
    path = f"{report_dir}/selfplay.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


EXPERIMENT = Experiment(config=SelfPlayExperimentConfig, run=run_selfplay, plots=plots_selfplay)
