"""MPE simple_spread: fedarena against JaxMARL (Rutherford et al., 2024) in one run -- environment throughput
(fedarena's vectorised numpy env, JaxMARL, and mpe2 through fedarena's PettingZoo batch runner) and, with
``--train``, IPPO training.

Counted: environment steps (one joint step of one copy) per CPU-second (``time.process_time``, so every
thread a library starts is charged), random actions drawn in the loop, ``--num-envs`` copies (1,024 by
default), episodes of 25 steps with resets. JaxMARL runs ``jit(vmap(step))`` inside ``lax.scan``, its
fastest form on CPU, in its own interpreter: JaxMARL pins its own jax/flax versions, so it lives in a
separate virtual environment, named by ``--jaxmarl-python`` or the ``FEDARENA_JAXMARL_PYTHON`` variable
(default ``/work/jaxmarl-venv/bin/python``; make it with ``python -m venv /work/jaxmarl-venv &&
/work/jaxmarl-venv/bin/pip install jaxmarl``). Without it that part is skipped with a message.

    PYTHONPATH=$PWD python benchmarks/marl_vs_jaxmarl.py [--num-envs 1024] [--steps 500]
    PYTHONPATH=$PWD python benchmarks/marl_vs_jaxmarl.py --train [--train-steps 512000] [--seeds 0 1 2]

``--train``: IPPO (de Witt et al., 2020; one network shared by the agents) on simple_spread with the
hyper-parameters of JaxMARL's published IPPO config for it (``baselines/IPPO/config/ippo_ff_mpe.yaml``:
16 envs, 128-step rollouts, Adam 2.5e-4 annealed linearly to 0, 4 epochs of 4 minibatches, gamma 0.99,
GAE lambda 0.95, clip 0.2, entropy 0.01, value coefficient 0.5, gradient norm 0.5, two tanh layers of 64 for
the actor and for the critic, orthogonal init), on both sides, with ``--train-steps`` environment steps per
seed instead of the config's 1e7. JaxMARL's baseline scripts are not part of its pip package, so the JaxMARL
side is that algorithm (PureJaxRL-style: one ``jit`` of rollout scan, GAE scan and the epoch/minibatch
scans per update) written here on JaxMARL's own environment, jax, flax and optax; fedarena's side is
``fedarena.marl.independent.IndependentPPO`` on ``fedarena.envs.mpe``, treating the 25-step limit as terminal
as JaxMARL's baseline does (``bootstrap_truncated=False``; ``--bootstrap-truncated`` bootstraps it from the
value of the last observation instead, fedarena's default). Known difference: fedarena's shared network also
sees a one-hot agent id and the (all-ones) action mask. Logged per update: the mean team return (mean over
agents of the summed rewards) of the training episodes that ended in the rollout. Reported per side: the return over the last ``--window`` updates at the same environment steps,
mean and seed range, the wall and CPU time (JaxMARL: after compiling, which is reported apart) until the
return over ``--window`` updates first reaches ``--threshold`` (mean over the seeds that reach it), and the
wall and CPU time of the whole budget, per seed. Seeds run one after the other in one process
per side.
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


JAXMARL_IPPO = r"""
import json, sys, time
import flax.linen as nn
import jax, jax.numpy as jnp
import optax
from jaxmarl import make

hp = json.loads(sys.argv[1])
env = make("MPE_simple_spread_v3", max_steps=25)
agents = env.agents
M, N, T = len(agents), hp["num_envs"], hp["num_steps"]
A = env.action_space(agents[0]).n
U = hp["total_steps"] // (N * T)
rows = M * N * T
mb = rows // hp["num_minibatches"]


class Tower(nn.Module):
    out: int
    scale: float

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.orthogonal
        for _ in range(2):
            x = jnp.tanh(nn.Dense(64, kernel_init=init(2 ** 0.5), bias_init=nn.initializers.zeros)(x))
        return nn.Dense(self.out, kernel_init=init(self.scale), bias_init=nn.initializers.zeros)(x)


