"""Experiment kinds for learning agents in extensive-form games:

- ``nfsp``: NFSP (Heinrich & Silver, 2016) in self-play, one run per seed in ``learner_seeds``; the exact
  exploitability of each seed's average policy is logged every ``eval_every`` episodes with the wall time,
  and the report plots it against episodes and wall time (mean and the range over seeds);
- ``psro_rl``: PSRO (Lanctot et al., 2017) with a DQN or PPO best-response oracle
  (:mod:`fedarena.marl.rl_oracles`), the exact exploitability of the joint policy per iteration, beside
  PSRO with the exact best-response oracle on the same game and meta-solver.

Both checkpoint their whole state (networks, optimizer states, replay and reservoir memories, populations)
and resume with ``fedarena run CONFIG --resume RUN_DIR``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedarena.envs import load_game
from fedarena.marl.exploitability import exploitability
from fedarena.marl.meta_solvers import META_SOLVERS
from fedarena.marl.nfsp import NFSP, NFSPConfig
from fedarena.marl.policy_export import evaluate_exported, export_policy
from fedarena.marl.psro import PSRO, check_meta_solver
from fedarena.marl.rl_oracles import DQNOracle, DQNOracleConfig, PPOOracle, PPOOracleConfig
from fedarena.platform.errors import ConfigError
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop


def _check_game(name: str) -> None:
    try:
        game = load_game(name)
    except (KeyError, TypeError) as e:
        raise ValueError(str(e).strip("'\"")) from None
    state = game.new_initial_state()
    if not hasattr(state, "information_state_tensor"):
        raise ValueError(f"game: '{name}' has no information-state tensor, which the networks read")


# ----------------------------------------------------------------------------- NFSP


@dataclass(frozen=True)
class NFSPExperimentConfig(ExperimentConfig):
    game: str = param("kuhn_poker", "game by name (kuhn_poker, leduc_poker, or an OpenSpiel game string with an "
                      "information-state tensor, e.g. liars_dice)")
    episodes: int = param(200_000, "training episodes per seed")
    eval_every: int = param(10_000, "episodes between exact exploitability evaluations")
    learner_seeds: list[int] | None = param(doc="one NFSP run per seed, in sequence inside this run (the report "
                                            "shows their spread); null: the run's `seed` alone, for the platform's "
                                            "`seeds`, which makes one run folder per seed instead",
                                            factory=lambda: [0, 1, 2])
    target_exploitability: float | None = param(None, "the summary's reached_target: every seed's final "
                                                "exploitability at most this (a seed group counts the seeds that "
                                                "reached it); null: no target")
    nfsp: NFSPConfig = param(doc="NFSP hyper-parameters (fedarena.marl.nfsp.NFSPConfig)", factory=NFSPConfig)

    def __post_init__(self) -> None:
        _check_game(self.game)
        if self.episodes < 1:
            raise ValueError(f"episodes: must be at least 1, got {self.episodes}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every: must be at least 1, got {self.eval_every}")
        if not self.seed_list or len(set(self.seed_list)) != len(self.seed_list):
            raise ValueError(f"learner_seeds: expected distinct seeds, got {self.learner_seeds}")
        if self.target_exploitability is not None and not self.target_exploitability > 0:
            raise ValueError(f"target_exploitability: must be positive or null, got {self.target_exploitability}")

    @property
    def seed_list(self) -> list[int]:
        """The learners' seeds: ``learner_seeds``, or the run's ``seed`` where it is null."""
        return list(self.learner_seeds) if self.learner_seeds is not None else [self.seed]


def run_nfsp(cfg: NFSPExperimentConfig, run: Any) -> dict[str, Any]:
    return run_loop(run, _NFSPSteps(cfg, run.dir))


class _NFSPSteps:
    """NFSP under :func:`~fedarena.platform.loop.run_loop`: the seeds of ``learner_seeds`` one after another, a step
    is ``eval_every`` episodes of the current seed followed by the exact exploitability of its average policy.

    The checkpoint holds the current seed's agent even when it has spent its budget (a resume may raise
    ``episodes``); the next seed's agent starts at the next step, and its row of episode 0 is logged with the
    step on which the previous seed ended.
    """

    def __init__(self, cfg: NFSPExperimentConfig, out_dir: Any):
        self.cfg, self.out_dir = cfg, Path(out_dir)
        self.game = load_game(cfg.game)
        self.desc = f"nfsp {cfg.game}"
        self.total = -(-cfg.episodes // cfg.eval_every) * len(cfg.seed_list)
        self.k, self.steps = 0, 0
        self.agent: NFSP | None = None
        self.following: NFSP | None = None  # the next seed's fresh agent, built when the current one ends
        self.times: dict[int, float] = {}   # seed index -> training wall time
        self.finals: dict[int, float] = {}  # seed index -> final exploitability

    def _fresh(self, k: int) -> tuple[NFSP, dict[str, Any]]:
        seed = self.cfg.seed_list[k]
        agent = NFSP(self.game, self.cfg.nfsp, seed=seed)
        row = {f"seed{seed}/exploitability": exploitability(self.game, agent.average_policy()),
               f"seed{seed}/episodes": 0, f"seed{seed}/train_time": 0.0}
        if len(self.cfg.seed_list) == 1:
            row.update({"exploitability": row[f"seed{seed}/exploitability"], "episodes": 0, "train_time": 0.0})
        return agent, row

    def init(self) -> dict[str, Any]:
        self.agent, row = self._fresh(0)
        self.times[0] = 0.0
        return row

    def load(self, step: int, state: dict[str, Any]) -> None:
        self.steps, self.k = step, int(state["seed_index"])
        if self.k >= len(self.cfg.seed_list):
            raise ConfigError(f"learner_seeds: the checkpoint (step {step}) is at seed #{self.k + 1}, but "
                              f"{self.cfg.seed_list} lists {len(self.cfg.seed_list)}; keep the seeds it ran")
        self.agent = NFSP(self.game, self.cfg.nfsp, seed=self.cfg.seed_list[self.k])
        self.agent.load_state_dict(state["agent"])
        self.times = {int(k): float(v) for k, v in state["train_time"].items()}
        self.finals = {int(k): float(v) for k, v in state["finals"].items()}

    def state(self) -> dict[str, Any]:
        assert self.agent is not None
        return {"seed_index": self.k, "agent": self.agent.state_dict(),
                "train_time": {str(j): t for j, t in self.times.items()},
                "finals": {str(j): v for j, v in self.finals.items()}}

    def _spent(self) -> bool:
        assert self.agent is not None
        return self.agent.episodes >= self.cfg.episodes

    def done(self) -> bool:
        return self.k >= len(self.cfg.seed_list) - 1 and self._spent()

    def units(self) -> int:
        return self.steps

    def step(self, step: int) -> dict[str, Any]:
        if self._spent():  # the current seed ended on the step before: the next one starts
            self.finals.setdefault(self.k, exploitability(self.game, self.agent.average_policy()))
            self.k += 1
            self.agent, self.following = self.following or self._fresh(self.k)[0], None
            self.times.setdefault(self.k, 0.0)
        agent, k, seed = self.agent, self.k, self.cfg.seed_list[self.k]
        t0 = time.perf_counter()
        agent.train(min(self.cfg.eval_every, self.cfg.episodes - agent.episodes))
        self.times[k] += time.perf_counter() - t0
        e = exploitability(self.game, agent.average_policy())
        self.steps = step
        row = {f"seed{seed}/exploitability": e, f"seed{seed}/episodes": agent.episodes,
               f"seed{seed}/train_time": self.times[k],
               f"seed{seed}/episodes_per_second": agent.episodes / max(self.times[k], 1e-9)}
        if len(self.cfg.seed_list) == 1:   # one learner (a seed group's run): plain names the group report shares
            row.update({"exploitability": e, "episodes": agent.episodes, "train_time": self.times[k]})
        if self._spent():
            self.finals[k] = e
            self._export()
            if k + 1 < len(self.cfg.seed_list):
                self.following, first = self._fresh(k + 1)
                row.update(first)
        return row

    def _export(self) -> None:
        """The current seed's average policy as ``policy_seed<seed>.json`` (:mod:`fedarena.marl.policy_export`)."""
        export_policy(self.out_dir / f"policy_seed{self.cfg.seed_list[self.k]}.json", self.cfg.game,
                      self.agent.average_policy(), algorithm="nfsp", episodes=self.agent.episodes)

    def summary(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.k not in self.finals:  # resumed with the seed already at its budget
            self.finals[self.k] = exploitability(self.game, self.agent.average_policy())
            self._export()
        done = [k for k in range(len(cfg.seed_list)) if k in self.finals]
        vals = np.array([self.finals[k] for k in done])
        total_time = sum(self.times.values())
        episodes = self.agent.episodes  # cfg.episodes, unless a resume lowered it below the checkpoint's count
        out = {"game": cfg.game, "episodes_per_seed": episodes, "seeds": list(cfg.seed_list),
               "exploitability_mean": float(vals.mean()), "exploitability_min": float(vals.min()),
               "exploitability_max": float(vals.max()), "exploitability_std": float(vals.std()),
               **{f"seed{cfg.seed_list[k]}/exploitability": self.finals[k] for k in done},
               "episodes_per_second": episodes * len(done) / max(total_time, 1e-9)}
        if len(done) == 1:
            out["exploitability"] = float(vals[0])
        if cfg.target_exploitability is not None:
            out["reached_target"] = bool(len(done) == len(cfg.seed_list) and vals.max() <= cfg.target_exploitability)
        return out


def plots_nfsp(rows, cfg: NFSPExperimentConfig, report_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    curves = []
    for s in cfg.seed_list:
        pts = [(r[f"seed{s}/episodes"], r[f"seed{s}/train_time"], r[f"seed{s}/exploitability"])
               for r in rows if f"seed{s}/exploitability" in r]
        if not pts:
            continue
        ep, wall, ex = (np.array(v, dtype=float) for v in zip(*pts))
        axes[0].plot(ep, ex, lw=1.0, alpha=0.7, label=f"seed {s}")
        axes[1].plot(wall, ex, lw=1.0, alpha=0.7, label=f"seed {s}")
        curves.append((ep, ex))
    if len(curves) > 1:
        n = min(len(c[0]) for c in curves)
        ep = curves[0][0][:n]
        stack = np.stack([c[1][:n] for c in curves])
        axes[0].plot(ep, stack.mean(axis=0), "k-", lw=2, label="mean over seeds")
        axes[0].fill_between(ep, stack.min(axis=0), stack.max(axis=0), color="k", alpha=0.12,
                             label="min-max over seeds")
    axes[0].set_xlabel("training episodes")
    axes[0].xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, 1M: long tick labels would overlap
    axes[1].set_xlabel("training wall time (s, evaluation excluded)")
    for ax in axes:
        ax.set_yscale("log")
        ax.set_ylabel("exact exploitability of the average policy")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    num_seeds = len(cfg.seed_list)
    fig.suptitle(f"NFSP on {cfg.game} ({cfg.nfsp.num_games} games per batch, "
                 f"{num_seeds} seed{'s' if num_seeds != 1 else ''})")
    fig.tight_layout()
    path = f"{report_dir}/exploitability.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


# ----------------------------------------------------------------------------- PSRO with RL oracles


@dataclass(frozen=True)
class PSRORLConfig(ExperimentConfig):
    game: str = param("kuhn_poker", "two-player game by name (kuhn_poker, leduc_poker)")
    iterations: int = param(30, "PSRO iterations (one new policy per player each)")
    meta_solver: str = param("nash", "meta-solver: nash, prd, regret_matching, uniform or last")
    oracle: str = param("dqn", "best-response oracle: dqn or ppo (ppo only where every action is always legal)")
    compare_exact: bool = param(True, "run PSRO with the exact best-response oracle beside it")
    dqn: DQNOracleConfig = param(doc="DQN oracle hyper-parameters", factory=DQNOracleConfig)
    ppo: PPOOracleConfig = param(doc="PPO oracle hyper-parameters", factory=PPOOracleConfig)

    def __post_init__(self) -> None:
        _check_game(self.game)
        if self.iterations < 1:
            raise ValueError(f"iterations: must be at least 1, got {self.iterations}")
        if self.meta_solver not in META_SOLVERS:
            raise ValueError(f"meta_solver: unknown meta-solver '{self.meta_solver}'; "
                             f"known: {', '.join(sorted(META_SOLVERS))}")
        if self.oracle not in ("dqn", "ppo"):
            raise ValueError(f"oracle: expected dqn or ppo, got '{self.oracle}'")
        if self.oracle == "ppo":
            from fedarena.envs.efg_vector import compile_tables

            if not compile_tables(load_game(self.game)).legal.all():
                raise ValueError(f"oracle: ppo has no action masks and {self.game} has illegal actions; use dqn")
        check_meta_solver(load_game(self.game), self.meta_solver)


def run_psro_rl(cfg: PSRORLConfig, run: Any) -> dict[str, Any]:
    return run_loop(run, _PSRORLSteps(cfg, run))


class _PSRORLSteps:
    """psro_rl under :func:`~fedarena.platform.loop.run_loop`: a step is one PSRO iteration with the RL oracle (and
    one with the exact oracle beside it), each followed by its exact exploitability."""

    def __init__(self, cfg: PSRORLConfig, run: Any):
        self.cfg, self.run = cfg, run
        game = load_game(cfg.game)
        self.oracle = DQNOracle(cfg.dqn, seed=cfg.seed) if cfg.oracle == "dqn" else PPOOracle(cfg.ppo, seed=cfg.seed)
        self.learned = PSRO(game, meta_solver=cfg.meta_solver, oracle=self.oracle)
        self.exact = PSRO(game, meta_solver=cfg.meta_solver) if cfg.compare_exact else None
        self.t_rl = self.t_ex = 0.0
        self.it, self.desc, self.total = 0, f"psro-{cfg.oracle} {cfg.game}", cfg.iterations

    def init(self) -> dict[str, Any]:
        row = {"rl/exploitability": self.learned.exploitability(), "rl/wall_time": 0.0, "rl/training_episodes": 0}
        if self.exact is not None:
            row.update({"exact/exploitability": self.exact.exploitability(), "exact/wall_time": 0.0})
        return row

    def load(self, step: int, state: dict[str, Any]) -> None:
        if self.exact is not None and "exact" not in state:
            raise ConfigError(f"compare_exact: the checkpoint (step {step}) holds no exact-oracle PSRO; resume with "
                              "compare_exact=false")
        self.it = step
        self.learned.load_state_dict(state["learned"])
        self.oracle.rng.bit_generator.state = state["oracle_rng"]
        self.oracle.training_episodes = int(state["training_episodes"])
        self.t_rl, self.t_ex = float(state["t_rl"]), float(state["t_ex"])
        if self.exact is not None:
            self.exact.load_state_dict(state["exact"])

    def state(self) -> dict[str, Any]:
        st = {"learned": self.learned.state_dict(), "oracle_rng": self.oracle.rng.bit_generator.state,
              "training_episodes": int(self.oracle.training_episodes), "t_rl": self.t_rl, "t_ex": self.t_ex}
        if self.exact is not None:
            st["exact"] = self.exact.state_dict()
        return st

    def done(self) -> bool:
        return self.it >= self.cfg.iterations

    def units(self) -> int:
        return self.it

    def step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.learned.iteration()
        self.t_rl += time.perf_counter() - t0
        row = {"rl/exploitability": self.learned.exploitability(), "rl/wall_time": self.t_rl,
               "rl/training_episodes": self.oracle.training_episodes}
        if self.exact is not None:
            t0 = time.perf_counter()
            self.exact.iteration()
            self.t_ex += time.perf_counter() - t0
            row.update({"exact/exploitability": self.exact.exploitability(), "exact/wall_time": self.t_ex})
        self.it = step
        return row

    def summary(self) -> dict[str, Any]:
        cfg, rows = self.cfg, [r for r in self.run.rows() if r["step"] > 0]
        rl = [r["rl/exploitability"] for r in rows if "rl/exploitability" in r]
        ex = [r["exact/exploitability"] for r in rows if "exact/exploitability" in r]
        below = [r["step"] for r in rows if r.get("rl/exploitability", 1.0) <= 0.05]
        return {"game": cfg.game, "oracle": cfg.oracle, "meta_solver": cfg.meta_solver, "iterations": self.it,
                "rl/exploitability": rl[-1] if rl else float("nan"),
                "exact/exploitability": (ex[-1] if ex else float("nan")) if self.exact is not None else None,
                "rl/first_iteration_at_most_0.05": below[0] if below else None,
                "rl/training_episodes": int(self.oracle.training_episodes), "rl/seconds": self.t_rl}


def plots_psro_rl(rows, cfg: PSRORLConfig, report_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    series = {f"PSRO, {cfg.oracle.upper()} oracle": "rl"}
    if cfg.compare_exact:
        series["PSRO, exact best-response oracle"] = "exact"
    for label, key in series.items():
        pts = [(r["step"], r[f"{key}/exploitability"], r[f"{key}/wall_time"], r.get("rl/training_episodes", np.nan))
               for r in rows if f"{key}/exploitability" in r]
        if not pts:
            continue
        it, ex, wall, eps = (np.array(v, dtype=float) for v in zip(*pts))
        ex = np.maximum(ex, 1e-6)
        axes[0].plot(it, ex, "o-", ms=3, lw=1.3, label=label)
        axes[2].plot(np.maximum(wall, 1e-4), ex, "o-", ms=3, lw=1.3, label=label)
        if key == "rl":
            axes[1].plot(np.maximum(eps, 1), ex, "o-", ms=3, lw=1.3, label=label)
    for ax in axes:
        ax.axhline(0.05, color="gray", ls="--", lw=1, label="0.05")
        ax.set_yscale("log")
        ax.set_ylabel("exact exploitability (floored at 1e-6)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    axes[0].set_xlabel("PSRO iteration")
    axes[1].set_xlabel("oracle training episodes (cumulative)")
    axes[1].set_xscale("log")
    axes[2].set_xlabel("wall time (s)")
    axes[2].set_xscale("log")
    fig.suptitle(f"PSRO ({cfg.meta_solver} meta-solver) on {cfg.game}: {cfg.oracle.upper()} vs exact best responses")
    fig.tight_layout()
    path = f"{report_dir}/exploitability.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


NFSP_EXPERIMENT = Experiment(config=NFSPExperimentConfig, run=run_nfsp, plots=plots_nfsp,
                             evaluate=evaluate_exported, x_axis="episodes", group_metrics=("exploitability",))
PSRO_RL_EXPERIMENT = Experiment(config=PSRORLConfig, run=run_psro_rl, plots=plots_psro_rl)
