"""The agent the league trains on two-player alternating games: a masked actor-critic network, its PPO learner,
and :func:`play`, which runs batched games of the learner against a mixture of opponents.

Network (:class:`BoardAgent`): an MLP (``network="mlp"``, any observation shape, flattened) or a small CNN
(``network="cnn"``: 3x3 convolutions with padding 1 over (H, W, C) observations, then one dense layer), a shared
torso with a policy head (logits; illegal actions get ``-1e9`` added, so the softmax, log-probabilities and
entropies are those of the masked distribution) and a value head. Orthogonal initialisation with gains sqrt(2),
0.01 (policy head) and 1 (value head), as in PPO implementations (Huang et al., 2022).

Learning (:class:`BoardLearner`): PPO (Schulman et al., 2017: clipped surrogate, eq. 7; entropy bonus and value
loss, eq. 9) on the learner's own moves. A game seen from one seat is a sequence of that seat's turns whose only
reward is the final result at its last turn; GAE(lambda) (Schulman et al., 2016) runs over those turns, the
opponent's moves being part of the environment. Minibatches have a fixed size (the last one of an epoch is
padded with zero-weight rows), so one compiled update serves every batch size. Optimizer: Adam with global
gradient-norm clipping; the whole step is one ``engine.jit`` graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from fedarena import engine
from fedarena.engine import ops, optim
from fedarena.envs.boardgames import PASS
from fedarena.platform.experiment import param
from fedarena.rl.networks import orthogonal

Params = dict[str, np.ndarray]
ILLEGAL_LOGIT = -1e9
NETWORKS = ("mlp", "cnn")
ACT_BUCKET_MIN = 16  # act() pads batches to a power of two >= this, so a few compiled shapes serve all sizes


@dataclass(frozen=True)
class AgentConfig:
    network: str = param("mlp", "torso: mlp (any observation shape, flattened) or cnn ((H, W, C) observations)")
    hidden: tuple[int, ...] = param((128, 128), "MLP hidden sizes; for the CNN, the last entry is its dense layer")
    channels: tuple[int, ...] = param((32, 32), "CNN: output channels of the 3x3 convolutions (padding 1)")
    learning_rate: float = param(3e-4, "Adam learning rate")
    gamma: float = param(1.0, "discount over the learner's own turns")
    gae_lambda: float = param(0.95, "GAE lambda")
    clip_coef: float = param(0.2, "PPO ratio clipping epsilon")
    ent_coef: float = param(0.01, "entropy bonus coefficient")
    vf_coef: float = param(0.5, "value loss coefficient")
    max_grad_norm: float = param(0.5, "global gradient-norm clipping threshold")
    update_epochs: int = param(4, "passes over each batch of trajectories")
    minibatch_size: int = param(512, "rows per minibatch (the last minibatch of an epoch is padded)")
    norm_adv: bool = param(True, "normalise advantages per minibatch")

    def __post_init__(self) -> None:
        checks = {
            "network": self.network in NETWORKS, "hidden": len(self.hidden) >= 1 and min(self.hidden) >= 1,
            "channels": self.network != "cnn" or (len(self.channels) >= 1 and min(self.channels) >= 1),
            "learning_rate": self.learning_rate > 0, "gamma": 0.0 <= self.gamma <= 1.0,
            "gae_lambda": 0.0 <= self.gae_lambda <= 1.0, "clip_coef": self.clip_coef > 0,
            "ent_coef": self.ent_coef >= 0, "vf_coef": self.vf_coef >= 0, "max_grad_norm": self.max_grad_norm > 0,
            "update_epochs": self.update_epochs >= 1, "minibatch_size": self.minibatch_size >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"agent.{name}: invalid value {getattr(self, name)!r}")


@dataclass
class Trajectories:
    """The learner's moves of complete games, each game's moves contiguous and in order; ``done`` marks a game's
    last move and ``reward`` is the game's result there (0 elsewhere)."""

    obs: np.ndarray       # (M, *observation_shape) float32, from the learner's view
    mask: np.ndarray      # (M, A) bool
    action: np.ndarray    # (M,) int64
    log_prob: np.ndarray  # (M,) float32, behaviour policy
    value: np.ndarray     # (M,) float32, behaviour value estimate
    reward: np.ndarray    # (M,) float32
    done: np.ndarray      # (M,) bool

    def __len__(self) -> int:
        return int(self.action.shape[0])

    @property
    def num_games(self) -> int:
        return int(self.done.sum())

    @staticmethod
    def concatenate(parts: Sequence["Trajectories"]) -> "Trajectories":
        names = ("obs", "mask", "action", "log_prob", "value", "reward", "done")
        return Trajectories(**{k: np.concatenate([getattr(p, k) for p in parts]) for k in names})

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k) for k in ("obs", "mask", "action", "log_prob", "value", "reward", "done")}


