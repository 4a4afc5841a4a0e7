"""Experiment kind ``league``: AlphaStar-style league training (roles, PFSP, snapshot store, payoff table,
Elo/TrueSkill) on tic-tac-toe, connect four or rock-paper-scissors (``rps_v2``), in one process
(``execution: local``) or on Ray (``execution: ray``: learner, rollout and inference-server actors, the
manager as an actor), with an optional imitation stage (behaviour cloning from a scripted expert) first.

Logged per iteration: league size, games, every player's Elo and TrueSkill, each role's env steps/s and
learner updates/s, PPO diagnostics of the main agent, matchmaking branches; every ``eval.every`` iterations
the main agents' win/draw/loss rates against the game's reference players (greedy, both seats); for
``rps`` the exact exploitability of the league's Nash mixture and of each main agent. The run folder
keeps the snapshot store (``snapshots/``) and the final payoff table (``payoff.json``); the report plots
ratings over time, the payoff heat map, win rates against the references, league size and throughput.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedarena.marl.league.agent import AgentConfig, BoardAgent
from fedarena.marl.league.games import GAMES, get_game, rps_exploitability
from fedarena.marl.league.manager import LeagueManager
from fedarena.marl.league.roles import MAIN, RoleConfig
from fedarena.marl.league.store import SnapshotStore
from fedarena.marl.league.training import LocalLeague
from fedarena.marl.meta_solvers import META_SOLVERS
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop

EXECUTIONS = ("local", "ray")


@dataclass(frozen=True)
class ImitationConfig:
    """AlphaStar's supervised stage: behaviour cloning from games of the game's scripted expert."""

    enabled: bool = param(False, "pre-train the initial weights by behaviour cloning before league RL")
    expert: str = param("", "expert player: '' for the game's strongest reference (minimax / one_ply); two_ply for connect four")
    games: int = param(2000, "expert self-play games in the dataset")
    explore: float = param(0.1, "probability of a random move in the dataset's games (states off the expert's path)")
    epochs: int = param(20, "passes over the dataset")
    lr: float = param(1e-3, "behaviour-cloning learning rate")

    def __post_init__(self) -> None:
        if self.games < 1 or self.epochs < 1 or self.lr <= 0 or not 0.0 <= self.explore <= 1.0:
            raise ValueError("imitation: need games >= 1, epochs >= 1, lr > 0 and explore in [0, 1]")


@dataclass(frozen=True)
class EvalConfig:
    every: int = param(10, "evaluate the main agents against the reference players every this many iterations")
    games: int = param(200, "games per reference opponent and evaluation (half from each seat)")
    greedy: bool = param(True, "the main agent plays its argmax move in evaluations")

    def __post_init__(self) -> None:
        if self.every < 1 or self.games < 2:
            raise ValueError("eval: need every >= 1 and games >= 2")


@dataclass(frozen=True)
class RayLeagueConfig:
    rollout_actors: int = param(1, "rollout actors per learner, each stepping its own batch of environments")
    inference_max_batch: int = param(2048, "shared inference server: rows per batched forward pass")
    inference_deadline_s: float = param(0.002, "shared inference server: longest wait for a fuller batch")
    actor_cpus: float = param(0.5, "CPUs reserved per learner / rollout actor")

    def __post_init__(self) -> None:
        if self.rollout_actors < 1 or self.inference_max_batch < 1 or self.inference_deadline_s < 0 or self.actor_cpus <= 0:
            raise ValueError("ray: need rollout_actors >= 1, inference_max_batch >= 1, inference_deadline_s >= 0, actor_cpus > 0")


@dataclass(frozen=True)
class ReferenceOpponent:
    """A scripted player that main agents meet in a fixed share of their training games (outside the league:
    not in the payoff table or the ratings)."""

    name: str = param("random", "reference player: random, minimax (tic-tac-toe), one_ply (connect four)")
    share: float = param(0.1, "share of each main agent's training games against it")


@dataclass(frozen=True)
class LeagueExperimentConfig(ExperimentConfig):
    game: str = param("tictactoe", f"league game: {', '.join(GAMES)}")
    execution: str = param("local", "local (one process) or ray (learner/rollout/inference/manager actors)")
    iterations: int = param(100, "league iterations; in each, every learning player plays a batch and updates once")
    games_per_iteration: int = param(256, "games each learning player plays per iteration (one PPO batch)")
    main_agent_batches: int = param(1, "PPO batches (of games_per_iteration games each) every main agent plays and "
                                       "learns from per iteration; exploiters play one")
    num_envs: int = param(128, "environments stepped together per learner (per rollout actor on Ray)")
    roles: RoleConfig = param(doc="league composition, matchmaking shares and snapshot rules (AlphaStar defaults)", factory=RoleConfig)
    agent: AgentConfig = param(doc="the learning agent (network and PPO)", factory=AgentConfig)
    payoff_decay: float = param(0.99, "decay of the payoff table's counts per game of a pair")
    draw_probability: float = param(0.1, "TrueSkill's prior draw probability")
    nash_solver: str = param("nash", "meta-solver for the league's mixture over frozen players")
    evaluator_games: int = param(0, "games of each new snapshot against every other frozen player, into the payoff table (0: none)")
    reference_opponents: list[ReferenceOpponent] = param(
        doc="scripted players main agents also train against, each a fixed share of their games (empty: league only)",
        factory=list)
    engine_threads: int = param(1, "engine (BLAS) threads per process; 1 is fastest for these small batches on a loaded machine")
    store_path: str = param("", "snapshot store folder ('' = <run folder>/snapshots; a shared path on a cluster)")
    imitation: ImitationConfig = param(doc="imitation pre-training", factory=ImitationConfig)
    eval: EvalConfig = param(doc="evaluation against reference players", factory=EvalConfig)
    ray: RayLeagueConfig = param(doc="Ray execution (execution: ray)", factory=RayLeagueConfig)

    def __post_init__(self) -> None:
        if self.game not in GAMES:
            raise ValueError(f"game: unknown league game '{self.game}'; known: {', '.join(GAMES)}")
        if self.execution not in EXECUTIONS:
            raise ValueError(f"execution: expected one of {', '.join(EXECUTIONS)}, got '{self.execution}'")
        for name in ("iterations", "games_per_iteration", "main_agent_batches", "num_envs", "engine_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.payoff_decay <= 1.0:
            raise ValueError(f"payoff_decay: expected a number in (0, 1], got {self.payoff_decay}")
        if not 0.0 <= self.draw_probability < 1.0:
            raise ValueError(f"draw_probability: expected a number in [0, 1), got {self.draw_probability}")
        if self.nash_solver not in META_SOLVERS:
            raise ValueError(f"nash_solver: unknown meta-solver '{self.nash_solver}'; known: {', '.join(sorted(META_SOLVERS))}")
        if self.evaluator_games < 0:
            raise ValueError(f"evaluator_games: must be >= 0, got {self.evaluator_games}")
        if self.execution == "ray" and not self.cluster.address:
            learners = self.roles.main_agents + self.roles.main_exploiters + self.roles.league_exploiters
            need = learners * (1 + self.ray.rollout_actors) * self.ray.actor_cpus
            if need > self.cluster.num_cpus + 1e-9:
                raise ValueError(f"ray.actor_cpus: {learners} learners x (1 + {self.ray.rollout_actors} rollout actors) "
                                 f"x {self.ray.actor_cpus} CPUs = {need:g} exceeds cluster.num_cpus = {self.cluster.num_cpus}; "
                                 "the actors could never all be placed")
        refs = get_game(self.game).references
        for k, r in enumerate(self.reference_opponents):
            if r.name not in refs:
                raise ValueError(f"reference_opponents[{k}].name: '{r.name}' is not a reference player of {self.game} "
                                 f"({', '.join(refs)})")
            if not 0.0 < r.share < 1.0:
                raise ValueError(f"reference_opponents[{k}].share: expected a number in (0, 1), got {r.share}")
        if sum(r.share for r in self.reference_opponents) >= 1.0:
            raise ValueError("reference_opponents: the shares must sum to less than 1 (league games need the rest)")
        if self.imitation.enabled and self.game == "rps":
            raise ValueError("imitation.enabled: rps has no scripted expert to imitate")
        if self.imitation.expert and self.imitation.expert not in ("random", "minimax", "one_ply", "two_ply"):
            raise ValueError(f"imitation.expert: unknown player '{self.imitation.expert}'")


def initial_params(cfg: LeagueExperimentConfig, agent: BoardAgent, log) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Random initial weights, or (imitation) weights cloned from the expert's games."""
    params = agent.init_params(cfg.seed)
    if not cfg.imitation.enabled:
        return params, {}
    from fedarena.marl.league.imitation import behaviour_clone, expert_dataset

    game = get_game(cfg.game)
    name = cfg.imitation.expert or game.references[-1]
    t0 = time.perf_counter()
    data = expert_dataset(cfg.game, game.reference(name), cfg.imitation.games, cfg.seed, explore=cfg.imitation.explore)
    params, metrics = behaviour_clone(agent, params, data, cfg.imitation.epochs, cfg.imitation.lr, cfg.seed)
    info = {f"imitation/{k}": float(v) for k, v in metrics.items()}
    info["imitation/positions"] = float(len(data["action"]))
    info["imitation/seconds"] = time.perf_counter() - t0
    log(f"imitation: {len(data['action'])} positions from {name}, metrics {metrics}")
    return params, info


