"""Distributed training on :mod:`fedarena.engine.collectives`: a data-parallel learner (replicas all-reduce
bucketed gradients) and a parameter server (sharded parameters; synchronous, threshold-synchronous and
asynchronous workers)."""

from .data_parallel import DataParallelLearner, GradientBuckets, ReplicaStep, data_parallel_step
from .parameter_server import ParameterServerConfig, ServerShard, WorkerLog, run_parameter_server
from .ps_learner import ParameterServerLearner

__all__ = ["DataParallelLearner", "GradientBuckets", "ParameterServerConfig", "ParameterServerLearner",
           "ReplicaStep", "ServerShard",
           "WorkerLog", "data_parallel_step", "run_parameter_server"]
