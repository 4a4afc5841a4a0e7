"""GPU measurements of the cupy backend, each against the alternative in the same run, written
as JSON to a results folder (run by benchmarks/gpu_check.sh on a machine with a CUDA device):

  gemm   the hand-tiled SGEMM variants vs cuBLAS (cupy.matmul) at 1024-8192: TFLOPS and ratio
         (target: best variant >= 0.7x cuBLAS at 4096);
  fused  a 10-operation elementwise chain at 1M elements: one generated kernel vs the same chain
         as separate cupy calls (target >= 2x);
  ppo    the PPO training step (MLP 8-64-64-{4,1}, Adam) at batch 4096: engine.jit(backend="cupy")
         vs PyTorch CUDA eager (target: faster);
  cnn    the CNN step of benchmarks/engine_vs_torch.py on the GPU vs PyTorch CUDA eager;
  fl     64 federated clients' local steps as one vmapped program on the GPU vs the numpy backend.

``--cpu-dry-run`` runs every part at toy sizes on the CPU (kernels through the CUDA emulation,
numpy for cupy, torch on the CPU) to check the plumbing; its timings mean nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fedarena import engine  # noqa: E402
from fedarena.engine import nn, ops, optim  # noqa: E402
from fedarena.engine.backends import cupy as cb  # noqa: E402
from fedarena.engine.backends.cupy import gemm  # noqa: E402


class Env:
    """What a part runs on: the device, its array module, how to wait for it, torch's device."""

    def __init__(self, dry: bool):
        self.dry = dry
        if dry:
            self.device = cb.EmulatedDevice()
            self.xp = np
            self.torch_device = "cpu"
        else:
            self.device = cb.CupyDevice()
            self.xp = self.device.xp
            self.torch_device = "cuda"

    def sync(self) -> None:
        self.device.synchronize()

    def jit(self, fn):
        return cb.jit(fn, device=self.device)

    def time(self, fn, reps: int, warmup: int = 2) -> float:
        """Median seconds per call over ``reps`` calls (device synchronised around each)."""
        for _ in range(warmup):
            fn()
        self.sync()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            self.sync()
            ts.append(time.perf_counter() - t)
        return float(np.median(ts))


def _torch(env: Env):
    import torch

    sync = (lambda: torch.cuda.synchronize()) if env.torch_device == "cuda" else (lambda: None)
    return torch, sync


def part_gemm(env: Env) -> dict:
    xp = env.xp
    sizes = [64, 128] if env.dry else [1024, 2048, 4096, 8192]
    mod = env.device.load(gemm.source())
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        a = xp.asarray(rng.standard_normal((n, n)).astype(np.float32))
        b = xp.asarray(rng.standard_normal((n, n)).astype(np.float32))
        ref = xp.matmul(a, b)
        flops = 2.0 * n**3
        reps = 1 if env.dry else (3 if n >= 8192 else 10)
        t_blas = env.time(lambda: xp.matmul(a, b), reps)
        row = {"n": n, "cublas_tflops": flops / t_blas / 1e12, "variants": {}}
        for v in gemm.VARIANTS:
            out = xp.empty((n, n), np.float32)
            if v == "naive" and n >= 8192 and not env.dry:
                r = 1
            else:
                r = reps
            t = env.time(lambda: gemm.sgemm(mod, v, a, b, out), r, warmup=1)
            err = float(xp.max(xp.abs(out - ref)) / xp.max(xp.abs(ref)))
            row["variants"][v] = {"tflops": flops / t / 1e12, "vs_cublas": t_blas / t, "max_rel_err": err}
        rows.append(row)
        best = max(row["variants"].items(), key=lambda kv: kv[1]["tflops"])
        print(f"gemm n={n}: cuBLAS {row['cublas_tflops']:.2f} TFLOPS; " + ", ".join(f"{k} {d['tflops']:.2f} ({d['vs_cublas']:.2f}x)" for k, d in row["variants"].items()) + f"; best {best[0]}")
    at = next((r for r in rows if r["n"] == (4096 if not env.dry else sizes[-1])), rows[-1])
    best = max(d["vs_cublas"] for d in at["variants"].values())
    return {"rows": rows, "best_vs_cublas_at_4096": best, "target": 0.7, "met": best >= 0.7}


