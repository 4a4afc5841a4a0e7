"""Device rules of the cupy backend for control flow: ``scan``, ``cond`` and ``while``.

The body graph (each branch of ``cond``, the predicate and the body of ``while``) goes through the
backend's :data:`.pipeline.PIPELINE` and becomes an :class:`.executor.Executable` on the same device,
compiled once (cached on the graph object per device); the loop runs on the host and launches the
body's kernels, its values staying device arrays from one step to the next:

- ``scan``: no value crosses to the host.  ``xs`` are read as device views ``x[t]``; the stacked
  outputs ``ys`` are device arrays written row by row (``ys[t] = y``); ``reverse`` walks ``t``
  backwards; the trip count is the static ``length``.
- ``while``: the predicate graph runs on the device, and its scalar result is the one value that
  crosses to the host, once per iteration (the host must decide whether to launch the body again).
- ``cond``: the predicate (a scalar) is copied to the host once per call and only the chosen
  branch runs.  Running both branches and selecting on the device would avoid that copy, but it
  would run the branch the program guards against (an out-of-range index raises in the engine)
  and pay for both.

Body executables are themselves planned by the executor, so control flow nested in a body is
handled by these same rules; host steps inside a body appear in the outer
``Executable.host_steps`` as ``"<primitive>:<inner primitive>"``.

:func:`store_outputs` writes a control-flow equation's results to its outputs, one output per
result with its own dtype (control flow equations have several outputs; nothing is packed).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ...core.ir import Eqn, Graph, Literal, Var
from . import lowering
from .executor import Executable
from .pipeline import PIPELINE


def body_executable(graph: Graph, device: Any) -> Executable:
    """``graph`` compiled by the cupy pipeline for ``device`` (once per graph and device)."""
    cache = graph.__dict__.setdefault("_cupy_bodies", {})
    exe = cache.get(device)
    if exe is None:
        exe = cache[device] = Executable(PIPELINE(graph), device, validate=False)
    return exe


def store_outputs(xp: Any, e: Eqn, buffers: Sequence[Any], results: Sequence[Any], env: dict) -> None:
    """Write a control-flow equation's ``results`` (carry, then stacked ys, in order) to its outputs,
    one output per result with its own shape and dtype: each is copied into its output's buffer, or
    into a fresh array, never left an alias of an operand."""
    if len(e.outputs) != len(results):
        raise AssertionError(f"{e.prim.name}: {len(results)} results for {len(e.outputs)} outputs")
    for o, buf, r in zip(e.outputs, buffers, results):
        if buf is None:
            buf = xp.array(r, copy=True)
        else:
            buf[...] = r
        env[o] = buf


def _reader(exe: Executable, operands: Sequence[Any]) -> Callable[[dict], list]:
    """``read(env)``: the operands' device arrays (literals copied to the device once, here)."""
    dev = exe.device
    fixed = {k: dev.to_device(np.asarray(a.value, a.aval.dtype))
             for k, a in enumerate(operands) if isinstance(a, Literal)}
    ops = list(operands)

    def read(env: dict) -> list:
        return [fixed[k] if k in fixed else env[a] for k, a in enumerate(ops)]

    return read


def _nested(prim: str, bodies: Sequence[Executable]) -> list:
    return [f"{prim}:{h}" for b in bodies for h in b.host_steps]


class ScanStep:
    """The device step of one ``scan`` equation (see the module docstring)."""

    def __init__(self, exe: Executable, e: Eqn):
        self.body = body_executable(e.attrs["body"], exe.device)
        self.host_steps = _nested("scan", [self.body])

    def __call__(self, exe: Executable, e: Eqn, buffers: list) -> Callable[[dict], None]:
        xp, body = exe.xp, self.body
        nc, nx, length = e.attrs["n_carry"], e.attrs["n_x"], e.attrs["length"]
        order = range(length - 1, -1, -1) if e.attrs["reverse"] else range(length)
        y_avals = [a.aval for a in body.graph.outvars[nc:]]
        read = _reader(exe, e.inputs)

        def scan_step(env: dict) -> None:
            ins = read(env)
            carry, xs, consts = ins[:nc], ins[nc : nc + nx], ins[nc + nx :]
            ys = [xp.empty((length,) + tuple(av.shape), av.dtype) for av in y_avals]
            for t in order:
                outs = body(*carry, *[x[t] for x in xs], *consts)
                carry = outs[:nc]
                for buf, y in zip(ys, outs[nc:]):
                    buf[t] = y
            store_outputs(xp, e, buffers, list(carry) + ys, env)

        return scan_step


class CondStep:
    """The device step of one ``cond`` equation: the predicate is read on the host, one branch runs."""

    def __init__(self, exe: Executable, e: Eqn):
        self.branches = [body_executable(g, exe.device) for g in e.attrs["branches"]]
        self.host_steps = _nested("cond", self.branches)

    def __call__(self, exe: Executable, e: Eqn, buffers: list) -> Callable[[dict], None]:
        xp, dev = exe.xp, exe.device
        on_true, on_false = self.branches
        read = _reader(exe, e.inputs)

        def cond_step(env: dict) -> None:
            pred, *ops = read(env)
            run = on_true if bool(dev.to_host(pred)) else on_false  # the predicate crosses to the host
            store_outputs(xp, e, buffers, run(*ops), env)

        return cond_step


class WhileStep:
    """The device step of one ``while`` equation: predicate and body on the device, the predicate's
    scalar read on the host once per iteration."""

    def __init__(self, exe: Executable, e: Eqn):
        self.cond = body_executable(e.attrs["cond"], exe.device)
        self.body = body_executable(e.attrs["body"], exe.device)
        self.host_steps = _nested("while", [self.cond, self.body])

    def __call__(self, exe: Executable, e: Eqn, buffers: list) -> Callable[[dict], None]:
        xp, dev = exe.xp, exe.device
        cond, body, nc = self.cond, self.body, e.attrs["n_carry"]
        read = _reader(exe, e.inputs)

        def while_step(env: dict) -> None:
            ins = read(env)
            carry, consts = ins[:nc], ins[nc:]
            while bool(dev.to_host(cond(*carry, *consts)[0])):  # the predicate crosses to the host
                carry = body(*carry, *consts)
            store_outputs(xp, e, buffers, list(carry), env)

        return while_step


# The control-flow primitives' cupy rules sit beside them in engine/control_flow/ and ask for these step
# classes through ``lowering.control_step``.
lowering.CONTROL_STEPS.update(scan=ScanStep, cond=CondStep, **{"while": WhileStep})
