"""Secure aggregation cost: fedarena SecAgg / SecAgg+ vs. Flower's SecAgg+ in the same run.

For each number of clients n (default 100, 500, 1000) and model size d (default 100,000), 10% of the clients drop
after sending their masked input (they do not answer the unmasking request; their inputs stay in the sum and the
server rebuilds their mask seeds from shares). Reported per implementation: server compute time, mean client
compute time, mean bytes sent per client, and whether the unmasked result equals the expected aggregate.
``--drop-stage masked_input`` instead drops clients before they send their masked input (the server then rebuilds
their key-agreement secrets and removes pairwise masks).

Flower is driven in-process with its own code on both sides: ``flwr.server.workflow.SecAggPlusWorkflow`` on the
server and ``flwr.client.mod.secaggplus_mod`` in a ``ClientApp`` on every client, connected by a small in-memory
``Grid`` that copies each message through Flower's protobuf serialization (as the wire would) and counts the bytes
of every reply. Serialization is excluded from Flower's server and client times (transport), while fedarena's
server time includes decoding the clients' messages, so the comparison leans in Flower's favour.

Both use the same quantization (clip 8, 2^22 levels, mod 2^32) and the same SecAgg+ graph size (``--neighbours``
neighbours, i.e. ``neighbours + 1`` shares, and ``--threshold`` shares to reconstruct). Times are CPU seconds of
this process (``time.process_time``) by default, so other load on a shared machine does not skew the ratios.

    python benchmarks/secagg.py                         # n = 100, 500, 1000; d = 100,000
    python benchmarks/secagg.py --clients 100 --dim 100000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fedarena.privacy.secagg import SecAggConfig, secure_aggregate  # noqa: E402

CLIP = 8.0
LEVELS = 2**22


def run_fedarena(inputs, neighbours, threshold, drop_ids, drop_stage, clock):
    n = len(inputs)
    d = len(next(iter(inputs.values())))
    cfg = SecAggConfig(dimension=d, threshold=threshold, clip=CLIP, scale=LEVELS / (2 * CLIP), modulus_bits=32,
                       num_neighbours=neighbours)
    rep = secure_aggregate(inputs, cfg, dropouts={drop_stage: set(drop_ids)}, clock=clock)
    included = [u for u in inputs if not (drop_stage == "masked_input" and u in drop_ids)]
    expected = np.sum([np.clip(inputs[u], -CLIP, CLIP) for u in included], axis=0)
    err = float(np.abs(rep.result.values - expected).max())
    ok = err <= len(included) * 0.5 / cfg.scale + 1e-9 and rep.result.survivors == tuple(sorted(included))
    return {"server_s": rep.server_seconds, "client_s": float(np.mean(list(rep.client_seconds.values()))),
            "bytes_sent": float(np.mean([rep.bytes_sent[u] for u in inputs])), "correct": bool(ok),
            "max_abs_error": err, "n": n}


def run_flower(inputs, num_shares, threshold, drop_ids, drop_stage, clock):
    """Flower's SecAgg+ (server workflow + client mod) over an in-memory grid; see the module docstring."""
    logging.disable(logging.WARNING)
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
    from flwr.common.serde import message_from_proto, message_to_proto
    from flwr.proto.message_pb2 import Message as ProtoMessage
    from flwr.server import ServerConfig
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
    from flwr.serverapp.grid import Grid
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id = 1  # what a SuperLink-started ServerApp process would have set
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 1
    n = len(inputs)
    d = len(next(iter(inputs.values())))
    flwr_stage = {"masked_input": "collect_masked_vectors", "unmask": "unmask"}[drop_stage]

    class FixedUpdate(NumPyClient):
        def __init__(self, nid):
            self.nid = nid

        def fit(self, parameters, config):
            return [inputs[self.nid].astype(np.float32)], 1, {}

    app = ClientApp(client_fn=lambda context: FixedUpdate(context.node_id).to_client(), mods=[secaggplus_mod])

    class InMemoryGrid(Grid):
        def __init__(self):
            self.contexts = {u: Context(run_id=1, node_id=u, node_config={}, state=RecordDict(), run_config={})
                             for u in inputs}
            self.client_s = {u: 0.0 for u in inputs}
            self.sent = {u: 0 for u in inputs}
            self.transport_s = 0.0

        def set_run(self, run):
            pass

        def run(self):
            return None

        def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
            return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

        def get_node_ids(self):
            return list(self.contexts)

        def push_messages(self, messages):
            raise NotImplementedError("InMemoryGrid only implements send_and_receive")

        def pull_messages(self, message_ids):
            raise NotImplementedError("InMemoryGrid only implements send_and_receive")

        def send_and_receive(self, messages, *, timeout=None):
            replies = []
            for msg in messages:
                nid = msg.metadata.dst_node_id
                t0 = clock()
                msg = message_from_proto(message_to_proto(msg))  # each client gets its own copy, as on the wire
                self.transport_s += clock() - t0
                if nid in drop_ids and msg.content.config_records[RECORD_KEY_CONFIGS]["stage"] == flwr_stage:
                    continue
                t0 = clock()
                reply = app(msg, self.contexts[nid])
                self.client_s[nid] += clock() - t0
                t0 = clock()
                data = message_to_proto(reply).SerializeToString()
                self.sent[nid] += len(data)
                proto = ProtoMessage()
                proto.ParseFromString(data)
                replies.append(message_from_proto(proto))
                self.transport_s += clock() - t0
            return replies

    grid = InMemoryGrid()
    manager = SimpleClientManager()
    for u in inputs:
        manager.register(GridClientProxy(u, grid, 1))
    strategy = FedAvg(fraction_fit=1.0, min_fit_clients=n, min_available_clients=n, fraction_evaluate=0.0)
    ctx = LegacyContext(Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                        config=ServerConfig(num_rounds=1), strategy=strategy, client_manager=manager)
    cfg = ConfigRecord()
    cfg[Key.CURRENT_ROUND] = 1
    cfg[Key.START_TIME] = time.time()
    ctx.state.config_records[MAIN_CONFIGS_RECORD] = cfg
    ctx.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters([np.zeros(d, np.float32)]), keep_input=True)
    workflow = SecAggPlusWorkflow(num_shares=num_shares, reconstruction_threshold=threshold, clipping_range=CLIP,
                                  max_weight=1.0,  # every client reports weight 1: full quantization precision
                                  quantization_range=LEVELS, modulus_range=2**32)
    t0 = clock()
    workflow(grid, ctx)
    total = clock() - t0
    out = parameters_to_ndarrays(compat.arrayrecord_to_parameters(ctx.state.array_records[MAIN_PARAMS_RECORD],
                                                                  keep_input=True))[0]
    included = [u for u in inputs if not (drop_stage == "masked_input" and u in drop_ids)]
    expected = np.mean([np.clip(inputs[u], -CLIP, CLIP) for u in included], axis=0)  # FedAvg with equal weights
    err = float(np.abs(out - expected).max())
    logging.disable(logging.NOTSET)
    client_total = sum(grid.client_s.values())
    return {"server_s": total - client_total - grid.transport_s, "client_s": client_total / n,
            "bytes_sent": float(np.mean(list(grid.sent.values()))), "correct": err <= 2 * (2 * CLIP / LEVELS),
            "max_abs_error": err, "transport_s": grid.transport_s, "n": n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="100,500,1000", help="comma-separated numbers of clients")
    ap.add_argument("--dim", type=int, default=100_000, help="model size d")
    ap.add_argument("--dropout", type=float, default=0.1, help="fraction of clients that drop")
    ap.add_argument("--drop-stage", choices=["unmask", "masked_input"], default="unmask",
                    help="unmask: drop after sending the masked input (default); masked_input: drop before")
    ap.add_argument("--neighbours", type=int, default=20, help="SecAgg+ neighbours per client (shares = +1)")
    ap.add_argument("--threshold", type=int, default=11, help="SecAgg+ shares needed to reconstruct")
    ap.add_argument("--skip", default="", help="comma-separated implementations to skip: secagg,secagg+,flower")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    ap.add_argument("--json", default="", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    skip = set(filter(None, args.skip.split(",")))
    results = []
    print(f"d={args.dim}, dropout={args.dropout:.0%} at stage '{args.drop_stage}', SecAgg+ neighbours="
          f"{args.neighbours} threshold={args.threshold}; SecAgg threshold=n//2+1; times: {args.clock} seconds")
    print(f"{'n':>5} {'implementation':<18} {'server s':>9} {'client s':>9} {'KB sent/client':>15} {'correct':>8}")
    for n in [int(c) for c in args.clients.split(",")]:
        rng = np.random.default_rng(n)
        inputs = {u: rng.uniform(-1, 1, size=args.dim) for u in range(1, n + 1)}
        drop = set(rng.choice(np.arange(1, n + 1), size=int(round(args.dropout * n)), replace=False).tolist())
        row = {}
        runs = [("secagg+", "fedarena SecAgg+", lambda: run_fedarena(inputs, args.neighbours, args.threshold, drop,
                                                                      args.drop_stage, clock)),
                ("flower", "Flower SecAgg+", lambda: run_flower(inputs, args.neighbours + 1, args.threshold, drop,
                                                                 args.drop_stage, clock)),
                ("secagg", "fedarena SecAgg", lambda: run_fedarena(inputs, None, n // 2 + 1, drop, args.drop_stage,
                                                                    clock))]
        for key, label, fn in runs:
            if key in skip:
                continue
            try:
                r = fn()
            except ImportError as exc:
                print(f"{n:>5} {label:<18} skipped: {exc}")
                continue
            row[key] = r
            results.append({"implementation": label, **r})
            print(f"{n:>5} {label:<18} {r['server_s']:>9.3f} {r['client_s']:>9.4f} {r['bytes_sent'] / 1e3:>15.1f} "
                  f"{str(r['correct']):>8}", flush=True)
        if "flower" in row and "secagg+" in row:
            f, s = row["flower"], row["secagg+"]
            ratio = {"server": f["server_s"] / s["server_s"], "client": f["client_s"] / s["client_s"],
                     "bytes": f["bytes_sent"] / s["bytes_sent"]}
            results.append({"implementation": "ratio Flower/fedarena SecAgg+", "n": n, **ratio})
            print(f"{n:>5} ratio Flower SecAgg+ / fedarena SecAgg+: server {ratio['server']:.1f}x, client "
                  f"{ratio['client']:.1f}x, bytes sent {ratio['bytes']:.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
