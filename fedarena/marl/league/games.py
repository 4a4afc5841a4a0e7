"""The games a league trains on, behind one interface: how to make a batch of environments, play a batch of
games of a learner against opponents drawn per game, evaluate against a fixed opponent, and which scripted
reference players exist.

- ``tictactoe``, ``connect_four``: :class:`fedarena.envs.boardgames.BoardGameBatch` (PettingZoo's
  ``tictactoe_v3`` / ``connect_four_v3`` rules and observations) and :func:`fedarena.marl.league.agent.play`;
  references ``random`` and ``minimax`` (tic-tac-toe) / ``one_ply`` (connect four).
- ``rps``: PettingZoo's ``rps_v2`` parallel env (one round per game, ``max_cycles=1``), ``num_envs``
  copies stepped together by :class:`RPSBatch`; both players move at once, so a game is one
  learner move. Each policy is a mixed strategy over the three actions (its distribution at the round's
  only observation), and the exploitability of a mixture of policies is exact: NashConv / 2 of
  :func:`fedarena.marl.exploitability` on the ``rock_paper_scissors`` matrix game.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fedarena.envs.boardgames import BoardGameBatch
from fedarena.marl.league.agent import BoardAgent, Trajectories, play
from fedarena.marl.league.players import evaluate, minimax_player, one_ply_player, random_player, two_ply_player

GAMES = ("tictactoe", "connect_four", "rps")


class CountingEnv:
    """Wraps a batch env and counts transitions: ``env_steps`` grows by ``num_envs`` per ``step`` call
    (board games keep every board moving, so boards whose share of games is done add filler moves)."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.env_steps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self):
        return self.env.reset()

    def step(self, actions):
        self.env_steps += self.env.num_envs
        return self.env.step(actions)


def _rps_env() -> Any:
    from pettingzoo.classic import rps_v2

    return rps_v2.parallel_env(max_cycles=1)


class RPSBatch:
    """``num_envs`` one-round PettingZoo ``rps_v2`` parallel envs stepped together (seat 0 = ``player_0``);
    observations are one-hot codes of rps_v2's Discrete(4) observation, every action is legal."""

    def __init__(self, num_envs: int, seed: int = 0) -> None:
        self.envs = [_rps_env() for _ in range(num_envs)]
        self.agents = list(self.envs[0].possible_agents)
        self.num_envs = num_envs
        self.num_actions = int(self.envs[0].action_space(self.agents[0]).n)
        self.obs_size = int(self.envs[0].observation_space(self.agents[0]).n)
        self.observation_shape = (self.obs_size,)
        self.seed = seed
        self._resets = 0

    def _reset_all(self) -> tuple[np.ndarray, np.ndarray]:
        obs = np.zeros((self.num_envs, 2, self.obs_size), dtype=np.float32)
        for i, env in enumerate(self.envs):
            o, _ = env.reset(seed=self.seed * 1_000_003 + self._resets)
            self._resets += 1
            for k, a in enumerate(self.agents):
                obs[i, k, int(o[a])] = 1.0
        self._obs = obs
        return obs, np.ones((self.num_envs, 2, self.num_actions), dtype=bool)

    def reset(self):
        return self._reset_all()

    def step(self, actions: np.ndarray):
        """``actions`` (N, 2) -> (next obs, next mask, rewards (N, 2)); every copy finishes its game (one
        round) and starts a new one."""
        reward = np.zeros((self.num_envs, 2))
        for i, env in enumerate(self.envs):
            _, rew, term, trunc, _ = env.step({a: int(actions[i, k]) for k, a in enumerate(self.agents)})
            if env.agents:
                raise RuntimeError("rps: a one-round game did not end after one step")
            reward[i] = [rew[a] for a in self.agents]
        obs, mask = self._reset_all()
        return obs, mask, reward


def _actor(agent: BoardAgent, opponent: Any) -> Callable:
    if isinstance(opponent, dict):
        return lambda obs, mask, rng: agent.act(opponent, obs, mask, rng)
    return opponent


