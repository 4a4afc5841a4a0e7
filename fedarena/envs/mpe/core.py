"""Batched physics of the Multi-Agent Particle Environment (Lowe et al., 2017, "Multi-Agent Actor-Critic for
Mixed Cooperative-Competitive Environments"; the ``mpe2`` package's ``World.step``), over ``n`` worlds at once.

Arrays are batch-first: positions ``(n, entities, 2)``. One step, as ``mpe2`` does it: agents' actions become
forces (``sensitivity`` 5, or the agent's ``accel``); every pair of colliding entities pushes apart with
``contact_force * delta / dist * k * log(1 + exp(-(dist - (size_a + size_b)) / k))`` (``k`` =
``contact_margin``); movable agents integrate semi-implicitly (position with the old velocity, then damping,
then ``force / mass * dt``) and are slowed to ``max_speed``; each speaking agent's channel takes its
communication action. Forces on an entity are summed in the other entity's index order, as ``mpe2`` does, so
the arithmetic is the same to the last bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DT = 0.1
DAMPING = 0.25
CONTACT_FORCE = 1e2
CONTACT_MARGIN = 1e-3
SENSITIVITY = 5.0  # action force of agents without their own ``accel``
MOVE_ACTIONS = 5  # no-op, -x, +x, -y, +y


@dataclass(frozen=True)
class WorldSpec:
    """The fixed properties of one scenario's entities (agents first, then landmarks)."""

    agent_size: np.ndarray       # (A,)
    agent_movable: np.ndarray    # (A,) bool
    agent_silent: np.ndarray     # (A,) bool
    agent_collide: np.ndarray    # (A,) bool
    agent_accel: np.ndarray      # (A,) action force scale
    agent_max_speed: np.ndarray  # (A,) inf where none
    landmark_size: np.ndarray    # (L,)
    landmark_collide: np.ndarray  # (L,) bool
    dim_c: int
    pair_a: np.ndarray = field(init=False)  # colliding pairs (a < b, entity indices: agents, then landmarks)
    pair_b: np.ndarray = field(init=False)
    pair_dist_min: np.ndarray = field(init=False)  # size_a + size_b

    def __post_init__(self) -> None:
        collide = np.concatenate([self.agent_collide, self.landmark_collide])
        movable = np.concatenate([self.agent_movable, np.zeros(len(self.landmark_size), dtype=bool)])
        size = np.concatenate([self.agent_size, self.landmark_size])
        pairs = [(a, b) for a in range(len(collide)) for b in range(a + 1, len(collide))
                 if collide[a] and collide[b] and (movable[a] or movable[b])]
        object.__setattr__(self, "pair_a", np.array([a for a, _ in pairs], dtype=np.int64))
        object.__setattr__(self, "pair_b", np.array([b for _, b in pairs], dtype=np.int64))
        object.__setattr__(self, "pair_dist_min", np.array([size[a] + size[b] for a, b in pairs]))

    @property
    def num_agents(self) -> int:
        return len(self.agent_size)

    @property
    def num_landmarks(self) -> int:
        return len(self.landmark_size)

    def action_size(self, i: int, continuous: bool) -> int:
        """Agent ``i``'s action count (discrete: movement x message, ``mpe2``'s layout) or vector length."""
        move = MOVE_ACTIONS if self.agent_movable[i] else (0 if continuous else 1)
        if self.agent_silent[i]:
            return move
        return move + self.dim_c if continuous else move * self.dim_c


@dataclass
class WorldState:
    """The state of ``n`` worlds; ``goal`` holds a scenario's integer draws (goal landmark, key, ...)."""

    agent_pos: np.ndarray     # (n, A, 2)
    agent_vel: np.ndarray     # (n, A, 2)
    agent_c: np.ndarray       # (n, A, dim_c) communication channels
    landmark_pos: np.ndarray  # (n, L, 2)
    goal: np.ndarray          # (n, G) int64

    def copy(self) -> "WorldState":
        return WorldState(self.agent_pos.copy(), self.agent_vel.copy(), self.agent_c.copy(),
                          self.landmark_pos.copy(), self.goal.copy())


