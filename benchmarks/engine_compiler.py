"""The engine compiler's passes, vmap and memory plan, measured in one run against the alternatives.

Prints, with the median over interleaved rounds (each round times every contender back to back):
  1. the PPO-sized and CNN training steps of ``engine_vs_torch.py`` with the default pass pipeline
     on vs off vs default + elementwise fusion (time per call, equations, and the executor's memory
     plan: bytes of the buffers the compiled code holds vs one buffer per value, equations run in
     place, bytes allocated per call) and against
     PyTorch eager (``torch.set_num_threads(1)``);
  2. a vmapped local-SGD step for 256 federated clients (each its own MLP 8 -> 32 -> 4 and batch
     of 16) vs a Python loop over the clients calling the jitted single-client step (target: >= 10x)
     vs ``torch.func.vmap`` of the same step (target: not slower);
  3. per-example gradients of the PPO-sized MLP (8 -> 64 -> 64 -> 4) for a batch of 256 vs
     ``torch.func.vmap(torch.func.grad(...))`` (target: not slower).
Ratios are alternative time / fedarena time (> 1: fedarena faster).  Results are checked equal.

Run:  python benchmarks/engine_compiler.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engine_vs_torch as EV  # noqa: E402  (the core benchmark's models and steps)

from fedarena import engine  # noqa: E402
from fedarena.engine import nn, ops  # noqa: E402
from fedarena.engine.compiler.passes import FUSION_PIPELINE  # noqa: E402


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def per_call(fn, reps: int, clock=time.perf_counter) -> float:
    t0 = clock()
    for _ in range(reps):
        fn()
    return (clock() - t0) / reps


def interleaved(fns: dict, reps: dict, rounds: int, clock=time.perf_counter) -> dict:
    for k, f in fns.items():
        for _ in range(2):
            f()
    samples = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            samples[k].append(per_call(f, reps[k], clock))
    return {k: statistics.median(v) for k, v in samples.items()}


# ----------------------------------------------------------------------------- 256 clients, local SGD

N_CLIENTS, C_BATCH, C_IN, C_HID, C_OUT, C_LR = 256, 16, 8, 32, 4, 0.1
client_mlp = nn.MLP([C_IN, C_HID, C_OUT], activation="tanh")


def client_loss(p, x, y):
    return ops.cross_entropy(client_mlp.apply(p, x), y)


def client_step(p, x, y):
    loss, g = engine.value_and_grad(client_loss)(p, x, y)
    return engine.tree_map(lambda a, b: a - C_LR * b, p, g), loss


def torch_client_step(torch):
    F = torch.nn.functional

    def loss(p, x, y):
        h = torch.tanh(x @ p["w0"] + p["b0"])
        return F.cross_entropy(h @ p["w1"] + p["b1"], y)

    def step(p, x, y):
        g = torch.func.grad(loss)(p, x, y)
        return {k: p[k] - C_LR * g[k] for k in p}

    return torch.func.vmap(step)


# ----------------------------------------------------------------------------- per-example gradients

PE_BATCH = 256
pe_mlp = nn.MLP([8, 64, 64, 4], activation="tanh")


def pe_loss(p, x, y):
    return ops.cross_entropy(pe_mlp.apply(p, x[None]), y[None])


def torch_pe(torch):
    F = torch.nn.functional

    def loss(p, x, y):
        h = torch.tanh(x @ p["w0"] + p["b0"])
        h = torch.tanh(h @ p["w1"] + p["b1"])
        return F.cross_entropy((h @ p["w2"] + p["b2"])[None], y[None])

    return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))


def _torch_params(torch, layers) -> dict:
    out = {}
    for i, layer in enumerate(layers):
        out[f"w{i}"] = torch.tensor(np.ascontiguousarray(layer["w"]))
        out[f"b{i}"] = torch.tensor(np.ascontiguousarray(layer["b"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--clock", choices=sorted(CLOCKS), default="wall",
        help="wall: perf_counter; cpu: this thread's CPU time (robust on a loaded machine; everything runs on 1 thread)",
    )
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    engine.set_num_threads(1)
    scale = 0.25 if args.quick else 1.0
    rng = np.random.default_rng(0)

    # ------------------------------------------------------------------ 1. passes on/off vs torch
    obs = rng.standard_normal((EV.BATCH, EV.OBS)).astype(np.float32)
    act = rng.integers(0, EV.ACT, EV.BATCH)
    adv = rng.standard_normal(EV.BATCH).astype(np.float32)
    logp_old = (np.log(1 / EV.ACT) + 0.1 * rng.standard_normal(EV.BATCH)).astype(np.float32)
    ret = rng.standard_normal(EV.BATCH).astype(np.float32)
    batch = (obs, act, adv, logp_old, ret)
    p0 = EV.ppo_init(0)
    x = rng.standard_normal((EV.CNN_BATCH, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, EV.CNN_BATCH)
    cp0 = EV.cnn.init(0)
    rows = []
    fns, reps = {}, {}
    for name, step, a0, r in (
        ("ppo", EV.ppo_step, (p0, EV.ppo_opt.init(p0)) + batch, 200),
        ("cnn", EV.cnn_step, (cp0, EV.cnn_opt.init(cp0), x, y), 10),
    ):
        for mode, passes in (("on", None), ("fusion", FUSION_PIPELINE), ("off", ())):
            j = engine.jit(step, passes=passes)
            t0 = time.perf_counter()
            g = j.graph(*a0)
            compile_s = time.perf_counter() - t0
            # the memory plan the compiled code really follows (buffers it holds per buffer set)
            plan = j.memory(*a0)
            rows.append((name, mode, len(g.eqns), plan, compile_s))
            state = {"a": a0}

            def call(j=j, state=state):
                out = j(*state["a"])
                state["a"] = (out[0], out[1]) + state["a"][2:]

            fns[(name, mode)] = call
            reps[(name, mode)] = max(1, int(r * scale))
    t_ppo = EV.torch_ppo(torch, p0)[0]
    tb = [torch.tensor(a) for a in batch]
    t_cnn = EV.torch_cnn(torch, cp0)
    tx, ty = torch.tensor(x), torch.tensor(y)
    fns[("ppo", "torch")] = lambda: t_ppo(*tb)
    fns[("cnn", "torch")] = lambda: t_cnn(tx, ty)
    reps[("ppo", "torch")] = reps[("ppo", "on")]
    reps[("cnn", "torch")] = reps[("cnn", "on")]

    # ------------------------------------------------------------------ 2. 256 clients
    clients = [client_mlp.init(s) for s in range(N_CLIENTS)]
    P = engine.tree_map(lambda *a: np.stack(a), *clients)
    X = rng.standard_normal((N_CLIENTS, C_BATCH, C_IN)).astype(np.float32)
    Y = rng.integers(0, C_OUT, (N_CLIENTS, C_BATCH))
    v_step = engine.jit(engine.vmap(client_step))
    one_step = engine.jit(client_step)
    tP = {k: v for k, v in _torch_params(torch, [{"w": P[i]["w"], "b": P[i]["b"]} for i in range(2)]).items()}
    tX, tY = torch.tensor(X), torch.tensor(Y)
    t_vstep = torch_client_step(torch)
    ours_v = v_step(P, X, Y)[0]
    loop = [one_step(clients[c], X[c], Y[c])[0] for c in range(N_CLIENTS)]
    tv = t_vstep(tP, tX, tY)
    err_loop = max(float(np.max(np.abs(ours_v[i]["w"] - np.stack([l[i]["w"] for l in loop])))) for i in range(2))
    err_torch = max(float(np.max(np.abs(ours_v[i]["w"] - tv[f"w{i}"].numpy()))) for i in range(2))
    fns["clients_vmap"] = lambda: v_step(P, X, Y)
    fns["clients_loop"] = lambda: [one_step(clients[c], X[c], Y[c]) for c in range(N_CLIENTS)]
    fns["clients_torch"] = lambda: t_vstep(tP, tX, tY)
    reps.update(clients_vmap=max(1, int(40 * scale)), clients_loop=max(1, int(3 * scale)), clients_torch=max(1, int(40 * scale)))

    # ------------------------------------------------------------------ 3. per-example gradients
    pp = pe_mlp.init(1)
    PX = rng.standard_normal((PE_BATCH, 8)).astype(np.float32)
    PY = rng.integers(0, 4, PE_BATCH)
    pe = engine.jit(engine.vmap(engine.grad(pe_loss), in_axes=(None, 0, 0)))
    t_pe = torch_pe(torch)
    tpp = _torch_params(torch, pp)
    tPX, tPY = torch.tensor(PX), torch.tensor(PY)
    g_ours = pe(pp, PX, PY)
    g_t = t_pe(tpp, tPX, tPY)
    err_pe = max(float(np.max(np.abs(g_ours[i]["w"] - g_t[f"w{i}"].numpy()))) for i in range(3))
    fns["pe_ours"] = lambda: pe(pp, PX, PY)
    fns["pe_torch"] = lambda: t_pe(tpp, tPX, tPY)
    reps.update(pe_ours=max(1, int(50 * scale)), pe_torch=max(1, int(50 * scale)))

    med = interleaved(fns, reps, args.rounds, CLOCKS[args.clock])
    print(f"clock: {args.clock}; median of {args.rounds} interleaved rounds; torch {torch.__version__}, 1 thread each")

    print("== 1. training steps: default passes on vs off, vs PyTorch eager (1 thread)")
    print(f"{'step':<5} {'passes':<6} {'eqns':>5} {'compile s':>9} {'us/call':>9} {'torch/ours':>10}  memory plan")
    for name, mode, n_eq, plan, cs in rows:
        t = med[(name, mode)]
        ratio = med[(name, "torch")] / t
        print(f"{name:<5} {mode:<6} {n_eq:>5} {cs:>9.3f} {t * 1e6:>9.1f} {ratio:>9.2f}x  {plan.report()}")
    for name in ("ppo", "cnn"):
        print(f"{name}: PyTorch eager {med[(name, 'torch')] * 1e6:.1f} us/call; time off/on {med[(name, 'off')] / med[(name, 'on')]:.2f}x, "
              f"off/fusion {med[(name, 'off')] / med[(name, 'fusion')]:.2f}x")
    print()
    print(f"== 2. local SGD step for {N_CLIENTS} clients (MLP {C_IN}->{C_HID}->{C_OUT}, batch {C_BATCH} each)")
    print(f"vmapped (one program): {med['clients_vmap'] * 1e3:.2f} ms; Python loop over clients: {med['clients_loop'] * 1e3:.2f} ms "
          f"-> {med['clients_loop'] / med['clients_vmap']:.1f}x (target >= 10x)")
    print(f"torch.func.vmap: {med['clients_torch'] * 1e3:.2f} ms -> torch/ours {med['clients_torch'] / med['clients_vmap']:.2f}x (target >= 1)")
    print(f"max |diff| of new weights: vs loop {err_loop:.2e}, vs torch {err_torch:.2e}")
    print()
    print(f"== 3. per-example gradients, MLP 8->64->64->4, batch {PE_BATCH}")
    print(f"ours jit(vmap(grad)): {med['pe_ours'] * 1e3:.2f} ms; torch.func.vmap(grad): {med['pe_torch'] * 1e3:.2f} ms "
          f"-> torch/ours {med['pe_torch'] / med['pe_ours']:.2f}x (target >= 1); max |diff| {err_pe:.2e}")


if __name__ == "__main__":
    main()
