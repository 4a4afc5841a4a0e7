"""The NaN/Inf debugger (issue 22, item 2): ``engine.debug_nans`` and ``jit(..., debug_nans=True)`` stop at the
first equation producing NaN/Inf and name its primitive, its inputs' statistics and the user's source line.
Oracles: numpy's statistics of the operand, the line numbers of this file, and the run folder's status.json."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops

HERE = Path(__file__).resolve()
X = np.array([0.0, 1.0, 2.0])


def _line(marker: str) -> str:
    """``file:line`` of the line of this file holding ``marker``."""
    for k, text in enumerate(HERE.read_text().splitlines(), 1):
        if marker in text and "_line(" not in text:
            return f"{HERE}:{k}"
    raise AssertionError(marker)


def loss(x):
    y = x * 2.0
    z = ops.log(y)  # MARK-LOG
    return ops.sum(z * 3.0)


def sqrt_sum(x):
    return ops.sum(ops.sqrt(x))  # MARK-SQRT


def _stats(a: np.ndarray) -> str:
    a = np.asarray(a, np.float64)
    return f"min={a.min():.6g} max={a.max():.6g} mean={a.mean():.6g} nan=0 inf=0"


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's own divide-by-zero warnings
        yield
    engine.debug_nans(False)


@pytest.mark.parametrize("mode", ["eager", "jit", "jit_option", "grad_eager"])
def test_log_of_zero_names_log_its_operand_and_the_source_line(mode):
    if mode == "jit_option":
        fn = engine.jit(loss, debug_nans=True)  # this function only; the process-wide switch stays off
    else:
        engine.debug_nans(True)
        fn = {"eager": loss, "jit": engine.jit(loss), "grad_eager": engine.grad(loss)}[mode]
    with pytest.raises(engine.NonFiniteError) as info:
        fn(X)
    err = info.value
    assert isinstance(err, FloatingPointError) and isinstance(err, engine.EngineError)
    assert err.primitive == "log"
    assert err.source == _line("MARK-LOG")
    assert err.inputs == (f"float64[3] {_stats(2 * X)}",)
    assert err.output == "1 Inf in 3 elements"
    assert (err.equation is None) == (mode in ("eager", "grad_eager"))
    text = str(err)
    assert "\n" not in text and text.startswith("log produced 1 Inf in 3 elements at ")
    assert _line("MARK-LOG") in text


def test_backward_pass_under_jit_names_the_backward_equation_at_the_forward_line():
    # d/dx sqrt(x) = 0.5 / sqrt(x): the backward's div makes the Inf at x = 0 (the forward is finite)
    with engine.debug_nans():
        with pytest.raises(engine.NonFiniteError) as info:
            engine.jit(engine.grad(sqrt_sum))(X)
    err = info.value
    assert err.primitive == "div" and err.source == _line("MARK-SQRT")
    assert err.inputs[1] == f"float64[3] {_stats(2 * np.sqrt(X))}"  # sqrt(x) + sqrt(x) as the vjp computes it
    assert not engine.debugging_nans()  # the context restored the switch


def test_nan_from_the_callers_input_is_reported_with_its_count():
    x = np.array([1.0, np.nan, 3.0, np.inf])
    with engine.debug_nans(), pytest.raises(engine.NonFiniteError) as info:
        engine.jit(loss)(x)
    assert info.value.primitive == "mul"
    assert info.value.inputs[0] == "float64[4] min=1 max=3 mean=2 nan=1 inf=1"
    assert info.value.output == "1 NaN and 1 Inf in 4 elements"


def test_inside_a_scan_body_the_debugger_names_the_body_equation():
    def body(c, x):
        c = c + ops.log(x)  # MARK-SCAN
        return c, c

    def run(xs):
        return engine.scan(body, np.float64(0.0), xs)[0]

    xs = np.array([1.0, 2.0, 0.0, 3.0])
    batch = np.stack([xs, xs + 1])
    for fn, arg in ((run, xs), (engine.jit(run), xs), (engine.vmap(run), batch), (engine.jit(engine.vmap(run)), batch)):
        with engine.debug_nans(), pytest.raises(engine.NonFiniteError) as info:
            fn(arg)
        assert info.value.primitive == "log" and info.value.source == _line("MARK-SCAN")
        assert info.value.inputs == (f"float64{list(arg.shape[:-1])} {_stats(arg[..., 2])}",)


def test_off_by_default_changes_nothing_and_switching_recompiles():
    assert not engine.debugging_nans()
    f = engine.jit(loss)
    assert f(X) == -np.inf
    plain_source = f.source(X)
    assert "_finite" not in plain_source
    engine.debug_nans(True)
    with pytest.raises(engine.NonFiniteError):
        f(X)  # the cached fast path of the unchecked program is not used any more
    assert "_finite" in f.source(X)
    engine.debug_nans(False)
    assert f(X) == -np.inf
    assert f.source(X) == plain_source  # the ordinary program again, cached
    assert engine.jit(loss, debug_nans=False)(X) == -np.inf
    with engine.debug_nans():
        assert engine.jit(loss, debug_nans=False)(X) == -np.inf  # an explicit False wins
        ok = np.array([1.0, 2.0])
        np.testing.assert_allclose(engine.jit(engine.grad(loss))(ok), 3.0 / ok, rtol=1e-15)


def test_a_failing_run_writes_the_message_to_status_json(tmp_path):
    from fedarena.platform.runs import execute

    root = HERE.parents[2]
    out = tmp_path / "run"
    with engine.debug_nans(), pytest.raises(engine.NonFiniteError) as info:
        execute(root / "experiments/dpsgd_digits.yaml", ["lr=1e300", "epochs=1"], out=out, quiet=True)
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "failed" and status["error_type"] == "NonFiniteError"
    assert status["error"] == str(info.value)
    assert status["error"].startswith("mul produced ") and "dpsgd_experiment.py:" in status["error"]
    assert status["user_error"] is True
