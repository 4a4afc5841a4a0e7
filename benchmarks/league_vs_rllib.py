"""League-based self-play on connect four: fedarena vs RLlib, in one run, with the same CPU budget.

Part 1, environment throughput: random legal play on fedarena's numpy-batched connect four and tic-tac-toe
(:class:`~fedarena.envs.boardgames.BoardGameBatch`, N = 256 boards) against PettingZoo's ``connect_four_v3`` /
``tictactoe_v3`` stepped one move at a time (the per-env API RL loops use), moves per second and their ratio
(target >= 20x).

Part 2, league training from scratch (no imitation stage on either side) until the main agent, playing greedily,
beats a uniform random player in >= 95% of 200 games (both seats):

- RLlib: its example ``rllib/examples/multi_agent/self_play_league_based_with_open_spiel.py`` (Ray 2.60) on
  ``connect_four`` through RLlib's ``OpenSpielEnv`` wrapper: PPO, the example's ``SelfPlayLeagueBasedCallback``
  (main / main-exploiter / league-exploiter groups, win-rate threshold 0.85), 20 epochs per batch, the example's
  1024-1024 MLP, two env runners, ``ray.init(num_cpus=2)``. After every training iteration the driver plays 200 games
  of the ``main`` module (argmax over the legal moves) against uniform random play on OpenSpiel's connect four.
- fedarena: the ``league`` kind's in-process league (:class:`fedarena.marl.league.training.LocalLeague`; one main
  agent, one main exploiter, one league exploiter, PFSP) with the BoardAgent CNN on ``BoardGameBatch``, one process,
  engine threads 1; after every league iteration the main agent plays 200 greedy games against random.

Evaluation time is excluded from both sides' wall times. RLlib pins an older gymnasium, so its side runs in its own
interpreter (``--rllib-python``, default ``$FEDARENA_RLLIB_PYTHON`` or /work/venv-rllib/bin/python; that venv needs
``ray[rllib]==2.60.0``, ``torch`` and ``open-spiel``). RLlib's ``sample_timeout_s`` is raised from 60 s to 3600 s
(on a loaded machine its first samples time out otherwise and the example's callback fails on the missing
``env_runners`` results). Reported per side: environment steps/s (moves of both seats: RLlib's sampled env steps,
fedarena's moves played), learner updates/s (PPO updates: one per trained module and train batch), samples trained
per second (rows through gradient steps, epochs counted), wall time to the 95% mark, the machine's load average,
and the fedarena/RLlib ratios. fedarena's agent here is the one-convolution CNN (32 channels, dense 128) with 2 PPO
epochs per batch.

    python benchmarks/league_vs_rllib.py --budget-min 15
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

TARGET = 0.95
EVAL_GAMES = 200


# ---------------------------------------------------------------- part 1: environment throughput

def env_throughput(game: str, num_envs: int, seconds: float) -> dict:
    from pettingzoo.classic import connect_four_v3, tictactoe_v3

    from fedarena.envs.boardgames import BoardGameBatch

    rng = np.random.default_rng(0)
    env = (connect_four_v3 if game == "connect_four" else tictactoe_v3).env()
    env.reset(seed=0)
    moves, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        obs = env.observe(env.agent_selection)
        if any(env.terminations.values()):
            env.reset()
            continue
        env.step(int(rng.choice(np.flatnonzero(obs["action_mask"]))))
        moves += 1
    pz = moves / (time.perf_counter() - t0)
    batch = BoardGameBatch(game, num_envs)
    _, mask, _ = batch.reset()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a = np.argmax(rng.random(mask.shape) * mask + mask, axis=1)  # uniform over the legal moves
        _, mask, *_ = batch.step(a)
        steps += 1
    ours = steps * num_envs / (time.perf_counter() - t0)
    return {"game": game, "num_envs": num_envs, "pettingzoo_moves_per_s": round(pz), "fedarena_moves_per_s": round(ours),
            "ratio": round(ours / pz, 1)}


# ---------------------------------------------------------------- part 2: RLlib side (its own interpreter)

def rllib_side(budget_s: float, seed: int) -> dict:
    import functools

    import pyspiel
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.env.wrappers.open_spiel import OpenSpielEnv
    from ray.rllib.examples.multi_agent.utils import SelfPlayLeagueBasedCallback
    from ray.rllib.examples.rl_modules.classes.random_rlm import RandomRLModule
    from ray.tune.registry import register_env

    launched = time.time()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    register_env("open_spiel_env", lambda _: OpenSpielEnv(pyspiel.load_game("connect_four")))
    names = ["main", "main_0", "main_exploiter_0", "main_exploiter_1", "league_exploiter_0", "league_exploiter_1"]
    specs = {m: RLModuleSpec(module_class=RandomRLModule if m in ("main_exploiter_0", "league_exploiter_0") else None,
                             model_config=DefaultModelConfig(fcnet_hiddens=[1024, 1024])) for m in names}

    def mapping(agent_id, episode, **kwargs):  # the example's initial mapping: main against the random exploiter
        return "main" if hash(episode.id_) % 2 == agent_id else "main_exploiter_0"

    config = (PPOConfig().environment("open_spiel_env")
              .callbacks(functools.partial(SelfPlayLeagueBasedCallback, win_rate_threshold=0.85))
              # sample_timeout_s raised from 60 s: on a loaded machine the first samples can take longer
              .env_runners(num_env_runners=2, num_envs_per_env_runner=1, sample_timeout_s=3600)
              .training(num_epochs=20)
              .multi_agent(policies=set(names), policy_mapping_fn=mapping, policies_to_train=["main"])
              .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs=specs))
              .debugging(seed=seed))
    algo = config.build()
    game = pyspiel.load_game("connect_four")
    rng = np.random.default_rng(seed)

    def eval_vs_random() -> float:
        module = algo.get_module("main")
        states = [game.new_initial_state() for _ in range(EVAL_GAMES)]
        seats = [g % 2 for g in range(EVAL_GAMES)]
        while not all(s.is_terminal() for s in states):
            live = [i for i, s in enumerate(states) if not s.is_terminal() and s.current_player() == seats[i]]
            if live:
                obs = torch.tensor(np.array([states[i].observation_tensor() for i in live]), dtype=torch.float32)
                with torch.no_grad():
                    logits = module.forward_inference({"obs": obs})["action_dist_inputs"].numpy()
                for j, i in enumerate(live):
                    legal = states[i].legal_actions()
                    states[i].apply_action(legal[int(np.argmax(logits[j][legal]))])
            for i, s in enumerate(states):
                if not s.is_terminal() and s.current_player() != seats[i]:
                    s.apply_action(int(rng.choice(s.legal_actions())))
        return float(np.mean([s.returns()[seats[i]] > 0 for i, s in enumerate(states)]))

    train_s = eval_s = 0.0
    history = []
    reached = None
    steps = updates = sgd_steps = 0
    while train_s < budget_s:
        t = time.time()
        result = algo.train()
        train_s += time.time() - t
        steps = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
        # one PPO update per trained module and iteration (the league grows its trainable set)
        learners = {k: v for k, v in result.get("learners", {}).items() if k != "__all_modules__" and isinstance(v, dict)}
        updates += sum(1 for v in learners.values() if v.get("num_module_steps_trained", 0) > 0)
        sgd_steps = int(sum(v.get("num_module_steps_trained_lifetime", 0) for v in learners.values()))
        iterations = len(history) + 1
        t = time.time()
        win = eval_vs_random()
        eval_s += time.time() - t
        history.append({"iteration": iterations, "train_s": round(train_s, 1), "env_steps": steps, "win_vs_random": win,
                        "league_size": result.get("league_size")})
        print(json.dumps({"rllib": history[-1]}), file=sys.stderr, flush=True)
        if win >= TARGET:
            reached = train_s
            break
    algo.stop()
    ray.shutdown()
    return {"side": "rllib", "reached": reached is not None, "time_to_target_s": reached, "train_s": round(train_s, 1),
            "eval_s": round(eval_s, 1), "env_steps": steps, "env_steps_per_s": round(steps / train_s, 1),
            "updates": updates, "updates_per_s": round(updates / train_s, 4),
            "samples_trained": sgd_steps, "samples_trained_per_s": round(sgd_steps / train_s, 1), "startup_s": round(time.time() - launched - train_s - eval_s, 1),
            "history": history}



# ---------------------------------------------------------------- part 2: fedarena side

def fedarena_side(budget_s: float, seed: int, num_envs: int, games: int) -> dict:
    import tempfile

    from fedarena import engine
    from fedarena.marl.league.agent import AgentConfig, BoardAgent
    from fedarena.marl.league.games import get_game
    from fedarena.marl.league.manager import LeagueManager
    from fedarena.marl.league.players import evaluate, random_player
    from fedarena.marl.league.roles import MAIN, RoleConfig
    from fedarena.marl.league.store import SnapshotStore
    from fedarena.marl.league.training import LocalLeague

    launched = time.time()
    engine.set_num_threads(1)
    game = get_game("connect_four")
    agent = BoardAgent(game.observation_shape, game.num_actions,
                       AgentConfig(network="cnn", channels=(32,), hidden=(128,), learning_rate=3e-4, ent_coef=0.01,
                                   update_epochs=2))
    roles = RoleConfig(main_agents=1, main_exploiters=1, league_exploiters=1, snapshot_min_steps=20_000,
                       snapshot_max_steps=60_000)  # experiments/connect_four_league.yaml
    train_s = eval_s = 0.0
    history = []
    reached = None
    with tempfile.TemporaryDirectory() as store_dir:
        manager = LeagueManager(roles, SnapshotStore(store_dir), agent.init_params(seed), seed)
        league = LocalLeague(game, agent, manager, num_envs, games, seed)
        main = next(i for i in manager.learners if manager.role(i) == MAIN)
        startup = time.time() - launched
        iteration = 0
        while train_s < budget_s:
            t = time.time()
            league.iteration()
            train_s += time.time() - t
            iteration += 1
            t = time.time()
            win = evaluate(agent, league.learner_params(main), random_player(), "connect_four", EVAL_GAMES,
                           seed=iteration, greedy=True)["win_rate"]
            eval_s += time.time() - t
            tp = league.throughput.values()
            steps = sum(getattr(e, "env", e).moves for e in league.envs.values())  # moves played, passes not counted
            updates, samples = sum(x.updates for x in tp), sum(x.moves for x in tp)
            history.append({"iteration": iteration, "train_s": round(train_s, 1), "env_steps": steps,
                            "win_vs_random": win, "league_size": len(manager.players)})
            print(json.dumps({"fedarena": history[-1]}), file=sys.stderr, flush=True)
            if win >= TARGET:
                reached = train_s
                break
    return {"side": "fedarena", "reached": reached is not None, "time_to_target_s": reached,
            "train_s": round(train_s, 1), "eval_s": round(eval_s, 1), "env_steps": steps,
            "env_steps_per_s": round(steps / train_s, 1), "updates": updates,
            "updates_per_s": round(updates / train_s, 4), "samples_trained": samples * agent.config.update_epochs,
            "samples_trained_per_s": round(samples * agent.config.update_epochs / train_s, 1), "startup_s": round(startup, 1), "history": history}


# ---------------------------------------------------------------- driver

def run_side(python: str, side: str, args: argparse.Namespace) -> dict:
    cmd = [python, os.path.abspath(__file__), "--side", side, "--budget-min", str(args.budget_min),
           "--seed", str(args.seed), "--num-envs", str(args.num_envs), "--games", str(args.games)]
    load_before = os.getloadavg()[0]
    t = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_s"] = round(time.time() - t, 1)
    out["load_avg_1min"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--side", choices=("fedarena", "rllib"), help=argparse.SUPPRESS)
    ap.add_argument("--budget-min", type=float, default=15.0, help="training wall-clock budget per side")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-envs", type=int, default=128, help="fedarena: boards per learner")
    ap.add_argument("--games", type=int, default=256, help="fedarena: games per learner and league iteration")
    ap.add_argument("--env-seconds", type=float, default=3.0, help="seconds per environment-throughput measurement")
    ap.add_argument("--skip-rllib", action="store_true")
    ap.add_argument("--rllib-python", default=os.environ.get("FEDARENA_RLLIB_PYTHON", "/work/venv-rllib/bin/python"))
    args = ap.parse_args()
    if args.side == "rllib":
        print(json.dumps(rllib_side(args.budget_min * 60, args.seed)))
        return
    if args.side == "fedarena":
        print(json.dumps(fedarena_side(args.budget_min * 60, args.seed, args.num_envs, args.games)))
        return
    print(f"load average before: {os.getloadavg()} on {os.cpu_count()} cores", flush=True)
    for game in ("connect_four", "tictactoe"):
        print(json.dumps({"env_throughput": env_throughput(game, 256, args.env_seconds)}), flush=True)
    sides = {"fedarena": run_side(sys.executable, "fedarena", args)}
    print(json.dumps({k: v for k, v in sides["fedarena"].items() if k != "history"}), flush=True)
    if args.skip_rllib:
        return
    sides["rllib"] = run_side(args.rllib_python, "rllib", args)
    print(json.dumps({k: v for k, v in sides["rllib"].items() if k != "history"}), flush=True)
    f, r = sides["fedarena"], sides["rllib"]
    ratios = {k: round(f[k] / r[k], 2) for k in ("env_steps_per_s", "updates_per_s", "samples_trained_per_s")
              if r.get(k)}
    if f["reached"] and r["reached"]:
        ratios["time_to_target_rllib_over_fedarena"] = round(r["time_to_target_s"] / f["time_to_target_s"], 2)
    print(json.dumps({"ratios_fedarena_over_rllib": ratios, "target_env_steps_ratio": 5.0}), flush=True)


if __name__ == "__main__":
    main()