def evaluate_mains(cfg, game, agent, manager, params_of, seed: int) -> dict[str, float]:
    """Main agents against the reference players; for rps the exact exploitability of the league's Nash
    mixture and of each main agent."""
    out: dict[str, float] = {}
    for i in [p.id for p in manager.players if p.learning and p.role == MAIN]:
        name = manager.players[i].name
        for ref in game.references:
            r = game.evaluate(agent, params_of(i), ref, cfg.eval.games, seed, greedy=cfg.eval.greedy)
            for k in ("win_rate", "draw_rate", "loss_rate"):
                out[f"eval/{name}/vs_{ref}/{k}"] = r[k]
        if cfg.game == "rps":
            out[f"exploitability/{name}"] = rps_exploitability(game.strategy(agent, params_of(i)))
    if cfg.game == "rps":
        # over every frozen player, and over the learned ones only (the snapshot of the initial weights, a
        # near-uniform policy at random initialisation, is already close to the equilibrium by itself)
        learned = [p.id for p in manager.players if not p.learning and p.step > 0]
        for suffix, ids in (("", manager.frozen), ("_learned", learned)):
            if not ids:
                out[f"exploitability/nash_mixture{suffix}"] = float("nan")
                continue
            ids, sigma = manager.nash_mixture(ids, solver=cfg.nash_solver)
            mix = sum(w * game.strategy(agent, manager.frozen_params(j)) for j, w in zip(ids, sigma))
            out[f"exploitability/nash_mixture{suffix}"] = rps_exploitability(mix)
            out[f"nash_mixture_support{suffix}"] = float((sigma > 1e-6).sum())
        out["exploitability/initial"] = rps_exploitability(game.strategy(agent, manager.initial_params()))
    return out


