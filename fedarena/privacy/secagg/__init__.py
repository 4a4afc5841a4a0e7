"""Secure aggregation: SecAgg (Bonawitz et al., CCS 2017) and SecAgg+ (Bell et al., CCS 2020).

Clients mask their fixed-point-quantized updates with pairwise masks that cancel in the sum plus a self mask,
Shamir-share the secrets needed to remove the masks of clients that drop out, and the server unmasks only the
sum. ``SecAggServer`` and ``SecAggClient`` exchange the per-stage messages of :mod:`.messages`; any transport
(the in-process :func:`secure_aggregate`, gRPC) drives them.
"""

from fedarena.privacy.secagg.client import SecAggClient
from fedarena.privacy.secagg.messages import MalformedMessage, decode, encode
from fedarena.privacy.secagg.protocol import InsufficientSurvivorsError, ProtocolError, SecAggConfig
from fedarena.privacy.secagg.quantization import dequantize, quantize
from fedarena.privacy.secagg.server import AggregateResult, SecAggServer
from fedarena.privacy.secagg.simulation import DROP_STAGES, RoundReport, secure_aggregate

__all__ = [
    "SecAggConfig", "SecAggClient", "SecAggServer", "AggregateResult", "ProtocolError",
    "InsufficientSurvivorsError", "MalformedMessage", "encode", "decode", "quantize", "dequantize",
    "secure_aggregate", "RoundReport", "DROP_STAGES",
]
