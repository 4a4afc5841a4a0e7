"""Gymnasium environments from an id string, with validation and the per-environment wrappers of RL configs.

``env_id`` takes three forms:

- a registered gymnasium id, e.g. ``CartPole-v1`` or ``Pendulum-v1``;
- gymnasium's ``module:EnvId``: ``module`` is imported (it registers ``EnvId`` with ``gymnasium.register``),
  then ``EnvId`` is made — the form gymnasium's own ``make`` accepts;
- a Python entry point ``package.module:make_env``: a callable in an importable module that returns a
  ``gymnasium.Env`` when called with ``env_kwargs`` (and ``render_mode=`` when rendering is asked for).

:func:`check_env_id` resolves the id without building an environment (imports only), so a config with an
unknown id, an unimportable module or a missing optional package (Box2D, MuJoCo, pygame) fails when it is
loaded. Errors are :class:`EnvSpecError` / :class:`EnvStepError`, marked ``user_error = True`` (the platform's
rule for exit status 2, see ``fedarena.platform.errors``), each with a one-line message.

Wrappers (:class:`EnvWrappers`), applied to each environment from the inside out: ``action_repeat`` (the action
is applied ``k`` times and the rewards summed, stopping at an episode end), ``time_limit`` (truncate after this
many agent steps; the environment's registered limit still applies to its own steps), ``frame_stack`` (the last
``k`` observations stacked on a new leading axis, gymnasium's ``FrameStackObservation``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import gymnasium as gym
import numpy as np


class EnvSpecError(ValueError):
    """An ``env_id`` / ``env_kwargs`` that cannot be turned into an environment (a user error)."""

    user_error = True


class EnvStepError(RuntimeError):
    """The user's environment raised in ``reset`` or ``step`` (a user error: the environment needs fixing)."""

    user_error = True


@dataclass(frozen=True)
class EnvWrappers:
    """Per-environment wrappers (see the module docstring); the defaults leave the environment unchanged."""

    frame_stack: int = 1
    action_repeat: int = 1
    time_limit: int | None = None

    def __post_init__(self) -> None:
        if self.frame_stack < 1 or self.action_repeat < 1:
            raise EnvSpecError(f"wrappers: frame_stack and action_repeat must be >= 1, got {self.frame_stack}, "
                               f"{self.action_repeat}")
        if self.time_limit is not None and self.time_limit < 1:
            raise EnvSpecError(f"wrappers.time_limit: must be >= 1 or null, got {self.time_limit}")

    @property
    def any(self) -> bool:
        return self.frame_stack > 1 or self.action_repeat > 1 or self.time_limit is not None


@dataclass(frozen=True)
class EnvSource:
    """How an ``env_id`` resolves: ``form`` is ``gymnasium`` (``name`` a registered id) or ``entry_point``."""

    form: str
    name: str
    factory: Callable[..., Any] | None = None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":  # KeyError-style quoting
        text = text[1:-1]
    return text or type(exc).__name__


def _import(module: str, env_id: str) -> Any:
    try:
        return importlib.import_module(module)
    except gym.error.DependencyNotInstalled as e:
        raise EnvSpecError(f"env_id '{env_id}': a package it needs is not installed: {_one_line(e)}") from None
    except ImportError as e:
        raise EnvSpecError(f"env_id '{env_id}': cannot import module '{module}' ({_one_line(e)}); check the name "
                           "and that the module is on PYTHONPATH") from None
    except Exception as e:  # the user's module raised while importing
        raise EnvSpecError(f"env_id '{env_id}': importing module '{module}' raised {type(e).__name__}: "
                           f"{_one_line(e)}") from None


def _check_registered(name: str, env_id: str) -> None:
    try:
        spec = gym.spec(name)
    except gym.error.Error as e:
        raise EnvSpecError(f"env_id: gymnasium does not know '{env_id}' ({_one_line(e)}); use a registered id, "
                           "'module:EnvId' or 'package.module:make_env'") from None
    entry = spec.entry_point
    if isinstance(entry, str) and ":" in entry:  # import the implementation: missing optional packages show here
        _import(entry.split(":", 1)[0], env_id)