def league_row(manager: LeagueManager, throughput: dict, results, t_iter: float) -> dict[str, Any]:
    row: dict[str, Any] = {"league_size": len(manager.players), "frozen_players": len(manager.frozen),
                           "games": manager.games, "iteration_seconds": t_iter}
    table = manager.ratings_table()
    # every player's rating as one list in player-id order (players only join), learning players also as scalars
    row["elo"] = [table[p.name]["elo"] for p in manager.players]
    row["trueskill"] = [table[p.name]["trueskill_mu"] for p in manager.players]
    for p in manager.players:
        if p.learning:
            row[f"elo/{p.name}"] = table[p.name]["elo"]
            row[f"trueskill/{p.name}"] = table[p.name]["trueskill_mu"]
    for role, tp in throughput.items():
        for k, v in tp.rates().items():
            row[f"throughput/{role}/{k}"] = v
    row["env_steps"] = sum(tp.env_steps for tp in throughput.values())
    row["learner_updates"] = sum(tp.updates for tp in throughput.values())
    for res in results:
        if manager.role(res.learner) == MAIN and manager.players[res.learner].name.endswith("-0"):
            for k, v in res.metrics.items():
                row[f"ppo/{k}"] = float(v)
            for b, n in res.branches.items():
                row[f"branch/{b}"] = n / max(1, sum(res.branches.values()))
            won = [r for _, r in res.results]
            row["main_train_score"] = float(np.mean(won)) if won else float("nan")
            for name, rs in res.extra.get("references", {}).items():
                row[f"main_train_score/vs_{name}"] = float(np.mean(rs))
    row["snapshots_this_iteration"] = sum(r.snapshot is not None for r in results)
    return row