def gae_over_turns(reward: np.ndarray, value: np.ndarray, done: np.ndarray, gamma: float, lam: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """GAE(lambda) advantages and value targets over consecutive turns; ``done`` ends a game (no bootstrap past it).
    The last row must end a game."""
    n = len(reward)
    if n and not done[-1]:
        raise ValueError("trajectories: the last move must end a game (done[-1] is False)")
    adv = np.zeros(n, dtype=np.float64)
    r, v, d = reward.astype(np.float64), value.astype(np.float64), done.astype(bool)
    next_v = np.append(v[1:], 0.0)
    nonterminal = (~d).astype(np.float64)
    delta = r + gamma * next_v * nonterminal - v
    carry = 0.0
    decay = gamma * lam
    for t in range(n - 1, -1, -1):  # games are <= 21 moves a seat; a plain reverse sweep
        carry = delta[t] + decay * nonterminal[t] * carry
        adv[t] = carry
    return adv.astype(np.float32), (adv + v).astype(np.float32)


class BoardAgent:
    """A masked actor-critic over ``observation_shape`` with ``num_actions`` discrete actions."""

    def __init__(self, observation_shape: tuple[int, ...], num_actions: int, config: AgentConfig) -> None:
        self.observation_shape = tuple(int(s) for s in observation_shape)
        self.num_actions = int(num_actions)
        self.config = config
        if config.network == "cnn" and len(self.observation_shape) != 3:
            raise ValueError(f"agent.network: cnn needs (H, W, C) observations, got shape {self.observation_shape}")
        self._forward = engine.jit(self.apply)

    # -- network
    def init_params(self, seed: int) -> Params:
        rng = np.random.default_rng(seed)
        c = self.config
        p: Params = {}
        root2 = float(np.sqrt(2.0))
        if c.network == "mlp":
            width = int(np.prod(self.observation_shape))
            for i, h in enumerate(c.hidden):
                p[f"torso.{i}.w"], p[f"torso.{i}.b"] = orthogonal(rng, width, h, root2), np.zeros(h, np.float32)
                width = h
        else:
            height, wide, chans = self.observation_shape
            for i, o in enumerate(c.channels):
                fan = chans * 9
                w = orthogonal(rng, fan, o, root2).T.reshape(o, 9, chans).transpose(0, 2, 1).reshape(o, chans, 3, 3)
                p[f"conv.{i}.w"], p[f"conv.{i}.b"] = np.ascontiguousarray(w), np.zeros(o, np.float32)
                chans = o
            width = chans * height * wide
            h = c.hidden[-1]
            p["dense.w"], p["dense.b"] = orthogonal(rng, width, h, root2), np.zeros(h, np.float32)
            width = h
        p["pi.w"], p["pi.b"] = orthogonal(rng, width, self.num_actions, 0.01), np.zeros(self.num_actions, np.float32)
        p["v.w"], p["v.b"] = orthogonal(rng, width, 1, 1.0), np.zeros(1, np.float32)
        return p

    def features(self, params: Any, obs: Any) -> Any:
        c = self.config
        n = obs.shape[0]
        if c.network == "mlp":
            x = ops.reshape(obs, (n, -1))
            for i in range(len(c.hidden)):
                x = ops.relu(ops.matmul(x, params[f"torso.{i}.w"]) + params[f"torso.{i}.b"])
            return x
        x = ops.transpose(obs, (0, 3, 1, 2))  # NHWC -> NCHW
        for i in range(len(c.channels)):
            x = ops.relu(ops.conv2d(x, params[f"conv.{i}.w"], padding=1, bias=params[f"conv.{i}.b"]))
        x = ops.reshape(x, (n, -1))
        return ops.relu(ops.matmul(x, params["dense.w"]) + params["dense.b"])

    def apply(self, params: Any, obs: Any, mask: Any) -> tuple[Any, Any]:
        """Masked logits (B, A) and values (B,) for obs (B, *shape) and a float 0/1 mask (B, A)."""
        h = self.features(params, obs)
        logits = ops.matmul(h, params["pi.w"]) + params["pi.b"] + (1.0 - mask) * ILLEGAL_LOGIT
        value = ops.reshape(ops.matmul(h, params["v.w"]) + params["v.b"], (-1,))
        return logits, value

    # -- acting
    def policy(self, params: Params, obs: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Masked logits (B, A) float64 and values (B,) for a batch of any size (padded to a compiled bucket)."""
        obs = np.asarray(obs, dtype=np.float32)
        mask = np.asarray(mask, dtype=bool)
        b = obs.shape[0]
        if obs.shape[1:] != self.observation_shape or mask.shape != (b, self.num_actions):
            raise ValueError(f"obs/mask: expected (B, {self.observation_shape}) and (B, {self.num_actions}), "
                             f"got {obs.shape} and {mask.shape}")
        if b and not mask.any(axis=1).all():
            raise ValueError(f"mask: rows {np.flatnonzero(~mask.any(axis=1))[:8].tolist()} have no legal action")
        size = max(ACT_BUCKET_MIN, 1 << max(b - 1, 0).bit_length())
        xo = np.zeros((size,) + self.observation_shape, np.float32)
        xm = np.ones((size, self.num_actions), np.float32)
        xo[:b], xm[:b] = obs, mask
        logits, value = self._forward(params, xo, xm)
        logits = np.asarray(logits, dtype=np.float64)[:b]
        logits[~mask] = -np.inf  # exactly zero probability, whatever the float32 logits were
        return logits, np.asarray(value, dtype=np.float64)[:b]

    def sample(self, params: Params, obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator,
               greedy: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(actions, log_probs, values)``: a draw from the masked policy (Gumbel-max) or its argmax."""
        logits, value = self.policy(params, obs, mask)
        if greedy:
            actions = np.argmax(logits, axis=1)
        else:
            actions = np.argmax(logits - np.log(-np.log(rng.random(logits.shape))), axis=1)
        z = logits - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return actions, logp[np.arange(len(actions)), actions], value

    def act(self, params: Params, obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator,
            greedy: bool = False) -> np.ndarray:
        return self.sample(params, obs, mask, rng, greedy)[0]

    def learner(self, params: Params, seed: int) -> "BoardLearner":
        return BoardLearner(self, params, seed)


class BoardLearner:
    """PPO on :class:`Trajectories` for one :class:`BoardAgent`; ``params`` are the current weights."""

    def __init__(self, agent: BoardAgent, params: Params, seed: int) -> None:
        self.agent = agent
        self.config = agent.config
        self.rng = np.random.default_rng(seed)
        self._params = {k: np.array(v, dtype=np.float32, copy=True) for k, v in params.items()}
        self.optimizer = optim.adam(self.config.learning_rate, eps=1e-5)
        self.opt_state = self.optimizer.init(self._params)
        self.updates = 0
        self._step = engine.jit(self._train_step)

    @property
    def params(self) -> Params:
        return self._params

    def loss(self, params: Any, mb: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """PPO's loss on one weighted minibatch (weights 0 on padding rows), and diagnostics."""
        c = self.config
        logits, value = self.agent.apply(params, mb["obs"], mb["mask"])
        logp_all = ops.log_softmax(logits, axis=-1)
        logp = ops.sum(logp_all * mb["action"], axis=-1)
        w = mb["weight"]
        total = ops.sum(w)
        mean = lambda x: ops.sum(x * w) / total  # noqa: E731
        entropy = mean(-ops.sum(ops.exp(logp_all) * logp_all, axis=-1))
        log_ratio = logp - mb["log_prob"]
        ratio = ops.exp(log_ratio)
        adv = mb["advantage"]
        pg_loss = mean(ops.maximum(-adv * ratio, -adv * ops.clip(ratio, 1.0 - c.clip_coef, 1.0 + c.clip_coef)))
        v_loss = 0.5 * mean(ops.square(value - mb["value_target"]))
        loss = pg_loss - c.ent_coef * entropy + c.vf_coef * v_loss
        approx_kl = mean((ratio - 1.0) - log_ratio)
        clipfrac = mean(ops.astype(ops.abs(ratio - 1.0) > c.clip_coef, np.float32))
        return loss, {"pg_loss": pg_loss, "v_loss": v_loss, "entropy": entropy, "approx_kl": approx_kl,
                      "clipfrac": clipfrac}

    def _train_step(self, params: Any, opt_state: Any, mb: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
        (loss, aux), grads = engine.value_and_grad(self.loss, has_aux=True)(params, mb)
        grads, grad_norm = optim.clip_by_global_norm(grads, self.config.max_grad_norm)
        params, opt_state = self.optimizer.update(grads, opt_state, params)
        return params, opt_state, dict(aux, loss=loss, grad_norm=grad_norm)

    def minibatch(self, data: dict[str, np.ndarray], idx: np.ndarray, weight: np.ndarray) -> dict[str, np.ndarray]:
        """The compiled step's inputs for rows ``idx`` (weights ``weight``); advantages normalised over the
        weighted rows when ``norm_adv``."""
        adv = data["advantage"][idx].astype(np.float64)
        if self.config.norm_adv:
            wsum = weight.sum()
            mu = float((adv * weight).sum() / wsum)
            sd = float(np.sqrt((((adv - mu) ** 2) * weight).sum() / wsum))
            adv = (adv - mu) / (sd + 1e-8)
        return {
            "obs": data["obs"][idx].astype(np.float32),
            "mask": data["mask"][idx].astype(np.float32),
            "action": np.eye(self.agent.num_actions, dtype=np.float32)[data["action"][idx]],
            "log_prob": data["log_prob"][idx].astype(np.float32),
            "advantage": adv.astype(np.float32),
            "value_target": data["value_target"][idx].astype(np.float32),
            "weight": weight.astype(np.float32),
        }

    def update(self, batch: Trajectories) -> dict[str, float]:
        """One PPO update: GAE over the learner's turns, then ``update_epochs`` passes of minibatch Adam steps."""
        c = self.config
        n = len(batch)
        if n == 0:
            raise ValueError("trajectories: empty batch")
        adv, targets = gae_over_turns(batch.reward, batch.value, batch.done, c.gamma, c.gae_lambda)
        data = dict(batch.arrays(), advantage=adv, value_target=targets)
        mb = c.minibatch_size
        params, opt_state = self._params, self.opt_state
        sums: dict[str, float] = {}
        steps = 0
        for _ in range(c.update_epochs):
            perm = self.rng.permutation(n)
            for start in range(0, n, mb):
                idx = perm[start:start + mb]
                real = len(idx)
                weight = np.zeros(mb, np.float64)
                weight[:real] = 1.0
                if real < mb:  # pad with zero-weight rows (any rows: they do not enter the loss)
                    idx = np.concatenate([idx, perm[np.arange(mb - real) % n]])
                params, opt_state, aux = self._step(params, opt_state, self.minibatch(data, idx, weight))
                for k, v in aux.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                steps += 1
        self._params = {k: np.asarray(v) for k, v in params.items()}
        self.opt_state = opt_state
        self.updates += 1
        metrics = {k: v / steps for k, v in sums.items()}
        var = float(np.var(targets))
        metrics["explained_variance"] = float("nan") if var == 0 else 1.0 - float(np.var(targets - batch.value)) / var
        metrics["samples"] = float(n)
        return metrics

    # -- resume
    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters, Adam state and the update count as flat numpy arrays (``engine.save_params``-able)."""
        out = {f"params/{k}": np.array(v, copy=True) for k, v in self._params.items()}
        for i, leaf in enumerate(engine.tree_leaves(self.opt_state)):
            out[f"optimizer/{i}"] = np.array(leaf, copy=True)
        out["updates"] = np.array(self.updates, dtype=np.int64)
        out["rng"] = np.frombuffer(repr(self.rng.bit_generator.state).encode(), dtype=np.uint8).copy()
        return out

    def load_state_dict(self, d: dict[str, np.ndarray]) -> None:
        want = {f"params/{k}": v.shape for k, v in self._params.items()}
        leaves, treedef = engine.tree_flatten(self.optimizer.init(self._params))
        want.update({f"optimizer/{i}": np.shape(leaf) for i, leaf in enumerate(leaves)})
        for k, shape in want.items():
            if k not in d:
                raise ValueError(f"state_dict: missing {k!r}")
            if tuple(np.shape(d[k])) != tuple(shape):
                raise ValueError(f"state_dict: {k!r} has shape {tuple(np.shape(d[k]))}, expected {tuple(shape)}")
        self._params = {k[len("params/"):]: np.array(d[k], dtype=np.float32) for k in want if k.startswith("params/")}
        self.opt_state = engine.tree_unflatten(treedef, [np.array(d[f"optimizer/{i}"], dtype=np.asarray(leaf).dtype)
                                                         for i, leaf in enumerate(leaves)])
        self.updates = int(d.get("updates", 0))
        if "rng" in d:
            import ast

            self.rng.bit_generator.state = ast.literal_eval(bytes(np.asarray(d["rng"], np.uint8)).decode())


Opponent = Any  # a parameter dict of the same BoardAgent, or a ScriptedPlayer (players.py)


def _opponent_actor(agent: BoardAgent, opponent: Opponent) -> Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray]:
    if isinstance(opponent, dict):
        return lambda obs, mask, rng: agent.act(opponent, obs, mask, rng)
    if callable(opponent):
        return opponent
    raise TypeError(f"opponents: expected a parameter dict or a scripted player, got {type(opponent).__name__}")


def play(agent: BoardAgent, env: Any, learner_params: Params, opponents: list[Opponent], opponent_probs: np.ndarray,
         num_games: int, rng: np.random.Generator, collect: bool = True, greedy: bool = False,
         learner_seats: np.ndarray | None = None) -> tuple[Trajectories | None, list[tuple[int, float]]]:
    """Play ``num_games`` games on the boards of ``env`` (a :class:`~fedarena.envs.boardgames.BoardGameBatch`,
    reset here) of the learner against opponents drawn per game from ``opponent_probs``.

    The learner takes seat 0 or 1 uniformly at random per game (or ``learner_seats[g]`` for game ``g``); it samples
    its policy (``greedy``: plays its argmax). Each board plays a fixed share of the games, so short and long games
    are counted alike. Returns the learner's :class:`Trajectories` (``collect``) and one ``(opponent index,
    result)`` per game, result +1/0/-1 from the learner's seat.
    """
    probs = np.asarray(opponent_probs, dtype=np.float64)
    if probs.shape != (len(opponents),) or len(opponents) == 0 or (probs < 0).any() or not np.isclose(probs.sum(), 1.0):
        raise ValueError(f"opponent_probs: expected {len(opponents)} probabilities summing to 1, got {probs.tolist()}")
    if num_games < 1:
        raise ValueError(f"num_games: must be >= 1, got {num_games}")
    if learner_seats is not None and np.shape(learner_seats) != (num_games,):
        raise ValueError(f"learner_seats: expected ({num_games},), got {np.shape(learner_seats)}")
    actors = [_opponent_actor(agent, o) for o in opponents]
    n = env.num_envs
    quota = num_games // n + (np.arange(n) < num_games % n)
    played = np.zeros(n, dtype=np.int64)
    game_ids = np.cumsum(quota) - quota  # first game id of each board

    def new_games(boards: np.ndarray) -> None:
        gid = game_ids[boards] + played[boards]
        seat[boards] = rng.integers(0, 2, len(boards)) if learner_seats is None else np.asarray(learner_seats)[gid]
        opp[boards] = rng.choice(len(opponents), size=len(boards), p=probs)

    seat = np.zeros(n, dtype=np.int64)
    opp = np.zeros(n, dtype=np.int64)
    active = quota > 0
    new_games(np.flatnonzero(active))
    game_of = np.where(active, game_ids, -1)  # id of the game each board is playing
    obs, mask, to_play = env.reset()
    steps: list[tuple] = []  # per env step: the learner's boards' (game id, obs, mask, action, log_prob, value)
    result = np.zeros(num_games, np.float32)
    opp_of_game = np.zeros(num_games, np.int64)
    finish_order: list[np.ndarray] = []
    while active.any():
        actions = np.full(n, PASS, dtype=np.int64)  # boards that finished their share of games pass
        mine = np.flatnonzero(active & (to_play == seat))
        if len(mine):
            a, lp, v = agent.sample(learner_params, obs[mine], mask[mine], rng, greedy)
            actions[mine] = a
            if collect:
                steps.append((game_of[mine], obs[mine], mask[mine], a, lp, v))
        theirs = active & (to_play != seat)
        for k in np.unique(opp[theirs]):
            rows = np.flatnonzero(theirs & (opp == k))
            actions[rows] = actors[k](obs[rows], mask[rows], rng)
        obs, mask, to_play, rewards, done = env.step(actions)
        ended = np.flatnonzero(done & active)
        if len(ended):
            g = game_of[ended]
            result[g] = rewards[ended, seat[ended]]
            opp_of_game[g] = opp[ended]
            finish_order.append(g)
            played[ended] += 1
            active &= played < quota
            restart = ended[active[ended]]
            if len(restart):
                new_games(restart)
                game_of[restart] = game_ids[restart] + played[restart]
    order = np.concatenate(finish_order)
    results = list(zip(opp_of_game[order].tolist(), result[order].astype(float).tolist()))
    if not collect:
        return None, results
    gid = np.concatenate([s[0] for s in steps])
    rank = np.argsort(gid, kind="stable")  # game by game, each game's moves in time order
    gid = gid[rank]
    done_rows = np.append(gid[1:] != gid[:-1], True)
    traj = Trajectories(
        obs=np.concatenate([s[1] for s in steps])[rank].astype(np.float32),
        mask=np.concatenate([s[2] for s in steps])[rank].astype(bool),
        action=np.concatenate([s[3] for s in steps])[rank].astype(np.int64),
        log_prob=np.concatenate([s[4] for s in steps])[rank].astype(np.float32),
        value=np.concatenate([s[5] for s in steps])[rank].astype(np.float32),
        reward=np.where(done_rows, result[gid], 0.0).astype(np.float32),
        done=done_rows,
    )
    return traj, results


__all__ = ["AgentConfig", "BoardAgent", "BoardLearner", "Trajectories", "gae_over_turns", "play"]
