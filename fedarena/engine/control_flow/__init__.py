"""Control-flow primitives inside compiled graphs: ``scan``, ``cond``, ``while_loop``, ``fori_loop``.

Each primitive carries its body as a sub-graph (an attribute of the equation), has a shape rule, a
numpy kernel (the body compiled once by the numpy executor and called per step), autodiff rules and
a batching rule, following the structured control flow of JAX's ``lax`` (Frostig et al., SysML
2018) and XLA's While/Conditional.

The three are primitives with ``multiple_results``: one equation has one output per carry (and,
for ``scan``, per stacked ``y``), each with its own shape and dtype, so an int64 carry beside a
float32 one stays exact.  Modules: :mod:`.common` (sub-graph tracing and compilation shared by
the three), :mod:`.scan`, :mod:`.cond`, :mod:`.loops` (``while_loop`` and ``fori_loop``).
"""

from .cond import cond, cond_p
from .loops import fori_loop, while_loop, while_p
from .scan import scan, scan_flat, scan_p

__all__ = ["cond", "cond_p", "fori_loop", "scan", "scan_flat", "scan_p", "while_loop", "while_p"]
