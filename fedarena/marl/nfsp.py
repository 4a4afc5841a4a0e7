"""Neural Fictitious Self-Play, NFSP (Heinrich & Silver, 2016, "Deep reinforcement learning from self-play
in imperfect-information games", arXiv:1603.01121, Algorithm 1), batched over many games.

Each player has two networks over its information-state tensor: a Q network trained by DQN on its own
transitions (replay memory ``M_RL``, a ring buffer) -- the approximate best response -- and an average-policy
network trained by supervised classification (cross-entropy) on its best response's behaviour, kept in a
reservoir-sampled memory ``M_SL`` (Vitter, 1985) so the data stays a uniform sample of the whole history. Each
``M_SL`` item holds the epsilon-greedy best response's action distribution at that state (``epsilon / |legal|``
on every legal action, plus ``1 - epsilon`` on the greedy one), as OpenSpiel's ``nfsp.py`` stores it: the same
target in expectation as the sampled action of Algorithm 1, with less variance. At the start of every episode each player plays its epsilon-greedy best response with the
anticipatory probability ``eta`` and its average policy otherwise. The average policies approach a Nash
equilibrium in two-player zero-sum games; their exploitability is measured exactly by converting the network
to a table over every information state (:func:`network_policy`).

Batched: ``num_games`` games advance together through :class:`fedarena.envs.efg_vector.VectorGame`; one compiled
call evaluates every player's two networks on every game's tensor, and one compiled call per gradient step
trains one player's Q network and average network together (squared TD error with the legal-action-masked
max, cross-entropy on the masked logits, SGD or Adam); each network starts learning as soon as its own memory
holds ``min_buffer_size_to_learn`` items (the Q network first: every transition enters ``M_RL``, only
best-response actions enter ``M_SL``). Each player updates both networks once per ``learn_every`` of its steps
(a step is one decision or the end of an episode, as counted by OpenSpiel's ``nfsp.py``), so the ratio of updates
to experience does not depend on ``num_games``; the target network is copied every ``target_update_interval``
best-response steps and epsilon decays linearly over ``epsilon_decay_steps`` best-response steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from fedarena import engine
from fedarena.engine import ops, optim, tree_map
from fedarena.envs.efg import Game
from fedarena.envs.efg_vector import TENSOR_KINDS, GameTables, VectorGame, compile_tables
from fedarena.marl.game_tree import game_tree
from fedarena.marl.policy import TabularPolicy
from fedarena.platform.experiment import param
from fedarena.rl.networks import QNetwork, Torso
from fedarena.rl.replay import ReplayBuffer

ILLEGAL_LOGIT = -1e9
"""Added to the logits / Q-values of illegal actions before a softmax or a max."""


@dataclass(frozen=True)
class NFSPConfig:
    num_games: int = param(128, "games stepped together (batched environment)")
    hidden: tuple[int, ...] = param((128,), "hidden layer sizes of the Q and average-policy MLPs (ReLU)")
    anticipatory: float = param(0.1, "eta: probability of playing the best response in an episode")
    replay_capacity: int = param(200_000, "M_RL ring buffer capacity per player")
    reservoir_capacity: int = param(2_000_000, "M_SL reservoir capacity per player")
    batch_size: int = param(128, "transitions per gradient step (both networks)")
    learn_every: int = param(64, "player steps between gradient steps of both networks")
    min_buffer_size_to_learn: int = param(1000, "items in a memory before its network learns")
    rl_learning_rate: float = param(0.01, "Q network learning rate")
    sl_learning_rate: float = param(0.01, "average-policy network learning rate")
    optimizer: str = param("sgd", "sgd or adam (both networks)")
    discount: float = param(1.0, "discount of the TD target")
    target_update_interval: int = param(1000, "best-response steps between target-network copies")
    epsilon_start: float = param(0.06, "initial exploration rate of the best response")
    epsilon_end: float = param(0.001, "final exploration rate")
    epsilon_decay_steps: int = param(20_000_000, "best-response steps over which epsilon decays linearly")
    tensor: str = param("information_state", "network input: information_state or observation tensor")

    def __post_init__(self) -> None:
        checks = {
            "num_games": self.num_games >= 1, "anticipatory": 0.0 <= self.anticipatory <= 1.0,
            "replay_capacity": self.replay_capacity >= self.batch_size,
            "reservoir_capacity": self.reservoir_capacity >= self.batch_size, "batch_size": self.batch_size >= 1,
            "learn_every": self.learn_every >= 1, "min_buffer_size_to_learn": self.min_buffer_size_to_learn >= 0,
            "rl_learning_rate": self.rl_learning_rate > 0, "sl_learning_rate": self.sl_learning_rate > 0,
            "optimizer": self.optimizer in ("sgd", "adam"), "discount": 0.0 <= self.discount <= 1.0,
            "target_update_interval": self.target_update_interval >= 1,
            "epsilon_start": 0.0 <= self.epsilon_end <= self.epsilon_start <= 1.0,
            "epsilon_decay_steps": self.epsilon_decay_steps >= 1, "tensor": self.tensor in TENSOR_KINDS,
            "hidden": len(self.hidden) >= 1 and all(int(h) >= 1 for h in self.hidden),
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"nfsp.{name}: invalid value {getattr(self, name)!r}")


class ReservoirBuffer:
    """Reservoir sampling (Vitter, 1985, Algorithm R) over a stream of items, batched: after ``n`` additions
    every item seen is in the buffer with probability ``min(1, capacity / n)``."""

    def __init__(self, capacity: int, seed: int | np.random.Generator | None = None) -> None:
        if int(capacity) < 1:
            raise ValueError(f"capacity: must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self.data: dict[str, np.ndarray] = {}
        self.seen = 0

    def __len__(self) -> int:
        return min(self.seen, self.capacity)

    def add(self, batch: Mapping[str, np.ndarray]) -> None:
        arrays = {k: np.asarray(v) for k, v in batch.items()}
        b = len(next(iter(arrays.values())))
        if b == 0:
            return
        if not self.data:
            self.data = {k: np.zeros((self.capacity,) + a.shape[1:], dtype=a.dtype) for k, a in arrays.items()}
        n = self.seen + np.arange(b)                      # 0-based stream position of each item
        slot = np.where(n < self.capacity, n, self.rng.integers(0, n + 1))
        keep = slot < self.capacity
        for k, a in arrays.items():
            self.data[k][slot[keep]] = a[keep]            # later items win a shared slot, as in sequential order
        self.seen += b

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        if len(self) == 0:
            raise ValueError("sample: the reservoir is empty")
        idx = self.rng.integers(0, len(self), size=int(batch_size))
        return {k: v[idx] for k, v in self.data.items()}

    def state_dict(self) -> dict:
        return {"seen": int(self.seen), "data": {k: v[:len(self)].copy() for k, v in self.data.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.seen = int(state["seen"])
        n = len(self)
        self.data = {}
        for k, v in state["data"].items():
            v = np.asarray(v)
            self.data[k] = np.zeros((self.capacity,) + v.shape[1:], dtype=v.dtype)
            self.data[k][:n] = v[:n]


def _masked(x: Any, legal: Any) -> Any:
    return ops.where(legal, x, ILLEGAL_LOGIT)


def network_policy(game: Game | GameTables, apply_fn: Any, params_per_player: list[Any],
                   tensor: str = "information_state") -> TabularPolicy:
    """The tabular policy of softmax-over-legal-logits networks (one per player): ``apply_fn(params, x)``
    maps tensors ``(n, D)`` to logits ``(n, A)``; every information state of the game is evaluated."""
    t = compile_tables(game, tensor)
    if len(params_per_player) != t.num_players:
        raise ValueError(f"params_per_player: expected {t.num_players} networks, got {len(params_per_player)}")
    probs = np.zeros((len(t.infostates), t.num_actions))
    for p, params in enumerate(params_per_player):
        w = _first_weight(params)
        if w is not None and w.ndim == 2 and w.shape[0] != t.tensor_size:
            raise ValueError(f"policy: the network of player {p} reads inputs of size {w.shape[0]}, but "
                             f"{t.game.name}'s {t.tensor_kind} tensor has size {t.tensor_size}")
        rows = np.flatnonzero(t.infostate_player == p)
        logits = np.asarray(apply_fn(params, t.tensors[rows]), dtype=np.float64)
        if logits.shape != (len(rows), t.num_actions):
            raise ValueError(f"policy: network of player {p} returned shape {logits.shape} for "
                             f"{len(rows)} tensors, expected {(len(rows), t.num_actions)}")
        probs[rows] = _softmax_legal(logits, t.legal[rows])
    return tabular_from_tables(t, probs)


def _first_weight(params: Any) -> np.ndarray | None:
    """The first dense layer's weight matrix of an MLP parameter tree (``torso.l0.w``), if it has one."""
    try:
        return np.asarray(params["torso"]["l0"]["w"])
    except (KeyError, TypeError, IndexError):
        return None


