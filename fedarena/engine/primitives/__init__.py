"""Every primitive of the engine, one module per family, each primitive defined completely in one
place: shape/dtype rule, numpy kernel, emit rule for the compiled executor, VJP, JVP and (where
the generic loop is not enough) batching rule.

Families: ``elementwise``, ``reductions`` (sum/max/min/prod, cumsum, argsort), ``linalg``
(matmul), ``shapes`` (views, slice/pad, concatenate/stack), ``indexing`` (gather/scatter/take/
one_hot), ``conv`` (convolution), ``pooling`` (max/avg pooling and the max-pooling gradient), ``random`` (PRNG keys), ``checks`` (run-time checks);
``base`` holds the helpers they share and ``emit`` the emit vocabulary.  This package imports
every family, so the registry is complete once it is imported, and re-exports their names
(``primitives.add_p``, ``primitives.reshape``, ...) for the modules built on them.
"""

from __future__ import annotations

from . import base  # noqa: E402,F401
from .base import _bcast_tangent, _define, _floatify, _stand_in, _swap_last, add, broadcast_shapes, broadcast_to, cast, div, dtype_of, eq, exp, full, ge, gt, le, log, logical_and, matmul, mul, neg, promote, reduce_sum, reshape, select, shape_of, sign, sub, transpose, unbroadcast, zeros_like_aval
from . import elementwise  # noqa: E402,F401
from .elementwise import _add_jvp, _add_vjp, _binary, _cast_emit, _cast_impl, _cast_jvp, _cast_rule, _cast_vjp, _clip_emit, _clip_impl, _clip_mask, _div_jvp, _div_vjp, _erf_scale, _ew_rule, _float_or_int_rule, _full_emit, _full_impl, _full_rule, _identity_emit, _minmax_jvp, _minmax_vjp, _minmax_weights, _mod_jvp, _mod_vjp, _mul_jvp, _mul_vjp, _pow_emit, _pow_jvp, _pow_vjp, _relu_emit, _relu_impl, _rsqrt_emit, _rsqrt_impl, _same_rule, _select_emit, _select_impl, _select_jvp, _select_rule, _select_vjp, _sub_jvp, _sub_vjp, _sum_tangents, _ufunc_emit, _ufunc_impl, _unary, abs_p, add_p, and_p, batch_elementwise, cast_p, clip_p, cos_p, div_p, eq_p, erf_p, exp_p, floor_divide_p, full_p, ge_p, gt_p, isfinite_p, isnan_p, le_p, log1p_p, log_p, logistic_p, lt_p, max_p, min_p, mod_p, mul_p, ne_p, neg_p, not_p, or_p, pow_p, relu_p, rsqrt_p, select_p, sign_p, sin_p, sqrt_p, stop_gradient_p, sub_p, tanh_p
from . import reductions  # noqa: E402,F401
from .reductions import _ARG_OF, _TINY_REDUCE, _argmax_emit, _argmax_impl, _argmax_rule, _argsort_emit, _argsort_impl, _argsort_rule, _axis_batch, _chooser_jvp, _chooser_vjp, _cumsum_emit, _cumsum_impl, _cumsum_jvp, _cumsum_rule, _cumsum_vjp, _expand_reduced, _norm_axes, _others_product, _prod_emit, _prod_impl, _prod_jvp, _prod_rule, _prod_vjp, _reduce_emit, _reduce_impl, _reduce_rule, _shift_axes_batch, _sum_jvp, _sum_vjp, argmax_p, argsort_p, cumsum, cumsum_p, reduce_max_p, reduce_min_p, reduce_prod, reduce_prod_p, reduce_sum_p
from . import linalg  # noqa: E402,F401
from .linalg import _low_precision_matmul, _matmul_emit, _matmul_impl, _matmul_jvp, _matmul_rule, _matmul_vjp, matmul_p
from . import shapes  # noqa: E402,F401
from .shapes import _broadcast_rule, _concat_emit, _concat_jvp, _concat_rule, _concat_vjp, _expand_dims_rule, _linear_jvp, _pad_emit, _pad_impl, _pad_index, _pad_rule, _pad_vjp, _reshape_rule, _slice_emit, _slice_impl, _slice_rule, _slice_vjp, _slices, _squeeze_rule, _stack_emit, _stack_jvp, _stack_rule, _stack_vjp, _transpose_rule, _transpose_vjp, broadcast_to_p, concatenate_p, expand_dims_p, pad_p, reshape_p, slice_p, squeeze_p, stack_p, transpose_p
from . import indexing  # noqa: E402,F401
from .indexing import FlatIndex, _FLAT_INDEX_MIN, _check_index, _flat_index_pays, _full_index, _gather_emit, _gather_impl, _gather_jvp, _gather_rule, _gather_vjp, _grid, _index_add_emit, _index_add_impl, _index_add_rule, _one_hot_emit, _one_hot_impl, _one_hot_rule, _scatter_emit, _scatter_impl, _scatter_rule, _scatter_vjp, _take_emit, _take_rule, _take_vjp, gather_p, index_add_p, one_hot_p, scatter_add_p, take_p
from . import conv  # noqa: E402,F401
from .conv import BiasRow, Col2Im, Conv2dKernel, ConvInputGrad, Im2Col, PhaseCol2Im, PhaseGeometry, PhaseIm2Col, _col2im_attrs, _col2im_emit, _col2im_impl, _col2im_kernel, _col2im_rule, _col2im_vjp, _conv_emit, _conv_gemm_batch, _conv_gemm_emit, _conv_gemm_jvp, _conv_gemm_rule, _conv_gemm_vjp, _conv_geometry, _conv_impl, _conv_input_grad_batch, _conv_input_grad_emit, _conv_input_grad_impl, _conv_input_grad_jvp, _conv_input_grad_kernel, _conv_input_grad_rule, _conv_input_grad_vjp, _conv_jvp, _conv_kernel, _conv_rule, _conv_vjp, _geometry, _im2col_emit, _im2col_impl, _im2col_jvp, _im2col_kernel, _im2col_rule, _im2col_vjp, _pair, _reshaped, abstract_eval_conv, col2im_p, conv2d_p, conv_gemm_p, conv_input_grad_p, conv_out_size, im2col_p, window_geometry
from . import pooling  # noqa: E402,F401
from .pooling import MaxPoolGrad, PoolKernel, _max_pool_jvp, _pool_def, _pool_rule, avg_pool2d_p, max_pool2d_grad_p, max_pool2d_p
from . import checks  # noqa: E402,F401
from .checks import IndexRangeError, RangeCheck, _check_batch, _check_emit, _check_impl, _check_rule, check_range, check_range_p
from . import random  # noqa: E402,F401
from .random import Sampler, Splitter, _SPLIT_COUNTER, _batch, _check_key, _generator, _sample_emit, _sample_rule, _split_rule, random_normal_p, random_split_p, random_uniform_p
from .emit import CLIP, Code, EmitContext, expr, stmt  # noqa: E402,F401
