"""Environment steps per second: fedarena's batched CartPole-v1 / Acrobot-v1 vs gymnasium's SyncVectorEnv.

Both sides step ``--num-envs`` environments with the same random actions, auto-resetting, in this process.
Also reports gymnasium's own vectorized CartPoleVectorEnv ("vector_entry_point") for reference.
Acceptance (issue 9): ratio >= 20 at 256 environments.

    python benchmarks/rl_envs.py --num-envs 256 --steps 2000
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

from fedarena.envs.classic_control import BatchedClassicControl


def _rate(step, actions: np.ndarray, num_envs: int, min_seconds: float = 1.0) -> float:
    """Environment steps per second of ``step(actions[t])``, looping until ``min_seconds`` passed."""
    t0 = time.perf_counter()
    done_steps = 0
    while True:
        for a in actions:
            step(a)
        done_steps += len(actions)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            return done_steps * num_envs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200, help="action batches per timing loop")
    parser.add_argument("--seconds", type=float, default=2.0, help="minimum time per measurement")
    parser.add_argument("--gpu-envs", type=int, nargs="*", default=[],
                        help="also time the cupy build at these batch sizes (needs cupy and a CUDA device)")
    args = parser.parse_args()
    n = args.num_envs
    print(f"num_envs={n}")
    print(f"{'env':<12} {'fedarena batched':>18} {'gym SyncVectorEnv':>18} {'ratio':>7}  {'gym vector_entry_point':>22}")
    for env_id in ("CartPole-v1", "Acrobot-v1"):
        rng = np.random.default_rng(0)
        nact = 2 if env_id == "CartPole-v1" else 3
        actions = rng.integers(nact, size=(args.steps, n))
        ours = BatchedClassicControl(env_id, n, seed=0)
        ours.reset()
        ours_rate = _rate(ours.step, actions, n, args.seconds)
        sync = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync")
        sync.reset(seed=0)
        sync_rate = _rate(sync.step, actions, n, args.seconds)
        sync.close()
        entry = "n/a"
        try:
            native = gym.make_vec(env_id, num_envs=n, vectorization_mode="vector_entry_point")
            native.reset(seed=0)
            entry = f"{_rate(native.step, actions, n, args.seconds):,.0f}"
            native.close()
        except Exception:  # gymnasium has no vector entry point for this id
            pass
        print(f"{env_id:<12} {ours_rate:>18,.0f} {sync_rate:>18,.0f} {ours_rate / sync_rate:>6.1f}x  {entry:>22}")
    for m in args.gpu_envs:
        import cupy as cp

        for env_id in ("CartPole-v1", "Acrobot-v1"):
            nact = 2 if env_id == "CartPole-v1" else 3
            actions = cp.asarray(np.random.default_rng(0).integers(nact, size=(20, m)))
            gpu = BatchedClassicControl(env_id, m, seed=0, xp=cp)
            gpu.reset()
            cpu = BatchedClassicControl(env_id, m, seed=0)
            cpu.reset()

            def step_sync(a):
                gpu.step(a)
                cp.cuda.Device().synchronize()

            g = _rate(step_sync, actions, m, args.seconds)
            c = _rate(cpu.step, cp.asnumpy(actions), m, args.seconds)
            print(f"{env_id:<12} cupy {m:>9,} envs: {g:>15,.0f} steps/s   numpy same size: {c:>13,.0f}   ratio {g / c:.1f}x")


if __name__ == "__main__":
    main()
