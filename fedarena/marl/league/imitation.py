"""AlphaStar's supervised stage (Vinyals et al., 2019): datasets of games played by a scripted expert and
behaviour cloning of a :class:`~fedarena.marl.league.agent.BoardAgent` on them, before league RL.

:func:`expert_dataset` plays the expert against itself on a batch of boards and records, at every position, the
mover's observation, mask, the expert's move, the expert's whole move distribution (``target``; e.g. uniform over
minimax's optimal moves) and the game's final result from the mover's view. With ``explore > 0`` the move
actually played is uniform over the legal moves with that probability (the label stays the expert's), so the
data also covers positions the expert would not reach by itself, as an opponent of the learner may lead to.
:func:`behaviour_clone` minimises the cross-entropy between the masked policy and ``target`` (the expert's
distribution; the one-hot move if absent) plus ``value_coef`` times the squared error of the value head against
the result, with Adam on fixed-size minibatches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedarena import engine
from fedarena.engine import ops, optim
from fedarena.envs.boardgames import PASS, BoardGameBatch
from fedarena.marl.league.agent import BoardAgent, Params


def expert_dataset(game: str, expert: Any, num_games: int, seed: int, explore: float = 0.0,
                   num_envs: int = 256) -> dict[str, np.ndarray]:
    """``obs`` (M, *shape) float32, ``mask`` (M, A) bool, ``action`` (M,) int64 (the expert's move), ``target``
    (M, A) float32 (the expert's distribution), ``result`` (M,) float32 (final result for the mover), from
    ``num_games`` games of ``expert`` against itself."""
    if num_games < 1:
        raise ValueError(f"num_games: must be >= 1, got {num_games}")
    if not 0.0 <= explore <= 1.0:
        raise ValueError(f"explore: expected a probability, got {explore}")
    rng = np.random.default_rng(seed)
    env = BoardGameBatch(game, min(num_envs, num_games))
    n = env.num_envs
    quota = num_games // n + (np.arange(n) < num_games % n)
    played = np.zeros(n, dtype=np.int64)
    obs, mask, to_play = env.reset()
    bufs: list[list[tuple]] = [[] for _ in range(n)]
    rows: list[tuple] = []
    active = quota > 0
    while active.any():
        probs = np.zeros(mask.shape)
        probs[active] = expert.probs(obs[active], mask[active])
        labels = np.full(n, PASS, dtype=np.int64)  # boards that finished their share of games pass
        labels[active] = expert(obs[active], mask[active], rng)
        actions = labels.copy()
        wild = active & (rng.random(n) < explore)
        if wild.any():
            u = rng.random(mask.shape) * mask
            actions[wild] = np.argmax(u + mask, axis=1)[wild]
        for b in np.flatnonzero(active):
            bufs[b].append((obs[b], mask[b], labels[b], probs[b], to_play[b]))
        obs, mask, to_play, rewards, done = env.step(actions)
        for b in np.flatnonzero(done & active):
            rows.extend((o, m, a, p, float(rewards[b, s])) for o, m, a, p, s in bufs[b])
            bufs[b] = []
            played[b] += 1
        active &= played < quota
    return {
        "obs": np.stack([r[0] for r in rows]).astype(np.float32),
        "mask": np.stack([r[1] for r in rows]).astype(bool),
        "action": np.array([r[2] for r in rows], dtype=np.int64),
        "target": np.stack([r[3] for r in rows]).astype(np.float32),
        "result": np.array([r[4] for r in rows], dtype=np.float32),
    }


def behaviour_clone(agent: BoardAgent, params: Params, dataset: dict[str, np.ndarray], epochs: int, lr: float,
                    seed: int, batch_size: int = 256, value_coef: float = 0.5) -> tuple[Params, dict[str, float]]:
    """Fit ``agent``'s policy (and value head, when the dataset has ``result``) to ``dataset``; returns the new
    parameters and the last epoch's mean ``loss``, ``policy_loss``, ``value_loss`` and ``accuracy`` (share of
    rows whose argmax move has positive target probability)."""
    for k in ("obs", "mask", "action"):
        if k not in dataset:
            raise ValueError(f"dataset: missing {k!r}")
    n = len(dataset["action"])
    if n == 0 or epochs < 1 or lr <= 0 or batch_size < 1:
        raise ValueError(f"behaviour_clone: need rows, epochs >= 1, lr > 0, batch_size >= 1 (got {n}, {epochs}, "
                         f"{lr}, {batch_size})")
    target = dataset["target"] if "target" in dataset else np.eye(agent.num_actions, dtype=np.float32)[dataset["action"]]
    has_value = "result" in dataset
    result = dataset["result"] if has_value else np.zeros(n, np.float32)
    opt = optim.adam(lr)

    def loss_fn(p: Any, mb: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        logits, value = agent.apply(p, mb["obs"], mb["mask"])
        w = mb["weight"]
        total = ops.sum(w)
        logp = ops.log_softmax(logits, axis=-1)
        policy_loss = ops.sum(-ops.sum(mb["target"] * logp, axis=-1) * w) / total
        value_loss = ops.sum(ops.square(value - mb["result"]) * w) / total
        best = ops.one_hot(ops.argmax(logits, axis=-1), agent.num_actions)
        correct = ops.sum(ops.sum(best * ops.astype(mb["target"] > 0, np.float32), axis=-1) * w) / total
        loss = policy_loss + (value_coef if has_value else 0.0) * value_loss
        return loss, {"policy_loss": policy_loss, "value_loss": value_loss, "accuracy": correct}

    def step(p: Any, s: Any, mb: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
        (loss, aux), g = engine.value_and_grad(loss_fn, has_aux=True)(p, mb)
        p, s = opt.update(g, s, p)
        return p, s, dict(aux, loss=loss)

    step = engine.jit(step)
    rng = np.random.default_rng(seed)
    p = {k: np.array(v, dtype=np.float32, copy=True) for k, v in params.items()}
    state = opt.init(p)
    bs = min(batch_size, n)
    metrics: dict[str, float] = {}
    for _ in range(epochs):
        perm = rng.permutation(n)
        sums: dict[str, float] = {}
        weight_total = 0.0
        for start in range(0, n, bs):
            idx = perm[start:start + bs]
            real = len(idx)
            w = np.zeros(bs, np.float32)
            w[:real] = 1.0
            if real < bs:
                idx = np.concatenate([idx, perm[np.arange(bs - real) % n]])
            mb = {"obs": dataset["obs"][idx].astype(np.float32), "mask": dataset["mask"][idx].astype(np.float32),
                  "target": target[idx].astype(np.float32), "result": result[idx].astype(np.float32), "weight": w}
            p, state, aux = step(p, state, mb)
            for k, v in aux.items():
                sums[k] = sums.get(k, 0.0) + float(v) * real
            weight_total += real
        metrics = {k: v / weight_total for k, v in sums.items()}
    return {k: np.asarray(v) for k, v in p.items()}, metrics


__all__ = ["behaviour_clone", "expert_dataset"]
