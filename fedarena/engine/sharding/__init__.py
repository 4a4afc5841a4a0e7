"""Operator-level sharding of engine graphs over a 1-D mesh of ranks, after MindSpore's auto-parallel (Su et
al., "MindSpore: an all-scenario deep learning computing framework", 2021): tensor layouts, per-primitive
sharding rules (in each primitive's family file), propagation with redistribution collectives, execution over
the engine's collectives (each rank's local equations compiled by ``engine.jit`` in segments between the
collectives), a cost model and a strategy search.

``shard_jit(fn, Mesh(comm), in_shardings, out_shardings)`` runs ``fn`` sharded; layouts are ``R`` (replicated)
and ``S(axis)`` (split along ``axis``).
"""

from ..primitives.sharding import Layout, R, S
from .api import Mesh, ShardedFunction, block, shard_jit
from .cost import CostModel, calibrate
from .propagate import NO_RULE, ShardedProgram, ShardingError, shard_graph

__all__ = ["CostModel", "Layout", "Mesh", "NO_RULE", "R", "S", "ShardedFunction", "ShardedProgram", "ShardingError",
           "block", "calibrate", "shard_graph", "shard_jit"]
