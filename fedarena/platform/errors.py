"""The error rule of fedarena: which exceptions are the user's to fix (exit status 2) and which are ours (1).

A *user error* is anything the person running the experiment can fix without changing fedarena: a config
value, an environment id, a missing optional package, an environment (their code) that raises, a corrupt or
foreign run folder or checkpoint. It is an exception that

- derives from :class:`UserError` (``ConfigError``, ``RunError``, ``CheckpointError`` and the classes below), or
- has a class attribute ``user_error = True`` — the marker for lower layers that cannot import the platform
  (``fedarena.envs`` raises ``EnvSpecError`` / ``EnvStepError`` with it), or
- is a Ray task error whose ``cause`` is one of the above.

Its message is one line that names the field or thing and says what to do. Every other exception escaping a run
is an *internal error* (a bug in fedarena): the CLI prints one line with its type and message and exits with 1.
``--debug`` shows the traceback either way; the run folder's ``run.log`` always has it.
"""

from __future__ import annotations

EXIT_INTERNAL = 1
EXIT_USER = 2


class UserError(Exception):
    """An error the user fixes by changing their input; the CLI prints its one-line message and exits 2."""

    user_error = True


class ConfigError(UserError, ValueError):
    """A config that cannot be used; the message names the field and the reason."""


class RunError(UserError, RuntimeError):
    """A run that cannot start, resume or be read (the message says why)."""


class MissingDependencyError(UserError, ImportError):
    """An optional package the run needs is not installed; the message says what to install."""


class EnvironmentFailure(UserError, RuntimeError):
    """The user's environment could not be built or raised while it was stepped."""


def root_cause(exc: BaseException) -> BaseException:
    """The exception to report: Ray wraps a remote task's exception, whose original is ``exc.cause``."""
    seen = 0
    while seen < 8 and isinstance(getattr(exc, "cause", None), BaseException):
        exc = exc.cause  # type: ignore[assignment]
        seen += 1
    return exc


def is_user_error(exc: BaseException) -> bool:
    """True for the user errors of the module docstring's rule."""
    return bool(getattr(type(root_cause(exc)), "user_error", False)) or bool(getattr(type(exc), "user_error", False))


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` (or its Ray cause) on one line; internal errors are prefixed with their type."""
    cause = root_cause(exc)
    text = " ".join(str(cause).split()) or type(cause).__name__
    if is_user_error(exc):
        return text
    return f"{type(cause).__name__}: {text}"


def exit_status(exc: BaseException) -> int:
    return EXIT_USER if is_user_error(exc) else EXIT_INTERNAL