class ActorCritic(nn.Module):
    @nn.compact
    def __call__(self, x):
        return Tower(A, 0.01)(x), Tower(1, 1.0)(x)[..., 0]


net = ActorCritic()
per_update = hp["num_minibatches"] * hp["update_epochs"]
lr = lambda count: hp["lr"] * (1.0 - (count // per_update) / U)
tx = optax.chain(optax.clip_by_global_norm(hp["max_grad_norm"]), optax.adam(lr, eps=1e-5))


def stacked(d):
    return jnp.stack([d[a] for a in agents])  # (M, N, ...)


def loss_fn(params, x, action, logp_old, value_old, adv, target):
    logits, value = net.apply(params, x)
    logp_all = jax.nn.log_softmax(logits)
    logp = jnp.take_along_axis(logp_all, action[:, None], axis=1)[:, 0]
    entropy = -(jnp.exp(logp_all) * logp_all).sum(axis=1).mean()
    v_clip = value_old + jnp.clip(value - value_old, -hp["clip"], hp["clip"])
    v_loss = 0.5 * jnp.maximum((value - target) ** 2, (v_clip - target) ** 2).mean()
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = jnp.exp(logp - logp_old)
    pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - hp["clip"], 1 + hp["clip"]) * adv).mean()
    return pg + hp["vf_coef"] * v_loss - hp["ent_coef"] * entropy


def update(params, opt_state, env_state, obs, ep_ret, key):
    def env_step(carry, _):
        params, env_state, obs, ep_ret, key = carry
        key, ka, ks = jax.random.split(key, 3)
        x = obs.reshape(M * N, -1)
        logits, value = net.apply(params, x)
        action = jax.random.categorical(ka, logits)
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=1)[:, 0]
        acts = {a: action.reshape(M, N)[i] for i, a in enumerate(agents)}
        obs2, env_state, rew, done, _ = jax.vmap(env.step)(jax.random.split(ks, N), env_state, acts)
        r, d = stacked(rew), stacked(done)
        ep_ret = ep_ret + r.mean(axis=0)
        end = done["__all__"]
        out = (x, action, logp, value, r.reshape(-1), d.reshape(-1).astype(jnp.float32),
               jnp.where(end, ep_ret, 0.0).sum(), end.sum())
        return (params, env_state, stacked(obs2), jnp.where(end, 0.0, ep_ret), key), out

    (params, env_state, obs, ep_ret, key), traj = jax.lax.scan(env_step, (params, env_state, obs, ep_ret, key),
                                                               None, T)
    x, action, logp, value, reward, done, ret_sum, ret_n = traj
    _, last_value = net.apply(params, obs.reshape(M * N, -1))

    def gae_step(carry, t):
        gae, next_value = carry
        v, r, d = t
        delta = r + hp["gamma"] * next_value * (1 - d) - v
        gae = delta + hp["gamma"] * hp["gae_lambda"] * (1 - d) * gae
        return (gae, v), gae

    _, adv = jax.lax.scan(gae_step, (jnp.zeros_like(last_value), last_value), (value, reward, done), reverse=True)
    target = adv + value
    data = jax.tree.map(lambda a: a.reshape((rows,) + a.shape[2:]), (x, action, logp, value, adv, target))

    def epoch(carry, _):
        params, opt_state, key = carry
        key, kp = jax.random.split(key)
        perm = jax.random.permutation(kp, rows)
        batches = jax.tree.map(lambda a: a[perm].reshape((hp["num_minibatches"], mb) + a.shape[1:]), data)

        def minibatch(carry, b):
            params, opt_state = carry
            grads = jax.grad(loss_fn)(params, *b)
            step, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, step), opt_state), None

        (params, opt_state), _ = jax.lax.scan(minibatch, (params, opt_state), batches)
        return (params, opt_state, key), None

    (params, opt_state, key), _ = jax.lax.scan(epoch, (params, opt_state, key), None, hp["update_epochs"])
    return params, opt_state, env_state, obs, ep_ret, key, ret_sum.sum(), ret_n.sum()


