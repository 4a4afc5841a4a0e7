"""Overcooked throughput: fedarena's vectorised numpy Overcooked (:mod:`fedarena.envs.overcooked`) against JaxMARL's
``overcooked`` (Rutherford et al., 2024), in one run.

Counted: environment steps (one joint step of one copy) per CPU-second (``time.process_time``, so every thread a
library starts is charged) and per wall-second, random actions drawn in the loop, ``--num-envs`` copies (1,024 by
default), 400-step episodes with resets, observations built every step (26 channels for both agents). JaxMARL runs
``jit(vmap(step))`` inside ``lax.scan`` (compiled before timing) in its own interpreter, named by
``--jaxmarl-python`` or ``FEDARENA_JAXMARL_PYTHON`` (default ``/work/jaxmarl-venv/bin/python``; make it with
``python -m venv /work/jaxmarl-venv && /work/jaxmarl-venv/bin/pip install jaxmarl``); without it that part is
skipped with a message.

    PYTHONPATH=$PWD python benchmarks/overcooked_vs_jaxmarl.py [--layout cramped_room] [--num-envs 1024] [--steps 400]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

JAXMARL_LAYOUT = {"cramped_room": "cramped_room", "asymmetric_advantages": "asymm_advantages"}

JAXMARL_SCRIPT = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import jax, jax.numpy as jnp
from jaxmarl import make
from jaxmarl.environments.overcooked import overcooked_layouts
n, steps, layout = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
env = make("overcooked", layout=overcooked_layouts[layout], max_steps=400)
agents = env.agents

def run(key, T):
    key, k = jax.random.split(key)
    obs, state = jax.vmap(env.reset)(jax.random.split(k, n))
    def body(carry, _):
        key, state = carry
        key, ka, ks = jax.random.split(key, 3)
        ka = jax.random.split(ka, len(agents))
        actions = {a: jax.random.randint(ka[i], (n,), 0, 6) for i, a in enumerate(agents)}
        obs, state, rew, done, info = jax.vmap(env.step)(jax.random.split(ks, n), state, actions)
        return (key, state), rew[agents[0]].sum() + obs[agents[0]].sum()
    (_, state), r = jax.lax.scan(body, (key, state), None, length=T)
    return r.sum()

f = jax.jit(run, static_argnums=1)
f(jax.random.PRNGKey(0), steps).block_until_ready()  # compile
c0, w0 = time.process_time(), time.perf_counter()
f(jax.random.PRNGKey(1), steps).block_until_ready()
print(json.dumps({"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0, "steps": n * steps,
                  "jax": jax.__version__, "devices": str(jax.devices())}))
"""


def fedarena_rate(layout: str, n: int, steps: int) -> dict:
    from fedarena.envs.overcooked import OvercookedVecEnv

    env = OvercookedVecEnv(f"overcooked.{layout}", n, max_cycles=400, seed=0)
    rng = np.random.default_rng(0)
    env.reset()
    done = 0
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        st = env.step([rng.integers(0, 6, n), rng.integers(0, 6, n)])
        if st.truncated[0, 0]:
            env.reset()
        done += n
    return {"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0, "steps": done}


def jaxmarl_rate(python: str, layout: str, n: int, steps: int) -> dict | str:
    if not os.path.exists(python):
        return f"no JaxMARL interpreter at {python} (set FEDARENA_JAXMARL_PYTHON or --jaxmarl-python)"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run([python, "-c", JAXMARL_SCRIPT, str(n), str(steps), JAXMARL_LAYOUT[layout]],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return f"JaxMARL failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layout", default="cramped_room", choices=list(JAXMARL_LAYOUT))
    p.add_argument("--num-envs", type=int, default=1024)
    p.add_argument("--steps", type=int, default=400, help="batched steps per measurement")
    p.add_argument("--jaxmarl-python", default=os.environ.get("FEDARENA_JAXMARL_PYTHON",
                                                              "/work/jaxmarl-venv/bin/python"))
    a = p.parse_args()
    rows = {"fedarena (numpy, vectorised)": fedarena_rate(a.layout, a.num_envs, a.steps)}
    jm = jaxmarl_rate(a.jaxmarl_python, a.layout, a.num_envs, a.steps)
    if isinstance(jm, str):
        print(f"JaxMARL skipped: {jm}")
    else:
        rows[f"JaxMARL (jax {jm['jax']}, jit+vmap+scan)"] = jm
    print(f"Overcooked {a.layout}, random actions, {a.num_envs} copies, load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(f"{'':42s} {'steps/CPU-s':>12s} {'steps/wall-s':>13s}")
    for name, r in rows.items():
        print(f"{name:42s} {r['steps'] / r['cpu']:12,.0f} {r['steps'] / r['wall']:13,.0f}")
    if not isinstance(jm, str):
        ours = rows["fedarena (numpy, vectorised)"]
        print(f"fedarena / JaxMARL, per CPU-second: {ours['steps'] / ours['cpu'] / (jm['steps'] / jm['cpu']):.2f}x "
              f"(per wall-second: {ours['steps'] / ours['wall'] / (jm['steps'] / jm['wall']):.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
