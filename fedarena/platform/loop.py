"""The run loop every experiment kind goes through: restore, progress, metrics, checkpoints, evaluation
cadence and stop signals (SIGTERM, SIGINT).

A kind supplies its steps as an object with the :class:`Steps` methods (``init``, ``load``, ``state``,
``step``, ``done``, ``summary``, optionally ``evaluate``); :func:`run_loop` drives it::

    restored? -> load(step, state)       else -> init() (the row of step 0, if any, is logged)
    while not done():
        step += 1
        row = step(step)                   (+ evaluate(step) when the cadence says so)
        run.log(step, **row)               (when the row is not empty)
        run.checkpoint(step, state)        (every step is offered; ``checkpoint.every`` says which are written)
    run.final_checkpoint(); return summary()

A resumed run whose checkpoint already meets the budget (``--resume RUN --set iterations=N`` with N at or below
the checkpoint's step) runs no step and returns the summary of the checkpointed state.

Stop signals (:func:`stop_signals`, installed by :func:`fedarena.platform.runs.execute` around every run, so
kinds that do not use :func:`run_loop` get it too): the first SIGTERM (what ``kill``, SLURM and Kubernetes send)
or SIGINT (Ctrl-C) asks the run to stop. The run stops at its next checkpoint offer (``run.checkpoint`` or
``run.save_checkpoint``) after writing that step's checkpoint; a run that reaches no offer within
:data:`GRACE_S` seconds (or a second signal) is stopped where it is, keeping its newest checkpoint. Either way
:class:`RunInterrupted` (a ``KeyboardInterrupt``) unwinds the kind's ``finally`` blocks (Ray actors, worker
processes), ``status.json`` says ``interrupted`` and ``--resume`` continues from the checkpoint. Without a run
(the parent of a seed group), the first signal raises at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, Iterator, Mapping, Protocol

GRACE_S = 3.0
"""Seconds a run has, after the first stop signal, to reach its next checkpoint offer before it is stopped
where it is (the acceptance bound for ``kill PID`` to exit is 10 s, start-up and clean-up included)."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by SIGTERM or SIGINT; ``graceful``: at a checkpoint offer, after writing that step."""

    def __init__(self, signame: str, step: int | None = None, graceful: bool = False):
        self.signame, self.step, self.graceful = signame, step, graceful
        where = f" at step {step}" if step is not None else ""
        super().__init__(f"interrupted by {signame}{where}")


class Steps(Protocol):
    """What an experiment kind supplies to :func:`run_loop`. The object holds the kind's live state."""

    desc: str
    """Progress bar label."""
    total: int
    """Progress bar total, in the units :meth:`units` counts (iterations, episodes, environment steps, ...)."""

    def init(self) -> Mapping[str, Any] | None:
        """Start fresh; return the metrics row of step 0 (before any step), or None to log none."""

    def load(self, step: int, state: Any) -> None:
        """Continue from the checkpoint of ``step`` (``state``: what :meth:`state` returned)."""

    def state(self) -> Any:
        """The checkpoint of the current step: nested dicts/lists of arrays and JSON scalars."""

    def done(self) -> bool:
        """True when the budget is spent (or a stopping rule fired); checked before every step."""

    def step(self, step: int) -> Mapping[str, Any]:
        """Advance one step (numbered from 1) and return its metrics (may be empty)."""

    def units(self) -> int:
        """Work done so far, in the units of :attr:`total`."""

    def summary(self) -> dict[str, Any]:
        """The final summary, from the live state (also right after :meth:`load`, when no step ran)."""


def run_loop(run: Any, steps: Steps, *, eval_every: int = 0, eval_first: bool = False) -> dict[str, Any]:
    """Drive ``steps`` to its budget through ``run`` (a :class:`fedarena.platform.runs.Run`).

    Evaluation cadence: with ``eval_every`` > 0 the loop calls ``steps.evaluate(step)`` (its metrics join the
    step's row) every ``eval_every`` steps, on the last step, and on step 1 when ``eval_first``.
    """
    restored = run.restore(accept=steps.load)  # a checkpoint whose content steps.load rejects falls back to an older one
    if restored is None:
        step = 0
        first = steps.init()
        if first:
            run.log(0, **first)
    else:
        step = restored[0]
        if steps.done():
            run.logger.info("the checkpoint (step %d) already meets the budget: no step to run", step)
    with run.progress(total=steps.total, initial=steps.units(), desc=steps.desc) as bar:
        while not steps.done():
            step += 1
            row = dict(steps.step(step) or {})
            if eval_every > 0 and (step % eval_every == 0 or (eval_first and step == 1) or steps.done()):
                row.update(steps.evaluate(step))  # type: ignore[attr-defined]
            if row:
                run.log(step, **row)
            run.checkpoint(step, steps.state)
            bar.update(steps.units() - bar.n, **_postfix(row))
    run.final_checkpoint()
    return steps.summary()


def _postfix(row: Mapping[str, Any]) -> dict[str, Any]:
    """At most three scalar metrics of the row for the progress bar."""
    out = {}
    for k, v in row.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("wall_time",):
            out[k.rsplit("/", 1)[-1][:12]] = round(v, 4) if isinstance(v, float) else v
        if len(out) == 3:
            break
    return out


# ----------------------------------------------------------------------------- stop signals


class _Stopper:
    """The installed handler of :func:`stop_signals` (one per ``execute``; restored afterwards)."""

    def __init__(self, run: Any, grace: float):
        self.run, self.grace = run, grace
        self.pid = os.getpid()
        self.previous: dict[int, Any] = {}
        self.requested: str | None = None
        self._lock = threading.Lock()
        self._active = True
        self._timer: threading.Timer | None = None

    def handle(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.pid:  # a forked child inherited the handler: behave as before it was installed
            self._previous_behaviour(signum, frame)
            return
        name = signal.Signals(signum).name
        if self.run is None or self.requested is not None:
            raise RunInterrupted(self.requested or name, getattr(self.run, "last_step", None))
        self.requested = name
        self.run.stop_requested = name
        self._timer = threading.Timer(self.grace, self._escalate, args=(signum,))
        self._timer.daemon = True
        self._timer.start()

    def _escalate(self, signum: int) -> None:
        with self._lock:
            if self._active:
                signal.pthread_kill(threading.main_thread().ident, signum)  # type: ignore[arg-type]

    def _previous_behaviour(self, signum: int, frame: Any) -> None:
        prev = self.previous.get(signum, signal.SIG_DFL)
        if callable(prev):
            prev(signum, frame)
        elif prev != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def uninstall(self) -> None:
        with self._lock:
            self._active = False
            if self._timer is not None:
                self._timer.cancel()
            for signum, prev in self.previous.items():
                signal.signal(signum, prev)
            self.previous.clear()


@contextlib.contextmanager
def stop_signals(run: Any = None, grace: float = GRACE_S) -> Iterator[_Stopper | None]:
    """Turn SIGTERM and SIGINT into :class:`RunInterrupted` inside the block (see the module docstring).

    Outside the main thread (where Python cannot install signal handlers) the block runs unchanged and yields
    None. ``run``: the run to stop at its next checkpoint offer; None raises at the first signal.
    """
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    stopper = _Stopper(run, grace)
    for signum in STOP_SIGNALS:
        stopper.previous[signum] = signal.signal(signum, stopper.handle)
    try:
        yield stopper
    finally:
        stopper.uninstall()