out = {"jax": jax.__version__, "devices": str(jax.devices()), "seeds": {}}
compiled = None
for seed in hp["seeds"]:
    key = jax.random.PRNGKey(seed)
    key, k_init, k_reset = jax.random.split(key, 3)
    params = net.init(k_init, jnp.zeros(env.observation_space(agents[0]).shape))
    opt_state = tx.init(params)
    obs, env_state = jax.vmap(env.reset)(jax.random.split(k_reset, N))
    args = (params, opt_state, env_state, stacked(obs), jnp.zeros(N), key)
    if compiled is None:
        c0, w0 = time.process_time(), time.perf_counter()
        compiled = jax.jit(update).lower(*args).compile()
        out["compile_cpu"], out["compile_wall"] = time.process_time() - c0, time.perf_counter() - w0
    rows_out = []
    c0, w0 = time.process_time(), time.perf_counter()
    for u in range(U):
        *args, s, n = compiled(*args)
        n = int(n)
        rows_out.append([(u + 1) * N * T, float(s) / n if n else None, time.perf_counter() - w0,
                         time.process_time() - c0])
    out["seeds"][str(seed)] = rows_out
print(json.dumps(out))
"""

IPPO_HP = {"num_envs": 16, "num_steps": 128, "lr": 2.5e-4, "update_epochs": 4, "num_minibatches": 4, "gamma": 0.99,
           "gae_lambda": 0.95, "clip": 0.2, "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.5}
"""JaxMARL's baselines/IPPO/config/ippo_ff_mpe.yaml (MPE_simple_spread_v3), less its TOTAL_TIMESTEPS 1e7."""


def fedarena_ippo(seeds: list[int], total_steps: int, bootstrap_truncated: bool = False) -> dict:
    from fedarena import engine
    from fedarena.envs.mpe.batch import MPEBatch
    from fedarena.marl.independent import IndependentPPO
    from fedarena.rl.ppo import PPOConfig

    engine.set_num_threads(1)
    hp = IPPO_HP
    cfg = PPOConfig(num_envs=hp["num_envs"], num_steps=hp["num_steps"], learning_rate=hp["lr"], anneal_lr=True,
                    update_epochs=hp["update_epochs"], num_minibatches=hp["num_minibatches"], gamma=hp["gamma"],
                    gae_lambda=hp["gae_lambda"], clip_coef=hp["clip"], clip_vloss=True, ent_coef=hp["ent_coef"],
                    vf_coef=hp["vf_coef"], max_grad_norm=hp["max_grad_norm"], hidden=(64, 64), activation="tanh")
    out: dict = {"seeds": {}}
    for seed in seeds:
        env = MPEBatch("mpe2.simple_spread_v3", hp["num_envs"], seed=seed, max_cycles=25)
        ippo = IndependentPPO(env, cfg, shared=True, seed=seed, total_steps=total_steps,
                              bootstrap_truncated=bootstrap_truncated)
        rows = []
        c0, w0 = time.process_time(), time.perf_counter()
        while ippo.env_steps < total_steps:
            r, _ = ippo.iteration()
            rows.append([ippo.env_steps, float(r.mean()) if len(r) else None, time.perf_counter() - w0,
                         time.process_time() - c0])
        out["seeds"][str(seed)] = rows
    return out


def jaxmarl_ippo(python: str, seeds: list[int], total_steps: int) -> dict | str:
    if not os.path.exists(python):
        return f"no JaxMARL interpreter at {python} (set FEDARENA_JAXMARL_PYTHON or --jaxmarl-python)"
    hp = dict(IPPO_HP, seeds=seeds, total_steps=total_steps)
    out = subprocess.run([python, "-c", JAXMARL_IPPO, json.dumps(hp)], capture_output=True, text=True)
    if out.returncode != 0:
        return f"JaxMARL failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def _windowed(rows: list, window: int) -> list[tuple[int, float, float, float]]:
    """(env steps, mean return over the last ``window`` updates with finished episodes, wall, cpu) per update."""
    out, recent = [], []
    for steps, ret, wall, cpu in rows:
        if ret is not None:
            recent = (recent + [ret])[-window:]
        if len(recent) == window:
            out.append((steps, float(np.mean(recent)), wall, cpu))
    return out


