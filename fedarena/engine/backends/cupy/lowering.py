"""What a primitive's cupy rule (``prim.cuda(eqn, lib)``, defined beside the primitive in its family
file) is given as ``lib``: the backend's kernel generators (:mod:`.kernels`, :mod:`.indexing`,
:mod:`.random_kernels`), the C types they handle, and the constructors of the step specs the
executor (:mod:`.executor`) runs.  A rule returns one spec, or ``None`` when this equation (its
dtypes, a literal operand) has no device step and runs its numpy kernel on host copies.

Specs: ``kernel`` (a generated kernel over the operands), ``scatter`` (the same, into a zeroed
output), ``col2im`` (a GEMM then a generated col2im kernel), ``xp`` (``fn(xp, operands, attrs, out)``:
the array module's own device functions writing into the output's arena buffer), ``view``
(``fn(xp, operand)``: a view of a device array), ``matmul`` (the device's ``matmul``: cuBLAS, tensor cores for float16/bfloat16) and
``step`` (``make(executable, eqn)`` builds the step object for the executable being planned, e.g. a
control-flow loop over sub-executables; ``control_step(kind, e)`` is that spec for the control-flow
primitives, whose step classes :mod:`.control` registers in :data:`CONTROL_STEPS`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ...core.ir import LOW_PRECISION, Eqn, Literal, Var
from . import indexing  # noqa: F401  (indexing.RANK_SORT_MAX: read at each use, tests lower it)
from .indexing import ATOMIC_ADD, argsort_kernel, index_add_kernel, take_kernel  # noqa: F401
from .kernels import (  # noqa: F401  (the generators a rule may call)
    CTYPE,
    elementwise_kernel,
    gather_kernel,
    im2col_kernel,
    max_pool_grad_kernel,
    phase_col2im_kernel,
    plain_col2im_kernel,
    pool_kernel,
    reduction_kernel,
    row_softmax_kernel,
    scatter_add_kernel,
)
from .kernels import has_storage
from .random_kernels import random_kernel  # noqa: F401

_REDUCTIONS = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min"}


def low_precision_spec(e: Eqn) -> tuple | None:
    """The backend's own step for an equation over float16/bfloat16 values that its primitive's rule
    (written for :data:`CTYPE`) would leave to the host: the reductions (float32 accumulation).
    ``None`` for every other equation."""
    kind = _REDUCTIONS.get(e.prim.name)
    if kind is None:
        return None
    x, o = e.inputs[0], e.outputs[0]
    if isinstance(x, Literal) or not (x.aval.dtype in LOW_PRECISION or o.aval.dtype in LOW_PRECISION):
        return None
    if not (has_storage(x.aval.dtype) and has_storage(o.aval.dtype)):
        return None
    return kernel(reduction_kernel(kind, x.aval, e.attrs["axes"], o.aval.dtype), [x])


def has_literal(e: Eqn) -> bool:
    """Whether an operand of ``e`` is a literal (rules over raw device buffers leave those to the host)."""
    return any(isinstance(a, Literal) for a in e.inputs)


def kernel(k: Any, operands: Sequence[Any]) -> tuple:
    return ("kernel", k, list(operands))


def scatter(k: Any, operands: Sequence[Any]) -> tuple:
    return ("scatter", k, list(operands))


def col2im(k: Any, operands: Sequence[Any]) -> tuple:
    return ("col2im", k, list(operands))


def xp(fn: Callable, e: Eqn) -> tuple:
    return ("xp", fn, list(e.inputs))


def view(fn: Callable, e: Eqn) -> tuple:
    return ("view", fn, list(e.inputs))


def matmul(e: Eqn) -> tuple:
    return ("matmul", None, list(e.inputs))


def step(make: Callable, operands: Sequence[Any]) -> tuple:
    return ("step", make, list(operands))


CONTROL_STEPS: dict[str, Callable] = {}
"""The step classes of the control-flow primitives (``"scan"``, ``"cond"``, ``"while"``), registered by
:mod:`.control`: their steps run sub-executables of this backend, so the classes live here while the
rules that ask for them stay beside the primitives in ``engine/control_flow/``."""


def control_step(kind: str, e: Eqn) -> tuple:
    """The ``step`` spec of control-flow equation ``e`` (``kind``: its primitive's name)."""
    return step(CONTROL_STEPS[kind], [a for a in e.inputs if isinstance(a, Var)])
