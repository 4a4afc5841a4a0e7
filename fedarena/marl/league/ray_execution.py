"""The league on Ray (the MARL system figure: per agent a learner and rollout actors, a model store, an
evaluator and selector in the league manager, and a shared batching inference server):

- ``ManagerActor``: the :class:`~fedarena.marl.league.manager.LeagueManager` (roles, payoff, ratings, store
  writes), placed on the driver's node;
- ``InferenceActor``: one shared server for every opponent policy, a threaded actor holding one
  :class:`fedarena.rl.workers.InferenceServer` per policy (frozen snapshots loaded from the store with their
  checksum, learning players' weights pushed by their learners), so concurrent requests for one policy from
  many rollout actors share a forward pass; placed on the driver's node;
- ``LearnerActor`` per learning player: asks the manager for matches, spreads the games over its rollout
  actors, makes the PPO update, reports results and steps, snapshots / resets when the manager says so, and
  pushes its weights to the inference server;
- ``RolloutActor`` (``ray.rollout_actors`` per learner): steps its own batch of environments with the
  learner's weights for the learner's moves and the inference server for the opponents'.

Learner and rollout actors are spread over the cluster (``SPREAD``), restart when they die
(``max_restarts=-1``) and have their calls retried (``max_task_retries=-1``): a learner that comes back
loads its newest snapshot from the store (its optimizer starts fresh); a rollout actor needs no state.
A learner reports an iteration's games only after its update, so a killed iteration is replayed whole
rather than half-counted.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np
import ray
from fedarena import engine
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fedarena.marl.league.agent import AgentConfig, BoardAgent, Trajectories
from fedarena.marl.league.games import get_game
from fedarena.marl.league.manager import LeagueManager
from fedarena.marl.league.roles import RoleConfig
from fedarena.marl.league.store import SnapshotStore
from fedarena.marl.league.roles import MAIN
from fedarena.marl.league.training import (IterationResult, RoleThroughput, evaluate_snapshot, iteration_seq,
                                           learner_seed, split_results, with_references)
from fedarena.rl.distributions import Categorical
from fedarena.rl.workers import InferenceServer, Weights

LIVE = "live:"
REF = "ref:"   # a scripted reference player, built inside the rollout actor


def live_key(name: str) -> str:
    return LIVE + name


class ManagerActor:
    def __init__(self, roles: RoleConfig, store_root: str, initial_params, seed: int, decay: float,
                 draw_probability: float, state: dict | None = None) -> None:
        store = SnapshotStore(store_root)
        if state is not None:
            self.m = LeagueManager.from_state(state, roles, store)
        else:
            self.m = LeagueManager(roles, store, initial_params, seed, decay, draw_probability)
        self.live: dict[str, tuple[int, dict]] = {}

    def set_live(self, name: str, version: int, params: dict[str, np.ndarray]) -> None:
        """Learners' newest weights, kept here too so a restarted inference server gets them back."""
        self.live[name] = (version, params)

    def live_weights(self, name: str) -> tuple[int, dict] | None:
        return self.live.get(name)

    def roster(self) -> list[dict]:
        return [p.to_json() for p in self.m.players]

    def get_matches(self, learner: int, n: int) -> tuple[list[int], np.ndarray, dict, list[str], list[str | None]]:
        ids, probs, branches = self.m.get_matches(learner, n)
        keys, sums = [], []
        for i in ids:
            p = self.m.players[i]
            keys.append(live_key(p.name) if p.learning else p.snapshot)
            sums.append(None if p.learning else self.m.checksums[p.snapshot])
        return ids, probs, branches, keys, sums

    def finish_iteration(self, learner: int, seq: int, moves: int, results: list[tuple[int, int]]) -> bool:
        """Record an iteration's steps and games (once per sequence number ``seq``: a replayed report is
        ignored); True when the learner is due for a snapshot (it then sends its weights to :meth:`snapshot`,
        so weights cross the network only when a snapshot is taken)."""
        self.m.finish_iteration(learner, seq, moves, results)
        return self.m.snapshot_due(learner)

    def evaluation_work(self, learner: int) -> list[tuple[int, str, str, list[tuple[int, str, str]]]]:
        """The evaluator's pending work for ``learner``: per snapshot of it not yet evaluated, ``(id, name,
        checksum, [(id, name, checksum) of every other frozen player])``."""
        def ref(i: int) -> tuple[int, str, str]:
            name = self.m.players[i].snapshot
            return i, name, self.m.checksums[name]
        return [ref(new) + ([ref(j) for j in others],) for new, others in self.m.pending_evaluations(learner)]

    def report_evaluation(self, player: int, results: list[tuple[int, int, int]]) -> bool:
        return self.m.report_evaluation(player, results)

    def snapshot(self, learner: int, params: dict[str, np.ndarray]) -> tuple[str, bool]:
        ev = self.m.take_snapshot(learner, params)
        return ev.record.name, ev.reset

    def latest_snapshot(self, learner: int) -> tuple[str | None, str | None]:
        rec = self.m.latest_snapshot(learner)
        return (None, None) if rec is None else (rec.snapshot, self.m.checksums[rec.snapshot])

    def initial(self) -> tuple[str, str]:
        name = "initial-v0000"
        return name, self.m.checksums[name]

    def state_dict(self) -> dict:
        return self.m.state_dict()

    def nash_mixture(self, solver: str) -> tuple[list[int], np.ndarray]:
        return self.m.nash_mixture(solver=solver)

    def ratings_table(self) -> dict:
        return self.m.ratings_table()

    def games(self) -> int:
        return self.m.games