def decode_actions(spec: WorldSpec, actions: list[np.ndarray], continuous: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-agent actions -> ``(u (n, A, 2) forces, c (n, A, dim_c) messages)`` as ``mpe2``'s ``_set_action``.

    Discrete: ``a % 5`` is the movement and ``a // 5`` the message of agents that move and speak.
    Continuous (clipped to ``[0, 1]``): ``u = (a[2] - a[1], a[4] - a[3])``, then the message components.
    """
    n = len(actions[0])
    A = spec.num_agents
    u = np.zeros((n, A, 2))
    c = np.zeros((n, A, spec.dim_c))
    for i, a in enumerate(actions):
        if continuous:
            a = np.clip(a, 0.0, 1.0)
            if spec.agent_movable[i]:
                u[:, i, 0] = a[:, 2] - a[:, 1]  # differences in the action's own dtype, as mpe2
                u[:, i, 1] = a[:, 4] - a[:, 3]
                a = a[:, MOVE_ACTIONS:]
            if not spec.agent_silent[i]:
                c[:, i] = a
        else:
            a = np.asarray(a, dtype=np.int64)
            if spec.agent_movable[i]:
                move = a % MOVE_ACTIONS if not spec.agent_silent[i] else a
                u[:, i, 0] = (move == 2).astype(np.float64) - (move == 1)
                u[:, i, 1] = (move == 4).astype(np.float64) - (move == 3)
                a = a // MOVE_ACTIONS
            if not spec.agent_silent[i]:
                c[np.arange(n), i, a] = 1.0
        u[:, i] *= spec.agent_accel[i]
    return u, c


def contact_forces(spec: WorldSpec, ws: WorldState, force: np.ndarray) -> None:
    """Add the soft contact forces between colliding entities to the agents' ``force (n, A, 2)`` in place."""
    if len(spec.pair_a) == 0:
        return
    A = spec.num_agents
    pos = np.concatenate([ws.agent_pos, ws.landmark_pos], axis=1) if spec.num_landmarks else ws.agent_pos
    delta = pos[:, spec.pair_a] - pos[:, spec.pair_b]                                     # (n, P, 2): a - b
    dist = np.sqrt(np.square(delta[..., 0]) + np.square(delta[..., 1]))
    k = CONTACT_MARGIN
    penetration = np.logaddexp(0, -(dist - spec.pair_dist_min) / k) * k
    f = CONTACT_FORCE * delta / dist[..., None] * penetration[..., None]
    for p, (a, b) in enumerate(zip(spec.pair_a, spec.pair_b)):  # mpe2's pair order: a < b, lexicographic
        if a < A:
            force[:, a] += f[:, p]
        if b < A:
            force[:, b] -= f[:, p]


def world_step(spec: WorldSpec, ws: WorldState, u: np.ndarray, c: np.ndarray) -> None:
    """Advance ``ws`` by one step in place, given the decoded actions."""
    force = u.copy()
    contact_forces(spec, ws, force)
    m = spec.agent_movable
    if m.all():
        pos, vel = ws.agent_pos, ws.agent_vel
        pos += vel * DT
        vel *= 1 - DAMPING
        vel += force * DT  # every agent's mass is 1
    else:
        pos, vel = ws.agent_pos[:, m], ws.agent_vel[:, m]
        pos += vel * DT
        vel *= 1 - DAMPING
        vel += force[:, m] * DT
    capped = np.isfinite(spec.agent_max_speed[m])
    if capped.any():
        cap = spec.agent_max_speed[m]
        speed = np.sqrt(np.square(vel[..., 0]) + np.square(vel[..., 1]))
        over = (speed > cap) & capped
        vel[:] = np.where(over[..., None], vel / np.where(over, speed, 1.0)[..., None] * cap[:, None], vel)
    if not m.all():
        ws.agent_pos[:, m], ws.agent_vel[:, m] = pos, vel
    ws.agent_c[:] = np.where(spec.agent_silent[None, :, None], 0.0, c)