def chain(x, y):
    """Ten elementwise operations (mul, add, tanh, mul, sub, abs, neg, exp, add, maximum)."""
    v = x * 1.5 + y
    v = ops.tanh(v) * 0.5 - y
    v = ops.exp(-ops.abs(v)) + 0.25
    return ops.maximum(v, x)


def chain_separate(xp, x, y):
    v = x * 1.5
    v = v + y
    v = xp.tanh(v)
    v = v * 0.5
    v = v - y
    v = xp.abs(v)
    v = -v
    v = xp.exp(v)
    v = v + 0.25
    return xp.maximum(v, x)


def part_fused(env: Env) -> dict:
    xp = env.xp
    n = 4096 if env.dry else 1 << 20
    rng = np.random.default_rng(0)
    x = xp.asarray(rng.standard_normal(n).astype(np.float32))
    y = xp.asarray(rng.standard_normal(n).astype(np.float32))
    j = env.jit(chain)
    exe = j.entry(x, y)[0]
    got = j(x, y)
    sep = chain_separate(xp, x, y)
    err = float(xp.max(xp.abs(got - sep)))
    reps = 3 if env.dry else 200
    t_sep = env.time(lambda: chain_separate(xp, x, y), reps)
    t_jit = env.time(lambda: j(x, y), reps)
    t_exe = env.time(lambda: exe(x, y), reps)
    out = {"n": n, "kernels": len(exe.kernels), "separate_us": t_sep * 1e6, "jit_call_us": t_jit * 1e6, "executable_us": t_exe * 1e6,
           "speedup_jit": t_sep / t_jit, "speedup_executable": t_sep / t_exe, "max_abs_diff": err, "target": 2.0}
    out["met"] = out["speedup_jit"] >= 2.0
    print(f"fused 10-op chain, {n} elements: {out['kernels']} kernel(s); separate cupy calls {out['separate_us']:.1f} us, "
          f"jit call {out['jit_call_us']:.1f} us ({out['speedup_jit']:.2f}x), executable alone {out['executable_us']:.1f} us ({out['speedup_executable']:.2f}x)")
    return out


def _tree_to(xp, tree):
    return engine.tree_map(xp.asarray, tree)


def part_ppo(env: Env) -> dict:
    import engine_vs_torch as B

    xp = env.xp
    torch, tsync = _torch(env)
    n = 256 if env.dry else 4096
    rng = np.random.default_rng(0)
    batch = (rng.standard_normal((n, B.OBS)).astype(np.float32), rng.integers(0, B.ACT, n), rng.standard_normal(n).astype(np.float32),
             (rng.standard_normal(n) * 0.1 - 1.4).astype(np.float32), rng.standard_normal(n).astype(np.float32))
    p0 = B.ppo_init(0)
    j = env.jit(B.ppo_step)
    exe = j.entry(p0, B.ppo_opt.init(p0), *batch)[0]
    dbatch = [xp.asarray(b) for b in batch]
    state = {"p": _tree_to(xp, p0), "s": _tree_to(xp, B.ppo_opt.init(p0))}
    _, _, loss = j(state["p"], state["s"], *dbatch)
    ref_loss = float(engine.jit(B.ppo_step)(p0, B.ppo_opt.init(p0), *batch)[2])

    def ours():
        state["p"], state["s"], _ = j(state["p"], state["s"], *dbatch)

    tstep, _ = B.torch_ppo(torch, p0)
    dev = env.torch_device
    tb = [torch.tensor(b).to(dev) for b in batch]
    net_params = None  # torch_ppo builds its net on the CPU: move it
    for obj in tstep.__closure__ or ():
        c = obj.cell_contents
        if isinstance(c, torch.nn.Module):
            net_params = c
    if net_params is not None:
        net_params.to(dev)
    tloss = float(tstep(*tb).detach().cpu())
    reps = 3 if env.dry else 100

    def theirs():
        tstep(*tb)

    t_ours = env.time(ours, reps)
    for _ in range(2):
        theirs()
    tsync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        theirs()
        tsync()
        ts.append(time.perf_counter() - t)
    t_torch = float(np.median(ts))
    out = {"batch": n, "kernels": len(exe.kernels), "host_steps": exe.host_steps, "ours_us": t_ours * 1e6, "torch_eager_us": t_torch * 1e6,
           "speedup": t_torch / t_ours, "loss_ours": float(np.asarray(env.device.to_host(loss))), "loss_numpy_backend": ref_loss, "loss_torch_first_step": tloss}
    out["met"] = out["speedup"] > 1.0
    print(f"PPO step, batch {n}: ours {out['ours_us']:.0f} us ({len(exe.kernels)} kernels, host steps {exe.host_steps}), torch eager {out['torch_eager_us']:.0f} us -> {out['speedup']:.2f}x")
    return out


