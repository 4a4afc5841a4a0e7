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
``ray[rllib]==2.60.0``, ``torch`` and ``open-spiel``). Reported per side: environment steps/s (moves of both seats,
counted the same way), learner updates/s (PPO updates, i.e. train batches, and minibatch gradient steps), wall time
to the 95% mark, and the fedarena/RLlib ratios.

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
              .env_runners(num_env_runners=2, num_envs_per_env_runner=1)
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
    first = None
    while train_s < budget_s:
        t = time.time()
        result = algo.train()
        train_s += time.time() - t
        steps = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
        updates += 1
        learners = result.get("learners", {})
        sgd_steps = max(sgd_steps, int(sum(v.get("num_module_steps_trained_lifetime", 0) for k, v in learners.items()
                                           if isinstance(v, dict) and k != "__all_modules__")))
        if first is None:
            first = (steps, train_s, updates)
        t = time.time()
        win = eval_vs_random()
        eval_s += time.time() - t
        history.append({"iteration": updates, "train_s": round(train_s, 1), "env_steps": steps, "win_vs_random": win,
                        "league_size": result.get("league_size")})
        print(json.dumps({"rllib": history[-1]}), file=sys.stderr, flush=True)
        if win >= TARGET:
            reached = train_s
            break
    algo.stop()
    ray.shutdown()
    rate_steps = (steps - first[0]) / max(train_s - first[1], 1e-9) if updates > 1 else steps / train_s
    return {"side": "rllib", "reached": reached is not None, "time_to_target_s": reached, "train_s": round(train_s, 1),
            "eval_s": round(eval_s, 1), "env_steps": steps, "env_steps_per_s": round(rate_steps, 1),
            "updates": updates, "updates_per_s": round(updates / train_s, 4),
            "module_steps_trained": sgd_steps, "startup_s": round(time.time() - launched - train_s - eval_s, 1),
            "history": history}


if __name__ == "__main__" and sys.argv[1:2] == ["--probe-rllib"]:
    print(json.dumps(rllib_side(float(sys.argv[2]), 0)))
