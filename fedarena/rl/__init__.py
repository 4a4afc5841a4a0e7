"""fedarena.rl: replay buffers, return estimators, DQN / PPO / IMPALA on the engine, actor-learner workers,
a batching inference server, and local / multi-process / Ray execution (see docs/architecture.md)."""

from fedarena.rl.dqn import DQN, DQNConfig
from fedarena.rl.impala import IMPALA, IMPALAConfig
from fedarena.rl.ppo import PPO, PPOConfig
from fedarena.rl.replay import PrioritizedReplayBuffer, ReplayBuffer, SegmentTree
from fedarena.rl.returns import discounted_returns, gae, vtrace
from fedarena.rl.rollout import RolloutBuffer
from fedarena.rl.workers import Actor, InferenceServer, Learner, LocalPolicy, Weights

__all__ = [
    "DQN", "DQNConfig", "IMPALA", "IMPALAConfig", "PPO", "PPOConfig", "PrioritizedReplayBuffer", "ReplayBuffer",
    "SegmentTree", "discounted_returns", "gae", "vtrace", "RolloutBuffer", "Actor", "InferenceServer", "Learner",
    "LocalPolicy", "Weights",
]
