"""Every primitive of the engine, one module per family, each primitive defined completely in one
place: shape/dtype rule, numpy kernel, emit rule for the compiled executor, VJP and JVP (or, for a
linear primitive, its transpose rule and linearity), vmap batching rule (or the ``loop_batching``
declaration), and the cupy backend's rule (a step rule, an elementwise C expression, or ``host_only``).

Families: ``elementwise``, ``reductions`` (sum/max/min/prod, cumsum, argsort), ``linalg``
(matmul), ``shapes`` (views, slice/pad, concatenate/stack), ``indexing`` (gather/scatter/take/
one_hot), ``conv`` (convolution), ``pooling`` (max/avg pooling and the max-pooling gradient), ``random`` (PRNG keys), ``checks`` (run-time checks);
``base`` holds the helpers they share, ``emit`` the numpy emit vocabulary and ``cuda`` the CUDA C one.  This package imports
every family, so the registry is complete once it is imported, and re-exports their public names
(``primitives.add_p``, ``primitives.reshape``, ...) for the modules built on them; a module that needs a
family's private helper imports it from the family module.
"""

from __future__ import annotations

from . import base  # noqa: E402,F401
from .base import add, broadcast_shapes, broadcast_to, cast, div, dtype_of, eq, exp, full, ge, gt, le, log, logical_and, matmul, mul, neg, promote, reduce_sum, reshape, select, shape_of, sign, sub, transpose, unbroadcast, zeros_like_aval
from . import elementwise  # noqa: E402,F401
from .elementwise import abs_p, add_p, and_p, batch_elementwise, cast_p, clip_p, cos_p, div_p, eq_p, erf_p, exp_p, floor_divide_p, full_p, ge_p, gt_p, isfinite_p, isnan_p, le_p, log1p_p, log_p, logistic_p, lt_p, max_p, min_p, mod_p, mul_p, ne_p, neg_p, not_p, or_p, pow_p, relu_p, rsqrt_p, select_p, sign_p, sin_p, sqrt_p, stop_gradient_p, sub_p, tanh_p
from . import reductions  # noqa: E402,F401
from .reductions import argmax_p, argsort_p, cumsum, cumsum_p, reduce_max_p, reduce_min_p, reduce_prod, reduce_prod_p, reduce_sum_p
from . import linalg  # noqa: E402,F401
from .linalg import matmul_p
from . import shapes  # noqa: E402,F401
from .shapes import broadcast_to_p, concatenate_p, expand_dims_p, pad_p, reshape_p, slice_p, squeeze_p, stack_p, transpose_p
from . import indexing  # noqa: E402,F401
from .indexing import FlatIndex, gather_p, index_add_p, one_hot_p, scatter_add_p, take_p
from . import conv  # noqa: E402,F401
from .conv import BiasRow, Col2Im, Conv2dKernel, ConvInputGrad, Im2Col, PhaseCol2Im, PhaseGeometry, PhaseIm2Col, abstract_eval_conv, col2im_p, conv2d_p, conv_gemm_p, conv_input_grad_p, conv_out_size, im2col_p, window_geometry
from . import pooling  # noqa: E402,F401
from .pooling import MaxPoolGrad, PoolKernel, avg_pool2d_p, max_pool2d_grad_p, max_pool2d_p
from . import checks  # noqa: E402,F401
from .checks import IndexRangeError, RangeCheck, check_range, check_range_p
from . import random  # noqa: E402,F401
from .random import Sampler, Splitter, random_normal_p, random_split_p, random_uniform_p
from .emit import CLIP, Code, EmitContext, expr, stmt  # noqa: E402,F401