class InferenceActor:
    """Batched opponent actions for every policy of the league (threaded: requests run concurrently)."""

    def __init__(self, game: str, agent_config: AgentConfig, store_root: str, max_batch: int, deadline_s: float,
                 manager, capacity: int = 64, seed: int = 0, engine_threads: int = 1) -> None:
        engine.set_num_threads(engine_threads)
        g = get_game(game)
        self.agent = BoardAgent(g.observation_shape, g.num_actions, agent_config)
        self.shape, self.num_actions = g.observation_shape, g.num_actions
        self.store = SnapshotStore(store_root)
        self.manager = manager
        self.max_batch, self.deadline_s, self.capacity, self.seed = max_batch, deadline_s, capacity, seed
        self.servers: OrderedDict[str, InferenceServer] = OrderedDict()
        self.lock = threading.Lock()
        self.requests = 0

    def _forward(self, params, x: np.ndarray):
        d = int(np.prod(self.shape))
        obs = x[:, :d].reshape((-1,) + self.shape)
        mask = x[:, d:] > 0.5
        logits, value = self.agent.policy(params, obs, mask)
        return (logits,), value

    def _server(self, key: str, weights: Weights | None, checksum: str | None) -> InferenceServer:
        with self.lock:
            server = self.servers.get(key)
            if server is not None:
                self.servers.move_to_end(key)
                if weights is not None:
                    server.set_weights(weights)
                return server
            if weights is None:
                if key.startswith(LIVE):   # e.g. after a restart of this actor: the manager has them
                    live = ray.get(self.manager.live_weights.remote(key[len(LIVE):]))
                    if live is None:
                        raise KeyError(f"inference: no weights pushed yet for {key}")
                    weights = Weights(*live)
                else:
                    weights = Weights(0, self.store.load(key, checksum))
            server = InferenceServer(self._forward, Categorical(self.num_actions), weights, self.max_batch,
                                     self.deadline_s, seed=self.seed + len(self.servers) + self.requests)
            self.servers[key] = server
            while len(self.servers) > self.capacity:
                _, old = self.servers.popitem(last=False)
                old.stop()
            return server

    def set_live(self, name: str, version: int, params: dict[str, np.ndarray]) -> None:
        self._server(live_key(name), Weights(version, params), None)

    def infer(self, key: str, checksum: str | None, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        server = self._server(key, None, checksum)
        self.requests += 1
        x = np.concatenate([obs.reshape(len(obs), -1).astype(np.float32), mask.astype(np.float32)], axis=1)
        return server.infer(x)["action"]

    def stats(self) -> dict[str, int]:
        with self.lock:
            servers = list(self.servers.values())
        return {"policies": len(servers), "requests": self.requests,
                "batches": sum(s.batches_served for s in servers), "rows": sum(s.rows_served for s in servers)}


class RemotePolicy:
    """An opponent whose moves come from the shared inference server."""

    def __init__(self, server, key: str, checksum: str | None) -> None:
        self.server, self.key, self.checksum = server, key, checksum

    def __call__(self, obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return ray.get(self.server.infer.remote(self.key, self.checksum, obs, mask))


class RolloutActor:
    def __init__(self, game: str, agent_config: AgentConfig, num_envs: int, seed: int, server,
                 engine_threads: int = 1, store_root: str | None = None) -> None:
        engine.set_num_threads(engine_threads)
        self.game = get_game(game)
        self.agent = BoardAgent(self.game.observation_shape, self.game.num_actions, agent_config)
        self.env = self.game.make_env(num_envs, seed)
        self.server = server
        self.store = None if store_root is None else SnapshotStore(store_root)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def rollout(self, params, keys: list[str], checksums: list, probs: np.ndarray, num_games: int,
                seed: int) -> tuple[dict, list[tuple[int, float]], int]:
        opponents = [self.game.reference(k[len(REF):]) if k.startswith(REF) else RemotePolicy(self.server, k, c)
                     for k, c in zip(keys, checksums)]
        before = self.env.env_steps
        traj, results = self.game.play(self.agent, self.env, params, opponents, probs, num_games,
                                       np.random.default_rng(seed))
        return traj.arrays(), results, self.env.env_steps - before

    def evaluate(self, new: tuple[int, str, str], others: list[tuple[int, str, str]], num_games: int,
                 seed: int) -> list[tuple[int, int, int]]:
        """The evaluator's games: frozen ``new`` against each of ``others`` (``(id, snapshot, checksum)``, both
        loaded from the store), ``num_games`` each, as ``(home, away, result)``."""
        if self.store is None:
            raise ValueError("evaluate: this rollout actor has no snapshot store")
        params = {i: self.store.load(name, checksum) for i, name, checksum in [new, *others]}
        return evaluate_snapshot(self.game, self.agent, self.env, params.__getitem__, new[0],
                                 [j for j, _, _ in others], num_games, np.random.default_rng(seed))


class LearnerActor:
    def __init__(self, learner: int, name: str, role: str, game: str, agent_config: AgentConfig, seed: int,
                 store_root: str, manager, server, rollouts: list, state: dict | None = None,
                 references: tuple = (), engine_threads: int = 1, evaluator_games: int = 0) -> None:
        engine.set_num_threads(engine_threads)
        g = get_game(game)
        self.agent = BoardAgent(g.observation_shape, g.num_actions, agent_config)
        self.id, self.name, self.role, self.seed = learner, name, role, seed
        self.manager, self.server, self.rollouts = manager, server, rollouts
        self.references = tuple(references) if role == MAIN else ()
        self.evaluator_games = int(evaluator_games)
        self.store = SnapshotStore(store_root)
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self.iterations = 0
        init_name, init_sum = ray.get(manager.initial.remote())
        self._initial = (init_name, init_sum)
        if self.restarted:   # back after a crash: resume from the newest snapshot in the store
            snap, checksum = ray.get(manager.latest_snapshot.remote(learner))
            params = self._load(*(snap, checksum) if snap else self._initial)
            self.learner = self.agent.learner(params, learner_seed(seed, learner, 1 << 22))
        else:
            self.learner = self.agent.learner(self._load(*self._initial), learner_seed(seed, learner, 0))
            if state is not None:
                self.learner.load_state_dict(state["learner"])
                self.iterations = int(state["iterations"])
        self.version = self.iterations
        self._publish()

    def _publish(self) -> None:
        ray.get([self.manager.set_live.remote(self.name, self.version, self.learner.params),
                 self.server.set_live.remote(self.name, self.version, self.learner.params)])

    def _load(self, name: str, checksum: str) -> dict[str, np.ndarray]:
        return {k: np.array(v) for k, v in self.store.load(name, checksum).items()}

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def was_restarted(self) -> bool:
        return bool(self.restarted)

    def iteration(self, num_games: int, seq: int) -> dict[str, Any]:
        """One batch: play ``num_games`` on the rollout actors, update, report as number ``seq`` (a retried
        call reports the same number, which the manager counts once), snapshot / reset when due, and run the
        evaluator for this learner's snapshots not yet evaluated."""
        t0 = time.perf_counter()
        ids, probs, branches, keys, sums = ray.get(self.manager.get_matches.remote(self.id, num_games))
        if self.references:
            ids, probs = with_references(ids, probs, self.references)
            keys = keys + [REF + n for n, _ in self.references]
            sums = sums + [None] * len(self.references)
        n = len(self.rollouts)
        share = [num_games // n + (k < num_games % n) for k in range(n)]
        seeds = np.random.SeedSequence([self.seed, self.id, self.iterations]).generate_state(n)
        params = self.learner.params
        outs = ray.get([r.rollout.remote(params, keys, sums, probs, g, int(s))
                        for r, g, s in zip(self.rollouts, share, seeds) if g > 0])
        traj = Trajectories.concatenate([Trajectories(**o[0]) for o in outs])
        metrics = self.learner.update(traj)
        results, refs = split_results(ids, [x for o in outs for x in o[1]])
        snap, reset = None, False
        if ray.get(self.manager.finish_iteration.remote(self.id, seq, len(traj), results)):
            snap, reset = ray.get(self.manager.snapshot.remote(self.id, self.learner.params))
        eval_s = self._evaluate(seq) if self.evaluator_games else 0.0
        if reset:
            self.learner = self.agent.learner(self._load(*self._initial),
                                              learner_seed(self.seed, self.id, 1000 + self.iterations))
        self.iterations += 1
        self.version += 1
        self._publish()
        return {"learner": self.id, "role": self.role, "moves": len(traj), "references": refs,
                "games": len(results) + sum(len(v) for v in refs.values()),
                "env_steps": int(sum(o[2] for o in outs)), "metrics": metrics, "branches": branches,
                "results": results, "snapshot": snap, "reset": reset, "evaluator_seconds": eval_s,
                "seconds": time.perf_counter() - t0 - eval_s}

    def _evaluate(self, seq: int) -> float:
        """The evaluator for this learner's new snapshots (after a crash also those whose games were never
        reported), the opponents spread over the rollout actors; returns its seconds."""
        t0 = time.perf_counter()
        for new, name, checksum, others in ray.get(self.manager.evaluation_work.remote(self.id)):
            n = len(self.rollouts)
            parts = [others[k::n] for k in range(n)]
            seeds = np.random.SeedSequence([self.seed, self.id, new, 7]).generate_state(n)
            outs = ray.get([r.evaluate.remote((new, name, checksum), part, self.evaluator_games, int(s))
                            for r, part, s in zip(self.rollouts, parts, seeds) if part])
            ray.get(self.manager.report_evaluation.remote(new, [x for o in outs for x in o]))
        return time.perf_counter() - t0

    def params(self) -> dict[str, np.ndarray]:
        return self.learner.params

    def state_dict(self) -> dict:
        return {"learner": self.learner.state_dict(), "iterations": self.iterations}


def _here() -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


class RayLeague:
    """The driver's view of a league running on Ray: creates the actors, runs iterations (all learners in
    parallel), gathers state for checkpoints, and exposes the actor handles (tests kill them)."""

    def __init__(self, cfg, store_root: str, initial_params: dict[str, np.ndarray] | None,
                 state: dict | None = None) -> None:
        self.cfg = cfg
        self.store = SnapshotStore(store_root)
        restart = {"max_restarts": -1, "max_task_retries": -1}
        game = get_game(cfg.game)
        self.manager = ray.remote(ManagerActor).options(num_cpus=0, scheduling_strategy=_here()).remote(
            cfg.roles, store_root, initial_params, cfg.seed, cfg.payoff_decay, cfg.draw_probability,
            None if state is None else state["manager"])
        self.server = ray.remote(InferenceActor).options(
            num_cpus=0, max_concurrency=256, scheduling_strategy=_here(), **restart).remote(
            cfg.game, cfg.agent, store_root, cfg.ray.inference_max_batch, cfg.ray.inference_deadline_s,
            self.manager, seed=cfg.seed, engine_threads=cfg.engine_threads)
        roster = ray.get(self.manager.roster.remote())
        self.players = roster
        self.learner_ids = [p["id"] for p in roster if p["learning"]]
        self.rollouts: dict[int, list] = {}
        self.learners: dict[int, Any] = {}
        for i in self.learner_ids:
            p = roster[i]
            self.rollouts[i] = [ray.remote(RolloutActor).options(num_cpus=cfg.ray.actor_cpus, scheduling_strategy="SPREAD",
                                                                  **restart).remote(
                cfg.game, cfg.agent, cfg.num_envs, learner_seed(cfg.seed, i, 2000 + k), self.server, cfg.engine_threads,
                store_root)
                for k in range(cfg.ray.rollout_actors)]
        for i in self.learner_ids:
            p = roster[i]
            self.learners[i] = ray.remote(LearnerActor).options(num_cpus=cfg.ray.actor_cpus, scheduling_strategy="SPREAD",
                                                                 **restart).remote(
                i, p["name"], p["role"], cfg.game, cfg.agent, cfg.seed, store_root, self.manager, self.server,
                self.rollouts[i], None if state is None else state["learners"][str(i)],
                tuple((r.name, r.share) for r in cfg.reference_opponents), cfg.engine_threads, cfg.evaluator_games)
        ray.get([l.node_id.remote() for l in self.learners.values()])   # constructed (weights pushed)
        self.throughput = {p["role"]: RoleThroughput() for p in roster if p["learning"]}
        self.completed = 0   # iterations done (the learners' report sequence numbers derive from it)
        if state is not None:
            for k, d in state["throughput"].items():
                self.throughput[k] = RoleThroughput(**d)
            self.completed = int(state.get("completed", 0))
        self.game = game

    def batches(self, i: int) -> int:
        """PPO batches learner ``i`` plays per iteration (main agents ``main_agent_batches``)."""
        return self.cfg.main_agent_batches if self.players[i]["role"] == MAIN else 1

    def submit(self) -> list:
        """Start one iteration of every learner (in parallel; a main agent's batches in order on its actor);
        :meth:`collect` waits for them."""
        futures = [self.learners[i].iteration.remote(self.cfg.games_per_iteration,
                                                     iteration_seq(self.completed, self.batches(i), k))
                   for i in self.learner_ids for k in range(self.batches(i))]
        self.completed += 1
        return futures

    def iteration(self) -> list[IterationResult]:
        return self.collect(self.submit())

    def collect(self, futures: list) -> list[IterationResult]:
        outs = ray.get(futures)
        done = []
        for o in outs:
            tp = self.throughput[o["role"]]
            tp.env_steps += o["env_steps"]
            tp.moves += o["moves"]
            tp.games += o["games"]
            tp.updates += 1
            tp.seconds += o["seconds"]
            done.append(IterationResult(o["learner"], o["moves"], o["games"], o["env_steps"], o["results"],
                                        o["metrics"], o["branches"], o["seconds"], o["snapshot"], o["reset"],
                                        {"references": o["references"], "evaluator_seconds": o["evaluator_seconds"]}))
        return done

    def view(self) -> LeagueManager:
        """A read-only copy of the manager's current state (ratings, payoff, roster) in the driver."""
        return LeagueManager.from_state(self.manager_state(), self.cfg.roles, self.store, verify=False)

    def learner_params(self, i: int) -> dict[str, np.ndarray]:
        return ray.get(self.learners[i].params.remote())

    def manager_state(self) -> dict:
        return ray.get(self.manager.state_dict.remote())

    def state_dict(self) -> dict[str, Any]:
        return {"manager": self.manager_state(),
                "learners": {str(i): s for i, s in zip(self.learner_ids,
                                                        ray.get([self.learners[i].state_dict.remote() for i in self.learner_ids]))},
                "throughput": {k: v.to_json() for k, v in self.throughput.items()}, "completed": self.completed}

    def placement(self) -> dict[str, list[str]]:
        """Node id of every learner and rollout actor."""
        return {"learners": ray.get([l.node_id.remote() for l in self.learners.values()]),
                "rollouts": ray.get([r.node_id.remote() for rs in self.rollouts.values() for r in rs])}

    def shutdown(self) -> None:
        for a in [*self.learners.values(), *(r for rs in self.rollouts.values() for r in rs), self.server, self.manager]:
            ray.kill(a, no_restart=True)
