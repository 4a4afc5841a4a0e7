"""Tabular policies of extensive-form games: information state -> probabilities over the game's actions.

A :class:`TabularPolicy` holds one row per information state of every player (``probs[s, a]``, zero on
illegal actions), in the order of the compiled :class:`~fedarena.marl.game_tree.GameTree`. Plain dicts
``{information state: probabilities}`` are accepted wherever a policy is, and validated with errors that
name the information state (Shoham & Leyton-Brown, *Multiagent Systems*, sec. 5.2.3, behavioural strategies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Union

import numpy as np

from fedarena.envs.efg import Game
from fedarena.marl.game_tree import GameTree, game_tree

PROB_TOLERANCE = 1e-6
"""How far a row of probabilities may sum from one."""


class PolicyError(ValueError):
    """A policy that is not a valid behavioural strategy of the game; the message names the information state."""


@dataclass(frozen=True, eq=False)
class TabularPolicy:
    """Action probabilities per information state; ``probs`` has shape ``(num_infostates, num_actions)``."""

    tree: GameTree
    probs: np.ndarray

    def __post_init__(self) -> None:
        p = np.array(self.probs, dtype=np.float64)
        p.setflags(write=False)
        object.__setattr__(self, "probs", p)

    @property
    def infostates(self) -> tuple[str, ...]:
        return self.tree.infostates

    def __getitem__(self, infostate: str) -> np.ndarray:
        return self.probs[self._row(infostate)]

    def __contains__(self, infostate: object) -> bool:
        return infostate in self.tree.infostate_index

    def _row(self, infostate: str) -> int:
        try:
            return self.tree.infostate_index[infostate]
        except KeyError:
            raise KeyError(f"'{infostate}' is not an information state of {self.tree.game.name}") from None

    def action_probabilities(self, infostate: str) -> dict[int, float]:
        """``{action: probability}`` over the legal actions of ``infostate``."""
        row = self._row(infostate)
        return {int(a): float(self.probs[row, a]) for a in np.flatnonzero(self.tree.legal[row])}

    def to_dict(self) -> dict[str, list[float]]:
        return {s: self.probs[i].tolist() for i, s in enumerate(self.tree.infostates)}

    def with_player(self, player: int, other: "TabularPolicy") -> "TabularPolicy":
        """This policy with ``player``'s rows taken from ``other``."""
        rows = self.tree.infostate_player == player
        p = self.probs.copy()
        p[rows] = other.probs[rows]
        return TabularPolicy(self.tree, p)


PolicyLike = Union[TabularPolicy, Mapping[str, Any], np.ndarray]


def uniform_policy(game: Game | GameTree) -> TabularPolicy:
    """Uniform random play over the legal actions of every information state."""
    tree = game_tree(game)
    return TabularPolicy(tree, tree.uniform_probs())


def policy_from_array(game: Game | GameTree, probs: np.ndarray) -> TabularPolicy:
    """A validated policy from an array of shape ``(num_infostates, num_actions)`` in the tree's order."""
    tree = game_tree(game)
    p = np.asarray(probs, dtype=np.float64)
    if p.shape != tree.legal.shape:
        raise PolicyError(f"policy: expected an array of shape {tree.legal.shape} "
                          f"(information states x actions), got {p.shape}")
    _check_rows(tree, p)
    return TabularPolicy(tree, p)


def _row_from_value(tree: GameTree, row: int, value: Any) -> np.ndarray:
    name = tree.infostates[row]
    legal = np.flatnonzero(tree.legal[row])
    out = np.zeros(tree.num_actions)
    if isinstance(value, Mapping):
        for a, q in value.items():
            if not isinstance(a, (int, np.integer)) or not 0 <= int(a) < tree.num_actions:
                raise PolicyError(f"policy['{name}']: action {a!r} is not one of 0..{tree.num_actions - 1}")
            out[int(a)] = float(q)
        return out
    v = np.asarray(value, dtype=np.float64)
    if v.ndim != 1:
        raise PolicyError(f"policy['{name}']: expected a vector of probabilities, got shape {v.shape}")
    if len(v) == tree.num_actions:
        return v.copy()
    if len(v) == len(legal):
        out[legal] = v
        return out
    raise PolicyError(f"policy['{name}']: expected {tree.num_actions} probabilities (one per action) "
                      f"or {len(legal)} (one per legal action), got {len(v)}")


