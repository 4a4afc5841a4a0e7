"""Tabular policies as JSON files that other tools can read, and their loaders (fedarena and OpenSpiel).

File format (``format: "fedarena.tabular_policy/1"``), one JSON object:

- ``game``: the game string as :func:`fedarena.envs.load_game` takes it (``"leduc_poker"``, ``"liars_dice"``,
  ``"kuhn_poker(players=3)"``);
- ``num_actions``: the game's ``num_distinct_actions``; every probability vector has this length, zero on
  illegal actions;
- ``policy``: information-state string -> probabilities over the game's actions, one entry per information
  state of every player (the strings are the game's own: OpenSpiel's for OpenSpiel games);
- ``algorithm``, ``iterations`` and any other keys: what produced the policy (informative only).

Run folders keep the export as ``policy.json`` (``cfr``, ``mccfr``), ``policy_<meta-solver>.json`` (``psro``: the
populations mixed by each meta-solver's meta-strategy) or ``policy_seed<seed>.json`` (``nfsp``: each learner's
average network as a table); ``fedarena evaluate RUN`` scores them exactly.

Probabilities are written with Python's shortest round-tripping float repr, so a loaded policy equals the
saved one bit for bit. :func:`to_openspiel_policy` builds an ``open_spiel.python.policy.TabularPolicy`` of the
same game; for fedarena's own Kuhn and Leduc poker, whose information-state strings are fedarena's, it walks
both games' trees together (same actions and chance outcomes) to map each string to OpenSpiel's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from fedarena.envs import load_game
from fedarena.envs.efg import CHANCE, TERMINAL, Game
from fedarena.marl.policy import TabularPolicy

FORMAT = "fedarena.tabular_policy/1"
POLICY_FILE = "policy.json"
"""Where a run folder keeps its exported average policy."""


class PolicyFileError(ValueError):
    """A policy file that cannot be read or does not fit its game (one-line message; a user error)."""

    user_error = True


@dataclass(frozen=True)
class ExportedPolicy:
    """A loaded policy file: the game string, information-state string -> probabilities, and the rest."""

    game: str
    num_actions: int
    policy: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)


def export_policy(path: str | Path, game: str, policy: TabularPolicy | Mapping[str, Any], **meta: Any) -> Path:
    """Write ``policy`` (a :class:`TabularPolicy` or a dict information state -> probabilities over the game's
    actions) for the game called ``game`` to ``path`` in the format of the module docstring."""
    if isinstance(policy, TabularPolicy):
        rows = {s: policy.probs[j] for j, s in enumerate(policy.tree.infostates)}
    else:
        rows = dict(policy)
    num_actions = load_game(game).num_distinct_actions
    table = {}
    for key, p in rows.items():
        v = np.asarray(p, dtype=np.float64)
        if v.shape != (num_actions,):
            raise ValueError(f"policy['{key}']: expected {num_actions} probabilities, got shape {v.shape}")
        table[str(key)] = [float(x) for x in v]
    doc = {"format": FORMAT, "game": game, "num_actions": num_actions, **meta, "policy": table}
    path = Path(path)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def load_policy(path: str | Path) -> ExportedPolicy:
    """Read a policy file; anything malformed is a one-line :class:`PolicyFileError` naming the field."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PolicyFileError(f"{path}: no policy file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PolicyFileError(f"{path}: not a JSON policy file ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PolicyFileError(f"{path}: format: expected '{FORMAT}'")
    game, A, table = doc.get("game"), doc.get("num_actions"), doc.get("policy")
    if not isinstance(game, str) or not isinstance(A, int) or not isinstance(table, dict):
        raise PolicyFileError(f"{path}: expected 'game' (string), 'num_actions' (int) and 'policy' (mapping)")
    out = {}
    for key, p in table.items():
        v = np.asarray(p, dtype=np.float64) if isinstance(p, list) else np.zeros(0)
        if (v.shape != (A,) or not np.all(np.isfinite(v)) or (v < 0).any()
                or not math.isclose(float(v.sum()), 1.0, abs_tol=1e-6)):
            raise PolicyFileError(f"{path}: policy['{key}']: expected {A} probabilities summing to 1")
        out[key] = v
    meta = {k: v for k, v in doc.items() if k not in ("format", "game", "num_actions", "policy")}
    return ExportedPolicy(game, A, out, meta)


def _openspiel_keys(game: Game, pyspiel_game: Any) -> dict[str, str]:
    """fedarena information-state string -> OpenSpiel's, by walking both trees with the same moves."""
    mapping: dict[str, str] = {}
    stack = [(game.new_initial_state(), pyspiel_game.new_initial_state())]
    while stack:
        s, o = stack.pop()
        p = s.current_player()
        if p == TERMINAL:
            continue
        if p == CHANCE:
            mine, theirs = s.chance_outcomes(), [(int(a), float(q)) for a, q in o.chance_outcomes()]
            if [a for a, _ in mine] != [a for a, _ in theirs] or not np.allclose([q for _, q in mine],
                                                                                 [q for _, q in theirs]):
                raise PolicyFileError(f"game {game.name}: chance outcomes differ from OpenSpiel's at {s.history()}")
            moves = [a for a, _ in mine]
        else:
            if p != o.current_player() or s.legal_actions() != list(o.legal_actions()):
                raise PolicyFileError(f"game {game.name}: players or legal actions differ from OpenSpiel's at "
                                      f"{s.history()}")
            mapping[s.information_state_string(p)] = o.information_state_string(p)
            moves = s.legal_actions()
        stack.extend((s.child(a), o.child(a)) for a in moves)
    return mapping


def to_openspiel_policy(exported: ExportedPolicy) -> Any:
    """The policy as an ``open_spiel.python.policy.TabularPolicy`` of the OpenSpiel game of the same name."""
    from open_spiel.python import policy as os_policy

    from fedarena.envs.openspiel import OpenSpielGame, load_openspiel

    game = load_game(exported.game)
    spec = game.spec if isinstance(game, OpenSpielGame) else exported.game
    pyspiel_game = game.pyspiel_game if isinstance(game, OpenSpielGame) else load_openspiel(spec)
    keys = ({k: k for k in exported.policy} if isinstance(game, OpenSpielGame)
            else _openspiel_keys(game, pyspiel_game))
    tabular = os_policy.TabularPolicy(pyspiel_game)
    by_openspiel = {keys[k]: v for k, v in exported.policy.items() if k in keys}
    missing = [k for k in tabular.state_lookup if k not in by_openspiel]
    if missing:
        raise PolicyFileError(f"game {exported.game}: the policy has no entry for OpenSpiel information state "
                              f"{missing[0]!r} ({len(missing)} missing)")
    for key, row in tabular.state_lookup.items():
        tabular.action_probability_array[row] = by_openspiel[key]
    return tabular


def exact_exploitability(exported: ExportedPolicy) -> float:
    """fedarena's exact exploitability (NashConv / n) of the exported policy (games within ``max_tree_nodes``)."""
    from fedarena.marl.exploitability import exploitability

    return exploitability(load_game(exported.game), exported.policy)


def evaluate_exported(run_dir: Any, config: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``evaluate`` hook of the kinds that export policies: the exact exploitability of ``policy.json``, or of
    every ``policy_<name>.json`` (PSRO: one per meta-solver; NFSP: one per seed) when there is no ``policy.json``."""
    from fedarena.platform.errors import RunError

    run_dir = Path(run_dir)
    paths = [run_dir / POLICY_FILE] if (run_dir / POLICY_FILE).exists() else sorted(run_dir.glob("policy_*.json"))
    if not paths:
        raise RunError(f"evaluate {run_dir}: no {POLICY_FILE} (the run did not finish)")
    out: dict[str, Any] = {}
    for path in paths:
        exported = load_policy(path)
        prefix = "" if path.name == POLICY_FILE else path.stem[len("policy_"):] + "/"
        out.update({"game": exported.game, f"{prefix}policy": str(path),
                    f"{prefix}information_states": len(exported.policy),
                    f"{prefix}exploitability": exact_exploitability(exported)})
    return out