def write_payoff(run_dir: Path, manager: LeagueManager) -> None:
    data = {"players": [p.name for p in manager.players], "win_rate": manager.payoff.matrix().tolist(),
            "games": manager.payoff.total_games.tolist(), "ratings": manager.ratings_table()}
    (run_dir / "payoff.json").write_text(json.dumps(data))


class _LeagueSteps:
    """The league under :func:`~fedarena.platform.loop.run_loop`: a step is one league iteration of the
    in-process or Ray backend (every learner plays its batches and updates), the row its ratings, throughput
    and PPO diagnostics; the evaluation is :func:`evaluate_mains`.

    Loading a checkpoint first rolls the snapshot store back to the checkpoint's view (snapshots written after
    it are set aside), so a resume from any checkpoint replays the uninterrupted run. The backend (Ray actors)
    is built by :meth:`init` or :meth:`load`; :meth:`close` shuts it down.
    """

    def __init__(self, cfg: LeagueExperimentConfig, game, agent: BoardAgent, store: SnapshotStore, run_dir: Path,
                 log):
        self.cfg, self.game, self.agent, self.store, self.run_dir, self.log = cfg, game, agent, store, run_dir, log
        self.desc, self.total = f"league {cfg.game}", cfg.iterations
        self.league: Any = None
        self.extra: dict[str, float] = {}       # imitation metrics, logged with iteration 1
        self.last_eval: dict[str, float] = {}
        self._view: LeagueManager | None = None  # the manager as of the last step (the Ray league's is remote)

    def _build(self, init: dict[str, np.ndarray] | None, state: dict[str, Any] | None) -> None:
        cfg = self.cfg
        if cfg.execution == "ray":
            from fedarena.marl.league.ray_execution import RayLeague

            self.league = RayLeague(cfg, str(self.store.root), init, state)
            return
        if state is None:
            manager = LeagueManager(cfg.roles, self.store, init, cfg.seed, cfg.payoff_decay, cfg.draw_probability)
        else:
            manager = LeagueManager.from_state(state["manager"], cfg.roles, self.store)
        league = LocalLeague(self.game, self.agent, manager, cfg.num_envs, cfg.games_per_iteration, cfg.seed,
                             tuple((r.name, r.share) for r in cfg.reference_opponents), cfg.evaluator_games,
                             cfg.main_agent_batches)
        if state is not None:
            league.load_state_dict(state)
        self.league = league

    def init(self) -> None:
        init, self.extra = initial_params(self.cfg, self.agent, self.log)
        self._build(init, None)

    def load(self, step: int, state: dict[str, Any]) -> None:
        league, extra = dict(state["league"]), dict(state.get("extra", {}))
        league.setdefault("completed", step)   # one step is one iteration
        # roll the store back to the checkpoint's view: snapshots written after it move out of the league's way
        aside = self.store.set_aside(league["manager"]["checksums"])
        if aside is not None:
            self.log(f"snapshots written after the checkpoint of iteration {step} set aside in {aside}")
        if self.cfg.execution == "ray":   # what the actors need, checked before any is started
            missing = [p["name"] for p in league["manager"]["players"]
                       if p["learning"] and "learner" not in league["learners"].get(str(p["id"]), {})]
            if missing:
                raise KeyError(f"league state: no learner state for {', '.join(missing)}")
        self.extra = extra
        self._build(None, league)

    def state(self) -> dict[str, Any]:
        return {"league": self.league.state_dict(), "extra": self.extra}

    def done(self) -> bool:
        return self.league.completed >= self.cfg.iterations

    def units(self) -> int:
        return self.league.completed

    def step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        results = self.league.iteration()
        self._view = self.league.view()
        row = league_row(self._view, self.league.throughput, results, time.perf_counter() - t0)
        if step == 1:
            row.update(self.extra)
        return row

    def evaluate(self, step: int) -> dict[str, float]:
        assert self._view is not None
        self.last_eval = evaluate_mains(self.cfg, self.game, self.agent, self._view, self.league.learner_params,
                                        self.cfg.seed * 7919 + step)
        return self.last_eval

    def summary(self) -> dict[str, Any]:
        manager = self.league.view()
        write_payoff(self.run_dir, manager)
        out = summary(self.cfg, manager, self.league.throughput, self.last_eval, self.store)
        if self.cfg.game == "tictactoe":
            out.update(exact_results(self.agent, manager, self.league.learner_params))
        return out

    def close(self) -> None:
        if self.league is not None:
            self.league.shutdown()
            self.league = None


