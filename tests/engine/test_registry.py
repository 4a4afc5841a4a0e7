"""The primitive registry against the test tables: every registered primitive is exercised by a
row of ``cases.py`` — differentiable ones by a gradient row (VJP and JVP against finite
differences, VJP against PyTorch, vmap against a loop), the others by a batching row — and the
registry is complete right after ``import fedarena.engine``."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from fedarena import engine
from fedarena.engine import ops, passes

from .cases import CASES, NONDIFF_CASES

# primitives whose VJP rule exists only to refuse reverse mode with a clear error
# primitives no traced graph can contain
NEVER_TRACED = {"full": "no operands: bind computes it at once, so it becomes a constant, never an equation"}
REVERSE_MODE_REFUSED = {"while": "a loop with an unknown trip count cannot size its tape; test_control_flow checks the error"}


def _prims(graph) -> set:
    names = set()
    for e in graph.eqns:
        names.add(e.prim.name)
        for v in e.attrs.values():
            inner = getattr(v, "graph", v)
            if hasattr(inner, "eqns"):
                names |= _prims(inner)
    return names


def _covered(fn, args, with_grad: bool) -> set:
    names = set()
    for g in (engine.make_graph(fn)(*args),):  # the forward alone (kernel selection sees its chains)
        names |= _prims(g) | _prims(passes.DEFAULT_PIPELINE(g))
    if with_grad:  # the cotangent is an input, so no backward equation folds into a constant
        ct = np.cos(np.arange(np.size(fn(*args)))).reshape(np.shape(fn(*args)))

        def scalar(c, *a):
            return ops.sum(ops.multiply(fn(*a), c))

        target = engine.value_and_grad(scalar, argnums=tuple(range(1, len(args) + 1)))
        args = [ct, *args]
    else:
        target = fn
    graph = engine.make_graph(target)(*args)
    batched = engine.make_graph(engine.vmap(target))(*[np.stack([a, a]) for a in args])
    names |= _prims(graph) | _prims(batched)
    for g in (graph, batched):
        names |= _prims(passes.DEFAULT_PIPELINE(g))
    return names


def test_every_primitive_has_a_case_in_the_tables():
    rng = np.random.default_rng(0)
    grad_cov: set = set()
    for _, fn, _, make in CASES:
        grad_cov |= _covered(fn, make(rng), True)
    batch_cov: set = set(grad_cov)
    for _, fn, make in NONDIFF_CASES:
        batch_cov |= _covered(fn, make(rng), False)
    # a primitive with a VJP rule needs a gradient row; one without (no gradient, or forward mode
    # only, like while) a batching row
    missing_grad = sorted(n for n, p in engine.PRIMITIVES.items() if p.differentiable and p.vjp is not None and n not in grad_cov and n not in REVERSE_MODE_REFUSED)
    missing_batch = sorted(n for n in engine.PRIMITIVES if n not in batch_cov and n not in NEVER_TRACED)
    assert not missing_grad, f"differentiable primitives without a gradient case in tests/engine/cases.py CASES: {missing_grad}"
    assert not missing_batch, f"primitives without a batching case in tests/engine/cases.py NONDIFF_CASES: {missing_batch}"


def test_registry_is_complete_right_after_import():
    code = (
        "import fedarena.engine as e, pkgutil, importlib\n"
        "before = sorted(e.PRIMITIVES)\n"
        "for m in pkgutil.walk_packages(e.__path__, 'fedarena.engine.'):\n"
        "    importlib.import_module(m.name)\n"
        "after = sorted(e.PRIMITIVES)\n"
        "print(sorted(set(after) - set(before)))\n"
    )
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]", f"primitives registered only by a later import: {out.stdout.strip()}"


def test_op_sets_are_derived_from_traits():
    """The executor's emit rules', memory planner's, fusion's, the cupy generator's op sets and vmap's
elementwise batching are the primitives' traits."""
    import importlib

    from fedarena.engine.core.tracing import TRAITS, names_with

    paths = {"emit_elementwise": "backends.numpy.emit_elementwise", "emit_shapes": "backends.numpy.emit_shapes", "memory_plan": "compiler.memory_plan", "fusion": "compiler.fusion", "cupy": "backends.cupy.kernels"}
    mods = {m: importlib.import_module(f"fedarena.engine.{p}") for m, p in paths.items()}
    for name, p in engine.PRIMITIVES.items():
        assert p.traits <= set(TRAITS), f"{name}: unknown traits {sorted(p.traits - set(TRAITS))}"
    assert mods["emit_elementwise"].ELEMENTWISE == names_with("elementwise") == mods["emit_shapes"].ELEMENTWISE
    assert mods["emit_elementwise"].SCALAR_CONST_PRIMS == names_with("typed_scalars")
    assert set(mods["emit_elementwise"].SCALAR_EXPR) == {n for n, p in engine.PRIMITIVES.items() if p.scalar_emit is not None}
    assert mods["memory_plan"].VIEW_PRIMITIVES == names_with("view")
    assert mods["fusion"].FUSIBLE == names_with("fusible")
    from fedarena.engine.primitives.elementwise import batch_elementwise

    assert all(engine.PRIMITIVES[n].batch is batch_elementwise for n in names_with("elementwise"))
    assert mods["cupy"].ELEMENTWISE_OPS == names_with("elementwise") | names_with("fusible")
    ip = mods["memory_plan"].in_place_operands
    assert ip("mul", 2) == (0, 1) and ip("select", 3) == (2,) and ip("fused_elementwise", 2) == () and ip("matmul", 2) == ()
    # a new elementwise primitive joins every set through its traits alone
    assert {"floor_divide", "mod", "isnan", "isfinite", "erf"} <= names_with("elementwise")


def test_compiler_value_categories_are_traits():
    """The native VM's and the C generator's predicate and transcendental sets are the ``predicate``
    and ``transcendental`` traits; the predicate trait agrees with numpy (a float operand gives a
    boolean result exactly for the primitives that carry it, among the elementwise ones and the VM's
    opcodes)."""
    from fedarena.engine.compiler import codegen_c, native
    from fedarena.engine.core.tracing import names_with

    assert native._PREDICATES == codegen_c._PREDICATES == names_with("predicate")
    assert native._TRANSCENDENTAL == names_with("transcendental")
    x = np.array([0.5, -1.5, 2.0])
    checked = set()
    for name in names_with("elementwise") | (set(native.OPCODE) & set(engine.PRIMITIVES)):
        p = engine.PRIMITIVES[name]
        for arity in (1, 2):
            try:
                with np.errstate(all="ignore"):
                    out = np.asarray(p.impl(*[x] * arity))
            except TypeError:
                continue
            assert (out.dtype == np.bool_) == (name in names_with("predicate")), name
            checked.add(name)
            break
    assert names_with("predicate") <= checked and {"exp", "add", "maximum", "neg"} <= checked
    # every transcendental primitive is differentiable float math (no predicate among them)
    assert not names_with("transcendental") & names_with("predicate")
    assert {"exp", "log", "tanh", "logistic", "pow"} <= names_with("transcendental")
