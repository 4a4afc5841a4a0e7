"""Deterministic evaluation episodes, exported policies and ``fedarena evaluate``.

Evaluation plays ``episodes`` episodes at once on a separate vectorized environment (one episode per copy,
reset with ``seed``; copies that finish wait for the others) with the greedy action: the mode of the policy
distribution (PPO / IMPALA: argmax of the logits, or the Gaussian mean, clipped or squashed as in training) or
argmax Q (DQN). The same parameters, environment construction, batch size and seed give the same returns, so
``fedarena evaluate RUN_DIR`` reproduces the run's last evaluation (the convention of SB3's ``EvalCallback`` and
rl-baselines3-zoo's ``enjoy``/``evaluate``: deterministic actions, separate environments).

An exported policy is a folder ``policies/<final|best>/`` with ``params.npz`` (the engine's parameter file with
each array named by its place in the network, e.g. ``pi/torso/l0/w``: :mod:`fedarena.rl.export`;
observation-normalization statistics included) and ``manifest.json``: format, algorithm and its config,
environment (id, kwargs, wrappers, backend), observation and action spaces, network, the step it was taken at
and its evaluation (return, episodes, seed). :func:`load_policy` reads it into a :class:`Policy` (``fedarena.load_policy``),
which acts, evaluates, and rebuilds itself in PyTorch or ONNX.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from fedarena import engine
from fedarena.envs.gym_envs import describe_space
from fedarena.platform.errors import RunError
from fedarena.platform.experiment import param
from fedarena.rl import export
from fedarena.rl.spaces import env_action

MANIFEST_FORMAT = "fedarena.policy/1"
MAX_EVAL_STEPS = 1_000_000


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation episodes beside training (deterministic actions, separate environments)."""

    every: int = param(10_000, "run evaluation episodes every this many environment steps (0: only at the end)")
    episodes: int = param(10, "episodes per evaluation, played in parallel (one per environment copy)")
    seed: int | None = param(None, "seed of the evaluation environments (null: the run's seed + 10000)")

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"eval.every: must be >= 0 (0 = only at the end), got {self.every}")
        if self.episodes < 1:
            raise ValueError(f"eval.episodes: must be >= 1, got {self.episodes}")


def eval_seed(cfg: Any) -> int:
    return int(cfg.eval.seed) if cfg.eval.seed is not None else int(cfg.seed) + 10_000


@dataclass(frozen=True)
class EnvOptions:
    """What builds the run's environments (mirrors the RL config's fields)."""

    env_id: str
    backend: str = "auto"
    env_kwargs: Mapping[str, Any] | None = None
    wrappers: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, cfg: Any) -> "EnvOptions":
        return cls(cfg.env_id, cfg.env_backend, dict(cfg.env_kwargs), env_wrappers(cfg))

    def build(self, num_envs: int, seed: int | None = None) -> Any:
        from fedarena.rl.execution import build_vector_env

        backend = "sync" if self.backend == "async" else self.backend  # evaluation runs in this process
        return build_vector_env(self.env_id, num_envs, seed, backend, dict(self.env_kwargs or {}),
                                dict(self.wrappers or {}))


def env_wrappers(cfg: Any) -> dict[str, Any]:
    """The per-environment wrapper fields of an RL config's ``wrappers`` section."""
    w = cfg.wrappers
    return {"frame_stack": w.frame_stack, "action_repeat": w.action_repeat, "time_limit": w.time_limit}


class GreedyPolicy:
    """Deterministic actions of an algorithm's network: ``act(params, obs) -> environment actions``."""

    def __init__(self, algorithm: str, observation_space: Any, action_space: Any, config: Mapping[str, Any]) -> None:
        from fedarena.rl.execution import build_agent

        self.algorithm = algorithm
        self.agent = build_agent(algorithm, observation_space, action_space, dict(config), seed=0)
        self.adapter = self.agent.adapter
        if algorithm == "dqn":
            self._q = self.agent.q_values
        else:
            self.dist = self.agent.dist
            self._forward = self.agent.forward

    def initial_params(self) -> Any:
        return self.agent.learner.params

    def act(self, params: Any, obs: Any) -> np.ndarray:
        x = self.adapter(obs)
        if self.algorithm == "dqn":
            return np.argmax(np.asarray(self._q(params, x)), axis=-1).astype(np.int64)
        dist_inputs, _ = self._forward(params, x)
        return env_action(self.dist, self.dist.mode(np.asarray(dist_inputs[0])))