def part_cnn(env: Env) -> dict:
    import engine_vs_torch as B

    xp = env.xp
    torch, tsync = _torch(env)
    n = 4 if env.dry else 256
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, n)
    p0 = B.cnn.init(0)
    j = env.jit(B.cnn_step)
    exe = j.entry(p0, B.cnn_opt.init(p0), x, y)[0]
    state = {"p": _tree_to(xp, p0), "s": _tree_to(xp, B.cnn_opt.init(p0))}
    dx, dy = xp.asarray(x), xp.asarray(y)
    _, _, loss = j(state["p"], state["s"], dx, dy)
    ref_loss = float(engine.jit(B.cnn_step)(p0, B.cnn_opt.init(p0), x, y)[2])

    def ours():
        state["p"], state["s"], _ = j(state["p"], state["s"], dx, dy)

    tstep = B.torch_cnn(torch, p0)
    for obj in tstep.__closure__ or ():
        c = obj.cell_contents
        if isinstance(c, torch.nn.Module):
            c.to(env.torch_device)
    tx, ty = torch.tensor(x).to(env.torch_device), torch.tensor(y).to(env.torch_device)
    reps = 2 if env.dry else 30
    t_ours = env.time(ours, reps)
    for _ in range(2):
        tstep(tx, ty)
    tsync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        tstep(tx, ty)
        tsync()
        ts.append(time.perf_counter() - t)
    t_torch = float(np.median(ts))
    out = {"batch": n, "host_steps": exe.host_steps, "ours_ms": t_ours * 1e3, "torch_eager_ms": t_torch * 1e3, "speedup": t_torch / t_ours,
           "loss_ours": float(np.asarray(env.device.to_host(loss))), "loss_numpy_backend": ref_loss}
    print(f"CNN step, batch {n}: ours {out['ours_ms']:.2f} ms (host steps {exe.host_steps}), torch eager {out['torch_eager_ms']:.2f} ms -> {out['speedup']:.2f}x")
    return out


def part_fl(env: Env) -> dict:
    xp = env.xp
    clients = 8 if env.dry else 64
    per, dim = 32, 20
    mlp = nn.MLP([dim, 64, 10], activation="relu")
    opt = optim.sgd(0.1)

    def local_step(params, state, x, y):
        loss, grads = engine.value_and_grad(lambda p: ops.cross_entropy(mlp.apply(p, x), y))(params)
        params, state = opt.update(grads, state, params)
        return params, state, loss

    rng = np.random.default_rng(0)
    ps = [mlp.init(i) for i in range(clients)]
    stacked = engine.tree_map(lambda *a: np.stack(a), *ps)
    st = engine.tree_map(lambda *a: np.stack(a), *[opt.init(p) for p in ps])
    X = rng.standard_normal((clients, per, dim)).astype(np.float32)
    Y = rng.integers(0, 10, (clients, per))
    step = engine.vmap(local_step)
    j_np = engine.jit(step)
    j_gpu = env.jit(step)
    exe = j_gpu.entry(stacked, st, X, Y)[0]
    ref = j_np(stacked, st, X, Y)
    got = j_gpu(_tree_to(xp, stacked), _tree_to(xp, st), xp.asarray(X), xp.asarray(Y))
    err = max(float(np.max(np.abs(np.asarray(env.device.to_host(a)) - b))) for a, b in zip(engine.tree_leaves(got), engine.tree_leaves(ref)))
    dp, ds, dX, dY = _tree_to(xp, stacked), _tree_to(xp, st), xp.asarray(X), xp.asarray(Y)
    reps = 2 if env.dry else 50
    t_gpu = env.time(lambda: j_gpu(dp, ds, dX, dY), reps)
    t0 = time.perf_counter()
    for _ in range(reps):
        j_np(stacked, st, X, Y)
    t_np = (time.perf_counter() - t0) / reps
    out = {"clients": clients, "host_steps": exe.host_steps, "gpu_ms": t_gpu * 1e3, "numpy_backend_ms": t_np * 1e3, "speedup": t_np / t_gpu, "max_abs_diff": err}
    print(f"FL: {clients} vmapped clients' local step: GPU {out['gpu_ms']:.2f} ms (host steps {exe.host_steps}), numpy backend {out['numpy_backend_ms']:.2f} ms -> {out['speedup']:.2f}x; max diff {err:.2g}")
    return out