def check_env_id(env_id: str) -> EnvSource:
    """Resolve ``env_id`` (module docstring) by importing what it names; raise :class:`EnvSpecError` if it cannot."""
    if not isinstance(env_id, str) or not env_id.strip():
        raise EnvSpecError(f"env_id: expected a gymnasium id or 'module:name', got {env_id!r}")
    if ":" not in env_id:
        _check_registered(env_id, env_id)
        return EnvSource("gymnasium", env_id)
    module_name, _, name = env_id.partition(":")
    if not module_name or not name:
        raise EnvSpecError(f"env_id '{env_id}': expected 'module:EnvId' or 'package.module:make_env'")
    module = _import(module_name, env_id)
    if name in gym.registry:
        _check_registered(name, env_id)
        return EnvSource("gymnasium", name)
    factory = getattr(module, name, None)
    if factory is None:
        raise EnvSpecError(f"env_id '{env_id}': module '{module_name}' neither registers a gymnasium id '{name}' "
                           f"nor defines '{name}'")
    if not callable(factory):
        raise EnvSpecError(f"env_id '{env_id}': '{name}' in module '{module_name}' is not callable")
    return EnvSource("entry_point", name, factory)


class ActionRepeat(gym.Wrapper):
    """Apply each action ``repeat`` times, summing the rewards; stop early when the episode ends."""

    def __init__(self, env: gym.Env, repeat: int) -> None:
        super().__init__(env)
        self.repeat = int(repeat)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


def make_env(env_id: str, env_kwargs: Mapping[str, Any] | None = None, wrappers: EnvWrappers | None = None,
             render_mode: str | None = None) -> gym.Env:
    """One wrapped environment for ``env_id`` (any of the three forms)."""
    source = check_env_id(env_id)
    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    try:
        if source.form == "gymnasium":
            env = gym.make(source.name, **kwargs)
        else:
            assert source.factory is not None
            env = source.factory(**kwargs)
    except gym.error.DependencyNotInstalled as e:
        raise EnvSpecError(f"env_id '{env_id}': a package it needs is not installed: {_one_line(e)}") from None
    except TypeError as e:
        raise EnvSpecError(f"env_kwargs of '{env_id}': {_one_line(e)}") from None
    except Exception as e:
        raise EnvSpecError(f"env_id '{env_id}': building the environment raised {type(e).__name__}: "
                           f"{_one_line(e)}") from None
    if not isinstance(env, gym.Env):
        raise EnvSpecError(f"env_id '{env_id}': the entry point returned {type(env).__name__}, not a gymnasium.Env")
    w = wrappers or EnvWrappers()
    if w.action_repeat > 1:
        env = ActionRepeat(env, w.action_repeat)
    if w.time_limit is not None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps=w.time_limit)
    if w.frame_stack > 1:
        env = gym.wrappers.FrameStackObservation(env, w.frame_stack)
    return env


def env_factory(env_id: str, env_kwargs: Mapping[str, Any] | None = None, wrappers: EnvWrappers | None = None,
                render_mode: str | None = None) -> Callable[[], gym.Env]:
    """A picklable zero-argument constructor (for gymnasium's Sync/AsyncVectorEnv)."""
    return _Factory(env_id, dict(env_kwargs or {}), wrappers or EnvWrappers(), render_mode)


@dataclass(frozen=True)
class _Factory:
    env_id: str
    env_kwargs: dict
    wrappers: EnvWrappers
    render_mode: str | None

    def __call__(self) -> gym.Env:
        return make_env(self.env_id, self.env_kwargs, self.wrappers, self.render_mode)


def describe_space(space: Any) -> dict[str, Any]:
    """A JSON description of a gymnasium space (for policy manifests)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": np.asarray(space.low).reshape(-1).tolist()[:64],
                "high": np.asarray(space.high).reshape(-1).tolist()[:64]}
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist()}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: describe_space(s) for k, s in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [describe_space(s) for s in space.spaces]}
    return {"type": type(space).__name__, "repr": repr(space)}
