"""Vectorised two-player Overcooked (Carroll et al., 2019; JaxMARL's mechanics) as numpy arrays over many copies,
with the cramped_room and asymmetric_advantages layouts, and a PettingZoo parallel view of one copy."""

from fedarena.envs.overcooked.layouts import LAYOUTS, Layout
from fedarena.envs.overcooked.parallel import OvercookedParallelEnv, parallel_env
from fedarena.envs.overcooked.vector import (ACTIONS, OvercookedState, OvercookedStep, OvercookedVecEnv,
                                             UnknownLayoutError, is_overcooked, layout_name)

__all__ = ["ACTIONS", "LAYOUTS", "Layout", "OvercookedParallelEnv", "OvercookedState", "OvercookedStep",
           "OvercookedVecEnv", "UnknownLayoutError", "is_overcooked", "layout_name", "parallel_env"]