def _check_rows(tree: GameTree, p: np.ndarray, rows: np.ndarray | None = None) -> None:
    rows = np.arange(len(p)) if rows is None else rows
    sub, legal = p[rows], tree.legal[rows]
    bad = ~np.isfinite(sub).all(axis=1)
    if bad.any():
        raise PolicyError(f"policy['{tree.infostates[rows[np.argmax(bad)]]}']: probabilities must be finite numbers")
    neg = (sub < 0).any(axis=1)
    if neg.any():
        r = np.argmax(neg)
        raise PolicyError(f"policy['{tree.infostates[rows[r]]}']: negative probability in {sub[r].tolist()}")
    illegal = (sub * ~legal > 0).any(axis=1)
    if illegal.any():
        r = np.argmax(illegal)
        acts = np.flatnonzero((sub[r] > 0) & ~legal[r]).tolist()
        raise PolicyError(f"policy['{tree.infostates[rows[r]]}']: probability on illegal action(s) {acts}; "
                          f"legal actions are {np.flatnonzero(legal[r]).tolist()}")
    sums = sub.sum(axis=1)
    off = np.abs(sums - 1.0) > PROB_TOLERANCE
    if off.any():
        r = np.argmax(off)
        raise PolicyError(f"policy['{tree.infostates[rows[r]]}']: probabilities sum to {sums[r]:.9g}, expected 1")


def check_policy_batch(tree: GameTree, probs: np.ndarray, players: tuple[int, ...] | None = None,
                       name: str = "policies") -> None:
    """Validate a stack of policy arrays ``(K, S, A)`` at once; the error names the policy and the state."""
    P = np.asarray(probs, dtype=np.float64)
    if P.ndim != 3 or P.shape[1:] != tree.legal.shape:
        raise PolicyError(f"{name}: expected arrays of shape {tree.legal.shape}, got {P.shape[1:]}")
    rows = np.arange(tree.num_infostates) if players is None else np.flatnonzero(
        np.isin(tree.infostate_player, players))
    sub = P[:, rows]
    ok = (np.isfinite(sub).all(axis=2) & (sub >= 0).all(axis=2) & ~((sub * ~tree.legal[rows]) > 0).any(axis=2)
          & (np.abs(sub.sum(axis=2) - 1.0) <= PROB_TOLERANCE))
    if not ok.all():
        k = int(np.argmax(~ok.all(axis=1)))
        try:
            _check_rows(tree, P[k], rows)
        except PolicyError as e:
            raise PolicyError(f"{name}[{k}]: {e}") from None


def as_policy(game: Game | GameTree, policy: PolicyLike, players: tuple[int, ...] | None = None) -> TabularPolicy:
    """``policy`` (a :class:`TabularPolicy`, a dict ``infostate -> probabilities`` or an array) validated
    against ``game``. With ``players`` given, only their information states are required (the others are
    filled with uniform play and not used by the caller)."""
    tree = game_tree(game)
    needed = np.arange(tree.num_infostates) if players is None else np.flatnonzero(
        np.isin(tree.infostate_player, players))
    if isinstance(policy, TabularPolicy):
        if policy.tree is not tree and policy.tree.infostates != tree.infostates:
            raise PolicyError(f"policy: belongs to game {policy.tree.game.name}, not {tree.game.name}")
        if policy.probs.shape != tree.legal.shape:
            raise PolicyError(f"policy: probs has shape {policy.probs.shape}, expected {tree.legal.shape}")
        _check_rows(tree, policy.probs, needed)
        return policy if policy.tree is tree else TabularPolicy(tree, policy.probs)
    if isinstance(policy, np.ndarray):
        return policy_from_array(tree, policy)
    if not isinstance(policy, Mapping):
        raise PolicyError(f"policy: expected a TabularPolicy, a dict from information state to probabilities "
                          f"or an array, got {type(policy).__name__}")
    missing = [tree.infostates[r] for r in needed if tree.infostates[r] not in policy]
    if missing:
        shown = ", ".join(f"'{m}'" for m in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise PolicyError(f"policy: missing {len(missing)} information state(s) of {tree.game.name}: {shown}")
    unknown = [k for k in policy if k not in tree.infostate_index]
    if unknown:
        raise PolicyError(f"policy: '{unknown[0]}' is not an information state of {tree.game.name}")
    p = tree.uniform_probs()
    for r in needed:
        p[r] = _row_from_value(tree, r, policy[tree.infostates[r]])
    _check_rows(tree, p, needed)
    return TabularPolicy(tree, p)