def summarize(out: Path) -> str:
    """One line per part of the results folder, with the issue's targets."""
    lines = []
    for name in PARTS:
        f = out / f"{name}.json"
        if not f.exists():
            lines.append(f"{name}: not run")
            continue
        r = json.loads(f.read_text())
        if r.get("status") != "ok":
            lines.append(f"{name}: ERROR {r.get('error')}")
            continue
        dry = bool(r.get("dry_run"))
        tag = " (CPU dry run: timings meaningless, no verdict)" if dry else ""

        def verdict(ok: bool) -> str:
            return "n/a" if dry else ("met" if ok else "NOT met")
        if name == "gemm":
            at = r["rows"][-2] if len(r["rows"]) > 2 else r["rows"][-1]
            lines.append(f"gemm: best tiled variant {r['best_vs_cublas_at_4096']:.2f}x cuBLAS at n={at['n']} (target >= 0.7: {verdict(r['met'])}){tag}")
            for row in r["rows"]:
                lines.append(f"  n={row['n']}: cuBLAS {row['cublas_tflops']:.2f} TFLOPS | " + " | ".join(f"{k} {d['tflops']:.2f} ({d['vs_cublas']:.2f}x, err {d['max_rel_err']:.1e})" for k, d in row["variants"].items()))
        elif name == "fused":
            lines.append(f"fused: 10-op chain at {r['n']} elements: {r['speedup_jit']:.2f}x separate cupy calls per jit call, {r['speedup_executable']:.2f}x for the executable alone (target >= 2: {verdict(r['met'])}){tag}")
        elif name == "ppo":
            lines.append(f"ppo: batch {r['batch']}: ours {r['ours_us']:.0f} us vs torch CUDA eager {r['torch_eager_us']:.0f} us = {r['speedup']:.2f}x (target > 1: {verdict(r['met'])}); host steps {r['host_steps']}{tag}")
        elif name == "cnn":
            lines.append(f"cnn: batch {r['batch']}: ours {r['ours_ms']:.2f} ms vs torch CUDA eager {r['torch_eager_ms']:.2f} ms = {r['speedup']:.2f}x; host steps {r['host_steps']}{tag}")
        elif name == "fl":
            lines.append(f"fl: {r['clients']} vmapped clients: GPU {r['gpu_ms']:.2f} ms vs numpy backend {r['numpy_backend_ms']:.2f} ms = {r['speedup']:.2f}x; max diff {r['max_abs_diff']:.2g}; host steps {r['host_steps']}{tag}")
    return "\n".join(lines)


PARTS = {"gemm": part_gemm, "fused": part_fused, "ppo": part_ppo, "cnn": part_cnn, "fl": part_fl}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=sorted(PARTS) + ["all", "summary"])
    ap.add_argument("--out", default="gpu_results", help="folder for <part>.json")
    ap.add_argument("--cpu-dry-run", action="store_true", help="toy sizes on the CPU (CUDA emulation): checks the plumbing only")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.part == "summary":
        text = summarize(out)
        (out / "summary.txt").write_text(text + "\n")
        print(text)
        return 0
    env = Env(args.cpu_dry_run)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in PARTS if args.part == "all" else [args.part]:
        t = time.perf_counter()
        try:
            res = PARTS[name](env)
            res["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - record the failure, go on with the next part
            failed += 1
            res = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            print(f"{name}: FAILED {res['error']}", file=sys.stderr)
        res["seconds"] = time.perf_counter() - t
        res["dry_run"] = args.cpu_dry_run
        res["device"] = env.device.name
        (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
