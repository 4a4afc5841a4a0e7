"""fedarena.engine (compiled numpy) vs JAX ``jit`` on CPU, measured in the same run.

The same PPO-sized workloads as ``engine_vs_torch.py`` (imported from it): (a) the PPO training
step (MLP 8 -> 64 -> 64 -> {policy 4, value 1}, batch 64, clipped surrogate + value + entropy,
backward, Adam) and (b) the actor's single-observation forward pass.  JAX runs the same
equations (Adam written out, as optax is not a dependency) under ``jax.jit`` with
``block_until_ready``; its XLA CPU client is pinned to one intra-op thread
(``--xla_cpu_multi_thread_eigen=false``), matching the engine's one BLAS thread.  Each framework
runs in its own worker process (so one framework's background threads are never charged to the
other; in one shared process XLA's threads added ~1 us to every 2.3 us engine forward call), and
the driver interleaves them: per round, a block of calls in ours, then in JAX.  The median
per-call time of each side is reported with the ratio's range over rounds; the first lines
print both sides' loss on the same batch.  ``--clock process`` (the default) counts the CPU time
of every thread of the worker (XLA's helper threads against JAX), ``thread`` only the calling
thread's, ``wall`` elapsed time.
``--first-call`` instead times the first call of the PPO step (trace, passes, native build) in
fresh processes: twice with an empty native-code cache, then once more reusing it.

Run:  python benchmarks/engine_vs_jax.py [--rounds 7] [--quick] [--clock process|thread|wall] [--first-call]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_vs_torch as B  # noqa: E402

from fedarena import engine  # noqa: E402


def jax_fns(jax, params):
    jnp = jax.numpy

    def mlp(p, obs):
        h = obs
        for layer in p["body"]:
            h = jnp.tanh(h @ layer["w"] + layer["b"])
        return h @ p["pi"]["w"] + p["pi"]["b"], (h @ p["v"]["w"] + p["v"]["b"])[:, 0]

    def loss_fn(p, obs, act, adv, logp_old, ret):
        logits, value = mlp(p, obs)
        logp_all = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(logp_all, act[:, None], axis=1)[:, 0]
        ratio = jnp.exp(logp - logp_old)
        pg = -jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - B.CLIP, 1 + B.CLIP) * adv))
        vl = 0.5 * jnp.mean((value - ret) ** 2)
        ent = -jnp.mean(jnp.sum(jnp.exp(logp_all) * logp_all, axis=1))
        return pg + B.VF_COEF * vl - B.ENT_COEF * ent

    b1, b2, eps = 0.9, 0.999, 1e-8

    @jax.jit
    def step(p, m, v, t, obs, act, adv, logp_old, ret):
        loss, g = jax.value_and_grad(loss_fn)(p, obs, act, adv, logp_old, ret)
        t = t + 1
        m = jax.tree_util.tree_map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
        v = jax.tree_util.tree_map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, v, g)
        c1, c2 = 1 - b1**t, 1 - b2**t
        p = jax.tree_util.tree_map(lambda p_, m_, v_: p_ - B.LR * (m_ / c1) / (jnp.sqrt(v_ / c2) + eps), p, m, v)
        return p, m, v, t, loss

    @jax.jit
    def forward(p, obs):
        logits, value = mlp(p, obs)
        return jax.nn.softmax(logits), value

    return step, forward


CLOCKS = {"process": time.process_time, "thread": time.thread_time, "wall": time.perf_counter}

_FIRST_CALL = """
import os, resource, sys, time
sys.path.insert(0, {here!r})
t0 = time.perf_counter()
import numpy as np
import engine_vs_torch as B
from fedarena import engine
rng = np.random.default_rng(0)
obs = rng.standard_normal((B.BATCH, B.OBS)).astype(np.float32)
act = rng.integers(0, B.ACT, B.BATCH).astype(np.int32)
adv = rng.standard_normal(B.BATCH).astype(np.float32)
p = B.ppo_init(0)
s = B.ppo_opt.init(p)
j = engine.jit(B.ppo_step)
def cpu():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
t1, c1 = time.perf_counter(), cpu()
j(p, s, obs, act, adv, adv, adv)
t2, c2 = time.perf_counter(), cpu()
print(t2 - t1, c2 - c1, type(j._fast[0][1]).__name__)
"""


def first_call() -> None:
    """The PPO step's first call in fresh processes, without and then with the native-code cache:
    wall time and CPU time of the process and its children (the C compiler)."""
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FEDARENA_NATIVE_CACHE=cache)
        for label in ("no cache", "no cache", "cached"):
            if label == "no cache":
                for f in os.listdir(cache):
                    os.remove(os.path.join(cache, f))
            out = subprocess.run([sys.executable, "-c", _FIRST_CALL.format(here=here)], env=env, capture_output=True, text=True, check=True)
            secs, cpu, kind = out.stdout.split()
            print(f"first call of the PPO step ({label:8s}): {float(secs) * 1e3:8.1f} ms wall, {float(cpu) * 1e3:8.1f} ms CPU (compiler included)  [{kind}]")


def _workloads(side: str):
    """The two timed callables of ``side`` ("ours" or "jax") on the shared data, and that side's first loss."""
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((B.BATCH, B.OBS)).astype(np.float32)
    act = rng.integers(0, B.ACT, B.BATCH).astype(np.int32)
    adv = rng.standard_normal(B.BATCH).astype(np.float32)
    logp_old = (np.log(1 / B.ACT) + 0.1 * rng.standard_normal(B.BATCH)).astype(np.float32)
    ret = rng.standard_normal(B.BATCH).astype(np.float32)
    batch = (obs, act, adv, logp_old, ret)
    params0 = B.ppo_init(0)
    obs1 = obs[:1].copy()
    if side == "ours":
        engine.set_num_threads(1)
        j_ppo = engine.jit(B.ppo_step)
        _, _, loss = j_ppo(params0, B.ppo_opt.init(params0), *batch)
        j_fwd = engine.jit(B.actor_forward)
        j_fwd(params0, obs1)
        st = {"p": params0, "s": B.ppo_opt.init(params0)}

        def ours_ppo():
            st["p"], st["s"], _ = j_ppo(st["p"], st["s"], *batch)

        def ours_fwd():
            j_fwd(st["p"], obs1)

        kinds = f"{type(j_ppo._fast[0][1]).__name__},{type(j_fwd._fast[0][1]).__name__}"
        return {"ppo": ours_ppo, "fwd": ours_fwd}, float(loss), kinds
    import jax

    jax.config.update("jax_platforms", "cpu")
    jnp = jax.numpy
    jstep, jfwd = jax_fns(jax, params0)
    jp = jax.tree_util.tree_map(jnp.asarray, params0)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, jp)
    jbatch = tuple(jnp.asarray(a) for a in batch)
    jobs1 = jnp.asarray(obs1)
    jst = {"p": jp, "m": zeros, "v": zeros, "t": jnp.asarray(0.0, jnp.float32)}
    loss = float(jstep(jp, zeros, zeros, jnp.asarray(0.0, jnp.float32), *jbatch)[-1])

    def jax_ppo():
        jst["p"], jst["m"], jst["v"], jst["t"], out = jstep(jst["p"], jst["m"], jst["v"], jst["t"], *jbatch)
        out.block_until_ready()

    def jax_fwd():
        jax.block_until_ready(jfwd(jst["p"], jobs1))

    return {"ppo": jax_ppo, "fwd": jax_fwd}, loss, f"JAX {jax.__version__}"


