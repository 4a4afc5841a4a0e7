"""Experience replay: a uniform ring buffer and prioritized replay on a vectorized sum-tree.

Uniform replay: Lin (1992), "Self-improving reactive agents based on RL, planning and teaching";
Mnih et al. (2015), DQN. Prioritized replay (proportional variant, importance-sampling weights
normalised by the largest weight, stratified sampling over ``batch_size`` equal segments):
Schaul, Quan, Antonoglou & Silver (2016), "Prioritized Experience Replay", ICLR, section 3.3 and Alg. 1.

Storage is one preallocated numpy array per field (allocated on the first ``add`` from the shapes
seen). The sum- and min-trees are flat arrays with the root at index 1; a batch of priority updates
rewrites the leaves and then each level's touched parents in one vectorized step, and a batch of
samples descends all trees' levels together, so sampling and updating B items costs O(B log N) in a
few dozen numpy calls.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np


class ReplayBuffer:
    """Uniform experience replay over a fixed-capacity ring of numpy arrays (one per field)."""

    def __init__(self, capacity: int, seed: int | np.random.Generator | None = None) -> None:
        if int(capacity) < 1:
            raise ValueError(f"capacity: must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self._data: dict[str, np.ndarray] = {}
        self._next = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self._data)

    def add(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Append a batch of transitions (each field has the same leading size B); returns their slots."""
        if not batch:
            raise ValueError("batch: no fields given")
        arrays = {k: np.asarray(v) for k, v in batch.items()}
        sizes = {k: (a.shape[0] if a.ndim else -1) for k, a in arrays.items()}
        b = next(iter(sizes.values()))
        if b < 0 or any(s != b for s in sizes.values()):
            raise ValueError(f"batch: every field needs the same leading batch size, got {sizes}")
        if not self._data:
            self._data = {k: np.zeros((self.capacity,) + a.shape[1:], dtype=a.dtype) for k, a in arrays.items()}
        if set(arrays) != set(self._data):
            raise ValueError(f"batch: fields {sorted(arrays)} differ from the buffer's {sorted(self._data)}")
        for k, a in arrays.items():
            if a.shape[1:] != self._data[k].shape[1:]:
                raise ValueError(f"batch: field '{k}' has item shape {a.shape[1:]}, buffer holds "
                                 f"{self._data[k].shape[1:]}")
        if b > self.capacity:  # only the newest `capacity` items survive
            arrays = {k: a[-self.capacity:] for k, a in arrays.items()}
            b = self.capacity
        idx = (self._next + np.arange(b)) % self.capacity
        for k, a in arrays.items():
            self._data[k][idx] = a
        self._next = int((self._next + b) % self.capacity)
        self._size = min(self._size + b, self.capacity)
        return idx

    def gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The stored fields at ``indices`` (copies)."""
        return {k: v[indices] for k, v in self._data.items()}

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """``batch_size`` transitions drawn uniformly with replacement; adds ``indices``."""
        if self._size == 0:
            raise ValueError("sample: the buffer is empty")
        idx = self.rng.integers(0, self._size, size=int(batch_size))
        out = self.gather(idx)
        out["indices"] = idx
        return out

    # -- checkpointing (plain arrays and JSON scalars, no pickle)
    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "next": self._next,
            "size": self._size,
            "data": {k: v[: self._size].copy() if self._size < self.capacity else v.copy() for k, v in self._data.items()},
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"state: capacity {state['capacity']} differs from this buffer's {self.capacity}")
        self._next, self._size = int(state["next"]), int(state["size"])
        self._data = {}
        for k, v in state["data"].items():
            v = np.asarray(v)
            arr = np.zeros((self.capacity,) + v.shape[1:], dtype=v.dtype)
            arr[: v.shape[0]] = v
            self._data[k] = arr
        self.rng.bit_generator.state = _rng_state(state["rng"])


def _rng_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """numpy bit-generator state from its JSON form (nested dicts of ints)."""
    return {k: (_rng_state(v) if isinstance(v, Mapping) else (int(v) if isinstance(v, (np.integer,)) else v))
            for k, v in state.items()}


class SegmentTree:
    """A complete binary tree over ``capacity`` leaves, each node the sum (or min) of its children.

    Leaves live at ``[size, size + capacity)`` of a flat array (``size`` the next power of two); the root
    is index 1. ``update`` and ``find_prefix_sum`` take whole batches of indices.
    """

    def __init__(self, capacity: int, operation: str = "sum") -> None:
        if operation not in ("sum", "min"):
            raise ValueError(f"operation: expected 'sum' or 'min', got '{operation}'")
        self.capacity = int(capacity)
        self.size = 1 << max(0, (self.capacity - 1).bit_length())
        self.depth = self.size.bit_length() - 1
        self.operation = operation
        self.neutral = 0.0 if operation == "sum" else np.inf
        self.nodes = np.full(2 * self.size, self.neutral, dtype=np.float64)
        self._combine = np.add if operation == "sum" else np.minimum

    @property
    def root(self) -> float:
        return float(self.nodes[1])

    def __getitem__(self, indices: Any) -> np.ndarray:
        return self.nodes[np.asarray(indices) + self.size]

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``indices`` to ``values`` (the last value wins for repeated indices) and fix their ancestors."""
        nodes = self.nodes
        pos = np.asarray(indices, dtype=np.int64) + self.size
        if pos.size == 0:
            return
        nodes[pos] = values
        for _ in range(self.depth):
            # a parent shared by several updated leaves is recomputed once per leaf, from the same
            # (already updated) children, so duplicates write identical values and need no np.unique
            pos >>= 1
            left = pos << 1
            nodes[pos] = self._combine(nodes[left], nodes[left + 1])

    def find_prefix_sum(self, targets: np.ndarray) -> np.ndarray:
        """For each target t in [0, root), the leaf i with sum(leaves[:i]) <= t < sum(leaves[:i+1])."""
        if self.operation != "sum":
            raise ValueError("find_prefix_sum: only defined on a sum tree")
        nodes = self.nodes
        t = np.asarray(targets, dtype=np.float64).copy()
        pos = np.ones(t.shape, dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * pos
            left_sum = nodes[left]
            # go right when the target lies past the left subtree, or the left subtree is empty
            right = (t >= left_sum) & (nodes[left + 1] > 0.0) | (left_sum <= 0.0)
            t = np.where(right, t - left_sum, t)
            pos = np.where(right, left + 1, left)
        return np.minimum(pos - self.size, self.capacity - 1)


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay: P(i) = p_i^alpha / sum_k p_k^alpha, weights (N P(i))^-beta / max w."""

    def __init__(self, capacity: int, alpha: float = 0.6, epsilon: float = 1e-6,
                 seed: int | np.random.Generator | None = None) -> None:
        super().__init__(capacity, seed)
        if alpha < 0:
            raise ValueError(f"alpha: must be >= 0, got {alpha}")
        self.alpha = float(alpha)
        self.epsilon = float(epsilon)
        self.sum_tree = SegmentTree(self.capacity, "sum")
        self.min_tree = SegmentTree(self.capacity, "min")
        self.max_priority = 1.0

    def add(self, batch: Mapping[str, Any], priorities: np.ndarray | None = None) -> np.ndarray:
        """Add transitions with the largest priority seen so far (or the given ``priorities``)."""
        idx = super().add(batch)
        if priorities is None:
            p = np.full(idx.shape[0], self.max_priority ** self.alpha)
        else:
            pr = np.asarray(priorities, dtype=np.float64)[-idx.shape[0]:]
            self.max_priority = max(self.max_priority, float(pr.max()))
            p = (np.abs(pr) + self.epsilon) ** self.alpha
        self.sum_tree.update(idx, p)
        self.min_tree.update(idx, p)
        return idx

    def sample(self, batch_size: int, beta: float = 0.4, stratified: bool = True) -> dict[str, np.ndarray]:
        """A batch drawn with probability proportional to priority^alpha; adds ``indices`` and ``weights``."""
        if self._size == 0:
            raise ValueError("sample: the buffer is empty")
        b = int(batch_size)
        total = self.sum_tree.root
        if stratified:
            u = (np.arange(b) + self.rng.random(b)) * (total / b)
        else:
            u = self.rng.random(b) * total
        idx = self.sum_tree.find_prefix_sum(np.minimum(u, np.nextafter(total, 0.0)))
        p = self.sum_tree[idx] / total
        p_min = self.min_tree.root / total
        weights = (p / p_min) ** (-beta)  # = (N p)^-beta / (N p_min)^-beta
        out = self.gather(idx)
        out["indices"] = idx
        out["weights"] = weights.astype(np.float32)
        return out

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set new priorities (typically |TD error|) for sampled ``indices``."""
        pr = np.abs(np.asarray(priorities, dtype=np.float64))
        idx = np.asarray(indices, dtype=np.int64)
        if pr.shape != idx.shape:
            raise ValueError(f"priorities: shape {pr.shape} differs from indices' {idx.shape}")
        if not np.all(np.isfinite(pr)):
            raise ValueError("priorities: must be finite")
        if idx.size and (idx.min() < 0 or idx.max() >= self._size):
            raise ValueError(f"indices: must lie in [0, {self._size})")
        self.max_priority = max(self.max_priority, float(pr.max(initial=0.0)))
        p = (pr + self.epsilon) ** self.alpha
        self.sum_tree.update(idx, p)
        self.min_tree.update(idx, p)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["leaf_priorities"] = self.sum_tree[np.arange(self._size)].copy()
        state["max_priority"] = self.max_priority
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.max_priority = float(state["max_priority"])
        self.sum_tree = SegmentTree(self.capacity, "sum")
        self.min_tree = SegmentTree(self.capacity, "min")
        p = np.asarray(state["leaf_priorities"], dtype=np.float64)
        if p.size:
            self.sum_tree.update(np.arange(p.size), p)
            self.min_tree.update(np.arange(p.size), p)