def play(policy: GreedyPolicy, params: Any, env: Any, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One episode per copy of ``env`` (reset with ``seed``); returns (undiscounted returns, lengths)."""
    obs = env.reset(seed=seed)
    n = env.num_envs
    returns = np.zeros(n, dtype=np.float64)
    lengths = np.zeros(n, dtype=np.int64)
    done = np.zeros(n, dtype=bool)
    for _ in range(MAX_EVAL_STEPS):
        step = env.step(policy.act(params, obs))
        live = ~done
        returns[live] += np.asarray(step.reward, dtype=np.float64)[live]
        lengths[live] += 1
        done |= np.asarray(step.terminated) | np.asarray(step.truncated)
        if done.all():
            return returns, lengths
        obs = step.obs
    raise RunError(f"evaluation: an episode ran {MAX_EVAL_STEPS} steps without ending; set wrappers.time_limit")


class Evaluator:
    """Evaluation episodes of a run: builds its own environments and greedy policy once, then scores weights."""

    def __init__(self, algorithm: str, env: EnvOptions, config: Mapping[str, Any], episodes: int, seed: int) -> None:
        self.env_options, self.episodes, self.seed = env, int(episodes), int(seed)
        self.env = env.build(self.episodes)
        self.policy = GreedyPolicy(algorithm, self.env.observation_space, self.env.action_space, config)

    def __call__(self, params: Any) -> dict[str, Any]:
        returns, lengths = play(self.policy, params, self.env, self.seed)
        return {"eval_return": float(returns.mean()), "eval_return_std": float(returns.std()),
                "eval_return_min": float(returns.min()), "eval_return_max": float(returns.max()),
                "eval_length": float(lengths.mean()), "eval_returns": returns.tolist()}

    def close(self) -> None:
        if hasattr(self.env, "close"):
            self.env.close()


# ------------------------------------------------------------------------------------------ export


def _np_tree(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _np_tree(v) for k, v in tree.items()}
    return np.asarray(tree)


def export_policy(directory: str | Path, params: Any, *, algorithm: str, config: Mapping[str, Any],
                  env: EnvOptions, observation_space: Any, action_space: Any, step: int, env_steps: int,
                  evaluation: Mapping[str, Any], seed: int) -> Path:
    """Write ``params.npz`` + ``manifest.json`` into ``directory`` (replacing an older export there)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    export.save_named_params(directory / "params.npz", _np_tree(params))
    manifest = {
        "format": MANIFEST_FORMAT, "algorithm": algorithm, "config": dict(config),
        "env": {"env_id": env.env_id, "backend": env.backend, "env_kwargs": dict(env.env_kwargs or {}),
                "wrappers": dict(env.wrappers or {})},
        "observation_space": describe_space(observation_space), "action_space": describe_space(action_space),
        "network": {"observation_normalization": bool(config.get("normalize_obs", False)),
                    "hidden": list(config.get("hidden", [])), "activation": config.get("activation", "relu"),
                    "log_std": config.get("log_std"), "dueling": config.get("dueling")},
        "step": int(step), "env_steps": int(env_steps),
        "evaluation": {"return": evaluation["eval_return"], "returns": list(evaluation["eval_returns"]),
                       "episodes": len(evaluation["eval_returns"]), "seed": int(seed)},
    }
    tmp = directory / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    tmp.replace(directory / "manifest.json")
    return directory


@dataclass
class Policy:
    """An exported policy: its manifest, greedy policy, parameters and environment."""

    directory: Path
    manifest: dict[str, Any]
    greedy: GreedyPolicy
    params: Any
    env: EnvOptions

    def act(self, obs: Any) -> np.ndarray:
        """Deterministic environment actions for a batch of observations (as evaluation plays)."""
        return self.greedy.act(self.params, obs)

    def prepare(self, obs: Any) -> np.ndarray:
        """A batch of observations as the network's float32 input (the input of :meth:`to_torch` / ONNX)."""
        return np.asarray(self.greedy.adapter(obs), dtype=np.float32)

    def named_parameters(self) -> dict[str, np.ndarray]:
        """The parameters by their place in the network (``pi/torso/l0/w``, ...)."""
        return export.named_parameters(self.params)

    def to_torch(self) -> Any:
        """An equivalent ``torch.nn.Module``: ``module(torch.from_numpy(policy.prepare(obs)))`` gives the actions."""
        network = self.greedy.agent.q if self.greedy.algorithm == "dqn" else self.greedy.agent.net
        return export.to_torch(network, getattr(self.greedy, "dist", None), self.params)

    def to_onnx(self, path: str | Path) -> Path:
        """Write the :meth:`to_torch` module as ONNX (input ``obs`` = :meth:`prepare`'s array, output ``action``)."""
        return export.to_onnx(self.to_torch(), tuple(self.greedy.adapter.shape), path)

    def evaluate(self, episodes: int | None = None, seed: int | None = None) -> dict[str, Any]:
        """Deterministic episodes (default: the run's evaluation episodes and seed): mean return and lengths."""
        episodes = int(episodes or self.manifest["evaluation"]["episodes"])
        seed = int(self.manifest["evaluation"]["seed"] if seed is None else seed)
        env = self.env.build(episodes)
        try:
            returns, lengths = play(self.greedy, self.params, env, seed)
        finally:
            if hasattr(env, "close"):
                env.close()
        return {"episodes": episodes, "seed": seed, "mean_return": float(returns.mean()),
                "std_return": float(returns.std()), "mean_length": float(lengths.mean()), "returns": returns.tolist()}


def load_policy(directory: str | Path) -> Policy:
    """Read an exported policy folder (``policies/final`` or ``policies/best`` of an RL run)."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise RunError(f"{directory}: no readable exported policy (manifest.json: {e})") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise RunError(f"{directory}/manifest.json: format {manifest.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    e = manifest["env"]
    env = EnvOptions(e["env_id"], e.get("backend", "auto"), e.get("env_kwargs") or {}, e.get("wrappers") or {})
    probe = env.build(1)
    policy = GreedyPolicy(manifest["algorithm"], probe.observation_space, probe.action_space, manifest["config"])
    if hasattr(probe, "close"):
        probe.close()
    try:
        params = engine.load_params(directory / "params.npz", like=policy.initial_params())
    except engine.ParamsFileError as err:
        raise RunError(f"{directory}: {err}") from None
    return Policy(directory, manifest, policy, params, env)


def evaluate_run(run_dir: Any, cfg: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """``fedarena evaluate``: replay ``policies/<final|best>`` for the run's evaluation episodes and seed."""
    which = options.get("policy") or "final"
    folder = Path(run_dir) / "policies" / which
    if not (folder / "manifest.json").exists():
        raise RunError(f"evaluate {run_dir}: no exported {which} policy (policies/{which}/manifest.json); "
                       "the run may have failed before its first evaluation")
    loaded = load_policy(folder)
    manifest, policy, params, env_options = loaded.manifest, loaded.greedy, loaded.params, loaded.env
    result = loaded.evaluate(options.get("episodes"), options.get("seed"))
    episodes, seed = result["episodes"], result["seed"]
    out: dict[str, Any] = {"policy": which, "step": manifest["step"], "env_steps": manifest["env_steps"],
                           "episodes": episodes, "seed": seed, "mean_return": result["mean_return"],
                           "std_return": result["std_return"], "mean_length": result["mean_length"],
                           "run_eval_return": manifest["evaluation"]["return"]}
    if options.get("render"):
        count = min(episodes, int(options.get("render_episodes") or 1))
        out.update(_render(policy, params, env_options, Path(run_dir) / "evaluation", count, seed,
                           str(options["render"])))
    return out


def _render(policy: GreedyPolicy, params: Any, env_options: EnvOptions, out_dir: Path, episodes: int, seed: int,
            mode: str) -> dict[str, Any]:
    """Play ``episodes`` single gymnasium environments with ``render_mode=mode`` (seeds ``seed + i``), one GIF per
    episode (frames at half resolution, every second frame: 25 fps for 50 steps per second)."""
    import os

    from PIL import Image

    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame renders off-screen; no display needed
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

    from fedarena.envs.gym_envs import EnvSpecError, EnvWrappers, make_env

    out_dir.mkdir(parents=True, exist_ok=True)
    returns = []
    for i in range(episodes):
        env = make_env(env_options.env_id, env_options.env_kwargs, EnvWrappers(**dict(env_options.wrappers or {})),
                       render_mode=mode)
        try:
            obs, _ = env.reset(seed=seed + i)
            frames, total = [env.render()], 0.0
        except Exception as e:
            raise EnvSpecError(f"render: {env_options.env_id} cannot render '{mode}': {type(e).__name__}: "
                               f"{' '.join(str(e).split())}") from None
        for _ in range(MAX_EVAL_STEPS):
            batch = _batch1(obs)
            action = policy.act(params, batch)[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            if len(frames) % 2 == 0 or terminated or truncated:
                frames.append(env.render())
            else:
                frames.append(None)
            if terminated or truncated:
                break
        env.close()
        returns.append(total)
        images = [Image.fromarray(np.asarray(f, dtype=np.uint8)[::2, ::2]) for f in frames if f is not None]
        if images:
            images[0].save(out_dir / f"episode-{i}.gif", save_all=True, append_images=images[1:], duration=40, loop=0)
    return {"rendered_episodes": episodes, "rendered_mean_return": float(np.mean(returns)),
            "frames_dir": str(out_dir)}


def _batch1(obs: Any) -> Any:
    if isinstance(obs, dict):
        return {k: _batch1(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_batch1(v) for v in obs)
    return np.asarray(obs)[None]
