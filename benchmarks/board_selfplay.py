"""Behaviour cloning, then PPO self-play against a snapshot pool (PFSP) for the league's BoardAgent on tic-tac-toe or
connect four: the learning side of issue 14 proved before (and independently of) the league.

Stage 1 (AlphaStar's supervised stage): an expert dataset (minimax for tic-tac-toe; for connect four the two-ply
heuristic of :func:`~fedarena.marl.league.players.two_ply_player`, since a clone of the one-ply player, uniform in
quiet positions, loses most games to it; ``--expert one_ply`` for that one), a share ``--explore`` of the moves
played uniformly at random, the labels always the expert's, and behaviour cloning. Stage 2: PPO updates of
``--games`` games each against a mixture of opponents: the learner itself (plain self-play, share ``--latest``), the
scripted reference players (fixed shares ``--ref-shares``), and a pool of the learner's snapshots (one every
``--snapshot-every`` updates) weighted by PFSP's ``squared`` weighting (1 - p)^2 of the learner's decayed win rate
p against each (Vinyals et al., 2019). Every ``--eval-every`` updates
the greedy learner plays the references (200 games, both seats equally); the final evaluation uses a fresh seed.
For tic-tac-toe each evaluation also gives the exact outcome probabilities against both references (every game
enumerated; :func:`~fedarena.marl.league.players.tictactoe_exact_results`). Against a uniform random player no
policy that never loses to minimax wins more than 95.56% of games on average over the two seats (99.48% moving
first, 91.64% second: the same enumeration with the best such policy), so the 95% acceptance needs close to the
best exploitation of random play. Prints one JSON line per evaluation and a final summary: win/draw/loss rates,
wall times of both stages, env steps (moves of both players) per second and learner updates per second.

    python benchmarks/board_selfplay.py --game tictactoe --minutes 8 --ref-shares 0.55 0.2 --latest 0.1
    python benchmarks/board_selfplay.py --game connect_four --minutes 17 --eval-every 10 --games 256 --explore 0.2 \
        --latest 0.1

``--minutes 0`` measures the behaviour-cloning stage alone (its row is the clone's strength), e.g. the
connect-four league's network and dataset:

    python benchmarks/board_selfplay.py --game connect_four --minutes 0 --channels 32 --kernel 3 --explore 0.2 \
        --bc-games 12000 --bc-epochs 8
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import numpy as np

from fedarena import engine
from fedarena.envs.boardgames import BoardGameBatch
from fedarena.marl.league.agent import AgentConfig, BoardAgent, play
from fedarena.marl.league.imitation import behaviour_clone, expert_dataset
from fedarena.marl.league.players import (evaluate, minimax_player, one_ply_player, random_player,
                                          tictactoe_exact_results, two_ply_player)

PRESETS = {
    "tictactoe": dict(config=AgentConfig(network="mlp", hidden=(128, 128), learning_rate=3e-4, ent_coef=0.01),
                      expert=minimax_player, refs=(random_player, minimax_player), ref_shares=(0.35, 0.25),
                      bc_games=3000, bc_epochs=10),
    "connect_four": dict(config=AgentConfig(network="cnn", channels=(64,), kernel=4, hidden=(128,), learning_rate=5e-4,
                                            ent_coef=0.01, minibatch_size=512, update_epochs=3),
                         expert=two_ply_player, refs=(random_player, one_ply_player), ref_shares=(0.1, 0.7),
                         bc_games=1500, bc_epochs=3),
}


def pfsp_squared(win_rate: np.ndarray) -> np.ndarray:
    """AlphaStar's ``squared`` PFSP weighting f(p) = (1 - p)^2, normalised (uniform if all weights vanish)."""
    w = (1.0 - win_rate) ** 2
    return w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--game", choices=sorted(PRESETS), default="tictactoe")
    ap.add_argument("--minutes", type=float, default=12.0, help="wall-clock budget of the RL stage")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-envs", type=int, default=256)
    ap.add_argument("--games", type=int, default=512, help="games per PPO update")
    ap.add_argument("--latest", type=float, default=0.2, help="share of games against the current learner")
    ap.add_argument("--ref-shares", type=float, nargs=2, default=None, help="shares of the two reference players")
    ap.add_argument("--snapshot-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--explore", type=float, default=0.5)
    ap.add_argument("--bc-games", type=int, default=None)
    ap.add_argument("--bc-epochs", type=int, default=None)
    ap.add_argument("--expert", choices=("", "minimax", "one_ply", "two_ply"), default="",
                    help="imitation expert ('' for the preset's)")
    ap.add_argument("--channels", type=int, nargs="+", default=None, help="CNN channels (default: the preset's)")
    ap.add_argument("--kernel", type=int, default=None, help="CNN kernel size (default: the preset's)")
    ap.add_argument("--threads", type=int, default=1, help="engine threads (1 is fastest on a loaded machine)")
    args = ap.parse_args()
    engine.set_num_threads(args.threads)
    preset = PRESETS[args.game]
    refs = [make() for make in preset["refs"]]
    ref_shares = np.asarray(args.ref_shares if args.ref_shares else preset["ref_shares"], dtype=np.float64)
    env = BoardGameBatch(args.game, args.num_envs)
    config = preset["config"]
    if args.channels:
        config = dataclasses.replace(config, channels=tuple(args.channels))
    if args.kernel:
        config = dataclasses.replace(config, kernel=args.kernel)
    agent = BoardAgent(env.observation_shape, env.num_actions, config)
    rng = np.random.default_rng(args.seed)
    t0 = time.time()

    def report(stage: str, params: dict, updates: int, seed: int, extra: dict) -> dict:
        row = {"stage": stage, "updates": updates, "wall_s": round(time.time() - t0, 1), **extra}
        for ref in refs:
            r = evaluate(agent, params, ref, args.game, 200, seed=seed, greedy=True)
            row[ref.name] = {k: r[k] for k in ("win_rate", "draw_rate", "loss_rate")}
        if args.game == "tictactoe":  # exact probabilities, every game enumerated
            exact = tictactoe_exact_results(agent, params)
            row["exact"] = {k: round(v, 4) for k, v in exact.items() if "seat" not in k}
        print(json.dumps(row), flush=True)
        return row

    # -- stage 1: behaviour cloning
    params = agent.init_params(args.seed)
    experts = {"minimax": minimax_player, "one_ply": one_ply_player, "two_ply": two_ply_player}
    expert = experts[args.expert]() if args.expert else preset["expert"]()
    data = expert_dataset(args.game, expert, args.bc_games or preset["bc_games"], seed=args.seed,
                          explore=args.explore)
    params, bc = behaviour_clone(agent, params, data, epochs=args.bc_epochs or preset["bc_epochs"], lr=1e-3,
                                 seed=args.seed)
    bc_time = time.time() - t0
    report("bc", params, 0, 10_000 + args.seed, {"bc_rows": len(data["action"]), "bc_s": round(bc_time, 1),
                                                "bc_accuracy": round(bc["accuracy"], 4)})

    # -- stage 2: PPO self-play with a snapshot pool
    learner = agent.learner(params, args.seed)
    snapshots: list[dict] = []
    wins: list[float] = []    # decayed PFSP statistics per snapshot
    counts: list[float] = []
    rl_start = time.time()
    env_steps = 0
    play_s = update_s = 0.0
    updates = 0
    moves0 = env.moves
    while time.time() - rl_start < args.minutes * 60:
        current = learner.params
        opponents: list = [current] + refs + snapshots
        probs = [args.latest] + list(ref_shares)
        rest = 1.0 - sum(probs)
        if snapshots:
            p = np.array(wins) / np.maximum(np.array(counts), 1e-9)
            probs += list(rest * pfsp_squared(np.where(np.array(counts) > 0, p, 0.5)))
        else:
            probs[0] += rest
        t = time.time()
        traj, results = play(agent, env, current, opponents, np.asarray(probs), args.games, rng)
        play_s += time.time() - t
        env_steps = env.moves - moves0
        for k, r in results:
            j = k - 1 - len(refs)
            if j >= 0:
                wins[j] = wins[j] * 0.99 + (r > 0) + 0.5 * (r == 0)
                counts[j] = counts[j] * 0.99 + 1.0
        t = time.time()
        metrics = learner.update(traj)
        update_s += time.time() - t
        updates += 1
        if updates % args.snapshot_every == 0:
            snapshots.append({k: v.copy() for k, v in learner.params.items()})
            wins.append(0.0)
            counts.append(0.0)
        if updates % args.eval_every == 0:
            report("rl", learner.params, updates, updates, {"env_steps": env_steps, "pool": len(snapshots),
                                                            "entropy": round(metrics["entropy"], 3)})
    rl_time = time.time() - rl_start
    final = report("final", learner.params, updates, 20_000 + args.seed, {"env_steps": env_steps})
    summary = {"game": args.game, "bc_s": round(bc_time, 1), "rl_s": round(rl_time, 1),
               "total_s": round(time.time() - t0, 1), "updates": updates, "env_steps": env_steps,
               "env_steps_per_s": round(env_steps / play_s, 1) if play_s else 0.0,
               "updates_per_s": round(updates / rl_time, 3),
               "final": {k: final[k] for k in final if k not in ("stage",)}}
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
