"""PPO on CartPole-v1 to a mean return of 475 over the last 20 episodes: fedarena vs RLlib, in one run.

Each side runs in its own fresh Python process, one after the other, with the same hyper-parameters
(8 environments x 32 steps = 256 transitions per update, 20 epochs of one 256-row minibatch, Adam
lr 1e-3, gamma 0.98, GAE lambda 0.8, clip 0.2, no KL penalty, no entropy bonus, gradient-norm clip
0.5, separate 64-64 tanh policy and value networks). RLlib's side uses its default (new) API stack,
local sampling (``num_env_runners=0``) and ``metrics_num_episodes_for_smoothing=20``; RLlib clips the
value *loss* at ``vf_clip_param`` where fedarena clips the value change (CleanRL style); RLlib keeps
its learning rate constant (fedarena anneals it; pass ``--no-anneal`` to match). Wall time is measured
from launching the process (imports, Ray start-up, building) to the first report at or above the
target; steady-state throughput is environment steps per second after the first update.

RLlib pins an older gymnasium than fedarena's environment, so its side runs with a separate
interpreter (``--rllib-python``, default ``$FEDARENA_RLLIB_PYTHON`` or /work/venv-rllib/bin/python).
``--rllib-profile rllib-tuned`` instead gives RLlib its own tuned CartPole example (4000-step batches),
since RLlib's per-iteration overhead makes small batches slow for it.
Acceptance (issue 9): fedarena >= 5x faster in wall time to the target.

    python benchmarks/rl_vs_rllib.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

TARGET = 475.0
WINDOW = 20
HP = {"num_envs": 8, "num_steps": 32, "epochs": 20, "minibatch": 256, "lr": 1e-3, "gamma": 0.98, "lam": 0.8,
      "clip": 0.2, "vf_coef": 0.5, "max_grad_norm": 0.5, "hidden": [64, 64]}


def fedarena_side(seed: int, launched: float, max_steps: int, anneal: bool) -> dict:
    import numpy as np
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    from fedarena.envs.vector import make_vector_env
    from fedarena.rl.ppo import PPO, PPOConfig
    from fedarena.rl.workers import Actor, LocalPolicy

    cfg = PPOConfig(num_envs=HP["num_envs"], num_steps=HP["num_steps"], update_epochs=HP["epochs"],
                    num_minibatches=HP["num_envs"] * HP["num_steps"] // HP["minibatch"], learning_rate=HP["lr"],
                    gamma=HP["gamma"], gae_lambda=HP["lam"], clip_coef=HP["clip"], vf_coef=HP["vf_coef"],
                    max_grad_norm=HP["max_grad_norm"], hidden=tuple(HP["hidden"]), anneal_lr=anneal)
    env = make_vector_env("CartPole-v1", cfg.num_envs, seed=seed)
    agent = PPO(env.observation_space, env.action_space, cfg, seed=seed, total_steps=max_steps)
    policy = LocalPolicy(agent.forward, agent.dist, agent.weights(), seed=seed + 1)
    actor = Actor(env, agent.adapter, agent.dist, policy, cfg.gamma, seed=seed)
    returns: list[float] = []
    steps, first = 0, None
    while steps < max_steps:
        traj = actor.rollout(cfg.num_steps)
        steps += traj["env_steps"]
        returns += traj["episode_returns"].tolist()
        now = time.time()
        if len(returns) >= WINDOW and np.mean(returns[-WINDOW:]) >= TARGET:
            rate = (steps - first[0]) / (now - first[1]) if first else float("nan")
            return {"reached": True, "steps": steps, "time_s": now - launched, "steady_sps": rate}
        agent.update(traj)
        policy.set_weights(agent.weights())
        if first is None:
            first = (steps, time.time())
    return {"reached": False, "steps": steps, "time_s": time.time() - launched,
            "steady_sps": (steps - first[0]) / (time.time() - first[1])}


def rllib_side(seed: int, launched: float, max_steps: int, profile: str = "same") -> dict:
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    if profile == "rllib-tuned":
        # RLlib's own CartPole PPO example (tuned_examples/ppo/cartpole_ppo.py): default 4000-step train batch,
        # lr 3e-4, 6 epochs, vf_loss_coeff 0.01, one shared linear 32-unit layer
        config = (
            PPOConfig()
            .environment("CartPole-v1")
            .training(lr=0.0003, num_epochs=6, vf_loss_coeff=0.01)
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                       vf_share_layers=True))
            .reporting(metrics_num_episodes_for_smoothing=WINDOW)
            .debugging(seed=seed)
        )
        return _train_rllib(config, launched, max_steps)
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=HP["num_envs"], rollout_fragment_length=HP["num_steps"])
        .training(lr=HP["lr"], gamma=HP["gamma"], lambda_=HP["lam"], clip_param=HP["clip"],
                  train_batch_size_per_learner=HP["num_envs"] * HP["num_steps"], minibatch_size=HP["minibatch"],
                  num_epochs=HP["epochs"], use_kl_loss=False, kl_coeff=0.0, entropy_coeff=0.0,
                  vf_loss_coeff=HP["vf_coef"], grad_clip=HP["max_grad_norm"], grad_clip_by="global_norm",
                  vf_clip_param=10_000.0)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=HP["hidden"], fcnet_activation="tanh",
                                                   vf_share_layers=False))
        .reporting(metrics_num_episodes_for_smoothing=WINDOW)
        .debugging(seed=seed)
    )
    return _train_rllib(config, launched, max_steps)


def _train_rllib(config, launched: float, max_steps: int) -> dict:
    import ray

    algo = config.build_algo()
    first = None
    steps = 0
    try:
        while steps < max_steps:
            result = algo.train()
            runners = result.get("env_runners", {})
            steps = int(runners.get("num_env_steps_sampled_lifetime", result.get("num_env_steps_sampled_lifetime", 0)))
            ret = runners.get("episode_return_mean", float("nan"))
            now = time.time()
            if first is None:
                first = (steps, now)
            if ret == ret and ret >= TARGET:
                rate = (steps - first[0]) / (now - first[1]) if now > first[1] else float("nan")
                return {"reached": True, "steps": steps, "time_s": now - launched, "steady_sps": rate,
                        "version": ray.__version__}
        return {"reached": False, "steps": steps, "time_s": time.time() - launched,
                "steady_sps": (steps - first[0]) / (time.time() - first[1]), "version": ray.__version__}
    finally:
        algo.stop()
        ray.shutdown()


def _child(python: str, side: str, seed: int, max_steps: int, anneal: bool, profile: str = "same") -> dict:
    launched = time.time()
    cmd = [python, os.path.abspath(__file__), "--side", side, "--seed", str(seed), "--launched", repr(launched),
           "--max-steps", str(max_steps), "--rllib-profile", profile] + ([] if anneal else ["--no-anneal"])
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{side} side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--max-steps", type=int, default=200_000)
    parser.add_argument("--no-anneal", action="store_true", help="constant learning rate on the fedarena side")
    parser.add_argument("--rllib-python", default=os.environ.get("FEDARENA_RLLIB_PYTHON", "/work/venv-rllib/bin/python"))
    parser.add_argument("--rllib-profile", choices=["same", "rllib-tuned"], default="same",
                        help="RLlib hyper-parameters: the same as fedarena's (default) or RLlib's own tuned CartPole "
                             "example (4000-step batches; fedarena keeps its settings)")
    parser.add_argument("--side", choices=["fedarena", "rllib"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "fedarena":
        print(json.dumps(fedarena_side(args.seed, args.launched, args.max_steps, not args.no_anneal)))
        return
    if args.side == "rllib":
        print(json.dumps(rllib_side(args.seed, args.launched, args.max_steps, args.rllib_profile)))
        return
    have_rllib = os.path.exists(args.rllib_python)
    print(f"PPO on CartPole-v1 to mean return {TARGET:g} over the last {WINDOW} episodes; hyper-parameters {HP}"
          f"; RLlib profile: {args.rllib_profile}")
    print(f"{'seed':>4} {'side':<9} {'reached':>7} {'env steps':>10} {'wall s':>8} {'steady steps/s':>15}")
    ratios = []
    for seed in args.seeds:
        ours = _child(sys.executable, "fedarena", seed, args.max_steps, not args.no_anneal)
        print(f"{seed:>4} {'fedarena':<9} {str(ours['reached']):>7} {ours['steps']:>10} {ours['time_s']:>8.1f} "
              f"{ours['steady_sps']:>15,.0f}", flush=True)
        if not have_rllib:
            print(f"     RLlib side skipped: {args.rllib_python} does not exist (pip install 'ray[rllib]' there)")
            continue
        theirs = _child(args.rllib_python, "rllib", seed, args.max_steps, True, args.rllib_profile)
        print(f"{seed:>4} {'RLlib ' + theirs.get('version', ''):<9} {str(theirs['reached']):>7} {theirs['steps']:>10} "
              f"{theirs['time_s']:>8.1f} {theirs['steady_sps']:>15,.0f}", flush=True)
        if ours["reached"] and theirs["reached"]:
            ratios.append(theirs["time_s"] / ours["time_s"])
            print(f"     wall-time ratio RLlib / fedarena: {ratios[-1]:.1f}x; "
                  f"steady throughput ratio fedarena / RLlib: {ours['steady_sps'] / theirs['steady_sps']:.1f}x")
    if ratios:
        print(f"median wall-time ratio (RLlib / fedarena) over {len(ratios)} seed(s): {sorted(ratios)[len(ratios) // 2]:.1f}x")


if __name__ == "__main__":
    main()