def run_league(cfg: LeagueExperimentConfig, run) -> dict[str, Any]:
    from fedarena import engine

    engine.set_num_threads(cfg.engine_threads)
    game = get_game(cfg.game)
    agent = BoardAgent(game.observation_shape, game.num_actions, cfg.agent)
    store = SnapshotStore(cfg.store_path or run.dir / "snapshots")
    steps = _LeagueSteps(cfg, game, agent, store, run.dir, run.logger.info)
    if cfg.execution == "ray":
        from fedarena.platform.cluster import ray_cluster

        with ray_cluster(cfg.cluster):
            return _run(run, steps, cfg)
    return _run(run, steps, cfg)


def _run(run, steps: _LeagueSteps, cfg: LeagueExperimentConfig) -> dict[str, Any]:
    try:
        return run_loop(run, steps, eval_every=cfg.eval.every, eval_first=True)
    finally:
        steps.close()


def summary(cfg, manager: LeagueManager, throughput: dict, last_eval: dict, store: SnapshotStore) -> dict[str, Any]:
    out: dict[str, Any] = {"game": cfg.game, "execution": cfg.execution, "league_size": len(manager.players),
                           "snapshots": len(store.names()), "games": manager.games}
    out.update(last_eval)
    for role, tp in throughput.items():
        for k, v in tp.rates().items():
            out[f"throughput/{role}/{k}"] = v
    return out


def exact_results(agent: BoardAgent, manager: LeagueManager, params_of) -> dict[str, float]:
    """Tic-tac-toe: the exact win/draw/loss probabilities of each main agent's greedy policy against the random
    and minimax players, averaged over the two seats (every game enumerated,
    :func:`~fedarena.marl.league.players.tictactoe_exact_results`)."""
    from fedarena.marl.league.players import tictactoe_exact_results

    out: dict[str, float] = {}
    for p in manager.players:
        if p.learning and p.role == MAIN:
            exact = tictactoe_exact_results(agent, params_of(p.id))
            for k, v in exact.items():
                if "seat" not in k:
                    ref, outcome = k.rsplit("_", 1)
                    out[f"exact/{p.name}/vs_{ref}/{outcome}_rate"] = float(v)
    return out


