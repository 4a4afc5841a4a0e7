"""Collective communication: broadcast, reduce, all-reduce, gather, all-gather, scatter, reduce-scatter and
barrier as the engine's own algorithms (ring, binary tree, recursive halving-doubling) over transports
(threads, TCP sockets, shared memory, Ray actors, NCCL through cupy).

``Communicator(transport)`` is one rank's handle; ``run_threads(n, fn)`` runs ``fn(comm)`` on ``n`` threads.
Transports: :class:`ThreadGroup` / :class:`ThreadTransport` here, ``tcp.TCPTransport``, ``shm.SharedMemoryTransport``,
``ray_actors.RayGroup`` and ``nccl.NCCLCommunicator`` in their modules (imported on use: they need sockets, shared
memory, Ray or cupy).
"""

from .communicator import OPS, Communicator
from .cost_model import ALGORITHMS, choose, coefficients, predict
from .framing import FramingError
from .threads import ThreadGroup, ThreadTransport, run_threads
from .transport import CollectiveError, PeerFailure, Request, Transport

__all__ = ["ALGORITHMS", "OPS", "CollectiveError", "Communicator", "FramingError", "PeerFailure", "Request",
           "ThreadGroup", "ThreadTransport", "Transport", "choose", "coefficients", "predict", "run_threads"]
