"""Attackers as participants of federated rounds: the attack interface, the built-in attacks, the strategy
wrapper that plants a colluding coalition in the in-process simulation (:class:`Attacked`), and the malicious
client of the gRPC runtime (:class:`ClientAttack`, which sees only its own data and update). The ``attack``
section is :class:`fedarena.federated.config.AttackConfig` (re-exported here).

An attack sees what a colluding coalition would see in its runtime and returns the coalition's uploads:
``attack(round, honest_updates, own_updates, context) -> (a, d)``. In the simulation the round's honest
updates are known to it (the strongest, "omniscient" coalition of the papers below); in the gRPC runtime
``honest_updates`` is None and ``own_updates`` is the one attacking client's own update, so only the attacks
that need no honest update run there (sign flip, scaling, label flipping, backdoor; :data:`NEEDS_HONEST`). Rows are flattened client deltas
(parameter names in sorted order, as :func:`flatten`). A data-poisoning attack changes its members' local
examples instead (:meth:`Attack.poison`), so it goes through ordinary local training.

* Sign flip and scaling: upload ``-s Delta`` or ``s Delta`` of the own update.
* ALIE, "A Little Is Enough" (Baruch, Baruch & Goldberg, NeurIPS 2019, Sec. 3 and Algorithm 3): every
  attacker uploads ``mu - z sigma`` (coordinate-wise mean and standard deviation of the benign updates), with
  ``s = floor(n / 2 + 1) - f`` and ``z = Phi^{-1}((n - s) / n)`` for ``n`` updates of which ``f`` are
  the coalition's: the largest shift that still leaves the attackers closer to the mean than enough honest
  updates for a median- or Krum-type rule to pick them.
* IPM, inner-product manipulation (Xie, Koyejo & Gupta, "Fall of Empires", UAI 2020): every attacker uploads
  ``-epsilon mu``; a small ``epsilon`` hides inside robust rules' acceptance region while it makes the inner
  product of the aggregate with the true gradient small or negative.
* Min-max and min-sum (Shejwalkar & Houmansadr, "Manipulating the Byzantine", NDSS 2021, Sec. IV, the
  aggregation-agnostic attacks): every attacker uploads ``mu + gamma p`` with the perturbation ``p`` one of
  ``-mu / ||mu||`` (unit), ``-sigma`` (std) or ``-sign(mu)`` (sign), and the largest ``gamma`` (a halving
  search from ``gamma_init`` to ``tolerance``) such that the malicious update's largest distance to a benign
  update is at most the largest distance between two benign updates (min-max), or its sum of squared distances
  to the benign updates is at most the largest such sum of a benign update (min-sum).
* Label flipping (data poisoning; Biggio et al. 2012, Fang et al. 2020's baseline): the attackers' examples of
  label ``y`` are relabelled ``C - 1 - y``.
* Backdoor by model replacement (Bagdasaryan et al., "How To Backdoor Federated Learning", AISTATS 2020,
  Sec. 3): the attackers add copies of their examples with a trigger stamped on them and the target label,
  train on the mix, and boost the result, ``Delta <- gamma Delta`` with ``gamma = n / (eta a)`` (``n`` updates,
  server learning rate ``eta``, ``a`` attackers in the round) so that the averaged model is replaced by the
  backdoored one; :func:`attack_success_rate` measures the backdoor on triggered test examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any, Protocol, Sequence

import numpy as np

from fedarena.federated.config import ATTACKS, AttackConfig, AttackName, Direction  # noqa: F401  (the section)
from fedarena.federated.strategy import ClientUpdate, Params, RoundState
from fedarena.federated.wrappers import StrategyWrapper



@dataclass(frozen=True)
class AttackContext:
    """What an attacker knows of its round besides the updates."""

    num_updates: int
    """``n``: the updates the server aggregates this round (honest and the coalition's)"""
    server_lr: float = 1.0
    """the server's learning rate ``eta`` (model replacement's boost ``n / (eta a)``)"""


class Attack(Protocol):
    """An attacker (see the module docstring)."""

    def attack(self, rnd: int, honest_updates: np.ndarray | None, own_updates: np.ndarray,
               context: AttackContext) -> np.ndarray: ...

    def poison(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]: ...


def _benign(honest: np.ndarray | None, own: np.ndarray) -> np.ndarray:
    """The benign updates the coalition reasons about: the honest ones when it sees them, else its own."""
    return own if honest is None or len(honest) == 0 else honest


class ModelAttack:
    """Base of the attacks that manipulate uploads only (their members' local data stays clean)."""

    def poison(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return x, y


@dataclass(frozen=True)
class SignFlip(ModelAttack):
    """Upload ``-scale * Delta``."""

    scale: float = 4.0

    def attack(self, rnd, honest_updates, own_updates, context):
        return -self.scale * np.asarray(own_updates, np.float64)


@dataclass(frozen=True)
class Scaling(ModelAttack):
    """Upload ``scale * Delta``."""

    scale: float = 4.0

    def attack(self, rnd, honest_updates, own_updates, context):
        return self.scale * np.asarray(own_updates, np.float64)


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s ``z_max = Phi^{-1}((n - s) / n)`` with ``s = floor(n / 2 + 1) - f`` (``s >= 1``)."""
    s = max(1, math.floor(n / 2 + 1) - f)
    return NormalDist().inv_cdf((n - s) / n)


@dataclass(frozen=True)
class ALIE(ModelAttack):
    """"A Little Is Enough": ``mu - z sigma`` for every attacker; ``z = 0`` takes Baruch et al.'s ``z_max``."""

    z: float = 0.0

    def attack(self, rnd, honest_updates, own_updates, context):
        b = _benign(honest_updates, own_updates)
        z = self.z if self.z > 0 else alie_z(context.num_updates, len(own_updates))
        mal = b.mean(0) - z * b.std(0)
        return np.repeat(mal[None], len(own_updates), axis=0)


@dataclass(frozen=True)
class IPM(ModelAttack):
    """Inner-product manipulation: ``-epsilon * mean(benign)`` for every attacker."""

    epsilon: float = 0.5

    def attack(self, rnd, honest_updates, own_updates, context):
        mal = -self.epsilon * _benign(honest_updates, own_updates).mean(0)
        return np.repeat(mal[None], len(own_updates), axis=0)


def perturbation(benign: np.ndarray, direction: Direction) -> np.ndarray:
    """Shejwalkar & Houmansadr's perturbation vectors: ``-mu / ||mu||``, ``-sigma`` or ``-sign(mu)``."""
    mu = benign.mean(0)
    if direction == "unit":
        return -mu / max(float(np.linalg.norm(mu)), 1e-30)
    if direction == "std":
        return -benign.std(0)
    return -np.sign(mu)


def _sq_dists(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0)


def largest_gamma(ok: Any, gamma_init: float, tolerance: float, max_doublings: int = 60) -> float:
    """The largest ``gamma >= 0`` with ``ok(gamma)`` for a feasible set ``[0, gamma_max]``: doubling from
    ``gamma_init`` while feasible, then halving steps until the step is below ``tolerance`` (the search of
    Shejwalkar & Houmansadr's Algorithm 1). Returns the last feasible ``gamma`` (0 if none was)."""
    lo, hi = 0.0, gamma_init
    for _ in range(max_doublings):
        if not ok(hi):
            break
        lo, hi = hi, 2.0 * hi
    else:
        return lo
    while hi - lo > tolerance:
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class MinMax(ModelAttack):
    """Min-max: the largest ``gamma`` with ``max_i ||m - g_i|| <= max_{i,j} ||g_i - g_j||``."""

    direction: Direction = "std"
    gamma_init: float = 10.0
    tolerance: float = 1e-5

    def gamma(self, benign: np.ndarray) -> float:
        mu, p = benign.mean(0), perturbation(benign, self.direction)
        bound = _sq_dists(benign, benign).max()
        return largest_gamma(lambda g: _sq_dists((mu + g * p)[None], benign).max() <= bound,
                             self.gamma_init, self.tolerance)

    def attack(self, rnd, honest_updates, own_updates, context):
        b = _benign(honest_updates, own_updates)
        mal = b.mean(0) + self.gamma(b) * perturbation(b, self.direction)
        return np.repeat(mal[None], len(own_updates), axis=0)


@dataclass(frozen=True)
class MinSum(MinMax):
    """Min-sum: the largest ``gamma`` with ``sum_i ||m - g_i||^2 <= max_i sum_j ||g_i - g_j||^2``."""

    def gamma(self, benign: np.ndarray) -> float:
        mu, p = benign.mean(0), perturbation(benign, self.direction)
        bound = _sq_dists(benign, benign).sum(1).max()
        return largest_gamma(lambda g: _sq_dists((mu + g * p)[None], benign).sum() <= bound,
                             self.gamma_init, self.tolerance)


@dataclass(frozen=True)
class LabelFlip:
    """Data poisoning: label ``y`` becomes ``num_classes - 1 - y``; the uploads are the honestly trained ones."""

    num_classes: int

    def poison(self, x, y, rng):
        return x, (self.num_classes - 1 - np.asarray(y)).astype(np.asarray(y).dtype)

    def attack(self, rnd, honest_updates, own_updates, context):
        return np.asarray(own_updates, np.float64)


DIGITS_TRIGGER: tuple[int, ...] = (54, 55, 62, 63)
"""a 2x2 square in the bottom-right corner of an 8x8 digits image (flat pixel indices), blank in clean digits"""


@dataclass(frozen=True)
class Backdoor:
    """Model replacement with a pixel-pattern trigger (see the module docstring)."""

    target: int = 0
    trigger: tuple[int, ...] = DIGITS_TRIGGER
    trigger_value: float = 1.0
    poison_fraction: float = 0.5
    """triggered copies added, as a fraction of the attacker's examples (drawn without replacement)"""
    boost: float = 0.0
    """the upload's scale ``gamma``; 0 = model replacement's ``n / (eta a)``"""

    def stamp(self, x: np.ndarray) -> np.ndarray:
        """``x`` with the trigger pixels set to ``trigger_value``."""
        out = np.array(x, copy=True)
        out[:, list(self.trigger)] = self.trigger_value
        return out

    def poison(self, x, y, rng):
        if max(self.trigger) >= np.shape(x)[1]:
            raise ValueError(f"kind: backdoor's trigger pixels {list(self.trigger)} need at least "
                             f"{max(self.trigger) + 1} features (8x8 digits), the data has {np.shape(x)[1]}")
        k = int(round(self.poison_fraction * len(y)))
        pick = rng.choice(len(y), size=k, replace=False)
        return (np.concatenate([x, self.stamp(x[pick])]),
                np.concatenate([y, np.full(k, self.target, np.asarray(y).dtype)]))

    def attack(self, rnd, honest_updates, own_updates, context):
        a = len(own_updates)
        gamma = self.boost if self.boost > 0 else context.num_updates / (context.server_lr * a)
        return gamma * np.asarray(own_updates, np.float64)


def attack_success_rate(logits_fn: Any, x: np.ndarray, y: np.ndarray, backdoor: Backdoor) -> float:
    """The fraction of the examples not of the target class that the model classifies as the target once the
    trigger is stamped on them (Bagdasaryan et al.'s backdoor accuracy); ``logits_fn(x) -> (n, C)``."""
    keep = np.asarray(y) != backdoor.target
    if not keep.any():
        return float("nan")
    pred = np.asarray(logits_fn(backdoor.stamp(np.asarray(x)[keep]))).argmax(1)
    return float((pred == backdoor.target).mean())


# ----------------------------------------------------------------------------- the simulation's attacker


def flatten(delta: Params, names: Sequence[str]) -> np.ndarray:
    return np.concatenate([np.asarray(delta[k], np.float64).ravel() for k in names])


def unflatten(flat: np.ndarray, like: Params, names: Sequence[str]) -> Params:
    out, i = {}, 0
    for k in names:
        n = int(np.size(like[k]))
        out[k] = flat[i: i + n].reshape(np.shape(like[k]))
        i += n
    return out


@dataclass
class Attacked(StrategyWrapper):
    """A strategy whose round includes a colluding coalition ``attacker_ids``: before ``inner`` aggregates,
    the coalition's updates of the round are replaced by ``attack(round, honest, own, context)``, where
    ``honest`` are the other clients' updates of that round. Every other hook is the inner strategy's.
    ``last_attackers`` is how many of the coalition reported in the last aggregated round."""

    inner: Any
    attack: Attack
    attacker_ids: frozenset[str]
    last_attackers: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.attacker_ids = frozenset(self.attacker_ids)

    @property
    def linear(self) -> bool:
        return False  # the coalition needs the round's individual updates

    def aggregate_partial(self, state, total):
        raise ValueError("attack: the coalition replaces individual updates; a partial sum hides them")

    def aggregate(self, state: RoundState, updates: Sequence[ClientUpdate], num_clients: int) -> RoundState:
        bad = [i for i, u in enumerate(updates) if u.client_id in self.attacker_ids]
        self.last_attackers = len(bad)
        if bad:
            names = sorted(state.params)
            good = [i for i in range(len(updates)) if i not in set(bad)]
            flat = np.stack([flatten(u.delta, names) for u in updates])
            opt = getattr(self.inner, "server_optimizer", None)
            ctx = AttackContext(len(updates), float(getattr(opt, "lr", 1.0)))
            mal = np.asarray(self.attack.attack(state.round, flat[good], flat[bad], ctx), np.float64)
            if mal.shape != (len(bad), flat.shape[1]):
                raise ValueError(f"attack: returned shape {mal.shape}, expected {(len(bad), flat.shape[1])}")
            updates = list(updates)
            for r, i in enumerate(bad):
                updates[i] = replace(updates[i], delta=unflatten(mal[r], state.params, names))
        return self.inner.aggregate(state, updates, num_clients)


NEEDS_HONEST: tuple[str, ...] = ("alie", "ipm", "min_max", "min_sum")
"""the attacks computed from the round's honest updates (their mean and spread): simulation only"""


@dataclass(frozen=True)
class ClientAttack:
    """One attacking client of the gRPC runtime: it sees only its own data (poisoned by the deployment before the
    client starts, :meth:`Attack.poison`) and its own update, so ``honest_updates`` is None and ``own_updates`` is
    its one row; ``context`` holds what the deployment's config makes public (the clients per round ``n`` and the
    server learning rate)."""

    attack: Attack
    context: AttackContext

    def upload(self, rnd: int, delta: Params) -> Params:
        """The update this client uploads in round ``rnd`` in place of its honest ``delta`` (float32 tensors)."""
        names = sorted(delta)
        mal = np.asarray(self.attack.attack(rnd, None, flatten(delta, names)[None], self.context), np.float64)
        return {k: np.asarray(v, np.float32) for k, v in unflatten(mal[0], delta, names).items()}


def client_attack(spec: dict[str, Any], index: int, num_classes: int, x: np.ndarray, y: np.ndarray
                  ) -> tuple[ClientAttack | None, np.ndarray, np.ndarray]:
    """The attack of client ``index`` of a deployment (``spec`` as written by the ``fedavg_grpc`` kind: ``kind``,
    ``params``, ``clients`` (the coalition's indices), ``num_updates``, ``server_lr``, ``seed``), and its local
    data poisoned as in the simulation (:func:`poison_clients`'s draw ``(seed, index, 17)``); ``(None, x, y)`` for
    an honest client."""
    if not spec or index not in spec.get("clients", ()):
        return None, x, y
    if spec["kind"] in NEEDS_HONEST:
        raise ValueError(f"attack.kind: {spec['kind']} needs the round's honest updates, which a client sees only "
                         "in the simulation")
    attack = make_attack(spec["kind"], num_classes, **spec["params"])
    px, py = attack.poison(x, y, np.random.default_rng([spec["seed"], index, 17]))
    ctx = AttackContext(int(spec["num_updates"]), float(spec["server_lr"]))
    return ClientAttack(attack, ctx), np.asarray(px, np.asarray(x).dtype), np.asarray(py, np.asarray(y).dtype)


def poison_clients(attack: Attack, x: np.ndarray, y: np.ndarray, train: Sequence[np.ndarray],
                   client_ids: Sequence[str], attacker_ids: frozenset[str], seed: int
                   ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """The simulation's examples with every attacker's local training set replaced by ``attack.poison`` of it:
    the poisoned examples are appended to ``(x, y)`` and the attacker's training indices point at them, so the
    other clients' examples, the held-out sets and the test set are untouched."""
    if isinstance(attack, ModelAttack):  # uploads only: the local data stays as it is
        return x, y, list(train)
    xs, ys, new_train = [np.asarray(x)], [np.asarray(y)], list(train)
    end = len(y)
    for i, cid in enumerate(client_ids):
        if cid not in attacker_ids:
            continue
        px, py = attack.poison(np.asarray(x)[train[i]], np.asarray(y)[train[i]],
                               np.random.default_rng([seed, i, 17]))
        xs.append(px.astype(xs[0].dtype))
        ys.append(py.astype(ys[0].dtype))
        new_train[i] = np.arange(end, end + len(py))
        end += len(py)
    return np.concatenate(xs), np.concatenate(ys), new_train


# ----------------------------------------------------------------------------- config


@dataclass(frozen=True)
class AttackPlan:
    """A built attack: the attack, its coalition, and how it enters a simulation."""

    attack: Attack | None
    attacker_ids: frozenset[str]
    seed: int = 0

    def strategy(self, inner: Any) -> Any:
        """``inner`` with the coalition planted (``inner`` itself when there is no attack)."""
        return inner if self.attack is None or not self.attacker_ids else Attacked(inner, self.attack,
                                                                                  self.attacker_ids)

    def data(self, x, y, train, client_ids):
        """``(x, y, train)`` with the coalition's local data poisoned (:func:`poison_clients`)."""
        if self.attack is None or not self.attacker_ids:
            return x, y, list(train)
        return poison_clients(self.attack, x, y, train, client_ids, self.attacker_ids, self.seed)


def make_attack(kind: str, num_classes: int, **params: Any) -> Attack | None:
    """The built-in attack ``kind`` (None for ``none``) with the parameters of the ``attack`` section."""
    p = params
    return {
        "none": lambda: None,
        "sign_flip": lambda: SignFlip(p["scale"]), "scale": lambda: Scaling(p["scale"]),
        "alie": lambda: ALIE(p["z"]), "ipm": lambda: IPM(p["epsilon"]),
        "min_max": lambda: MinMax(p["direction"], p["gamma_init"], p["tolerance"]),
        "min_sum": lambda: MinSum(p["direction"], p["gamma_init"], p["tolerance"]),
        "label_flip": lambda: LabelFlip(num_classes),
        "backdoor": lambda: Backdoor(p["target"], poison_fraction=p["poison_fraction"], boost=p["boost"]),
    }[kind]()
