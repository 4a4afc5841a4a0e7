"""fedarena.engine: a typed graph IR, a tracing ``jit``, autodiff as a graph transformation,
a compiled numpy executor, neural-network layers and optimizers.

Public entry points (see docs/architecture.md, section "engine"):
``jit``, ``make_graph``, ``grad``, ``value_and_grad``, ``vjp``, ``jvp``, ``hvp`` and the
submodules ``ops`` (numpy-named operations), ``nn`` (layers), ``optim`` (optimizers).
"""

from . import primitives as _primitives  # noqa: F401  (registers every primitive)
from . import ops
from . import initializers
from . import nn
from . import optim
from . import random
from .serialization import ParamsFileError, load_params, save_params
from .transforms.autodiff import grad, hvp, jvp, value_and_grad, vjp
from .core.ir import EngineError, Graph, GraphValidationError, LeakedTracerError, ShapedArray, ShapeError, TracerControlFlowError, UnknownPrimitiveError, UnsupportedDtypeError
from .jit import RecompileWarning, explain_cache_misses, jit, make_graph
from .transforms.vmap import vmap
from .control_flow import cond, fori_loop, scan, while_loop
from .custom import checkpoint, custom_vjp, remat
from .transforms.jacobians import hessian, jacfwd, jacrev
from .compiler import fusion as _fusion  # noqa: F401  (registers fused_elementwise)
from .compiler import passes
from .inspection import inspect
from .profiler import profile
from .core.pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten
from .core.threads import get_num_threads, set_num_threads
from .core.nonfinite import NonFiniteError, debug_nans, debugging_nans
from .core.tracing import PRIMITIVES, Tracer
from .interop import from_dlpack, from_torch, to_dlpack  # noqa: F401  (torch.fx / DLPack interop)

__all__ = [
    "EngineError",
    "Graph",
    "GraphValidationError",
    "LeakedTracerError",
    "NonFiniteError",
    "debug_nans",
    "debugging_nans",
    "PRIMITIVES",
    "ShapeError",
    "ShapedArray",
    "Tracer",
    "TracerControlFlowError",
    "UnknownPrimitiveError",
    "UnsupportedDtypeError",
    "ParamsFileError",
    "RecompileWarning",
    "explain_cache_misses",
    "get_num_threads",
    "grad",
    "initializers",
    "load_params",
    "nn",
    "optim",
    "random",
    "save_params",
    "set_num_threads",
    "hvp",
    "jit",
    "jvp",
    "make_graph",
    "ops",
    "tree_flatten",
    "tree_leaves",
    "tree_map",
    "tree_unflatten",
    "value_and_grad",
    "vjp",
    "vmap",
    "cond",
    "fori_loop",
    "scan",
    "while_loop",
    "checkpoint",
    "custom_vjp",
    "remat",
    "hessian",
    "jacfwd",
    "jacrev",
    "inspect",
    "passes",
    "profile",
]
