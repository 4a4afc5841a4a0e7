"""fedarena vs OpenSpiel's Python implementations on Kuhn and Leduc poker, in one run:

1. NFSP: ``fedarena.marl.nfsp.NFSP`` (batched games, compiled updates) against OpenSpiel's PyTorch NFSP
   (``open_spiel.python.pytorch.nfsp``, one game at a time, as in its ``nfsp_kuhn_pytorch.py`` example), with
   the same hyper-parameters (network, memories, eta, batch, learn-every, optimizer and learning rates,
   target interval, epsilon schedule). Both are timed on training only and evaluated with their own exact
   exploitability code (fedarena's tree walk; OpenSpiel's ``exploitability.exploitability`` on its policy
   wrapper) at the same episode counts.
2. The RL best-response oracle of PSRO: fedarena's ``DQNOracle`` against OpenSpiel's PyTorch DQN
   (``open_spiel.python.pytorch.dqn``) trained as a best response of each player to the same opponent
   mixture (the meta-strategy of exact PSRO after three iterations, one member sampled per episode), with the
   same hyper-parameters; the learned responses' exact values are compared with the exact best response.
   OpenSpiel's own PSRO driver (``psro_v2`` with ``rl_oracle``) cannot be imported here: it needs cvxpy and
   jax (its RL policies are written in jax), neither of which is installed, so the comparison is of the
   oracle, the part PSRO spends its time in.

Prints episodes/s and exploitability (or best-response gap) side by side, and the speed ratios.

    python benchmarks/marl_vs_openspiel.py                      # Kuhn 200k / Leduc 4k NFSP episodes
    python benchmarks/marl_vs_openspiel.py --games kuhn_poker --skip-oracle --seed 1   # one Kuhn seed, NFSP only

Both implementations are stochastic (OpenSpiel's run is not reproducible from its seed), and at equal
settings their exploitabilities at one episode count differ by about as much as two seeds of either do:
compare them over several ``--seed`` values, not at one.
    python benchmarks/marl_vs_openspiel.py --games kuhn_poker --skip-oracle   # the Kuhn NFSP rows only
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

from fedarena.envs import load_game
from fedarena.marl import best_response, expected_returns, exploitability
from fedarena.marl.nfsp import NFSP, NFSPConfig
from fedarena.marl.psro import PSRO, mixture_policy
from fedarena.marl.rl_oracles import DQNOracle, DQNOracleConfig
from fedarena.platform.config import build, load_yaml

ROOT = Path(__file__).resolve().parents[1]
NFSP_SETTINGS = build(NFSPConfig, load_yaml(ROOT / "experiments" / "kuhn_nfsp.yaml")["nfsp"], "nfsp")
"""The shipped Kuhn settings (``experiments/kuhn_nfsp.yaml``), used for both games and both libraries."""


# ----------------------------------------------------------------------------- NFSP


def fedarena_nfsp(game_name: str, checkpoints: list[int], seed: int) -> list[tuple[int, float, float]]:
    game = load_game(game_name)
    agent = NFSP(game, NFSP_SETTINGS, seed=seed)
    out, train = [], 0.0
    for n in checkpoints:
        t0 = time.perf_counter()
        agent.train(n - agent.episodes)
        train += time.perf_counter() - t0
        out.append((agent.episodes, train, exploitability(game, agent.average_policy())))
    return out


def openspiel_nfsp(game_name: str, checkpoints: list[int], seed: int) -> list[tuple[int, float, float]]:
    import torch
    from open_spiel.python import policy, rl_environment
    from open_spiel.python.algorithms import exploitability as os_exploitability
    from open_spiel.python.pytorch import nfsp

    np.random.seed(seed)
    torch.manual_seed(seed)
    c = NFSP_SETTINGS
    env = rl_environment.Environment(game_name)
    size = env.observation_spec()["info_state"][0]
    num_actions = env.action_spec()["num_actions"]
    agents = [nfsp.NFSP(p, size, num_actions, list(c.hidden), c.reservoir_capacity, c.anticipatory,
                        batch_size=c.batch_size, rl_learning_rate=c.rl_learning_rate,
                        sl_learning_rate=c.sl_learning_rate, min_buffer_size_to_learn=c.min_buffer_size_to_learn,
                        learn_every=c.learn_every, optimizer_str=c.optimizer, seed=seed + p,
                        replay_buffer_capacity=c.replay_capacity, update_target_network_every=c.target_update_interval,
                        discount_factor=c.discount, epsilon_start=c.epsilon_start, epsilon_end=c.epsilon_end,
                        epsilon_decay_duration=c.epsilon_decay_steps, epsilon_decay_schedule_str="linear",
                        loss_str="mse") for p in range(2)]

    class AveragePolicies(policy.Policy):
        def __init__(self):
            super().__init__(env.game, [0, 1])
            self._obs = {"info_state": [None, None], "legal_actions": [None, None]}

        def action_probabilities(self, state, player_id=None):
            cur = state.current_player()
            legal = state.legal_actions(cur)
            self._obs["current_player"] = cur
            self._obs["info_state"][cur] = state.information_state_tensor(cur)
            self._obs["legal_actions"][cur] = legal
            step = rl_environment.TimeStep(observations=self._obs, rewards=None, discounts=None, step_type=None)
            with agents[cur].temp_mode_as(nfsp.MODE.AVERAGE_POLICY):
                p = agents[cur].step(step, is_evaluation=True).probs
            return {a: p[a] for a in legal}

    out, train, done = [], 0.0, 0
    for n in checkpoints:
        t0 = time.perf_counter()
        while done < n:
            ts = env.reset()
            while not ts.last():
                p = ts.observations["current_player"]
                ts = env.step([agents[p].step(ts).action])
            for a in agents:
                a.step(ts)
            done += 1
        train += time.perf_counter() - t0
        out.append((done, train, float(os_exploitability.exploitability(env.game, AveragePolicies()))))
    return out


# ----------------------------------------------------------------------------- best-response oracle

ORACLE = DQNOracleConfig(episodes=10_000, num_envs=128, hidden=(64,), learning_rate=1e-3, batch_size=128,
                         buffer_size=50_000, train_every=4, learning_starts=1000, target_update_interval=2000,
                         epsilon_start=1.0, epsilon_final=0.02, exploration_fraction=0.5, loss="mse")


def openspiel_dqn_response(game_name: str, player: int, members: list, weights: np.ndarray, tree, episodes: int,
                           seed: int) -> tuple[dict, float]:
    """OpenSpiel's PyTorch DQN trained as ``player``'s response; the opponent draws a member per episode."""
    import torch
    from open_spiel.python import rl_environment
    from open_spiel.python.pytorch import dqn

    np.random.seed(seed)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    c = ORACLE
    env = rl_environment.Environment(game_name)
    size = env.observation_spec()["info_state"][0]
    steps_guess = int(episodes * 1.5)
    agent = dqn.DQN(player, size, env.action_spec()["num_actions"], list(c.hidden),
                    replay_buffer_capacity=c.buffer_size, batch_size=c.batch_size, learning_rate=c.learning_rate,
                    learn_every=c.train_every, min_buffer_size_to_learn=c.learning_starts,
                    update_target_network_every=c.target_update_interval, discount_factor=c.gamma,
                    epsilon_start=c.epsilon_start, epsilon_end=c.epsilon_final,
                    epsilon_decay_duration=int(steps_guess * c.exploration_fraction),
                    epsilon_decay_schedule_str="linear", optimizer_str="adam", loss_str="mse")
    t0 = time.perf_counter()
    for _ in range(episodes):
        member = members[rng.choice(len(members), p=weights)]
        ts = env.reset()
        while not ts.last():
            p = ts.observations["current_player"]
            if p == player:
                a = agent.step(ts).action
            else:
                s = env.get_state
                probs = member[s.information_state_string(p)]
                a = int(rng.choice(len(probs), p=probs / probs.sum()))
            ts = env.step([a])
        agent.step(ts)
    seconds = time.perf_counter() - t0
    # greedy response at every information state of ``player``
    table = {}
    for s in tree.infostates:
        row = tree.infostate_index[s]
        if tree.infostate_player[row] != player:
            continue
        table[s] = None
    states = {}
    stack = [env.game.new_initial_state()]
    while stack:  # collect one OpenSpiel state per information state of ``player``
        st = stack.pop()
        if st.is_terminal():
            continue
        if st.is_chance_node():
            stack += [st.child(a) for a, _ in st.chance_outcomes()]
            continue
        if st.current_player() == player:
            states.setdefault(st.information_state_string(player), st)
        stack += [st.child(a) for a in st.legal_actions()]
    for s, st in states.items():
        q = agent._q_network(torch.tensor([st.information_state_tensor(player)], dtype=torch.float32))[0]
        legal = st.legal_actions()
        table[s] = legal[int(np.argmax(q.detach().numpy()[legal]))]
    return table, seconds


def oracle_benchmark(game_name: str, seed: int) -> list[dict]:
    game = load_game(game_name)
    exact = PSRO(game, meta_solver="nash").run(3)
    rows = []
    for player in (0, 1):
        pols, w = exact.populations[1 - player], exact.meta_strategies[1 - player]
        mix = mixture_policy(game, pols, w, players=(1 - player,))
        best = best_response(game, mix, player).value
        oracle = DQNOracle(ORACLE, seed=seed)
        t0 = time.perf_counter()
        ours = oracle(game, player, pols, w)
        t_ours = time.perf_counter() - t0
        v_ours = expected_returns(game, mix.with_player(player, ours))[player]
        members = [{s: p.probs[i] for i, s in enumerate(p.infostates)} for p in pols]
        table, t_os = openspiel_dqn_response(game_name, player, members, w, exact.tree, ORACLE.episodes, seed)
        probs = ours.probs.copy()
        for s, a in table.items():
            r = exact.tree.infostate_index[s]
            probs[r] = 0.0
            probs[r, a] = 1.0
        from fedarena.marl.policy import TabularPolicy

        v_os = expected_returns(game, mix.with_player(player, TabularPolicy(exact.tree, probs)))[player]
        rows.append({"player": player, "best": best, "gap_fedarena": best - v_ours, "gap_openspiel": best - v_os,
                     "eps_fedarena": oracle.training_episodes / t_ours, "eps_openspiel": ORACLE.episodes / t_os})
    return rows


def main() -> None:
    global ORACLE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kuhn-episodes", type=int, default=200_000)
    ap.add_argument("--leduc-episodes", type=int, default=4_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--oracle-episodes", type=int, default=10_000)
    ap.add_argument("--skip-oracle", action="store_true")
    ap.add_argument("--games", default="kuhn_poker,leduc_poker",
                    help="comma-separated NFSP games, from kuhn_poker and leduc_poker")
    args = ap.parse_args()
    games = [g for g in args.games.split(",") if g]
    bad = [g for g in games if g not in ("kuhn_poker", "leduc_poker")]
    if bad or not games:
        ap.error(f"--games: expected kuhn_poker and/or leduc_poker, got {args.games!r}")
    ORACLE = dataclasses.replace(ORACLE, episodes=args.oracle_episodes)
    print("NFSP, same hyper-parameters:", NFSP_SETTINGS)
    ratios = []
    totals = {"kuhn_poker": args.kuhn_episodes, "leduc_poker": args.leduc_episodes}
    for game, total in ((g, totals[g]) for g in games):
        marks = sorted({max(1, total // 4), max(1, total // 2), total})
        ours = fedarena_nfsp(game, marks, args.seed)
        theirs = openspiel_nfsp(game, [n for n, _, _ in ours], args.seed)  # the same episode counts
        print(f"\nNFSP on {game}")
        print(f"{'episodes':>9} | {'fedarena ep/s':>13} {'expl':>8} | {'OpenSpiel ep/s':>14} {'expl':>8} | speed ratio")
        for (n, t1, e1), (_, t2, e2) in zip(ours, theirs):
            print(f"{n:>9} | {n / t1:>13.0f} {e1:>8.4f} | {n / t2:>14.1f} {e2:>8.4f} | {(n / t1) / (n / t2):>8.1f}x")
        ratios.append((game, (ours[-1][0] / ours[-1][1]) / (theirs[-1][0] / theirs[-1][1]), ours[-1][2], theirs[-1][2]))
    if not args.skip_oracle:
        print("\nDQN best-response oracle on kuhn_poker (response to exact PSRO's meta-strategy after 3 iterations),"
              f" {ORACLE.episodes} episodes each")
        print(f"{'player':>6} | {'fedarena ep/s':>13} {'BR gap':>8} | {'OpenSpiel ep/s':>14} {'BR gap':>8} | speed ratio")
        for r in oracle_benchmark("kuhn_poker", args.seed):
            print(f"{r['player']:>6} | {r['eps_fedarena']:>13.0f} {r['gap_fedarena']:>8.4f} | {r['eps_openspiel']:>14.1f} "
                  f"{r['gap_openspiel']:>8.4f} | {r['eps_fedarena'] / r['eps_openspiel']:>8.1f}x")
    print("\nSummary (final episode count):")
    for game, ratio, e1, e2 in ratios:
        verdict = "at most OpenSpiel's" if e1 <= e2 else "higher than OpenSpiel's"
        print(f"  NFSP {game}: fedarena {ratio:.1f}x OpenSpiel's episodes/s; exploitability {e1:.4f} vs {e2:.4f} ({verdict})")


if __name__ == "__main__":
    main()
