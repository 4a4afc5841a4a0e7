"""MPE simple_spread throughput: fedarena's vectorised numpy env against JaxMARL (Rutherford et al., 2024)
and against mpe2 through fedarena's PettingZoo batch runner, in one run.

Counted: environment steps (one joint step of one copy) per CPU-second (``time.process_time``, so every
thread a library starts is charged), random actions drawn in the loop, ``--num-envs`` copies (1,024 by
default), episodes of 25 steps with resets. JaxMARL runs ``jit(vmap(step))`` inside ``lax.scan``, its
fastest form on CPU, in its own interpreter: JaxMARL pins its own jax/flax versions, so it lives in a
separate virtual environment, named by ``--jaxmarl-python`` or the ``FEDARENA_JAXMARL_PYTHON`` variable
(default ``/work/jaxmarl-venv/bin/python``; make it with ``python -m venv /work/jaxmarl-venv &&
/work/jaxmarl-venv/bin/pip install jaxmarl``). Without it that part is skipped with a message.

    PYTHONPATH=$PWD python benchmarks/marl_vs_jaxmarl.py [--num-envs 1024] [--steps 500]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

JAXMARL_SCRIPT = r"""
import json, sys, time
import jax, jax.numpy as jnp
from jaxmarl import make
n, steps = int(sys.argv[1]), int(sys.argv[2])
env = make("MPE_simple_spread_v3", max_steps=25)
agents = env.agents

def run(key, T):
    key, k = jax.random.split(key)
    obs, state = jax.vmap(env.reset)(jax.random.split(k, n))
    def body(carry, _):
        key, state = carry
        key, ka, ks = jax.random.split(key, 3)
        ka = jax.random.split(ka, len(agents))
        actions = {a: jax.random.randint(ka[i], (n,), 0, env.action_space(a).n) for i, a in enumerate(agents)}
        obs, state, rew, done, info = jax.vmap(env.step)(jax.random.split(ks, n), state, actions)
        return (key, state), rew[agents[0]].sum()
    (_, state), r = jax.lax.scan(body, (key, state), None, length=T)
    return r.sum()

f = jax.jit(run, static_argnums=1)
f(jax.random.PRNGKey(0), steps).block_until_ready()  # compile
c0, w0 = time.process_time(), time.perf_counter()
f(jax.random.PRNGKey(1), steps).block_until_ready()
print(json.dumps({"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0, "steps": n * steps,
                  "jax": jax.__version__, "devices": str(jax.devices())}))
"""


def fedarena_rate(n: int, steps: int) -> dict:
    from fedarena.envs.mpe import MPEVecEnv

    env = MPEVecEnv("simple_spread", n, max_cycles=25, seed=0)
    rng = np.random.default_rng(0)
    env.reset()
    done = 0
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        st = env.step([rng.integers(0, 5, n) for _ in range(env.num_agents)])
        if st.truncated[0, 0]:
            env.reset()
        done += n
    return {"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0, "steps": done}


def pettingzoo_rate(n: int, steps: int) -> dict:
    from mpe2 import simple_spread_v3

    from fedarena.envs.pettingzoo_batch import ParallelEnvBatch

    env = ParallelEnvBatch(lambda: simple_spread_v3.parallel_env(max_cycles=25), n, seed=0)
    rng = np.random.default_rng(0)
    env.reset()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        env.step(rng.integers(0, 5, (n, env.num_agents)))
    return {"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0, "steps": n * steps}


def jaxmarl_rate(python: str, n: int, steps: int) -> dict | str:
    if not os.path.exists(python):
        return f"no JaxMARL interpreter at {python} (set FEDARENA_JAXMARL_PYTHON or --jaxmarl-python)"
    out = subprocess.run([python, "-c", JAXMARL_SCRIPT, str(n), str(steps)], capture_output=True, text=True)
    if out.returncode != 0:
        return f"JaxMARL failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-envs", type=int, default=1024)
    p.add_argument("--steps", type=int, default=500, help="batched steps per measurement")
    p.add_argument("--pettingzoo-envs", type=int, default=16, help="copies for the mpe2 batch runner (slow)")
    p.add_argument("--pettingzoo-steps", type=int, default=100)
    p.add_argument("--jaxmarl-python", default=os.environ.get("FEDARENA_JAXMARL_PYTHON",
                                                              "/work/jaxmarl-venv/bin/python"))
    a = p.parse_args()
    rows = {"fedarena (numpy, vectorised)": fedarena_rate(a.num_envs, a.steps),
            "mpe2 via ParallelEnvBatch": pettingzoo_rate(a.pettingzoo_envs, a.pettingzoo_steps)}
    jm = jaxmarl_rate(a.jaxmarl_python, a.num_envs, a.steps)
    if isinstance(jm, str):
        print(f"JaxMARL skipped: {jm}")
    else:
        rows[f"JaxMARL (jax {jm['jax']}, jit+vmap+scan)"] = jm
    print(f"MPE simple_spread, random actions, {a.num_envs} copies ({a.pettingzoo_envs} for mpe2), "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'':42s} {'steps/CPU-s':>12s} {'steps/wall-s':>13s}")
    for name, r in rows.items():
        print(f"{name:42s} {r['steps'] / r['cpu']:12,.0f} {r['steps'] / r['wall']:13,.0f}")
    ours = rows["fedarena (numpy, vectorised)"]
    base = rows["mpe2 via ParallelEnvBatch"]
    print(f"fedarena / mpe2 batch runner, per CPU-second: {ours['steps'] / ours['cpu'] / (base['steps'] / base['cpu']):.1f}x")
    if not isinstance(jm, str):
        print(f"fedarena / JaxMARL, per CPU-second: {ours['steps'] / ours['cpu'] / (jm['steps'] / jm['cpu']):.2f}x "
              f"(per wall-second: {ours['steps'] / ours['wall'] / (jm['steps'] / jm['wall']):.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
