"""Prioritized replay: batched sample + priority update of 256 items from a 1,000,000-item buffer,
fedarena's vectorized sum-tree vs RLlib's segment-tree PrioritizedReplayBuffer, in one run.

RLlib (ray[rllib]) pins an older gymnasium than fedarena's environment, so its side runs in a
subprocess of a separate interpreter (``--rllib-python``, default ``$FEDARENA_RLLIB_PYTHON`` or
/work/venv-rllib/bin/python) unless ``ray.rllib`` imports here. Both buffers hold the same
transitions (obs[4], action, reward, next_obs[4], done) and both are filled before timing; RLlib's
trees are filled bottom-up in bulk (the state its ``add`` would reach, without 10^6 Python calls).
Acceptance (issue 9): fedarena >= 10x faster.

    python benchmarks/replay.py --size 1000000 --batch 256
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

import numpy as np


def _timeit(fn, repeats: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def rllib_side(size: int, batch: int, repeats: int) -> dict:
    """Runs inside an interpreter with ray[rllib]; returns seconds per (sample + update) and per tree op."""
    import random

    from ray.rllib.policy.sample_batch import SampleBatch
    from ray.rllib.utils.replay_buffers.prioritized_replay_buffer import PrioritizedReplayBuffer

    import ray

    rng = np.random.default_rng(0)
    random.seed(0)
    buf = PrioritizedReplayBuffer(capacity=size, alpha=0.6)
    # fill: one small SampleBatch per slot (shared object: storage content does not change the timing)
    item = SampleBatch({"obs": np.zeros((1, 4), np.float32), "actions": np.zeros(1, np.int64),
                        "rewards": np.zeros(1, np.float32), "new_obs": np.zeros((1, 4), np.float32),
                        "terminateds": np.zeros(1, bool)})
    buf._add_single_batch(item)  # sets up bookkeeping for the first slot through RLlib's own code
    buf._storage = [item] * size
    buf._next_idx = 0
    buf._num_timesteps_added = size
    prio = (rng.random(size) + 0.01) ** 0.6
    for tree, combine in ((buf._it_sum, np.add), (buf._it_min, np.minimum)):
        cap = tree.capacity
        values = np.full(2 * cap, tree.neutral_element, dtype=np.float64)
        values[cap:cap + size] = prio
        level = cap
        while level > 1:
            lo = level // 2
            values[lo:level] = combine(values[2 * lo:2 * level:2], values[2 * lo + 1:2 * level:2])
            level = lo
        tree.value = values.tolist()
    buf._max_priority = 1.0

    def sample_and_update():
        b = buf.sample(batch, beta=0.4)
        idx = b["batch_indexes"]
        buf.update_priorities(idx, rng.random(len(idx)) + 0.01)

    def tree_only():
        total = buf._it_sum.sum()
        idx = [buf._it_sum.find_prefixsum_idx(random.random() * total) for _ in range(batch)]
        for i, p in zip(idx, rng.random(batch) + 0.01):
            buf._it_sum[i] = p
            buf._it_min[i] = p

    return {"sample_update_s": _timeit(sample_and_update, repeats), "tree_s": _timeit(tree_only, repeats),
            "version": ray.__version__}


def fedarena_side(size: int, batch: int, repeats: int) -> dict:
    from fedarena.rl.replay import PrioritizedReplayBuffer

    rng = np.random.default_rng(0)
    buf = PrioritizedReplayBuffer(size, alpha=0.6, seed=0)
    chunk = 100_000
    for start in range(0, size, chunk):
        b = min(chunk, size - start)
        buf.add({"obs": np.zeros((b, 4), np.float32), "action": np.zeros(b, np.int64),
                 "reward": np.zeros(b, np.float32), "next_obs": np.zeros((b, 4), np.float32),
                 "done": np.zeros(b, bool)}, priorities=rng.random(b) + 0.01)

    def sample_and_update():
        s = buf.sample(batch, beta=0.4)
        buf.update_priorities(s["indices"], rng.random(batch) + 0.01)

    def tree_only():
        idx = buf.sum_tree.find_prefix_sum(rng.random(batch) * buf.sum_tree.root)
        p = rng.random(batch) + 0.01
        buf.sum_tree.update(idx, p)
        buf.min_tree.update(idx, p)

    return {"sample_update_s": _timeit(sample_and_update, repeats), "tree_s": _timeit(tree_only, repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rllib-python", default=os.environ.get("FEDARENA_RLLIB_PYTHON", "/work/venv-rllib/bin/python"))
    parser.add_argument("--rllib-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rllib_side:
        print(json.dumps(rllib_side(args.size, args.batch, args.repeats)))
        return
    ours = fedarena_side(args.size, args.batch, args.repeats)
    try:
        import ray.rllib  # noqa: F401

        theirs = rllib_side(args.size, args.batch, args.repeats)
    except ImportError:
        if not os.path.exists(args.rllib_python):
            print(f"ray[rllib] is not importable here and {args.rllib_python} does not exist: RLlib side skipped")
            theirs = None
        else:
            cmd = [args.rllib_python, os.path.abspath(__file__), "--rllib-side", "--size", str(args.size),
                   "--batch", str(args.batch), "--repeats", str(args.repeats)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            theirs = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"prioritized replay, {args.size:,} items, batch {args.batch}: seconds per batched sample + priority update")
    print(f"  fedarena: sample+update {ours['sample_update_s'] * 1e3:8.3f} ms   tree only {ours['tree_s'] * 1e3:8.3f} ms")
    if theirs:
        print(f"  RLlib {theirs['version']}: sample+update {theirs['sample_update_s'] * 1e3:8.3f} ms   "
              f"tree only {theirs['tree_s'] * 1e3:8.3f} ms")
        print(f"  ratio (RLlib / fedarena): sample+update {theirs['sample_update_s'] / ours['sample_update_s']:.1f}x   "
              f"tree only {theirs['tree_s'] / ours['tree_s']:.1f}x")


if __name__ == "__main__":
    main()