def plots_league(rows, cfg: LeagueExperimentConfig, report_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    steps = np.array([r["step"] for r in rows])
    fig, axes = plt.subplots(2, 4, figsize=(22, 9))
    payoff_path = Path(report_dir).parent / "payoff.json"
    data = json.loads(payoff_path.read_text()) if payoff_path.exists() else None
    names = data["players"] if data else []
    for ax, key, label in ((axes[0, 0], "elo", "Elo (openskill Bradley-Terry on the Elo scale)"),
                           (axes[0, 1], "trueskill", "TrueSkill mu")):
        n_players = max((len(r.get(key, [])) for r in rows), default=0)
        for i in range(n_players):
            pts = [(r["step"], r[key][i]) for r in rows if len(r.get(key, [])) > i]
            name = names[i] if i < len(names) else str(i)
            frozen = "-v" in name
            ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.6 if frozen else 2.0,
                    color="gray" if frozen else None, alpha=0.6 if frozen else 1.0, label=None if frozen else name)
        ax.set_title(f"{label}; gray: frozen snapshots")
        ax.set_xlabel("iteration")
        ax.legend(fontsize=7)
    ax = axes[0, 2]
    ev = [r for r in rows if any(k.startswith("eval/") for k in r)]
    for k in sorted({k for r in ev for k in r if k.startswith("eval/") and not k.endswith("draw_rate")}):
        ax.plot([r["step"] for r in ev if k in r], [r[k] for r in ev if k in r], "o-", ms=3,
                label=k[len("eval/"):].replace("/", " "))
    ex = [r for r in rows if "exploitability/nash_mixture" in r]
    if ex:
        ax.plot([r["step"] for r in ex], [r["exploitability/nash_mixture"] for r in ex], "k^-", ms=3,
                label="exploitability of the league's Nash mixture (all frozen players)")
        ax.plot([r["step"] for r in ex], [r.get("exploitability/nash_mixture_learned", np.nan) for r in ex], "ms-", ms=3,
                label="... of learned snapshots only (initial weights left out)")
        ax.plot([r["step"] for r in ex], [r.get("exploitability/main-0", np.nan) for r in ex], "c.-", ms=3,
                label="exploitability of main-0")
        ax.axhline(0.05, color="k", ls=":", lw=0.8)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("main agents vs reference players (greedy, both seats)" + (" / rps exploitability" if ex else ""))
    ax.set_xlabel("iteration")
    ax.legend(fontsize=6)
    ax = axes[1, 0]
    ax.plot(steps, [r["league_size"] for r in rows], label="players")
    ax.plot(steps, [r["frozen_players"] for r in rows], label="frozen snapshots")
    ax.set_title("league size")
    ax.set_xlabel("iteration")
    ax.legend(fontsize=7)
    for ax, suffix, label in ((axes[1, 1], "env_steps_per_s", "env steps/s"), (axes[1, 2], "updates_per_s", "learner updates/s")):
        for k in sorted({k for r in rows for k in r if k.startswith("throughput/") and k.endswith(suffix)}):
            ax.plot(steps, [r.get(k, np.nan) for r in rows], label=k.split("/")[1])
        ax.set_title(f"{label} per role (cumulative average)")
        ax.set_xlabel("iteration")
        ax.legend(fontsize=7)
    ax = axes[0, 3]
    if data:
        m = np.array(data["win_rate"])
        im = ax.imshow(m, vmin=0, vmax=1, cmap="RdBu")
        n = len(data["players"])
        step = max(1, n // 24)
        ax.set_xticks(range(0, n, step), [data["players"][i] for i in range(0, n, step)], rotation=90, fontsize=5)
        ax.set_yticks(range(0, n, step), [data["players"][i] for i in range(0, n, step)], fontsize=5)
        fig.colorbar(im, ax=ax, fraction=0.046)
        ax.set_title("payoff: win rate of row vs column (decayed counts)")
    ax = axes[1, 3]
    pp = [r for r in rows if "ppo/policy_loss" in r or "main_train_score" in r]
    if pp:
        ax.plot([r["step"] for r in pp], [r.get("main_train_score", np.nan) for r in pp], label="main-0 mean training result")
        for b in sorted({k for r in rows for k in r if k.startswith("branch/")}):
            ax.plot([r["step"] for r in rows], [r.get(b, 0.0) for r in rows], lw=0.8, label=f"share {b[len('branch/'):]}")
        ax.set_title("main-0: training result and matchmaking branches")
        ax.set_xlabel("iteration")
        ax.legend(fontsize=6)
    fig.suptitle(f"league on {cfg.game}: {cfg.roles.main_agents} main / {cfg.roles.main_exploiters} main exploiter / "
                 f"{cfg.roles.league_exploiters} league exploiter ({cfg.execution})")
    fig.tight_layout()
    path = f"{report_dir}/league.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
    return paths


EXPERIMENT = Experiment(config=LeagueExperimentConfig, run=run_league, plots=plots_league,
                        summary_keys=("league_size", "games"))