def _softmax_legal(logits: np.ndarray, legal: np.ndarray) -> np.ndarray:
    z = np.where(legal, logits, -np.inf)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z) * legal
    return e / e.sum(axis=1, keepdims=True)


def tabular_from_tables(tables: GameTables, probs: np.ndarray) -> TabularPolicy:
    """A :class:`TabularPolicy` of the compiled game tree from rows in the tables' order."""
    tree = game_tree(tables.game)
    return TabularPolicy(tree, np.asarray(probs, dtype=np.float64)[tables.rows_of(tree.infostates)])


def check_network_input(tables: GameTables, torso: Torso, name: str = "policy") -> None:
    """A network whose input layout does not match the game's tensor is refused with one line."""
    if tuple(torso.input_shape) != (tables.tensor_size,):
        raise ValueError(f"{name}: the network reads inputs of shape {tuple(torso.input_shape)}, but "
                         f"{tables.game.name}'s {tables.tensor_kind} tensor has shape ({tables.tensor_size},)")


class NFSP:
    """NFSP for every player of ``game`` in self-play; :meth:`train` plays episodes, :meth:`average_policy`
    is the learned average strategy as a table (exact exploitability on small games)."""

    def __init__(self, game: Game, config: NFSPConfig = NFSPConfig(), seed: int = 0) -> None:
        self.config = c = config
        self.game = game
        self.rng = np.random.default_rng(seed)
        self.batch = VectorGame(game, c.num_games, seed=self.rng, tensor=c.tensor)
        t = self.tables = self.batch.tables
        self.P, self.A, self.D = t.num_players, t.num_actions, t.tensor_size
        torso = Torso("mlp", (self.D,), tuple(int(h) for h in c.hidden), "relu")
        self.net = QNetwork(torso, self.A, dueling=False)
        make = (lambda lr: optim.sgd(lr)) if c.optimizer == "sgd" else (lambda lr: optim.adam(lr))
        self.rl_opt, self.sl_opt = make(c.rl_learning_rate), make(c.sl_learning_rate)
        self.q_params = [self.net.init(self.rng) for _ in range(self.P)]
        self.avg_params = [self.net.init(self.rng) for _ in range(self.P)]
        self.target_params = [tree_map(np.copy, q) for q in self.q_params]
        self.rl_state = [self.rl_opt.init(q) for q in self.q_params]
        self.sl_state = [self.sl_opt.init(a) for a in self.avg_params]
        self.replay = [ReplayBuffer(c.replay_capacity, seed=self.rng) for _ in range(self.P)]
        self.reservoir = [ReservoirBuffer(c.reservoir_capacity, seed=self.rng) for _ in range(self.P)]
        B = c.num_games
        self.best_response_mode = self.rng.random((self.P, B)) < c.anticipatory
        self.pending = np.zeros((self.P, B), dtype=bool)
        self.pending_obs = np.zeros((self.P, B, self.D), dtype=np.float32)
        self.pending_action = np.zeros((self.P, B), dtype=np.int64)
        self.steps = np.zeros(self.P, dtype=np.int64)        # decisions + episode ends, per player
        self.br_steps = np.zeros(self.P, dtype=np.int64)
        self._learned_at = np.zeros(self.P, dtype=np.int64)
        self._target_at = np.zeros(self.P, dtype=np.int64)
        self.updates = 0
        self.episodes = 0
        self._act = engine.jit(self._forward_all)
        self._update = engine.jit(self._train_step)
        self._update_rl = engine.jit(self._rl_step)
        self._update_sl = engine.jit(self._sl_step)

    # ------------------------------------------------------------------ compiled functions
    def _forward_all(self, q_params: list, avg_params: list, x: Any) -> tuple[list, list]:
        return [self.net(q, x) for q in q_params], [self.net(a, x) for a in avg_params]

    def _rl_loss(self, params: Any, target: Any, b: Mapping[str, Any]) -> Any:
        q = ops.sum(self.net(params, b["obs"]) * b["action"], axis=-1)
        nxt = ops.max(_masked(self.net(target, b["next_obs"]), b["next_legal"]), axis=-1)
        y = ops.stop_gradient(b["reward"] + b["not_done"] * self.config.discount * nxt)
        return ops.mean(ops.square(q - y))

    def _sl_loss(self, params: Any, b: Mapping[str, Any]) -> Any:
        logp = ops.log_softmax(_masked(self.net(params, b["obs"]), b["legal"]), axis=-1)
        return -ops.mean(ops.sum(b["action"] * logp, axis=-1))

    def _rl_step(self, q: Any, target: Any, rl_state: Any, rl_batch: Mapping[str, Any]) -> tuple:
        rl_loss, g = engine.value_and_grad(self._rl_loss)(q, target, rl_batch)
        q, rl_state = self.rl_opt.update(g, rl_state, q)
        return q, rl_state, rl_loss

    def _sl_step(self, avg: Any, sl_state: Any, sl_batch: Mapping[str, Any]) -> tuple:
        sl_loss, g = engine.value_and_grad(self._sl_loss)(avg, sl_batch)
        avg, sl_state = self.sl_opt.update(g, sl_state, avg)
        return avg, sl_state, sl_loss

    def _train_step(self, q: Any, target: Any, rl_state: Any, avg: Any, sl_state: Any,
                    rl_batch: Mapping[str, Any], sl_batch: Mapping[str, Any]) -> tuple:
        q, rl_state, rl_loss = self._rl_step(q, target, rl_state, rl_batch)
        avg, sl_state, sl_loss = self._sl_step(avg, sl_state, sl_batch)
        return q, rl_state, avg, sl_state, rl_loss, sl_loss

    # ------------------------------------------------------------------ playing
    def epsilon(self, player: int) -> float:
        c = self.config
        frac = min(1.0, self.br_steps[player] / c.epsilon_decay_steps)
        return c.epsilon_start + frac * (c.epsilon_end - c.epsilon_start)

    def _choose(self, player: int, games: np.ndarray, q: np.ndarray, logits: np.ndarray,
                legal: np.ndarray) -> np.ndarray:
        br = self.best_response_mode[player, games]
        actions = np.zeros(len(games), dtype=np.int64)
        # average policy: sample the softmax over legal logits
        probs = _softmax_legal(logits.astype(np.float64), legal)
        u = self.rng.random(len(games))[:, None]
        actions[:] = np.minimum((u >= np.cumsum(probs, axis=1)).sum(axis=1), self.A - 1)
        if br.any():
            qb = np.where(legal[br], q[br], -np.inf)
            greedy = np.argmax(qb, axis=1)
            explore = self.rng.random(int(br.sum())) < self.epsilon(player)
            rand = np.argmax(self.rng.random(qb.shape) * legal[br], axis=1)  # uniform over legal
            actions[br] = np.where(explore, rand, greedy)
        bad = ~legal[np.arange(len(games)), actions]  # a probability mass of ~0 on the last legal action
        if bad.any():
            actions[bad] = np.argmax(legal[bad], axis=1)
        return actions

    def _br_probs(self, player: int, q: np.ndarray, legal: np.ndarray) -> np.ndarray:
        """The epsilon-greedy best response's action distribution (the supervised target of ``M_SL``):
        ``epsilon / |legal|`` on every legal action plus ``1 - epsilon`` on the greedy one."""
        eps = self.epsilon(player)
        n_legal = legal.sum(axis=1, keepdims=True)
        probs = np.where(legal, eps / np.maximum(n_legal, 1), 0.0)
        greedy = np.argmax(np.where(legal, q, -np.inf), axis=1)
        probs[np.arange(len(q)), greedy] += 1.0 - eps
        return probs.astype(np.float32)

    def _tick(self) -> None:
        """Every game advances by one move of the player to act."""
        b, P, B = self.batch, self.P, self.config.num_games
        allg = np.arange(B)
        cur = b.current_player()
        obs = b.observations(allg)
        legal = b.legal_mask(allg)
        q_all, logit_all = self._act(self.q_params, self.avg_params, obs)
        actions = np.zeros(B, dtype=np.int64)
        for p in range(P):
            g = np.flatnonzero(cur == p)
            if not len(g):
                continue
            had = g[self.pending[p, g]]
            if len(had):
                self._store_rl(p, self.pending_obs[p, had], self.pending_action[p, had], np.zeros(len(had)),
                               obs[had], legal[had], np.zeros(len(had)))
            actions[g] = self._choose(p, g, np.asarray(q_all[p])[g], np.asarray(logit_all[p])[g], legal[g])
            br = g[self.best_response_mode[p, g]]
            if len(br):
                self.reservoir[p].add({"obs": obs[br], "action": self._br_probs(p, np.asarray(q_all[p])[br], legal[br]),
                                       "legal": legal[br]})
                self.br_steps[p] += len(br)
            self.pending[p, g] = True
            self.pending_obs[p, g] = obs[g]
            self.pending_action[p, g] = actions[g]
            self.steps[p] += len(g)
        ended, payoff = b.step(allg, actions)
        if len(ended):
            for p in range(P):
                had = ended[self.pending[p, ended]]
                k = self.pending[p, ended]
                if len(had):
                    self._store_rl(p, self.pending_obs[p, had], self.pending_action[p, had], payoff[k, p],
                                   np.zeros((len(had), self.D), dtype=np.float32),
                                   np.ones((len(had), self.A), dtype=bool), np.ones(len(had)))
                    self.steps[p] += len(had)
                self.pending[p, ended] = False
            self.best_response_mode[:, ended] = self.rng.random((P, len(ended))) < self.config.anticipatory
            self.episodes += len(ended)
        self._maybe_learn()

    def _store_rl(self, p: int, obs, action, reward, next_obs, next_legal, done) -> None:
        self.replay[p].add({"obs": obs.astype(np.float32), "action": np.eye(self.A, dtype=np.float32)[action],
                            "reward": np.asarray(reward, dtype=np.float32), "next_obs": next_obs.astype(np.float32),
                            "next_legal": next_legal, "not_done": (1.0 - np.asarray(done)).astype(np.float32)})

    def _maybe_learn(self) -> None:
        c = self.config
        for p in range(self.P):
            due = (self.steps[p] - self._learned_at[p]) // c.learn_every
            if due <= 0:
                continue
            self._learned_at[p] += due * c.learn_every
            need = max(c.batch_size, c.min_buffer_size_to_learn)
            rl_ready, sl_ready = len(self.replay[p]) >= need, len(self.reservoir[p]) >= need
            for _ in range(int(due) if rl_ready or sl_ready else 0):
                rl = self.replay[p].sample(c.batch_size) if rl_ready else None
                sl = self.reservoir[p].sample(c.batch_size) if sl_ready else None
                if rl is not None:
                    rl.pop("indices", None)
                if rl_ready and sl_ready:
                    out = self._update(self.q_params[p], self.target_params[p], self.rl_state[p],
                                       self.avg_params[p], self.sl_state[p], rl, sl)
                    self.q_params[p], self.rl_state[p], self.avg_params[p], self.sl_state[p] = out[:4]
                    self.last_losses = (float(out[4]), float(out[5]))
                elif rl_ready:
                    self.q_params[p], self.rl_state[p], loss = self._update_rl(
                        self.q_params[p], self.target_params[p], self.rl_state[p], rl)
                    self.last_losses = (float(loss), float("nan"))
                else:
                    self.avg_params[p], self.sl_state[p], loss = self._update_sl(
                        self.avg_params[p], self.sl_state[p], sl)
                    self.last_losses = (float("nan"), float(loss))
                self.updates += 1
            if self.br_steps[p] - self._target_at[p] >= c.target_update_interval:
                self._target_at[p] = self.br_steps[p]
                self.target_params[p] = tree_map(np.copy, self.q_params[p])

    def train(self, episodes: int) -> None:
        """Play until at least ``episodes`` more games have finished (across the batch)."""
        goal = self.episodes + int(episodes)
        while self.episodes < goal:
            self._tick()

    # ------------------------------------------------------------------ results
    def average_policy(self) -> TabularPolicy:
        return network_policy(self.tables, self.net.__call__, self.avg_params, self.config.tensor)

    def best_response_policy(self) -> TabularPolicy:
        """The greedy policies of the Q networks (ties to the lowest legal action)."""
        t = self.tables
        probs = np.zeros((len(t.infostates), self.A))
        for p in range(self.P):
            rows = np.flatnonzero(t.infostate_player == p)
            q = np.asarray(self.net(self.q_params[p], t.tensors[rows]))
            a = np.argmax(np.where(t.legal[rows], q, -np.inf), axis=1)
            probs[rows, a] = 1.0
        return tabular_from_tables(t, probs)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"q": self.q_params, "avg": self.avg_params, "target": self.target_params, "rl_state": self.rl_state,
                "sl_state": self.sl_state,
                "replay": [{"next": r._next, "size": r._size, "data": {k: v[:r._size].copy() for k, v in r._data.items()}}
                           for r in self.replay],
                "reservoir": [r.state_dict() for r in self.reservoir],
                "counters": {"steps": self.steps.copy(), "br_steps": self.br_steps.copy(),
                             "learned_at": self._learned_at.copy(), "target_at": self._target_at.copy(),
                             "updates": int(self.updates), "episodes": int(self.episodes)},
                "batch": {"nodes": self.batch.nodes.copy(), "episodes": int(self.batch.episodes),
                          "mode": self.best_response_mode.copy(), "pending": self.pending.copy(),
                          "pending_obs": self.pending_obs.copy(), "pending_action": self.pending_action.copy()},
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, s: Mapping[str, Any]) -> None:
        as_np = lambda tree: tree_map(np.asarray, tree)  # noqa: E731
        self.q_params = [as_np(x) for x in s["q"]]
        self.avg_params = [as_np(x) for x in s["avg"]]
        self.target_params = [as_np(x) for x in s["target"]]
        self.rl_state = [as_np(x) for x in s["rl_state"]]
        self.sl_state = [as_np(x) for x in s["sl_state"]]
        for r, st in zip(self.replay, s["replay"]):
            r._size, r._next = int(st["size"]), int(st["next"])
            r._data = {}
            for k, v in st["data"].items():
                v = np.asarray(v)
                r._data[k] = np.zeros((r.capacity,) + v.shape[1:], dtype=v.dtype)
                r._data[k][:r._size] = v
        for r, st in zip(self.reservoir, s["reservoir"]):
            r.load_state_dict(st)
        cnt = s["counters"]
        self.steps, self.br_steps = np.asarray(cnt["steps"]).copy(), np.asarray(cnt["br_steps"]).copy()
        self._learned_at, self._target_at = np.asarray(cnt["learned_at"]).copy(), np.asarray(cnt["target_at"]).copy()
        self.updates, self.episodes = int(cnt["updates"]), int(cnt["episodes"])
        bt = s["batch"]
        self.batch.nodes[:] = bt["nodes"]
        self.batch.episodes = int(bt["episodes"])
        self.best_response_mode = np.asarray(bt["mode"]).copy()
        self.pending = np.asarray(bt["pending"]).copy()
        self.pending_obs = np.asarray(bt["pending_obs"]).copy()
        self.pending_action = np.asarray(bt["pending_action"]).copy()
        self.rng.bit_generator.state = s["rng"]
