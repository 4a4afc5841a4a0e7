"""fedarena.engine (compiled numpy) vs PyTorch eager on CPU, measured in the same run.

Measures the median time per call of
  (a) a PPO-sized training step: MLP 8 -> 64 -> 64 -> {policy 4, value 1}, batch 64,
      clipped-surrogate + value + entropy loss, backward, Adam;
  (b) the actor's single-observation forward pass of that network (policy probabilities + value);
  (c) a small CNN training step: conv3x3(1->8, pad 1) -> ReLU -> conv3x3(8->16, stride 2, pad 1)
      -> ReLU -> Linear(3136 -> 64) -> ReLU -> Linear(64 -> 10) on 1x28x28, batch 32,
      cross-entropy, backward, Adam;
against PyTorch eager with ``torch.set_num_threads(1)`` and with the default thread count, and
prints the ratios (torch time / fedarena time; > 1 means fedarena is faster).  fedarena runs with
one BLAS thread in every column by default (the engine's setting for RL/FL workers; on this
benchmark a second BLAS thread does not help it); ``--blas-threads N`` sets another count, and
``--blas-threads match`` gives it the torch column's count (numpy's BLAS threads through
``engine.set_num_threads``).
Also reports the trace + compile time of the PPO step and checks that both sides compute the same
loss.

With ``--large``: the larger models where PyTorch's kernels matter more than per-op overhead,
each framework timed in its own fresh process (in one process the order of the two swings the
result through malloc's adaptive thresholds), the processes interleaved, at 1 and 2 threads
(engine: BLAS threads and the engine's kernel pool via ``engine.set_num_threads``; torch:
``torch.set_num_threads``):
  (d) MLP 784 -> 512 -> 512 -> 10 (ReLU), batch 128, cross-entropy, backward, Adam: time per step;
      fedarena's step donates its parameters and Adam state (``engine.jit(step, donate_argnums=(0, 1))``),
      so the update writes them in place, as PyTorch's optimizer does;
  (e) a digits CNN, conv3x3(1->16, pad 1) -> ReLU -> maxpool2 -> conv3x3(16->32, pad 1) -> ReLU ->
      maxpool2 -> Linear(128 -> 10) on scikit-learn's 8x8 digits, batch 64, Adam: time per epoch
      (28 steps over the 1797 images).

Run:  python benchmarks/engine_vs_torch.py [--quick] [--blas-threads N|match]
      python benchmarks/engine_vs_torch.py --large [--rounds 5] [--clock cpu]  (cpu: one thread only)
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fedarena import engine
from fedarena.engine import nn, ops, optim


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
SETTLE_S = 0.3  # pause before a multi-threaded measurement (see main's settle)


def time_per_call(fn, reps: int, clock) -> float:
    t0 = clock()
    for _ in range(reps):
        fn()
    return (clock() - t0) / reps


# ----------------------------------------------------------------------------- PPO (ours)

OBS, HID, ACT, BATCH = 8, 64, 4, 64
CLIP, VF_COEF, ENT_COEF, LR = 0.2, 0.5, 0.01, 3e-4

body = nn.MLP([OBS, HID, HID], activation="tanh", output_activation="tanh")
pi_head = nn.Linear(HID, ACT)
v_head = nn.Linear(HID, 1)


def ppo_init(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"body": body.init(rng), "pi": pi_head.init(rng), "v": v_head.init(rng)}


def ppo_loss(params, obs, act, adv, logp_old, ret):
    h = body.apply(params["body"], obs)
    logits = pi_head.apply(params["pi"], h)
    value = v_head.apply(params["v"], h)[:, 0]
    logp_all = ops.log_softmax(logits)
    logp = ops.take_along_axis(logp_all, act[:, None], axis=1)[:, 0]
    ratio = ops.exp(logp - logp_old)
    pg_loss = -ops.mean(ops.minimum(ratio * adv, ops.clip(ratio, 1 - CLIP, 1 + CLIP) * adv))
    v_loss = 0.5 * ops.mean((value - ret) ** 2)
    entropy = -ops.mean(ops.sum(ops.exp(logp_all) * logp_all, axis=1))
    return pg_loss + VF_COEF * v_loss - ENT_COEF * entropy


ppo_opt = optim.adam(LR)


def ppo_step(params, opt_state, obs, act, adv, logp_old, ret):
    loss, grads = engine.value_and_grad(ppo_loss)(params, obs, act, adv, logp_old, ret)
    params, opt_state = ppo_opt.update(grads, opt_state, params)
    return params, opt_state, loss


def actor_forward(params, obs):
    h = body.apply(params["body"], obs)
    return ops.softmax(pi_head.apply(params["pi"], h)), v_head.apply(params["v"], h)


# ----------------------------------------------------------------------------- PPO (torch)


def torch_ppo(torch, params):
    tnn = torch.nn

    class Net(tnn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = tnn.Linear(OBS, HID), tnn.Linear(HID, HID)
            self.pi, self.v = tnn.Linear(HID, ACT), tnn.Linear(HID, 1)

        def forward(self, x):
            h = torch.tanh(self.l2(torch.tanh(self.l1(x))))
            return self.pi(h), self.v(h)

    net = Net()
    with torch.no_grad():
        for lin, p in ((net.l1, params["body"][0]), (net.l2, params["body"][1]), (net.pi, params["pi"]), (net.v, params["v"])):
            lin.weight.copy_(torch.tensor(p["w"].T))
            lin.bias.copy_(torch.tensor(p["b"]))
    opt = torch.optim.Adam(net.parameters(), lr=LR)

    def step(obs, act, adv, logp_old, ret):
        logits, value = net(obs)
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(1, act[:, None])[:, 0]
        ratio = torch.exp(logp - logp_old)
        pg = -torch.min(ratio * adv, torch.clamp(ratio, 1 - CLIP, 1 + CLIP) * adv).mean()
        vl = 0.5 * ((value[:, 0] - ret) ** 2).mean()
        ent = -(logp_all.exp() * logp_all).sum(1).mean()
        loss = pg + VF_COEF * vl - ENT_COEF * ent
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    def forward(obs):
        with torch.no_grad():
            logits, value = net(obs)
            return torch.softmax(logits, -1), value

    return step, forward


# ----------------------------------------------------------------------------- CNN

CNN_BATCH = 32
cnn = nn.Sequential([
    nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
    nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
    nn.Flatten(), nn.Linear(16 * 14 * 14, 64), nn.ReLU(), nn.Linear(64, 10),
])
cnn_opt = optim.adam(1e-3)


def cnn_step(params, opt_state, x, y):
    loss, grads = engine.value_and_grad(lambda p: ops.cross_entropy(cnn.apply(p, x), y))(params)
    params, opt_state = cnn_opt.update(grads, opt_state, params)
    return params, opt_state, loss


def torch_cnn(torch, params):
    tnn = torch.nn
    net = tnn.Sequential(
        tnn.Conv2d(1, 8, 3, padding=1), tnn.ReLU(), tnn.Conv2d(8, 16, 3, stride=2, padding=1), tnn.ReLU(),
        tnn.Flatten(), tnn.Linear(16 * 14 * 14, 64), tnn.ReLU(), tnn.Linear(64, 10),
    )
    with torch.no_grad():
        for i in (0, 2):
            net[i].weight.copy_(torch.tensor(params[i]["w"]))
            net[i].bias.copy_(torch.tensor(params[i]["b"]))
        for i in (5, 7):
            net[i].weight.copy_(torch.tensor(params[i]["w"].T))
            net[i].bias.copy_(torch.tensor(params[i]["b"]))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step(x, y):
        loss = tnn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


# ----------------------------------------------------------------------------- larger models (--large)

MLP_SIZES, MLP_BATCH = [784, 512, 512, 10], 128
DIGITS_BATCH = 64
digits_cnn = nn.Sequential([
    nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 2 * 2, 10),
])
large_mlp = nn.MLP(MLP_SIZES, activation="relu")


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    return x, d.target.astype(np.int64)


def _large_worker(model: str, framework: str, threads: int, reps: int, clock: str = "wall") -> float:
    """Median seconds per MLP step / per digits epoch of one framework in this (fresh) process
    (``clock="cpu"``: this thread's CPU time, for one thread on a loaded machine)."""
    rng = np.random.default_rng(0)
    if model == "mlp":
        x = rng.standard_normal((MLP_BATCH, MLP_SIZES[0])).astype(np.float32)
        y = rng.integers(0, 10, MLP_BATCH)
        batches = [(x, y)]
        module = large_mlp
    else:
        xs, ys = _digits()
        n = len(xs) // DIGITS_BATCH
        batches = [(xs[i * DIGITS_BATCH : (i + 1) * DIGITS_BATCH], ys[i * DIGITS_BATCH : (i + 1) * DIGITS_BATCH]) for i in range(n)]
        module = digits_cnn
    params = module.init(0)
    if framework == "ours":
        engine.set_num_threads(threads)
        opt = optim.adam(1e-3)

        def step(p, s, x, y):
            loss, g = engine.value_and_grad(lambda p: ops.cross_entropy(module.apply(p, x), y))(p)
            p, s = opt.update(g, s, p)
            return p, s, loss

        # the parameters and Adam state are donated (JAX's donate_argnums): the update writes them in
        # place, as torch.optim.Adam does
        j = engine.jit(step, donate_argnums=(0, 1))
        st = {"p": params, "s": opt.init(params)}

        def run():
            for x, y in batches:
                st["p"], st["s"], _ = j(st["p"], st["s"], x, y)
    else:
        import torch

        torch.set_num_threads(threads)
        tnn = torch.nn
        if model == "mlp":
            layers = []
            for i in range(len(MLP_SIZES) - 1):
                layers += [tnn.Linear(MLP_SIZES[i], MLP_SIZES[i + 1]), tnn.ReLU()]
            net = tnn.Sequential(*layers[:-1])
            lin = [m for m in net if isinstance(m, tnn.Linear)]
            with torch.no_grad():
                for m, p in zip(lin, params):
                    m.weight.copy_(torch.tensor(p["w"].T))
                    m.bias.copy_(torch.tensor(p["b"]))
        else:
            net = tnn.Sequential(
                tnn.Conv2d(1, 16, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2),
                tnn.Conv2d(16, 32, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2), tnn.Flatten(), tnn.Linear(128, 10),
            )
            with torch.no_grad():
                for i, k in ((0, 0), (3, 3)):
                    net[i].weight.copy_(torch.tensor(params[k]["w"]))
                    net[i].bias.copy_(torch.tensor(params[k]["b"]))
                net[7].weight.copy_(torch.tensor(params[7]["w"].T))
                net[7].bias.copy_(torch.tensor(params[7]["b"]))
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        tb = [(torch.tensor(x), torch.tensor(y)) for x, y in batches]

        def run():
            for x, y in tb:
                loss = tnn.functional.cross_entropy(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()

    for _ in range(3):
        run()
    tick = CLOCKS[clock]
    times = []
    for _ in range(reps):
        t0 = tick()
        run()
        times.append(tick() - t0)
    return statistics.median(times)


def large_main(rounds: int, reps: int, clock: str = "wall") -> None:
    import json
    import subprocess
    import sys

    results: dict = {}
    load_before = _load()
    thread_counts = (1,) if clock == "cpu" else (1, 2)
    for r in range(rounds):
        for model in ("mlp", "cnn"):
            for threads in thread_counts:
                order = ("ours", "torch") if r % 2 == 0 else ("torch", "ours")
                for fw in order:
                    out = subprocess.run(
                        [sys.executable, __file__, "--worker", model, fw, str(threads), str(reps), "--clock", clock],
                        capture_output=True, text=True, check=True,
                    )
                    results.setdefault((model, threads, fw), []).append(json.loads(out.stdout.strip().splitlines()[-1])["s"])
    print(f"fedarena.engine (numpy {np.__version__}) vs PyTorch eager, each in a fresh process, {rounds} interleaved rounds, "
          f"{'CPU time of the calling thread' if clock == 'cpu' else 'wall time'}; load average before: {load_before}")
    print(f"{'':34s}{'threads':>8s}{'ours':>12s}{'torch':>12s}{'ratio (median)':>16s}{'ratio range':>18s}")
    names = {"mlp": "(d) MLP 784-512-512-10 B=128 step", "cnn": "(e) digits CNN B=64 epoch"}
    for model in ("mlp", "cnn"):
        for threads in thread_counts:
            ours, theirs = results[(model, threads, "ours")], results[(model, threads, "torch")]
            ratios = [t / o for o, t in zip(ours, theirs)]
            print(
                f"{names[model]:34s}{threads:8d}{statistics.median(ours) * 1e3:10.2f}ms{statistics.median(theirs) * 1e3:10.2f}ms"
                f"{statistics.median(ratios):15.2f}x{min(ratios):8.2f}x-{max(ratios):.2f}x   target >= 1x"
            )
    print("ratio = torch time / fedarena time per round (> 1: fedarena is faster); load average after:", _load())


def _load() -> str:
    import os

    try:
        return " ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "n/a"


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved measurement rounds (median is reported)")
    ap.add_argument(
        "--clock", choices=sorted(CLOCKS), default="wall",
        help="wall: perf_counter; cpu: this thread's CPU time (robust on a shared, loaded machine; "
        "only meaningful for single-threaded runs, so torch's default-thread column is skipped)",
    )
    ap.add_argument(
        "--blas-threads", default="1",
        help="numpy BLAS threads for fedarena in every column (engine.set_num_threads), or 'match': the "
        "same number as the torch column it is compared with",
    )
    ap.add_argument("--large", action="store_true", help="the MLP 784-512-512-10 and digits CNN, fresh processes, 1 and 2 threads")
    ap.add_argument("--worker", nargs=4, metavar=("MODEL", "FRAMEWORK", "THREADS", "REPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        import json

        model, fw, th, reps = args.worker
        print(json.dumps({"s": _large_worker(model, fw, int(th), int(reps), args.clock)}))
        return
    if args.large:
        large_main(args.rounds if args.rounds != 7 else 3, 3 if args.quick else 10, args.clock)
        return
    if args.blas_threads != "match":
        if not args.blas_threads.isdigit() or int(args.blas_threads) < 1:
            ap.error(f"--blas-threads: expected a positive integer or 'match', got {args.blas_threads!r}")
        args.blas_threads = int(args.blas_threads)
    import torch

    clock = CLOCKS[args.clock]
    scale = 0.25 if args.quick else 1.0
    engine.set_num_threads(1 if args.blas_threads == "match" else args.blas_threads)  # 1: the engine's setting for small networks (one per worker)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((BATCH, OBS)).astype(np.float32)
    act = rng.integers(0, ACT, BATCH)
    adv = rng.standard_normal(BATCH).astype(np.float32)
    logp_old = (np.log(1 / ACT) + 0.1 * rng.standard_normal(BATCH)).astype(np.float32)
    ret = rng.standard_normal(BATCH).astype(np.float32)
    batch = (obs, act, adv, logp_old, ret)
    params0 = ppo_init(0)

    # trace + compile time of the PPO step (a fresh jit object; graph() traces and compiles only)
    compile_times = []
    for _ in range(3):
        t0 = time.perf_counter()
        j_ppo = engine.jit(ppo_step)
        graph = j_ppo.graph(params0, ppo_opt.init(params0), *batch)
        compile_times.append(time.perf_counter() - t0)
    compile_s = min(compile_times)
    n_eqns = len(graph.eqns)

    state = {"p": params0, "s": ppo_opt.init(params0)}

    def ours_ppo():
        state["p"], state["s"], _ = j_ppo(state["p"], state["s"], *batch)

    _, _, our_loss = j_ppo(params0, ppo_opt.init(params0), *batch)
    j_fwd = engine.jit(actor_forward)
    obs1 = obs[:1].copy()

    def ours_fwd():
        j_fwd(state["p"], obs1)

    cnn_params = cnn.init(0)
    cnn_state = {"p": cnn_params, "s": cnn_opt.init(cnn_params)}
    x = rng.standard_normal((CNN_BATCH, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, CNN_BATCH)
    j_cnn = engine.jit(cnn_step)
    _, _, our_cnn_loss = j_cnn(cnn_params, cnn_opt.init(cnn_params), x, y)

    def ours_cnn():
        cnn_state["p"], cnn_state["s"], _ = j_cnn(cnn_state["p"], cnn_state["s"], x, y)

    default_threads = torch.get_num_threads()
    thread_settings = [1] if args.clock == "cpu" else sorted({1, default_threads})
    tb = [torch.tensor(a) for a in batch]
    tobs1 = torch.tensor(obs1)
    tx, ty = torch.tensor(x), torch.tensor(y)
    t_loss = float(torch_ppo(torch, params0)[0](*tb).detach())
    t_cnn_loss = float(torch_cnn(torch, cnn_params)(tx, ty).detach())
    t_fns = {}
    for th in thread_settings:
        torch.set_num_threads(th)
        t_step, t_fwd = torch_ppo(torch, params0)
        t_cnn = torch_cnn(torch, cnn_params)
        t_fns[th] = {"ppo": lambda f=t_step: f(*tb), "fwd": lambda f=t_fwd: f(tobs1), "cnn": lambda f=t_cnn: f(tx, ty)}
    reps = {"ppo": max(1, int(200 * scale)), "fwd": max(1, int(2000 * scale)), "cnn": max(1, int(10 * scale))}
    ours_fns = {"ppo": ours_ppo, "fwd": ours_fwd, "cnn": ours_cnn}

    def ours_threads(th: int) -> int:
        return th if args.blas_threads == "match" else args.blas_threads

    # warm up everything, then interleave: each round times ours and torch back to back with the
    # same thread count, so load changes on a shared machine hit both sides alike; the median over
    # rounds is reported.
    for k in ours_fns:
        for th in thread_settings:
            engine.set_num_threads(ours_threads(th))
            torch.set_num_threads(th)
            for _ in range(3):
                ours_fns[k]()
                t_fns[th][k]()
    samples: dict = {}
    for th in thread_settings:
        for k in ours_fns:
            samples[("ours", th, k)] = []
            samples[(th, k)] = []
    last = {"threads": 1}

    def settle(threads: int) -> None:
        """Before a multi-threaded measurement, or after one: let idle worker threads stop
        spinning first (OpenBLAS and OpenMP workers busy-wait for a while after a parallel call,
        and a spinning thread takes a core the next measurement needs)."""
        if threads > 1 or last["threads"] > 1:
            time.sleep(SETTLE_S)
        last["threads"] = threads

    for _ in range(args.rounds):
        for k in ours_fns:
            for th in thread_settings:
                engine.set_num_threads(ours_threads(th))
                torch.set_num_threads(th)
                settle(ours_threads(th))
                samples[("ours", th, k)].append(time_per_call(ours_fns[k], reps[k], clock))
                settle(th)
                samples[(th, k)].append(time_per_call(t_fns[th][k], reps[k], clock))
    torch.set_num_threads(default_threads)
    engine.set_num_threads(None)
    med = {key: statistics.median(v) for key, v in samples.items()}

    ours_desc = "BLAS threads = the torch column's threads" if args.blas_threads == "match" else f"{args.blas_threads} BLAS thread(s) in every column"
    print(f"fedarena.engine (numpy {np.__version__}, {ours_desc}) vs PyTorch {torch.__version__} eager, CPU")
    print(f"clock: {args.clock}; median over {args.rounds} interleaved rounds of the mean time per call")
    print(f"PPO step graph: {n_eqns} equations; trace+compile {compile_s * 1e3:.1f} ms (target < 500 ms)")
    print(f"same loss: PPO {float(our_loss):.6f} vs torch {t_loss:.6f}; CNN {float(our_cnn_loss):.6f} vs torch {t_cnn_loss:.6f}")
    names = {"ppo": "(a) PPO train step  B=64", "fwd": "(b) actor forward   B=1 ", "cnn": "(c) CNN train step  B=32"}
    targets = {"ppo": 5.0, "fwd": 4.0, "cnn": 1.0}
    header = f"{'':26s}" + "".join(f"{f'ours {ours_threads(t)}thr':>12s}{f'torch {t}thr':>12s}{'ratio':>8s}" for t in thread_settings)
    print(header)
    for k in ("ppo", "fwd", "cnn"):
        row = f"{names[k]:26s}"
        for th in thread_settings:
            ours = med[("ours", th, k)]
            row += f"{ours * 1e6:10.1f}us{med[(th, k)] * 1e6:10.1f}us{med[(th, k)] / ours:7.2f}x"
        row += f"   target >= {targets[k]:.0f}x"
        print(row)
    print("ratio = torch time / fedarena time (> 1: fedarena is faster)")


if __name__ == "__main__":
    main()