def play_rps(agent: BoardAgent, env: Any, learner_params, opponents: list, opponent_probs: np.ndarray,
             num_games: int, rng: np.random.Generator, collect: bool = True, greedy: bool = False):
    """The learner's one-move games against opponents drawn per game; same contract as ``agent.play``."""
    probs = np.asarray(opponent_probs, dtype=np.float64)
    actors = [_actor(agent, o) for o in opponents]
    parts, results = [], []
    left = num_games
    obs, mask = env.reset()
    while left > 0:
        n = min(left, env.num_envs)
        seat = rng.integers(0, 2, env.num_envs)
        opp = rng.choice(len(opponents), size=env.num_envs, p=probs)
        rows = np.arange(env.num_envs)
        mine_obs, mine_mask = obs[rows, seat], mask[rows, seat]
        a, lp, v = agent.sample(learner_params, mine_obs, mine_mask, rng, greedy)
        actions = np.zeros((env.num_envs, 2), dtype=np.int64)
        actions[rows, seat] = a
        for k in np.unique(opp):
            r = np.flatnonzero(opp == k)
            actions[r, 1 - seat[r]] = actors[k](obs[r, 1 - seat[r]], mask[r, 1 - seat[r]], rng)
        obs, mask, reward = env.step(actions)
        res = np.sign(reward[rows, seat])[:n]
        results.extend((int(opp[i]), float(res[i])) for i in range(n))
        if collect:
            parts.append(Trajectories(obs=mine_obs[:n].astype(np.float32), mask=mine_mask[:n].astype(bool),
                                      action=a[:n].astype(np.int64), log_prob=lp[:n].astype(np.float32),
                                      value=v[:n].astype(np.float32), reward=res.astype(np.float32),
                                      done=np.ones(n, dtype=bool)))
        left -= n
    return (Trajectories.concatenate(parts) if collect else None), results


@dataclass(frozen=True)
class LeagueGame:
    name: str
    observation_shape: tuple[int, ...]
    num_actions: int
    references: tuple[str, ...]

    def make_env(self, num_envs: int, seed: int) -> CountingEnv:
        if self.name == "rps":
            return CountingEnv(RPSBatch(num_envs, seed))
        return CountingEnv(BoardGameBatch(self.name, num_envs, seed))

    def play(self, agent: BoardAgent, env: Any, learner_params, opponents: list, probs: np.ndarray,
             num_games: int, rng: np.random.Generator, collect: bool = True):
        if self.name == "rps":
            return play_rps(agent, env, learner_params, opponents, probs, num_games, rng, collect)
        return play(agent, env, learner_params, opponents, probs, num_games, rng, collect)

    def reference(self, name: str) -> Any:
        return {"random": random_player, "minimax": minimax_player, "one_ply": one_ply_player,
                "two_ply": two_ply_player}[name]()

    def evaluate(self, agent: BoardAgent, params, opponent_name: str, num_games: int, seed: int,
                 greedy: bool = True) -> dict[str, float]:
        """Win/draw/loss rates against a reference player, half the games from each seat."""
        opponent = self.reference(opponent_name)
        if self.name != "rps":
            return evaluate(agent, params, opponent, self.name, num_games, seed, greedy=greedy)
        rng = np.random.default_rng(seed)
        _, results = play_rps(agent, RPSBatch(min(num_games, 256), seed), params, [opponent], np.ones(1),
                              num_games, rng, collect=False, greedy=greedy)
        r = np.array([x for _, x in results])
        return {"games": float(num_games), "win_rate": float((r > 0).mean()), "draw_rate": float((r == 0).mean()),
                "loss_rate": float((r < 0).mean())}

    def strategy(self, agent: BoardAgent, params) -> np.ndarray:
        """rps: the policy's mixed strategy over (rock, paper, scissors) at the round's observation."""
        env = RPSBatch(1)
        obs, mask = env.reset()
        logits, _ = agent.policy(params, obs[:, 0], mask[:, 0])
        z = np.exp(logits[0] - logits[0].max())
        return z / z.sum()


def rps_exploitability(strategy: np.ndarray) -> float:
    """Exact exploitability (NashConv / 2) of both players playing ``strategy`` in rock-paper-scissors."""
    from fedarena.envs import load_game
    from fedarena.marl import exploitability

    p = np.asarray(strategy, dtype=np.float64)
    return float(exploitability(load_game("rock_paper_scissors"), {"row": p, "col": p}))


def get_game(name: str) -> LeagueGame:
    if name == "tictactoe":
        return LeagueGame(name, (3, 3, 2), 9, ("random", "minimax"))
    if name == "connect_four":
        return LeagueGame(name, (6, 7, 2), 7, ("random", "one_ply"))
    if name == "rps":
        return LeagueGame(name, (4,), 3, ("random",))
    raise ValueError(f"game: unknown league game '{name}'; known: {', '.join(GAMES)}")
