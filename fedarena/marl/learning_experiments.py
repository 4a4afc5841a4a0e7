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
from typing import Any

import numpy as np

from fedarena.envs import load_game
from fedarena.marl.exploitability import exploitability
from fedarena.marl.policy_export import evaluate_exported, export_policy
from fedarena.marl.meta_solvers import META_SOLVERS
from fedarena.marl.nfsp import NFSP, NFSPConfig
from fedarena.marl.psro import PSRO, check_meta_solver
from fedarena.marl.rl_oracles import DQNOracle, DQNOracleConfig, PPOOracle, PPOOracleConfig
from fedarena.platform.experiment import Experiment, ExperimentConfig, param


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
    game: str = param("kuhn_poker", "game by name (kuhn_poker, leduc_poker)")
    episodes: int = param(200_000, "training episodes per seed")
    eval_every: int = param(10_000, "episodes between exact exploitability evaluations")
    learner_seeds: list[int] = param(doc="one NFSP run per seed, in sequence inside this run (the report shows "
                                     "their spread); the platform's `seeds` makes one run folder per seed instead",
                                     factory=lambda: [0, 1, 2])
    nfsp: NFSPConfig = param(doc="NFSP hyper-parameters (fedarena.marl.nfsp.NFSPConfig)", factory=NFSPConfig)

    def __post_init__(self) -> None:
        _check_game(self.game)
        if self.episodes < 1:
            raise ValueError(f"episodes: must be at least 1, got {self.episodes}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every: must be at least 1, got {self.eval_every}")
        if not self.learner_seeds or len(set(self.learner_seeds)) != len(self.learner_seeds):
            raise ValueError(f"learner_seeds: expected distinct seeds, got {self.learner_seeds}")


