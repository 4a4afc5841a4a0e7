"""The simulation's execution backends on a 1.1M-parameter MLP round, in one run.

Task: scikit-learn digits upsampled to 32x32 (each pixel repeated 4x4; 1,797 examples of 1,024 features), split IID
over 50 clients (about 36 examples each), all 50 training every round; an MLP 1024-1024-64-10 (1,115,850
parameters), FedAvg with E = 1, B = 10, lr 0.05. Printed:

1. in-process (``backend="vmap"``) with the math library's default threads vs ``threads=1`` (threadpoolctl):
   seconds per round (after one untimed round that compiles the step);
2. Ray with 2 actors (``ray_workers=2``): seconds per round, and each actor's CPU share (its process's user +
   system CPU seconds during the timed rounds, from ``/proc/<pid>/stat``, over their wall time; on a loaded
   machine this is bounded by what the scheduler gives the process) and its part of the actors' CPU seconds
   (0.5 each when the work is split evenly), beside the in-process times;
3. peak memory of one in-process round with 50 clients, each in a fresh subprocess (the process's peak RSS,
   ``VmHWM`` of ``/proc/self/status``, after the backend's local training alone and after the whole round, and
   its RSS before the round), with ``max_stacked_clients`` 0 (one stack of 50 padded to 64) and 8.

Linux only (``/proc``).

The final models of the three backends are compared (max abs difference).

    python benchmarks/fedsim_backends.py [--rounds 2] [--skip-default-threads] [--skip-ray] [--skip-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from fedarena.federated import simulation as sim
from fedarena.federated import strategy as st
from fedarena.federated.data import load_digits

SIZES = (1024, 1024, 64, 10)
CLIENTS, EPOCHS, BATCH, LR = 50, 1, 10, 0.05


def task(seed: int = 0):
    x, y = load_digits()
    x = np.kron(x.reshape(-1, 8, 8), np.ones((4, 4), np.float32)).reshape(len(x), -1)  # 32x32, nearest neighbour
    perm = np.random.default_rng(seed).permutation(len(x))
    return np.ascontiguousarray(x, np.float32), y, [np.sort(p) for p in np.array_split(perm, CLIENTS)]


def simulation(**kw) -> sim.Simulation:
    x, y, train = task()
    return sim.Simulation(sim.BatchedMLP(SIZES), st.FedAvg(st.FitConfig(EPOCHS, BATCH, LR), clients_per_round=CLIENTS),
                          x, y, train, [f"c{i}" for i in range(CLIENTS)], 10, seed=0, eval_clients=False, **kw)


def timed(s: sim.Simulation, rounds: int, pids: list[int] | None = None):
    """(seconds per round of ``rounds`` rounds after one untimed round, final state, CPU share of each pid)."""
    state = s.init_state()
    state, _ = s.round(state)  # compiles the step (and starts the Ray actors)
    procs = pids() if callable(pids) else pids or []
    cpu0 = [_cpu_seconds(p) for p in procs]
    t0 = time.perf_counter()
    for _ in range(rounds):
        state, _ = s.round(state)
    wall = time.perf_counter() - t0
    shares = [(_cpu_seconds(p) - c) / wall for p, c in zip(procs, cpu0)]
    return wall / rounds, state, shares


def memory_child(max_stacked: int) -> None:
    s = simulation(max_stacked_clients=max_stacked, threads=1)
    state = s.init_state()
    before = _status_mb("VmRSS")
    s._train(state.params, s.client_ids, 0, s.strategy.configure(0, state), None)  # the backend's part alone
    train = _status_mb("VmHWM")
    s.round(state)
    print(json.dumps({"rss_before_mb": before, "train_peak_mb": train, "round_peak_mb": _status_mb("VmHWM")}))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (fields 14 and 15 of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_mb(field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident; unlike getrusage's ru_maxrss it is not inherited
    from the parent across fork and exec) of /proc/self/status, in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def memory(max_stacked: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, __file__, "--memory-child", str(max_stacked)], capture_output=True,
                          text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-1000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip-default-threads", action="store_true")
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child is not None:
        memory_child(args.memory_child)
        return 0
    n_params = sum(a * b + b for a, b in zip(SIZES[:-1], SIZES[1:]))
    print(f"MLP {SIZES} ({n_params:,} parameters), {CLIENTS} clients per round, E={EPOCHS}, B={BATCH}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    if not args.skip_memory:  # first, while this process is small
        for m in (0, 8):
            r = memory(m)
            print(f"one in-process round, {CLIENTS} clients, max_stacked_clients={m}: peak RSS {r['round_peak_mb']:.0f} "
                  f"MiB (after the local training alone {r['train_peak_mb']:.0f} MiB; before the round "
                  f"{r['rss_before_mb']:.0f} MiB)", flush=True)
    t_one, s_one, _ = timed(simulation(threads=1), args.rounds)
    print(f"in-process, threads=1:       {t_one:.2f} s/round", flush=True)
    if not args.skip_default_threads:
        t_default, s_default, _ = timed(simulation(), args.rounds)
        diff = max(float(np.max(np.abs(s_default.params[k] - s_one.params[k]))) for k in s_one.params)
        print(f"in-process, default threads: {t_default:.2f} s/round (default / 1 thread = {t_default / t_one:.2f}x; "
              f"max |default - 1 thread| of the final model {diff:.2e})", flush=True)
    if not args.skip_ray:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            s = simulation(backend="ray", ray_workers=2, ray_groups_per_task=0)
            t_ray, s_ray, shares = timed(s, args.rounds, pids=lambda: s._remote.pids())
            diff = max(float(np.max(np.abs(s_ray.params[k] - s_one.params[k]))) for k in s_one.params)
            print(f"ray, 2 actors:               {t_ray:.2f} s/round; CPU share per actor (CPU s / wall s) "
                  f"{', '.join(f'{v:.2f}' for v in shares)}, part of the actors' CPU s "
                  f"{', '.join(f'{v / max(sum(shares), 1e-12):.2f}' for v in shares)}; in-process 1 thread / ray = "
                  f"{t_one / t_ray:.2f}x; max |ray - in-process 1 thread| {diff:.2e}")
        finally:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