def _mean(xs: list[float]) -> float:
    """Mean over the seeds that reached the threshold (nan when none did)."""
    hit = [x for x in xs if np.isfinite(x)]
    return float(np.mean(hit)) if hit else float("nan")


def report_training(sides: dict, window: int, threshold: float) -> None:
    print(f"IPPO on simple_spread, JaxMARL's ippo_ff_mpe hyper-parameters; return = mean over the last {window} "
          f"updates of the training episodes' team return")
    print(f"{'':10s} {'env steps':>10s} {'return mean':>12s} {'seed min..max':>16s} {'wall to ' + str(threshold):>14s} "
          f"{'CPU to ' + str(threshold):>13s} {'wall total':>11s} {'CPU total':>10s}")
    for name, res in sides.items():
        finals, walls, cpus, totals, cpu_totals = [], [], [], [], []
        for seed, rows in res["seeds"].items():
            w = _windowed(rows, window)
            finals.append(w[-1][1])
            hit = next((r for r in w if r[1] >= threshold), None)
            walls.append(hit[2] if hit else float("nan"))
            cpus.append(hit[3] if hit else float("nan"))
            totals.append(rows[-1][2])
            cpu_totals.append(rows[-1][3])
        steps = next(iter(res["seeds"].values()))[-1][0]
        print(f"{name:10s} {steps:10,d} {np.mean(finals):12.2f} {min(finals):7.2f}..{max(finals):7.2f} "
              f"{_mean(walls):13.1f}s {_mean(cpus):12.1f}s {np.mean(totals):10.1f}s {np.mean(cpu_totals):9.1f}s   "
              "per seed: " + ", ".join(f"{f:.2f} ({w:.0f}s)" for f, w in zip(finals, walls))
              + f"; seeds reaching it: {sum(np.isfinite(walls))}/{len(walls)}")
        for frac in (0.25, 0.5):  # the curves at equal environment steps along the way
            vals = []
            for rows in res["seeds"].values():
                w = _windowed(rows, window)
                target = frac * w[-1][0]
                vals.append(min(w, key=lambda r: abs(r[0] - target))[1])
            print(f"{'':10s} {int(frac * steps):10,d} {np.mean(vals):12.2f} {min(vals):7.2f}..{max(vals):7.2f}")
    if "JaxMARL" in sides:
        print(f"JaxMARL compile: {sides['JaxMARL']['compile_wall']:.1f}s wall, {sides['JaxMARL']['compile_cpu']:.1f}s CPU "
              f"(jax {sides['JaxMARL']['jax']}, {sides['JaxMARL']['devices']})")


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
    p.add_argument("--train", action="store_true", help="IPPO training instead of throughput")
    p.add_argument("--train-steps", type=int, default=512_000, help="environment steps per seed (multiple of 2048)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--window", type=int, default=10, help="updates averaged for a return")
    p.add_argument("--threshold", type=float, default=-24.0, help="return for the time-to-threshold column")
    p.add_argument("--json", help="also write every logged row of both sides to this file")
    p.add_argument("--bootstrap-truncated", action="store_true",
                   help="fedarena side: bootstrap the 25-step time limit from V(final observation) (fedarena's "
                        "default elsewhere) instead of treating it as terminal as JaxMARL's baseline does")
    a = p.parse_args()
    if a.train:
        sides = {"fedarena": fedarena_ippo(a.seeds, a.train_steps, a.bootstrap_truncated)}
        jm = jaxmarl_ippo(a.jaxmarl_python, a.seeds, a.train_steps)
        if isinstance(jm, str):
            print(f"JaxMARL skipped: {jm}")
        else:
            sides["JaxMARL"] = jm
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        report_training(sides, a.window, a.threshold)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(sides, f)
        return
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