def run_nfsp(cfg: NFSPExperimentConfig, run: Any) -> dict[str, Any]:
    game = load_game(cfg.game)
    evals = -(-cfg.episodes // cfg.eval_every)
    step, first, agent_state = 0, 0, None
    times: dict[int, float] = {}     # seed index -> training wall time
    finals: dict[int, float] = {}    # seed index -> final exploitability
    restored = run.restore()
    if restored:
        step, state = restored
        first, agent_state = int(state["seed_index"]), state["agent"]
        times = {int(k): float(v) for k, v in state["train_time"].items()}
        finals = {int(k): float(v) for k, v in state["finals"].items()}
    with run.progress(total=evals * len(cfg.learner_seeds), initial=step, desc=f"nfsp {cfg.game}") as bar:
        for k in range(first, len(cfg.learner_seeds)):
            seed = cfg.learner_seeds[k]
            agent = NFSP(game, cfg.nfsp, seed=seed)
            if agent_state:
                agent.load_state_dict(agent_state)
                agent_state = None
            else:
                times[k] = 0.0
                run.log(step, **{f"seed{seed}/exploitability": exploitability(game, agent.average_policy()),
                                 f"seed{seed}/episodes": 0, f"seed{seed}/train_time": 0.0})
            while agent.episodes < cfg.episodes:
                t0 = time.perf_counter()
                agent.train(min(cfg.eval_every, cfg.episodes - agent.episodes))
                times[k] += time.perf_counter() - t0
                e = exploitability(game, agent.average_policy())
                step += 1
                run.log(step, **{f"seed{seed}/exploitability": e, f"seed{seed}/episodes": agent.episodes,
                                 f"seed{seed}/train_time": times[k],
                                 f"seed{seed}/episodes_per_second": agent.episodes / max(times[k], 1e-9)})
                last = agent.episodes >= cfg.episodes
                if last:
                    finals[k] = e
                if run.should_checkpoint(step) or last:  # the agent is kept: a resume may raise `episodes`
                    run.save_checkpoint(step, {"seed_index": k, "agent": agent.state_dict(),
                                               "train_time": {str(j): t for j, t in times.items()},
                                               "finals": {str(j): v for j, v in finals.items()}})
                bar.update(1, seed=seed, expl=e)
            if k not in finals:  # resumed with the seed already at its budget
                finals[k] = exploitability(game, agent.average_policy())
                bar.update(0)
            export_policy(run.dir / f"policy_seed{seed}.json", cfg.game, agent.average_policy(),  # one per seed
                          algorithm="nfsp", episodes=cfg.episodes)
    vals = np.array([finals[k] for k in range(len(cfg.learner_seeds))])
    total_time = sum(times.values())
    return {"game": cfg.game, "episodes_per_seed": cfg.episodes, "seeds": list(cfg.learner_seeds),
            "exploitability_mean": float(vals.mean()), "exploitability_min": float(vals.min()),
            "exploitability_max": float(vals.max()), "exploitability_std": float(vals.std()),
            **{f"seed{s}/exploitability": finals[k] for k, s in enumerate(cfg.learner_seeds)},
            "episodes_per_second": cfg.episodes * len(cfg.learner_seeds) / max(total_time, 1e-9)}


def plots_nfsp(rows, cfg: NFSPExperimentConfig, report_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    curves = []
    for s in cfg.learner_seeds:
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
    num_seeds = len(cfg.learner_seeds)
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
    game = load_game(cfg.game)
    oracle = DQNOracle(cfg.dqn, seed=cfg.seed) if cfg.oracle == "dqn" else PPOOracle(cfg.ppo, seed=cfg.seed)
    learned = PSRO(game, meta_solver=cfg.meta_solver, oracle=oracle)
    exact = PSRO(game, meta_solver=cfg.meta_solver) if cfg.compare_exact else None
    t_rl = t_ex = 0.0
    start = 0
    restored = run.restore()
    if restored:
        start, state = restored
        learned.load_state_dict(state["learned"])
        oracle.rng.bit_generator.state = state["oracle_rng"]
        oracle.training_episodes = int(state["training_episodes"])
        t_rl, t_ex = float(state["t_rl"]), float(state["t_ex"])
        if exact is not None:
            exact.load_state_dict(state["exact"])
    else:
        row = {"rl/exploitability": learned.exploitability(), "rl/wall_time": 0.0, "rl/training_episodes": 0}
        if exact is not None:
            row.update({"exact/exploitability": exact.exploitability(), "exact/wall_time": 0.0})
        run.log(0, **row)
    e_rl = e_ex = float("nan")
    first_below = None
    with run.progress(total=cfg.iterations, initial=start, desc=f"psro-{cfg.oracle} {cfg.game}") as bar:
        for it in range(start + 1, cfg.iterations + 1):
            t0 = time.perf_counter()
            learned.iteration()
            t_rl += time.perf_counter() - t0
            e_rl = learned.exploitability()
            row = {"rl/exploitability": e_rl, "rl/wall_time": t_rl, "rl/training_episodes": oracle.training_episodes}
            if exact is not None:
                t0 = time.perf_counter()
                exact.iteration()
                t_ex += time.perf_counter() - t0
                e_ex = exact.exploitability()
                row.update({"exact/exploitability": e_ex, "exact/wall_time": t_ex})
            run.log(it, **row)
            if first_below is None and e_rl <= 0.05:
                first_below = it
            if run.should_checkpoint(it) or it == cfg.iterations:
                st = {"learned": learned.state_dict(), "oracle_rng": oracle.rng.bit_generator.state,
                      "training_episodes": int(oracle.training_episodes), "t_rl": t_rl, "t_ex": t_ex}
                if exact is not None:
                    st["exact"] = exact.state_dict()
                run.save_checkpoint(it, st)
            bar.update(1, rl=e_rl, exact=e_ex)
    return {"game": cfg.game, "oracle": cfg.oracle, "meta_solver": cfg.meta_solver, "iterations": cfg.iterations,
            "rl/exploitability": e_rl, "exact/exploitability": e_ex if exact is not None else None,
            "rl/first_iteration_at_most_0.05": first_below, "rl/training_episodes": int(oracle.training_episodes),
            "rl/seconds": t_rl}


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
                             evaluate=evaluate_exported)
PSRO_RL_EXPERIMENT = Experiment(config=PSRORLConfig, run=run_psro_rl, plots=plots_psro_rl)
