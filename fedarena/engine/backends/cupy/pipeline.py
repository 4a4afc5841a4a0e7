"""The cupy backend's compilation pipeline (the passes every graph it runs goes through)."""

from __future__ import annotations

from ...compiler import passes as _passes
from ...compiler.fusion import elementwise_fusion
from .patterns import find_row_kernels


def fuse_all_elementwise(graph):
    """Every elementwise tree (also a single equation) becomes one fused group: one kernel."""
    return elementwise_fusion(graph, min_size=1)


PIPELINE = _passes.Pipeline(
    (
        _passes.constant_folding,
        _passes.algebraic_simplification,
        _passes.common_subexpression_elimination,
        find_row_kernels,
        _passes.unroll_small_reductions,
        fuse_all_elementwise,
        _passes.dead_code_elimination,
    )
)
"""The cupy backend's passes: folding, simplification, CSE, softmax/logsumexp row kernels,
small-reduction unrolling, fusion of every elementwise tree, dead-code elimination."""
