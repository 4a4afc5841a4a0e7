"""Learned best responses: RL oracles for PSRO (Lanctot et al., 2017, sec. 3: "an oracle ... computes an
approximate best response using deep RL"), trained against the meta-strategy mixture of the opponents.

Both oracles train in :class:`fedarena.envs.efg_vector.ResponseEnv`: a batch of games in which each
opponent plays one member of its population per episode, drawn from the meta-strategy weights -- the same
distribution of play as the mixture (Kuhn's theorem), so the best response to the episodes is the best
response to the mixture.

- :class:`DQNOracle`: :class:`fedarena.rl.dqn.DQN` (Mnih et al., 2015) with one-step double-DQN targets
  (van Hasselt et al., 2016), uniform replay, no dueling head, and its legal-action masks (the greedy
  action, exploration and the target's argmax range over legal actions only). The TD loss is DQN's
  ``loss: mse`` by default: poker payoffs are random given the information state (+1 or -2 after a bluff),
  and the Huber loss's minimiser is then not the mean but lies toward the median, which biases Q and picks
  wrong responses. The oracle keeps its own schedule: ``train_every`` transitions per gradient phase
  (with 128 games stepped together, 32 phases per step of the batch), counted in transitions as the
  target-network copies are;
- :class:`PPOOracle`: :class:`fedarena.rl.ppo.PPO` unchanged (clipped surrogate, GAE, minibatch epochs) on
  the same environment; since its categorical policy has no action mask it is refused for games whose
  legal actions vary (Leduc), and accepted where every action is always legal (Kuhn, matrix games).

Each call returns the response as a :class:`~fedarena.marl.policy.TabularPolicy` (the network read at every
information state: greedy for DQN, the policy's probabilities for PPO) so that PSRO's empirical game and the
exploitability are exact; :attr:`networks` keeps every response as a :class:`NetworkPolicy` that can also
be played as a network (a callable opponent of ``ResponseEnv``) on games of any size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from fedarena import engine
from fedarena.engine import tree_map
from fedarena.envs.efg import Game
from fedarena.envs.efg_vector import GameTables, Population, ResponseEnv, compile_tables
from fedarena.marl.game_tree import GameTree
from fedarena.marl.nfsp import _softmax_legal, tabular_from_tables
from fedarena.marl.policy import TabularPolicy
from fedarena.platform.experiment import param
from fedarena.rl.dqn import DQN, DQNConfig


@dataclass(frozen=True)
class DQNOracleConfig:
    episodes: int = param(10_000, "training episodes per best response")
    num_envs: int = param(128, "games stepped together")
    hidden: tuple[int, ...] = param((64,), "hidden layer sizes of the Q network (ReLU)")
    learning_rate: float = param(1e-3, "Adam learning rate")
    batch_size: int = param(128, "transitions per gradient step")
    buffer_size: int = param(50_000, "replay capacity in transitions")
    train_every: int = param(4, "learner transitions between gradient steps")
    gradient_steps: int = param(1, "gradient steps per gradient phase")
    learning_starts: int = param(1000, "transitions before learning begins")
    target_update_interval: int = param(2000, "transitions between target-network copies")
    gamma: float = param(1.0, "discount (1: episodic poker payoffs)")
    epsilon_start: float = param(1.0, "initial exploration rate")
    epsilon_final: float = param(0.02, "final exploration rate")
    exploration_fraction: float = param(0.5, "fraction of the episodes over which epsilon decays linearly")
    loss: str = param("mse", "TD loss: mse (unbiased for random payoffs) or huber")
    huber_delta: float = param(1.0, "Huber loss threshold (loss: huber)")
    max_grad_norm: float = param(10.0, "global gradient-norm clipping")
    warm_start: bool = param(False, "start each response from the previous one's network instead of a fresh one")

    def __post_init__(self) -> None:
        checks = {"episodes": self.episodes >= 1, "num_envs": self.num_envs >= 1,
                  "learning_rate": self.learning_rate > 0, "batch_size": self.batch_size >= 1,
                  "buffer_size": self.buffer_size >= self.batch_size, "train_every": self.train_every >= 1,
                  "gradient_steps": self.gradient_steps >= 1, "learning_starts": self.learning_starts >= 0,
                  "target_update_interval": self.target_update_interval >= 1, "gamma": 0 <= self.gamma <= 1,
                  "epsilon_start": 0 <= self.epsilon_final <= self.epsilon_start <= 1,
                  "exploration_fraction": 0 < self.exploration_fraction <= 1, "loss": self.loss in ("mse", "huber"),
                  "hidden": len(self.hidden) >= 1 and all(int(h) >= 1 for h in self.hidden)}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"dqn_oracle.{name}: invalid value {getattr(self, name)!r}")

    def dqn_config(self) -> DQNConfig:
        """The :class:`~fedarena.rl.dqn.DQNConfig` of the oracle's DQN (its training schedule is the oracle's)."""
        return DQNConfig(num_envs=self.num_envs, buffer_size=self.buffer_size, batch_size=self.batch_size,
                         learning_rate=self.learning_rate, gamma=self.gamma, n_step=1, double=True, dueling=False,
                         prioritized=False, target_update_interval=self.target_update_interval, tau=1.0,
                         learning_starts=self.learning_starts, train_frequency=self.train_every,
                         gradient_steps=self.gradient_steps, exploration_fraction=self.exploration_fraction,
                         epsilon_start=self.epsilon_start, epsilon_final=self.epsilon_final,
                         max_grad_norm=self.max_grad_norm, loss=self.loss, huber_delta=self.huber_delta,
                         hidden=tuple(int(h) for h in self.hidden))


@dataclass(eq=False)
class NetworkPolicy:
    """A learned policy of one player as a network over the game's tensors.

    ``kind`` is ``"greedy"`` (argmax of Q over legal actions) or ``"softmax"`` (softmax of legal logits).
    Calling it on ``(observations (n, D), legal (n, A))`` gives action probabilities, the
    :data:`~fedarena.envs.efg_vector.PolicyFn` contract of ``ResponseEnv`` opponents."""

    tables: GameTables
    player: int
    net: Any
    params: Any
    kind: str = "greedy"
    _forward: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        w = np.asarray(self.params["torso"]["l0"]["w"])
        if w.shape[0] != self.tables.tensor_size:
            raise ValueError(f"policy: the network reads inputs of size {w.shape[0]}, but "
                             f"{self.tables.game.name}'s {self.tables.tensor_kind} tensor has size "
                             f"{self.tables.tensor_size}")
        if self._forward is None:
            self._forward = engine.jit(self.net.__call__)

    def __call__(self, obs: np.ndarray, legal: np.ndarray) -> np.ndarray:
        out = np.asarray(self._forward(self.params, np.asarray(obs, dtype=np.float32)), dtype=np.float64)
        if self.kind == "softmax":
            return _softmax_legal(out, legal)
        a = np.argmax(np.where(legal, out, -np.inf), axis=1)
        return np.eye(out.shape[1])[a]

    def tabular(self) -> TabularPolicy:
        """This player's rows of a table over every information state (other players' rows uniform)."""
        t = self.tables
        rows = np.flatnonzero(t.infostate_player == self.player)
        probs = t.legal / t.legal.sum(axis=1, keepdims=True)
        probs = probs.astype(np.float64)
        probs[rows] = self(t.tensors[rows], t.legal[rows])
        return tabular_from_tables(t, probs)


class DQNOracle:
    """``oracle(game, player, opponent_policies, opponent_weights) -> TabularPolicy`` by DQN training."""

    def __init__(self, config: DQNOracleConfig = DQNOracleConfig(), seed: int = 0) -> None:
        self.config = config
        self.rng = np.random.default_rng(seed)
        self.networks: list[NetworkPolicy] = []
        self.training_episodes = 0
        self._prev: dict[int, Any] = {}

    def network(self, game: Game | GameTree, player: int, opponent_policies: Sequence[Any],
                opponent_weights: np.ndarray, opponents: Mapping[int, Any] | None = None) -> NetworkPolicy:
        """Train a DQN response of ``player`` (in two-player games the opponent is the mixture of
        ``opponent_policies``; ``opponents`` gives every other player's spec directly instead)."""
        c = self.config
        base = game.game if isinstance(game, GameTree) else game
        tables = compile_tables(base)
        if opponents is None:
            if tables.num_players != 2:
                raise ValueError("opponents: for games with more than two players pass each opponent's policy")
            opponents = {1 - player: Population(list(opponent_policies), opponent_weights)}
        env = ResponseEnv(tables, player, opponents, c.num_envs, seed=self.rng)
        agent = DQN(env.observation_space, env.action_space, c.dqn_config(), seed=int(self.rng.integers(2**63)))
        if c.warm_start and player in self._prev:
            params = tree_map(np.copy, self._prev[player])
            agent.learner.set_state(params, agent.optimizer.init(params), 0)
            agent.target_params = tree_map(np.copy, params)
        obs = env.reset()
        legal = env.legal_mask
        seen = trained = targeted = 0
        start = len(env.episode_returns)
        while len(env.episode_returns) - start < c.episodes:
            progress = (len(env.episode_returns) - start) / c.episodes
            x = agent.adapter(obs)
            actions = agent.act(x, agent.epsilon(progress), legal=legal)
            st = env.step(actions)
            next_legal = env.legal_mask
            agent.observe(x, actions, st.reward, agent.adapter(st.final_obs), st.terminated,
                          np.zeros(len(actions), bool), next_legal=next_legal)
            seen += len(actions)
            obs, legal = st.obs, next_legal
            if seen >= c.learning_starts and len(agent.replay) >= c.batch_size:
                while trained + c.train_every <= seen:
                    trained += c.train_every
                    for _ in range(c.gradient_steps):
                        batch = agent.replay.sample(c.batch_size)
                        batch["weights"] = np.ones(c.batch_size, dtype=np.float32)
                        agent.learner.update(batch)
                if seen - targeted >= c.target_update_interval:
                    targeted = seen
                    agent.target_params = tree_map(np.copy, agent.learner.params)
            else:
                trained = seen
        self.training_episodes += len(env.episode_returns) - start
        params = agent.learner.params
        self._prev[player] = params
        pol = NetworkPolicy(tables, player, agent.q, params, "greedy", agent.q_values)
        self.networks.append(pol)
        return pol

    def __call__(self, game: Game | GameTree, player: int, opponent_policies: Sequence[TabularPolicy],
                 opponent_weights: np.ndarray) -> TabularPolicy:
        return self.network(game, player, opponent_policies, opponent_weights).tabular()


@dataclass(frozen=True)
class PPOOracleConfig:
    episodes: int = param(20_000, "training episodes per best response")
    num_envs: int = param(64, "games stepped together")
    num_steps: int = param(16, "rollout length per game")
    learning_rate: float = param(3e-3, "Adam learning rate")
    update_epochs: int = param(4, "passes over each rollout")
    num_minibatches: int = param(4, "minibatches per epoch")
    ent_coef: float = param(0.01, "entropy bonus")
    hidden: tuple[int, ...] = param((64,), "hidden layer sizes (tanh)")

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.num_envs < 1 or self.num_steps < 1:
            raise ValueError("ppo_oracle: episodes, num_envs and num_steps must be >= 1")


class PPOOracle:
    """``oracle(game, player, opponent_policies, opponent_weights)`` by :class:`fedarena.rl.ppo.PPO`;
    the response is the trained policy's action probabilities (not made greedy)."""

    def __init__(self, config: PPOOracleConfig = PPOOracleConfig(), seed: int = 0) -> None:
        self.config = config
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.networks: list[Any] = []
        self.training_episodes = 0

    def __call__(self, game: Game | GameTree, player: int, opponent_policies: Sequence[TabularPolicy],
                 opponent_weights: np.ndarray) -> TabularPolicy:
        from fedarena.rl.ppo import PPO, PPOConfig

        c = self.config
        tables = compile_tables(game.game if isinstance(game, GameTree) else game)
        if not tables.legal.all():
            raise ValueError(f"oracle: PPO has no action masks; {tables.game.name} has information states where "
                             "some actions are illegal (use the DQN oracle)")
        env = ResponseEnv(tables, player, {1 - player: Population(list(opponent_policies), opponent_weights)},
                          c.num_envs, seed=self.rng)
        cfg = PPOConfig(num_envs=c.num_envs, num_steps=c.num_steps, gamma=1.0, gae_lambda=1.0,
                        update_epochs=c.update_epochs, num_minibatches=c.num_minibatches, ent_coef=c.ent_coef,
                        learning_rate=c.learning_rate, anneal_lr=False, hidden=tuple(c.hidden))
        agent = PPO(env.observation_space, env.action_space, cfg, seed=int(self.rng.integers(2**31)))
        obs = env.reset()
        start = len(env.episode_returns)
        while len(env.episode_returns) - start < c.episodes:
            roll = {k: [] for k in ("obs", "action", "log_prob", "value", "reward", "discount")}
            for _ in range(c.num_steps):
                x = obs.astype(np.float32)
                (logits,), value = agent.forward(agent.learner.params, x)
                probs = _softmax_legal(np.asarray(logits, dtype=np.float64), np.ones_like(np.asarray(logits), bool))
                a = (self.rng.random(len(x))[:, None] >= np.cumsum(probs, axis=1)).sum(axis=1)
                a = np.minimum(a, probs.shape[1] - 1)
                st = env.step(a)
                roll["obs"].append(x)
                roll["action"].append(a)
                roll["log_prob"].append(np.log(probs[np.arange(len(a)), a]))
                roll["value"].append(np.asarray(value))
                roll["reward"].append(st.reward)
                roll["discount"].append(np.where(st.terminated, 0.0, 1.0))
                obs = st.obs
            _, boot = agent.forward(agent.learner.params, obs.astype(np.float32))
            rollout = {k: np.stack(v) for k, v in roll.items()}
            rollout["bootstrap_value"] = np.asarray(boot)
            agent.update(rollout)
        self.training_episodes += len(env.episode_returns) - start
        params = agent.learner.params
        t = tables
        rows = np.flatnonzero(t.infostate_player == player)
        (logits,), _ = agent.forward(params, t.tensors[rows])
        probs = (t.legal / t.legal.sum(axis=1, keepdims=True)).astype(np.float64)
        probs[rows] = _softmax_legal(np.asarray(logits, dtype=np.float64), t.legal[rows])
        self.networks.append((agent, params))
        return tabular_from_tables(t, probs)
