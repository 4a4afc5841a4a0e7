"""Federated learning: horizontal FL over gRPC (scheduler, servers, clients) and vertical FL (``vertical/``).

Horizontal FL follows the MindSpore Federated architecture (FL-Scheduler, FL-Servers, FL-Clients with
time-limited rounds); see docs/architecture.md. Modules: ``wire`` (versioned msgpack codec), ``transport``
(gRPC), ``protocol`` (messages), ``auth``, ``scheduler``, ``server``, ``client``, ``strategy``, ``stages``,
``secure_round``, ``trainer`` / ``engine_trainer``, ``task``, ``deployment`` / ``node`` (processes),
``grpc_experiment`` (experiment kind ``fedavg_grpc``).
"""
