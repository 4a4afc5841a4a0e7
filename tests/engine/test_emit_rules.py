"""Each emit rule of the numpy executor alone, on a one- or two-equation graph: the source it
generates, and that source's result against numpy computing the same thing directly.

Values an earlier equation would have produced are set up by hand in the state (``_buffer``: held
in a persistent buffer the code knows at build time; ``_per_call``: computed by each call), the way
the executor's loop would have left them."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.engine.backends.numpy import emit_control, emit_elementwise, emit_linalg, emit_reductions, emit_shapes
from fedarena.engine.backends.numpy.emit_state import EmitState, Step
from fedarena.engine.backends.numpy.executor import DEFINE_RULES, KERNEL_RULES, OPERAND_RULES, Executable
from fedarena.engine.compiler import native
from fedarena.engine.compiler.memory_plan import BufferPlanner
from fedarena.engine.core.ir import Eqn, Graph, Literal, ShapedArray, Var
from fedarena.engine.core.tracing import PRIMITIVES
from fedarena import engine

F32 = np.float32


def _var(shape, dtype=F32):
    return Var(ShapedArray(shape, dtype))


def _eqn(name, ins, out, **attrs):
    return Eqn(PRIMITIVES[name], ins, [out] if isinstance(out, Var) else out, attrs, None)


def _state(invars, eqns, outvars, consts=()):
    g = Graph(invars, [v for v, _ in consts], [c for _, c in consts], eqns, outvars)
    return EmitState(g, BufferPlanner(g, reuse=False))


def _buffer(st, v, value):
    name = st.ctx.const(np.array(value, v.aval.dtype))
    st.names[v], st.storage[v] = name, "buffer"
    return name


def _per_call(st, v, name):
    st.names[v], st.storage[v] = name, "fresh"


def _exec(st, text, out=None, **per_call):
    ns = dict(st.ns, **per_call)
    ns["_o"] = out
    exec(text.replace("{o}", "_o"), ns)  # noqa: S102 - the rule's generated code
    return ns


def test_the_rule_tables_hold_one_rule_per_family_job():
    assert DEFINE_RULES == (emit_control.multiple_outputs, emit_shapes.elided_broadcast, emit_elementwise.scalar_expression)
    assert emit_linalg.outer_product in KERNEL_RULES and emit_reductions.drop_unit_axes in KERNEL_RULES
    assert emit_elementwise.typed_literals in OPERAND_RULES


# ----------------------------------------------------------------------------- elementwise


def test_scalar_expression_keeps_a_0d_chain_on_numpy_scalars():
    a, b, c = _var(()), _var(()), _var(())
    e0 = _eqn("mul", [a, Literal(2.0, weak=True)], b)
    st = _state([], [e0, _eqn("add", [b, Literal(1.0, weak=True)], c)], [c])
    name = _buffer(st, a, 3.0)
    assert emit_elementwise.scalar_expression(st, Step(0, e0))
    assert st.body == [f"v0 = ({name}[()] * 2.0)"]
    assert b in st.scalars and st.names[b] == "v0"
    got = _exec(st, st.body[0])["v0"]
    assert isinstance(got, np.float32) and got == np.float32(6.0)


def test_scalar_expression_declines_when_an_array_op_reads_the_value():
    a, b, c = _var(()), _var(()), _var((4,))
    e0 = _eqn("mul", [a, Literal(2.0, weak=True)], b)
    st = _state([], [e0, _eqn("broadcast_to", [b], c, shape=(4,))], [c])
    _buffer(st, a, 3.0)
    assert not emit_elementwise.scalar_expression(st, Step(0, e0))
    assert st.body == []


def test_typed_literals_turn_a_python_scalar_into_a_0d_constant_of_the_operand_dtype():
    x, y = _var((3,)), _var((3,))
    e = _eqn("add", [x, Literal(2.5, weak=True)], y)
    st = _state([x], [e], [y])
    step = Step(0, e)
    step.ins = [st.atom(a) for a in e.inputs]
    assert step.ins == ["i0", "2.5"]
    emit_elementwise.typed_literals(st, step)
    const = st.ns[step.ins[1]]
    assert isinstance(const, np.ndarray) and const.shape == () and const.dtype == F32 and const == 2.5


def test_same_size_operands_compute_in_the_per_call_operand_shape():
    x, w, y = _var((6,)), _var((1, 6)), _var((1, 6))
    e = _eqn("add", [x, w], y)
    st = _state([], [e], [_var(())])
    _per_call(st, x, "t0")
    wv = np.arange(6, dtype=F32).reshape(1, 6)
    _buffer(st, w, wv)
    step = Step(0, e)
    step.ins = [st.atom(a) for a in e.inputs]
    emit_elementwise.same_size_operands(st, step)
    assert step.out_shape == (6,) and step.ins[0] == "t0"
    assert st.ns[step.ins[1]].shape == (6,)  # the (1, 6) operand as a (6,) view made at build time
    code = PRIMITIVES["add"].emit(st.ctx, step.ins, step.attrs, step.in_avals, step.out_aval)
    out = np.empty(6, F32)
    xv = np.linspace(0, 1, 6, dtype=F32)
    _exec(st, code.text, out, t0=xv)
    np.testing.assert_array_equal(out.reshape(1, 6), xv + wv)


def test_ranked_operands_view_a_persistent_lower_rank_operand_with_the_output_rank():
    x, b, y = _var((2, 3)), _var((3,)), _var((2, 3))
    e = _eqn("add", [x, b], y)
    st = _state([x], [e], [y])
    bv = np.array([1, 2, 3], F32)
    _buffer(st, b, bv)
    step = Step(0, e)
    step.ins = [st.atom(a) for a in e.inputs]
    emit_elementwise.ranked_operands(st, step)
    assert st.ns[step.ins[1]].shape == (1, 3)
    assert np.shares_memory(st.ns[step.ins[1]], st.ns[st.names[b]])  # a view: sees later writes


def test_scalar_cast_assigns_the_item():
    x, y = _var((), np.int64), _var(())
    e = _eqn("cast", [x], y, dtype=np.dtype(F32))
    st = _state([], [e], [y])
    _buffer(st, x, 7)
    step = Step(0, e)
    step.ins = [st.atom(a) for a in e.inputs]
    emit_elementwise.scalar_cast(st, step)
    assert step.code.kind == "stmt" and step.code.text == f"{{o}}[()] = {step.ins[0]}"
    out = np.empty((), F32)
    _exec(st, step.code.text, out)
    assert out.dtype == F32 and out == 7.0


# ----------------------------------------------------------------------------- shapes, reductions, linalg


def test_elided_broadcast_names_the_smaller_operand():
    x, y, b, c, d = _var((3,)), _var((2, 3)), _var((2, 3)), _var((2, 3)), _var((2, 3))
    e0 = _eqn("broadcast_to", [x], b, shape=(2, 3))
    eqns = [e0, _eqn("add", [b, y], c), _eqn("exp", [c], d)]
    st = _state([x, y], eqns, [d])
    assert emit_shapes.elided_broadcast(st, Step(0, e0))
    assert st.names[b] == "i0" and st.phys[b] == (3,) and st.body == []
    exe = Executable(Graph([x, y], [], [], eqns, [d]))
    assert "broadcast" not in exe.source
    xv, yv = np.array([1, 2, 3], F32), np.ones((2, 3), F32)
    np.testing.assert_allclose(exe(xv, yv)[0], np.exp(xv + yv), rtol=1e-6)
    st2 = _state([x, y], eqns[:2], [c])  # the consumer's result escapes (the ufunc allocates it): kept
    assert not emit_shapes.elided_broadcast(st2, Step(0, e0))


def test_drop_unit_axes_reduces_the_squeezed_operand():
    x, y = _var((4, 1, 3)), _var((4, 1))
    e = _eqn("reduce_sum", [x], y, axes=(2,), keepdims=False)
    st = _state([], [e], [_var(())])
    xv = np.arange(12, dtype=F32).reshape(4, 1, 3)
    _buffer(st, x, xv)
    step = Step(0, e)
    step.ins = [st.atom(a) for a in e.inputs]
    emit_reductions.drop_unit_axes(st, step)
    assert step.attrs["axes"] == (1,) and step.in_avals[0].shape == (4, 3) and step.out_shape == (4,)
    code = PRIMITIVES["reduce_sum"].emit(st.ctx, step.ins, step.attrs, step.in_avals, step.out_aval)
    out = np.empty((4, 1), F32)
    _exec(st, code.text, out.reshape(4))
    np.testing.assert_array_equal(out, xv.sum(axis=2))


def test_unrolled_max_min_is_a_chain_of_binary_ufuncs_over_views():
    x, y = _var((4, 16)), _var((16,))
    e = _eqn("reduce_max", [x], y, axes=(0,), keepdims=False)
    assert not native.row_reduce_native(x.aval, 0)
    st = _state([], [e], [_var(())])
    xv = np.random.default_rng(0).normal(size=(4, 16)).astype(F32)
    _buffer(st, x, xv)
    step = Step(0, e)
    step.ins = [st.atom(a) for a in e.inputs]
    emit_reductions.unrolled_max_min(st, step)
    assert step.code.text.count("np.maximum(") == 3 and step.out_shape == (16,)
    out = np.empty(16, F32)
    _exec(st, step.code.text, out)
    np.testing.assert_array_equal(out, xv.max(axis=0))


def test_outer_product_is_one_dot():
    a, b, y = _var((5, 1)), _var((1, 3)), _var((5, 3))
    e = _eqn("mul", [a, b], y)
    st = _state([], [e], [_var(())])
    av, bv = np.arange(5, dtype=F32).reshape(5, 1), np.array([[1, -2, 3]], F32)
    na, nb = _buffer(st, a, av), _buffer(st, b, bv)
    step = Step(0, e)
    step.ins = [st.atom(x) for x in e.inputs]
    emit_linalg.outer_product(st, step)
    assert step.code.text == f"np.dot({na}, {nb}, {{o}})"
    out = np.empty((5, 3), F32)
    _exec(st, step.code.text, out)
    np.testing.assert_array_equal(out, av * bv)


# ----------------------------------------------------------------------------- control flow


def test_multiple_outputs_unpack_the_kernel_result_into_names_of_their_own():
    def f(i, x):
        return engine.while_loop(lambda s: s[1] < 10.0, lambda s: (s[0] + np.int64(1), s[1] * F32(2.0)), (i, x))

    g = engine.make_graph(f)(np.int64(2**60 + 1), F32(1.0))
    (n, e), = [(n, e) for n, e in enumerate(g.eqns) if e.prim.name == "while"]
    st = EmitState(g, BufferPlanner(g, reuse=False))
    assert n == 0  # its operands are the graph inputs
    assert emit_control.multiple_outputs(st, Step(n, e))
    (line,) = st.body
    assert line.startswith(f"v{n}_0, v{n}_1 = _k") and line.endswith("(i0, i1)")
    assert [st.storage[o] for o in e.outputs] == ["fresh", "fresh"]
    ns = _exec(st, line, i0=np.asarray(np.int64(2**60 + 1)), i1=np.asarray(F32(1.0)))
    assert int(ns[f"v{n}_0"]) == 2**60 + 5 and ns[f"v{n}_1"].dtype == F32 and float(ns[f"v{n}_1"]) == 16.0


def test_a_non_multi_output_equation_is_left_to_the_other_rules():
    x, y = _var((3,)), _var((3,))
    e = _eqn("exp", [x], y)
    st = _state([x], [e], [y])
    assert not emit_control.multiple_outputs(st, Step(0, e))
    assert not any(rule(st, Step(0, e)) for rule in DEFINE_RULES)


@pytest.mark.parametrize("shape", [(3,), (64, 4)])
def test_the_rules_together_still_compute_what_numpy_computes(shape):
    rng = np.random.default_rng(1)
    x = rng.normal(size=shape).astype(F32)

    def f(x):
        m = engine.ops.max(x, axis=-1, keepdims=True)
        return engine.ops.exp(x - m) * 2.0 + 1.0

    exe = Executable(engine.make_graph(f)(x))
    np.testing.assert_allclose(exe(x)[0], np.exp(x - x.max(-1, keepdims=True)) * 2.0 + 1.0, rtol=1e-6)
