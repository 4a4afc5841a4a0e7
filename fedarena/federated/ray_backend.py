"""Ray backend of the simulation: each round's clients spread over Ray actors, balanced by work.

Every actor holds the batched trainer (:class:`fedarena.federated.simulation.BatchedModel`, rebuilt from its
``spec``) and one *shard* of the data: the clients are given home actors once, by longest-processing-time-first
(LPT, Graham 1969) over their example counts, and each actor's shard (its home clients' examples) is put in the
object store once. Each round the selected clients are assigned to actors again by LPT over their step counts
(a step costs the same everywhere), preferring a client's home actor among the equally loaded ones, and with
ties between other actors broken from a round-dependent start, so no actor is always first. A client trained
away from home travels with its examples (only that client's rows). An actor stacks its clients in groups of
similar step counts (at most ``max_stacked`` each) and trains every group with exactly the code of the
in-process backend on the group's own rows, so the same seed gives the same model up to the float32 rounding
that differs between stack sizes (:mod:`fedarena.federated.simulation`). Actors are placed with
Ray's ``SPREAD`` strategy, so a multi-node cluster gets clients on every node; :meth:`RayTrainer.nodes` says
where each actor runs.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterator, Sequence

import numpy as np

from fedarena.federated.simulation import make_group_plan, stacked_groups


def lpt_assign(work: Sequence[float], workers: int, home: Sequence[int] | None = None, start: int = 0) -> list[int]:
    """Worker of each job: jobs in decreasing ``work``, each to a least-loaded worker (LPT; makespan at most
    4/3 - 1/(3m) of the optimum). Among the least-loaded workers a job takes its ``home`` one when that is among
    them, else the first from ``start`` on (cyclically)."""
    load = [0.0] * workers
    out = [0] * len(work)
    for j in sorted(range(len(work)), key=lambda j: (-work[j], j)):
        least = min(load)
        tied = [w for w in range(workers) if load[w] == least]
        if home is not None and home[j] in tied:
            w = home[j]
        else:
            w = min(tied, key=lambda w: (w - start) % workers)
        out[j] = w
        load[w] += work[j]
    return out


class _Worker:
    def __init__(self, spec: tuple, x: np.ndarray, onehot: np.ndarray) -> None:
        from threadpoolctl import threadpool_limits

        from fedarena.federated.simulation import batched_model

        threadpool_limits(1)  # the actor reserves one CPU
        self.model = batched_model(spec)
        self.x, self.onehot = x, onehot

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        import os

        return os.getpid()

    def train(self, params, jobs, cfg):
        """``jobs``: (plan over the job's own rows, home rows of this shard, travelling rows x, y, corrections)."""
        out = []
        for plan, rows, ex, ey, corr in jobs:
            x, y = self.x[rows], self.onehot[rows]
            if len(ex):
                x, y = np.concatenate([x, ex]), np.concatenate([y, ey])
            out.append(self.model.train_group(params, plan, x, y, cfg, corr))
        return out


class RayTrainer:
    """``num_workers`` actors (default: one per CPU of the cluster, at most 8), each with 1 CPU and one shard of
    ``(x, onehot)``: the examples ``train[i]`` of its home clients."""

    def __init__(self, spec: tuple, x: np.ndarray, onehot: np.ndarray, train: Sequence[np.ndarray],
                 num_workers: int = 0) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("backend: the ray backend needs a running Ray instance (cluster.address)")
        n = num_workers or max(1, min(8, int(ray.cluster_resources().get("CPU", 1))))
        self.x, self.onehot, self.train = x, onehot, list(train)
        self.home = lpt_assign([len(t) for t in self.train], n)
        self.offset = np.zeros(len(self.train), np.int64)  # where client i's examples start in its home shard
        remote = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_Worker)
        self.workers = []
        for w in range(n):
            mine = [i for i in range(len(self.train)) if self.home[i] == w]
            sizes = [len(self.train[i]) for i in mine]
            self.offset[mine] = np.cumsum([0, *sizes[:-1]]) if mine else []
            rows = np.concatenate([self.train[i] for i in mine]) if mine else np.zeros(0, np.int64)
            self.workers.append(remote.remote(spec, ray.put(np.ascontiguousarray(x[rows])),
                                              ray.put(np.ascontiguousarray(onehot[rows]))))

    def nodes(self) -> list[str]:
        import ray

        return ray.get([w.node.remote() for w in self.workers])

    def pids(self) -> list[int]:
        """Process id of every actor (for resource accounting)."""
        import ray

        return ray.get([w.pid.remote() for w in self.workers])

    def assign(self, clients: Sequence[int], steps: Sequence[int], rnd: int) -> list[int]:
        """The actor of each of a round's ``clients`` (:func:`lpt_assign` over their steps)."""
        n = len(self.workers)
        return lpt_assign(steps, n, [self.home[i] for i in clients], start=rnd % n)

    def run(self, params, clients: Sequence[int], plans, allowed, steps, corrections, cfg, rnd: int,
            max_stacked: int = 0, groups_per_task: int = 1) -> Iterator[tuple[list[int], Any, np.ndarray]]:
        """Train a round's ``clients`` (positions into ``train``; ``plans``/``allowed``/``steps``/``corrections``
        per client as :meth:`Simulation._plans` makes them) over the actors; yields ``(positions in clients,
        stacked local parameters, losses)`` per stacked group."""
        import ray

        owner = self.assign(clients, steps, rnd)
        pref = ray.put(params)
        tasks = []  # (groups, future)
        for w, worker in enumerate(self.workers):
            mine = [j for j in range(len(clients)) if owner[j] == w]
            groups = [[mine[r] for r in g] for g in stacked_groups([steps[j] for j in mine], max_stacked)]
            jobs = [self._job(w, g, clients, plans, allowed, corrections, cfg, max_stacked) for g in groups]
            per = groups_per_task or max(1, len(jobs))
            for s in range(0, len(jobs), per):
                tasks.append((groups[s: s + per], worker.train.remote(pref, jobs[s: s + per], cfg)))
        for groups, future in tasks:
            for g, (stack, ls) in zip(groups, ray.get(future)):
                yield g, stack, ls

    def _job(self, w, g, clients, plans, allowed, corrections, cfg, max_stacked):
        """One group's job for actor ``w``: its plan indexes the group's own rows, home rows first."""
        home = [j for j in g if self.home[clients[j]] == w]
        away = [j for j in g if self.home[clients[j]] != w]
        rows = (np.concatenate([self.offset[clients[j]] + np.arange(len(self.train[clients[j]])) for j in home])
                if home else np.zeros(0, np.int64))
        glob = {}
        pos = 0
        for j in home + away:
            glob[j] = np.arange(pos, pos + len(self.train[clients[j]]))
            pos += len(glob[j])
        away_rows = np.concatenate([self.train[clients[j]] for j in away]) if away else np.zeros(0, np.int64)
        plan = make_group_plan([(glob[j], plans[j][1], plans[j][2]) for j in g], [allowed[j] for j in g],
                               cfg.batch_size, max_stacked)
        corr = None if corrections is None else [corrections[j] for j in g]
        return plan, rows, self.x[away_rows], self.onehot[away_rows], corr

    def close(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