def worker(side: str, clock_name: str) -> None:
    """One framework in its own process: sets up, prints ``ready LOSS INFO``, then for each line ``KEY REPS``
    on stdin runs KEY's callable REPS times and prints the clock's seconds per call."""
    clock = CLOCKS[clock_name]
    fns, loss, info = _workloads(side)
    print(f"ready {loss!r} {info}", flush=True)
    for line in sys.stdin:
        key, reps = line.split()
        fn, n = fns[key], int(reps)
        t0 = clock()
        for _ in range(n):
            fn()
        print(repr((clock() - t0) / n), flush=True)


class _Side:
    def __init__(self, side: str, clock: str) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", side, "--clock", clock],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        head = self.proc.stdout.readline().split(maxsplit=2)
        if not head or head[0] != "ready":
            raise SystemExit(f"engine_vs_jax: the {side} worker failed to start (exit {self.proc.wait()})")
        self.loss, self.info = float(head[1]), head[2].strip()

    def run(self, key: str, reps: int) -> float:
        self.proc.stdin.write(f"{key} {reps}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="process")
    ap.add_argument("--first-call", action="store_true", help="time the PPO step's first call in fresh processes")
    ap.add_argument("--worker", choices=("ours", "jax"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.clock)
        return
    if args.first_call:
        first_call()
        return
    scale = 0.25 if args.quick else 1.0
    sides = {"ours": _Side("ours", args.clock), "jax": _Side("jax", args.clock)}
    try:
        keys = ("ppo", "fwd")
        reps = {"ppo": max(1, int(300 * scale)), "fwd": max(1, int(3000 * scale))}
        for k in keys:
            for side in sides.values():
                side.run(k, 20)
        samples = {k: {name: [] for name in sides} for k in keys}
        for _ in range(args.rounds):
            for k in keys:
                for name, side in sides.items():
                    samples[k][name].append(side.run(k, reps[k]))
    finally:
        for side in sides.values():
            side.close()
    ours, theirs = sides["ours"], sides["jax"]
    kinds = ours.info.split(",")
    print(f"fedarena.engine (numpy {np.__version__}, 1 BLAS thread) vs {theirs.info} jit (CPU, 1 intra-op thread), "
          "each in its own process")
    print(f"same loss: ours {ours.loss:.6f} vs JAX {theirs.loss:.6f}; median over {args.rounds} interleaved rounds, "
          f"clock {args.clock}")
    print(f"fedarena executables: PPO step {kinds[0]}, actor forward {kinds[1]}")
    names = {"ppo": "(a) PPO train step  B=64", "fwd": "(b) actor forward   B=1 "}
    targets = {"ppo": 3.0, "fwd": 20.0}
    print(f"{'':26s}{'ours':>12s}{'JAX jit':>12s}{'ratio':>8s}{'range':>16s}")
    for k in keys:
        o, t = samples[k]["ours"], samples[k]["jax"]
        ratios = [b / a for a, b in zip(o, t)]
        print(
            f"{names[k]:26s}{statistics.median(o) * 1e6:10.2f}us{statistics.median(t) * 1e6:10.1f}us"
            f"{statistics.median(ratios):7.2f}x{min(ratios):7.2f}x-{max(ratios):.2f}x   target >= {targets[k]}x"
        )
    print("ratio = JAX time / fedarena time (> 1: fedarena is faster)")


if __name__ == "__main__":
    main()
