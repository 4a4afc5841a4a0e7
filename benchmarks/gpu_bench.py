"""GPU checks and measurements of the cupy backend, each against an oracle or the alternative in
the same run, written as JSON to a results folder (run by benchmarks/gpu_check.sh on a machine
with a CUDA device):

  smoke  the go/no-go check, run first: a CUDA device is visible (``gpu_unavailable_reason()`` is
         None); one fused elementwise kernel, a row and a column reduction equal numpy (float64);
         the PPO step equals the numpy backend to 1e-5 with no host step; the SGEMM variants equal
         a float64 product and are timed against cuBLAS at 4096.  Any failed check fails the part;
  gemm   the hand-tiled SGEMM variants vs cuBLAS (cupy.matmul) at 1024-8192: TFLOPS and ratio
         (target: best variant >= 0.7x cuBLAS at 4096);
  fused  a 10-operation elementwise chain at 1M elements: one generated kernel vs the same chain
         as separate cupy calls (target >= 2x);
  ppo    the PPO training step (MLP 8-64-64-{4,1}, Adam) at batch 4096: engine.jit(backend="cupy")
         vs PyTorch CUDA eager (target: faster);
  cnn    the CNN step of benchmarks/engine_vs_torch.py on the GPU vs PyTorch CUDA eager;
  fl     64 federated clients' local steps as one vmapped program on the GPU vs the numpy backend.

Two more commands read what the parts and gpu_check.sh left in the folder: ``tests-report``
(pytest's JUnit XML of the ``-m gpu`` tests: counts, skip reasons, and a failure when a test
failed, none ran, or, on a device, any was skipped) and ``summary`` (summary.txt: one line per
step against the issue's targets; targets_missed.txt names the parts whose target was missed).

``--cpu-dry-run`` runs every part at toy sizes on the CPU (kernels through the CUDA emulation,
numpy for cupy, torch on the CPU where it is installed) to check the plumbing; its timings mean
nothing and no target is judged.  ``GPU_CHECK_FAIL=smoke`` corrupts one value the smoke check
compares, so that the check must fail (gpu_check.sh's planted failure).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

# fedarena is imported by _import_engine() when a part runs: `tests-report` and `summary` read JSON
# only, and importing the engine costs seconds on a loaded machine
engine = nn = ops = optim = cb = gemm = None


def _import_engine() -> None:
    global engine, nn, ops, optim, cb, gemm
    from fedarena import engine
    from fedarena.engine import nn, ops, optim
    from fedarena.engine.backends import cupy as cb
    from fedarena.engine.backends.cupy import gemm


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

    def host(self, x) -> np.ndarray:
        return np.asarray(self.device.to_host(x))

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
    """``(torch, sync)``, or ``(None, reason)`` in a dry run without torch (a device run needs it:
    the ppo and cnn targets are against PyTorch)."""
    try:
        import torch
    except ImportError as exc:
        if not env.dry:
            raise
        return None, f"torch not importable ({exc})"
    sync = (lambda: torch.cuda.synchronize()) if env.torch_device == "cuda" else (lambda: None)
    return torch, sync


def _device_info(env: Env) -> str:
    if env.dry:
        return f"emulated device (CPU dry run; gpu_unavailable_reason(): {cb.gpu_unavailable_reason()})"
    cupy = env.xp
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return (f"{name}, {props['multiProcessorCount']} SMs, cupy {cupy.__version__}, CUDA runtime "
            f"{cupy.cuda.runtime.runtimeGetVersion()}, driver {cupy.cuda.runtime.driverGetVersion()}")


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
            r = 1 if v == "naive" and n >= 8192 else reps
            t = env.time(lambda: gemm.sgemm(mod, v, a, b, out), r, warmup=1)
            err = float(xp.max(xp.abs(out - ref)) / xp.max(xp.abs(ref)))
            row["variants"][v] = {"tflops": flops / t / 1e12, "vs_cublas": t_blas / t, "max_rel_err": err}
        rows.append(row)
        best = max(row["variants"].items(), key=lambda kv: kv[1]["tflops"])
        print(f"gemm n={n}: cuBLAS {row['cublas_tflops']:.2f} TFLOPS; " + ", ".join(f"{k} {d['tflops']:.2f} ({d['vs_cublas']:.2f}x)" for k, d in row["variants"].items()) + f"; best {best[0]}")
    at = next((r for r in rows if r["n"] == (4096 if not env.dry else sizes[-1])), rows[-1])
    best = max(d["vs_cublas"] for d in at["variants"].values())
    low = [_low_precision_gemm(env, name, at["n"]) for name in ("bfloat16", "float16")]
    return {"rows": rows, "at_n": at["n"], "best_vs_cublas_at_4096": best, "target": 0.7, "met": best >= 0.7,
            "low_precision": low}


def _low_precision_gemm(env: Env, name: str, n: int) -> dict:
    """The compiled ``a @ b`` of ``name`` operands (the backend's cublasGemmEx with float32
    accumulation) against the library's own product of the same operands (torch's bfloat16
    matmul, cupy's float16 matmul: cuBLAS both) and a float64 reference of the rounded operands."""
    xp = env.xp
    row: dict = {"dtype": name, "n": n}
    try:
        dt = np.dtype(name) if name == "float16" else np.dtype(__import__("ml_dtypes").bfloat16)
        rng = np.random.default_rng(1)
        ha, hb = (rng.standard_normal((n, n)).astype(dt) for _ in range(2))
        a, b = xp.asarray(ha), xp.asarray(hb)  # cupy without bfloat16 support raises here
        j = env.jit(lambda p, q: p @ q)
        out = j(a, b)
        exact = ha.astype(np.float64) @ hb.astype(np.float64)
        scale = np.abs(ha.astype(np.float64)) @ np.abs(hb.astype(np.float64))
        err = np.abs(env.host(out).astype(np.float64) - exact) / scale
        row["max_err_over_AB"] = float(err.max())  # expected <= 2^-8 (bfloat16) / 2^-11 (float16) rounding
        flops, reps = 2.0 * n**3, (1 if env.dry else 20)
        row["ours_tflops"] = flops / env.time(lambda: j(a, b), reps) / 1e12
        if name == "float16":
            row["library"] = "numpy.matmul (emulated device)" if env.dry else "cupy.matmul (cuBLAS)"
            row["library_tflops"] = flops / env.time(lambda: xp.matmul(a, b), reps) / 1e12
        else:
            torch, tsync = _torch(env)
            if torch is None:
                row["library"] = tsync
            else:
                ta = torch.tensor(ha.astype(np.float32), device=env.torch_device).to(torch.bfloat16)
                tb = torch.tensor(hb.astype(np.float32), device=env.torch_device).to(torch.bfloat16)
                row["library"] = "torch.matmul bfloat16 (CPU)" if env.dry else "torch.matmul bfloat16 (cuBLAS)"
                row["library_tflops"] = flops / _time_torch(lambda: torch.matmul(ta, tb), tsync, reps) / 1e12
        if "library_tflops" in row:
            row["vs_library"] = row["ours_tflops"] / row["library_tflops"]
        print(f"gemm {name} n={n}: ours {row['ours_tflops']:.2f} TFLOPS, {row.get('library')} "
              f"{row.get('library_tflops', float('nan')):.2f} TFLOPS; max error {row['max_err_over_AB']:.1e} of |A||B|")
    except Exception as exc:  # noqa: BLE001 - recorded in the summary, the float32 target still judged
        row["error"] = f"{type(exc).__name__}: {exc}"
        print(f"gemm {name} n={n}: ERROR {row['error']}")
    return row


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


def _ppo_batch(n: int, seed: int = 0):
    import engine_vs_torch as B

    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, B.OBS)).astype(np.float32), rng.integers(0, B.ACT, n), rng.standard_normal(n).astype(np.float32),
            (rng.standard_normal(n) * 0.1 - 1.4).astype(np.float32), rng.standard_normal(n).astype(np.float32))


def _time_torch(fn, sync, reps: int) -> float:
    for _ in range(2):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def _move_closure_modules(torch, fn, device: str) -> None:
    """benchmarks/engine_vs_torch.py builds its torch nets on the CPU: move them to ``device``."""
    for cell in fn.__closure__ or ():
        if isinstance(cell.cell_contents, torch.nn.Module):
            cell.cell_contents.to(device)


def part_ppo(env: Env) -> dict:
    import engine_vs_torch as B

    xp = env.xp
    n = 256 if env.dry else 4096
    batch = _ppo_batch(n)
    p0 = B.ppo_init(0)
    j = env.jit(B.ppo_step)
    exe = j.entry(p0, B.ppo_opt.init(p0), *batch)[0]
    dbatch = [xp.asarray(b) for b in batch]
    state = {"p": _tree_to(xp, p0), "s": _tree_to(xp, B.ppo_opt.init(p0))}
    _, _, loss = j(state["p"], state["s"], *dbatch)
    ref_loss = float(engine.jit(B.ppo_step)(p0, B.ppo_opt.init(p0), *batch)[2])

    def ours():
        state["p"], state["s"], _ = j(state["p"], state["s"], *dbatch)

    reps = 3 if env.dry else 100
    t_ours = env.time(ours, reps)
    out = {"batch": n, "kernels": len(exe.kernels), "host_steps": exe.host_steps, "ours_us": t_ours * 1e6,
           "loss_ours": float(env.host(loss)), "loss_numpy_backend": ref_loss}
    out.update(_ppo_graph(env, B, p0, dbatch, reps))
    torch, tsync = _torch(env)
    if torch is None:
        out.update(torch_eager_us=None, speedup=None, met=None, torch=tsync)
        print(f"PPO step, batch {n}: ours {out['ours_us']:.0f} us ({len(exe.kernels)} kernels, host steps {exe.host_steps}); {tsync}")
        return out
    tstep, _ = B.torch_ppo(torch, p0)
    _move_closure_modules(torch, tstep, env.torch_device)
    tb = [torch.tensor(b).to(env.torch_device) for b in batch]
    out["loss_torch_first_step"] = float(tstep(*tb).detach().cpu())
    t_torch = _time_torch(lambda: tstep(*tb), tsync, reps)
    out.update(torch_eager_us=t_torch * 1e6, speedup=t_torch / t_ours)
    out["met"] = out["speedup"] > 1.0
    print(f"PPO step, batch {n}: ours {out['ours_us']:.0f} us ({len(exe.kernels)} kernels, host steps {exe.host_steps}), torch eager {out['torch_eager_us']:.0f} us -> {out['speedup']:.2f}x")
    return out


def _ppo_graph(env: Env, B, p0, dbatch, reps: int) -> dict:
    """The PPO step as one CUDA graph per call (``jit(cuda_graph=True)``): three steps from the same
    start equal the uncaptured executor's, and the replayed step is timed."""
    xp = env.xp
    jg, j = cb.jit(B.ppo_step, device=env.device, cuda_graph=True), env.jit(B.ppo_step)
    pg, sg = _tree_to(xp, p0), _tree_to(xp, B.ppo_opt.init(p0))
    pu, su = _tree_to(xp, p0), _tree_to(xp, B.ppo_opt.init(p0))
    counted = hasattr(env.device, "graph_launches")
    g0 = env.device.graph_launches if counted else None
    for _ in range(3):
        pg, sg, _ = jg(pg, sg, *dbatch)
        pu, su, _ = j(pu, su, *dbatch)
    env.sync()
    exe = jg.entry(pg, sg, *dbatch)[0]
    diff = max(float(np.max(np.abs(env.host(a) - env.host(b)))) for a, b in zip(engine.tree_leaves((pg, sg)), engine.tree_leaves((pu, su))))
    res = {"graph_status": exe.graph_status, "graph_max_diff_vs_uncaptured": diff}
    if counted:
        res["graph_launches_in_3_steps"] = env.device.graph_launches - g0
    state = {"p": pg, "s": sg}

    def replay():
        state["p"], state["s"], _ = jg(state["p"], state["s"], *dbatch)

    res["graph_us"] = env.time(replay, reps) * 1e6
    print(f"PPO step as a CUDA graph: {exe.graph_status}, {res['graph_us']:.0f} us, max diff vs uncaptured {diff:.2g}")
    return res


def part_cnn(env: Env) -> dict:
    import engine_vs_torch as B

    xp = env.xp
    n = 2 if env.dry else 256
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

    reps = 1 if env.dry else 30
    t_ours = env.time(ours, reps, warmup=1 if env.dry else 2)
    out = {"batch": n, "host_steps": exe.host_steps, "ours_ms": t_ours * 1e3, "loss_ours": float(env.host(loss)), "loss_numpy_backend": ref_loss}
    torch, tsync = _torch(env)
    if torch is None:
        out.update(torch_eager_ms=None, speedup=None, torch=tsync)
        print(f"CNN step, batch {n}: ours {out['ours_ms']:.2f} ms (host steps {exe.host_steps}); {tsync}")
        return out
    tstep = B.torch_cnn(torch, p0)
    _move_closure_modules(torch, tstep, env.torch_device)
    tx, ty = torch.tensor(x).to(env.torch_device), torch.tensor(y).to(env.torch_device)
    t_torch = _time_torch(lambda: tstep(tx, ty), tsync, reps)
    out.update(torch_eager_ms=t_torch * 1e3, speedup=t_torch / t_ours)
    print(f"CNN step, batch {n}: ours {out['ours_ms']:.2f} ms (host steps {exe.host_steps}), torch eager {out['torch_eager_ms']:.2f} ms -> {out['speedup']:.2f}x")
    return out


def part_fl(env: Env) -> dict:
    from fedarena.engine.core import cext

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
    err = max(float(np.max(np.abs(env.host(a) - b))) for a, b in zip(engine.tree_leaves(got), engine.tree_leaves(ref)))
    dp, ds, dX, dY = _tree_to(xp, stacked), _tree_to(xp, st), xp.asarray(X), xp.asarray(Y)
    reps = 2 if env.dry else 50
    t_gpu = env.time(lambda: j_gpu(dp, ds, dX, dY), reps)
    t0 = time.perf_counter()
    for _ in range(reps):
        j_np(stacked, st, X, Y)
    t_np = (time.perf_counter() - t0) / reps
    out = {"clients": clients, "host_steps": exe.host_steps, "gpu_ms": t_gpu * 1e3, "numpy_backend_ms": t_np * 1e3, "speedup": t_np / t_gpu,
           "max_abs_diff": err, "numpy_backend_native": cext.available()}
    print(f"FL: {clients} vmapped clients' local step: GPU {out['gpu_ms']:.2f} ms (host steps {exe.host_steps}), numpy backend {out['numpy_backend_ms']:.2f} ms "
          f"({'with' if out['numpy_backend_native'] else 'WITHOUT'} its C extension) -> {out['speedup']:.2f}x; max diff {err:.2g}")
    return out


# ----------------------------------------------------------------------------- smoke


def _check(checks: dict, name: str, fn) -> None:
    """Run one smoke check (``fn() -> (ok, detail)``); an exception is a failed check."""
    try:
        ok, detail = fn()
    except Exception as exc:  # noqa: BLE001 - recorded, the next check still runs
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    checks[name] = {"ok": bool(ok), "detail": detail}
    print(f"smoke {name}: {'ok' if ok else 'FAILED'}: {detail}", flush=True)


def part_smoke(env: Env) -> dict:
    """The first step of gpu_check.sh: whether the device runs the backend's kernels correctly."""
    import engine_vs_torch as B

    xp = env.xp
    planted = os.environ.get("GPU_CHECK_FAIL") == "smoke"
    rng = np.random.default_rng(0)
    checks: dict = {}
    out = {"device_info": _device_info(env), "gpu_unavailable_reason": cb.gpu_unavailable_reason(), "planted_failure": planted, "checks": checks}
    print(f"smoke: {out['device_info']}", flush=True)

    def fused():
        n = 4096 if env.dry else 1 << 20
        x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        j = env.jit(chain)
        exe = j.entry(x, y)[0]
        got = env.host(j(xp.asarray(x), xp.asarray(y))).astype(np.float64)
        if planted:
            got[n // 2] += 1e-3  # GPU_CHECK_FAIL=smoke: one wrong value that the comparison must catch
        ref = chain_separate(np, x.astype(np.float64), y.astype(np.float64))
        err = float(np.max(np.abs(got - ref) / (1 + np.abs(ref))))
        ok = len(exe.kernels) == 1 and exe.host_steps == [] and err <= 1e-5
        return ok, f"10-op chain at {n} elements: {len(exe.kernels)} kernel(s), host steps {exe.host_steps}, max error {err:.1e} of 1 + |numpy float64| (limit 1e-5)"

    def reductions():
        r, c = (64, 100) if env.dry else (4096, 1000)
        x = rng.standard_normal((r, c)).astype(np.float32)
        j = env.jit(lambda v: (ops.sum(v, axis=1), ops.max(v, axis=0)))
        exe = j.entry(x)[0]
        s, m = (env.host(a) for a in j(xp.asarray(x)))
        x64 = x.astype(np.float64)
        err = float(np.max(np.abs(s - x64.sum(1)) / (1 + np.abs(x64).sum(1))))
        exact = bool(np.array_equal(m, x.max(0)))
        ok = exe.host_steps == [] and err <= 1e-6 and exact
        return ok, (f"({r}, {c}) float32: row sums within {err:.1e} of numpy float64 (limit 1e-6 of 1 + sum |x|), column max "
                    f"{'equal to' if exact else 'DIFFERENT from'} numpy's, {len(exe.kernels)} kernel(s), host steps {exe.host_steps}")

    def ppo():
        n = 64 if env.dry else 4096
        batch = _ppo_batch(n, seed=1)
        p0 = B.ppo_init(0)
        s0 = B.ppo_opt.init(p0)
        j = env.jit(B.ppo_step)
        exe = j.entry(p0, s0, *batch)[0]
        got = j(_tree_to(xp, p0), _tree_to(xp, s0), *[xp.asarray(b) for b in batch])
        ref = engine.jit(B.ppo_step)(p0, s0, *batch)
        pairs = [(env.host(a), np.asarray(b)) for a, b in zip(engine.tree_leaves(got), engine.tree_leaves(ref))]
        close = all(np.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in pairs)
        diff = max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in pairs)
        ok = exe.host_steps == [] and close
        return ok, (f"batch {n}: {len(exe.kernels)} kernels, host steps {exe.host_steps}; parameters, Adam state and loss "
                    f"{'equal' if close else 'DIFFER from'} the numpy backend's to 1e-5 (max |diff| {diff:.1e})")

    def sgemm():
        n = 64 if env.dry else 4096
        mod = env.device.load(gemm.source())
        a = xp.asarray(rng.standard_normal((n, n)).astype(np.float32))
        b = xp.asarray(rng.standard_normal((n, n)).astype(np.float32))
        exact = xp.matmul(a.astype(np.float64), b.astype(np.float64))
        bound = 1e-5 * (1 + xp.matmul(xp.abs(a).astype(np.float64), xp.abs(b).astype(np.float64)))
        reps = 1 if env.dry else 5
        t_blas = env.time(lambda: xp.matmul(a, b), reps, warmup=1)
        res, bad = {}, []
        for v in gemm.VARIANTS:
            o = xp.full((n, n), np.nan, np.float32)
            gemm.sgemm(mod, v, a, b, o)
            if not bool(xp.all(xp.abs(o - exact) <= bound)):
                bad.append(v)
            res[v] = t_blas / env.time(lambda: gemm.sgemm(mod, v, a, b, o), reps, warmup=1)
        best = max(res, key=res.get)
        out["sgemm_vs_cublas"] = res
        return not bad, (f"n={n}: {'every variant' if not bad else 'WRONG: ' + ', '.join(bad) + '; the others'} within 1e-5 of "
                         f"(1 + |A||B|) of the float64 product; best {best} {res[best]:.2f}x cuBLAS "
                         f"(target >= 0.7 at 4096, judged by the gemm step)")

    for name, fn in (("fused", fused), ("reductions", reductions), ("ppo", ppo), ("sgemm", sgemm)):
        _check(checks, name, fn)
    failed = [k for k, c in checks.items() if not c["ok"]]
    out["failed_checks"] = failed
    if failed:
        raise SmokeFailure(f"smoke checks failed: {', '.join(failed)}" + (" (planted: GPU_CHECK_FAIL=smoke)" if planted else ""), out)
    print("smoke: every check passed", flush=True)
    return out


class SmokeFailure(Exception):
    """A smoke check failed; carries the part's results so they are still written."""

    def __init__(self, msg: str, result: dict):
        super().__init__(msg)
        self.result = result


# ----------------------------------------------------------------------------- tests-report and summary


def tests_report(out: Path, dry: bool) -> int:
    """Read OUT/tests.xml (pytest --junitxml) into OUT/tests.json; non-zero when no test ran, one
    failed or errored (a collection error included), or, on a device, one was skipped."""
    xml = out / "tests.xml"
    if not xml.exists():
        print(f"tests: {xml} not written (pytest did not get to the end)")
        return 1
    root = ET.parse(xml).getroot()
    cases = root.iter("testcase")
    res = {"tests": 0, "passed": 0, "skipped": 0, "failed": 0, "errors": 0, "skip_reasons": {}, "not_passed": []}
    for case in cases:
        res["tests"] += 1
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("skipped") is not None:
            res["skipped"] += 1
            skip = case.find("skipped")
            reason = (skip.get("message") or "").strip()
            if reason == "collection skipped":  # a module-level skip: the text is repr((path, line, "Skipped: why"))
                try:
                    reason = str(ast.literal_eval(skip.text.strip())[2]).removeprefix("Skipped: ")
                except (ValueError, SyntaxError, IndexError, TypeError, AttributeError):
                    reason = (skip.text or reason).strip()
            res["skip_reasons"][reason] = res["skip_reasons"].get(reason, 0) + 1
            res["not_passed"].append(f"SKIPPED {name}: {reason}")
        elif case.find("error") is not None:
            res["errors"] += 1
            res["not_passed"].append(f"ERROR {name}: {(case.find('error').get('message') or '')[:300]}")
        elif case.find("failure") is not None:
            res["failed"] += 1
            res["not_passed"].append(f"FAILED {name}: {(case.find('failure').get('message') or '')[:300]}")
        else:
            res["passed"] += 1
    problems = []
    if res["tests"] == 0:
        problems.append("no gpu test was collected")
    if res["failed"] or res["errors"]:
        problems.append(f"{res['failed']} failed, {res['errors']} errors (collection errors included)")
    if res["skipped"] and not dry:
        problems.append(f"{res['skipped']} skipped on the device (every gpu test must run there)")
    res["problems"] = problems
    (out / "tests.json").write_text(json.dumps(res, indent=1))
    print(f"tests: {res['tests']} gpu tests: {res['passed']} passed, {res['skipped']} skipped, {res['failed']} failed, {res['errors']} errors")
    for reason, count in res["skip_reasons"].items():
        print(f"  skipped ({count}): {reason}")
    for line in res["not_passed"]:
        if not line.startswith("SKIPPED"):
            print(f"  {line}")
    for p in problems:
        print(f"tests: PROBLEM: {p}")
    return 1 if problems else 0


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def summarize(out: Path, dry: bool) -> tuple[str, list[str]]:
    """The lines of summary.txt and the parts whose target was missed (none in a dry run)."""
    lines, missed = [], []
    native = _read(out / "native.txt") or "numpy backend's C extension: not checked (the env step did not run)"
    smoke = out / "smoke.json"
    if smoke.exists():
        r = json.loads(smoke.read_text())
        lines.append(f"device: {r.get('device_info', '?')}")
        if r.get("status") == "ok":
            lines.append("smoke: every check passed: " + "; ".join(f"{k}: {c['detail']}" for k, c in r["checks"].items()))
        else:
            lines.append(f"smoke: FAILED: {r.get('error')}")
    else:
        lines.append("smoke: not run")
    tests = out / "tests.json"
    if tests.exists():
        t = json.loads(tests.read_text())
        reasons = "; ".join(f"{n} skipped: {why}" for why, n in t["skip_reasons"].items())
        lines.append(f"tests: {t['tests']} gpu tests: {t['passed']} passed, {t['skipped']} skipped, {t['failed']} failed, {t['errors']} errors"
                     + (f" ({reasons})" if reasons else "") + "".join(f"; PROBLEM: {p}" for p in t["problems"]))
    else:
        lines.append("tests: not run")
    tag = " (CPU dry run: timings meaningless, no verdict)" if dry else ""

    def verdict(name: str, ok: bool) -> str:
        if dry:
            return "n/a"
        if not ok:
            missed.append(name)
        return "met" if ok else "NOT met"

    for name in PARTS:
        if name == "smoke":
            continue
        f = out / f"{name}.json"
        if not f.exists():
            lines.append(f"{name}: not run")
            continue
        r = json.loads(f.read_text())
        if r.get("status") != "ok":
            lines.append(f"{name}: ERROR {r.get('error')}")
            if name in TARGETS and not dry:
                missed.append(name)
            continue
        if name == "gemm":
            lines.append(f"gemm: best tiled variant {r['best_vs_cublas_at_4096']:.2f}x cuBLAS at n={r['at_n']} (target >= 0.7: {verdict(name, r['met'])}){tag}")
            for row in r["rows"]:
                lines.append(f"  n={row['n']}: cuBLAS {row['cublas_tflops']:.2f} TFLOPS | " + " | ".join(f"{k} {d['tflops']:.2f} ({d['vs_cublas']:.2f}x, err {d['max_rel_err']:.1e})" for k, d in row["variants"].items()))
            for low in r.get("low_precision", []):
                bound = (2.0**-8 if low["dtype"] == "bfloat16" else 2.0**-11) + 2.0**-20  # one rounding of the float32-accumulated sum
                if "error" in low:
                    lines.append(f"  {low['dtype']} n={low['n']}: ERROR {low['error']} ({verdict('gemm-' + low['dtype'], False)})")
                else:
                    vs = f" vs {low['library']} {low['library_tflops']:.2f} TFLOPS = {low['vs_library']:.2f}x" if "library_tflops" in low else f" ({low['library']})"
                    lines.append(f"  {low['dtype']} n={low['n']} ({'emulated reference GEMM' if dry else 'cublasGemmEx'}, float32 accumulation): {low['ours_tflops']:.2f} TFLOPS{vs}; "
                                 f"max error {low['max_err_over_AB']:.1e} of |A||B| (target <= {bound:.1e}: {verdict('gemm-' + low['dtype'], low['max_err_over_AB'] <= bound)}){tag}")
        elif name == "fused":
            lines.append(f"fused: 10-op chain at {r['n']} elements: {r['speedup_jit']:.2f}x separate cupy calls per jit call, {r['speedup_executable']:.2f}x for the executable alone (target >= 2: {verdict(name, r['met'])}){tag}")
        elif name == "ppo":
            if r.get("speedup") is None:
                lines.append(f"ppo: batch {r['batch']}: ours {r['ours_us']:.0f} us; {r.get('torch')} (target > 1: {verdict(name, False)}){tag}")
            else:
                lines.append(f"ppo: batch {r['batch']}: ours {r['ours_us']:.0f} us vs torch CUDA eager {r['torch_eager_us']:.0f} us = {r['speedup']:.2f}x (target > 1: {verdict(name, r['met'])}); host steps {r['host_steps']}{tag}")
            if "graph_status" in r:
                launches = f", {r['graph_launches_in_3_steps']} graph launches in 3 steps" if "graph_launches_in_3_steps" in r else ""
                ok = r["graph_status"] == "captured" and r["graph_max_diff_vs_uncaptured"] <= 1e-5
                lines.append(f"  as one CUDA graph: {r['graph_status']}, {r['graph_us']:.0f} us per step{launches}, "
                             f"max diff vs uncaptured {r['graph_max_diff_vs_uncaptured']:.2g} (target: captured, diff <= 1e-5: {verdict('ppo-graph', ok)}){tag}")
        elif name == "cnn":
            vs = f"vs torch CUDA eager {r['torch_eager_ms']:.2f} ms = {r['speedup']:.2f}x" if r.get("speedup") is not None else f"({r.get('torch')})"
            lines.append(f"cnn: batch {r['batch']}: ours {r['ours_ms']:.2f} ms {vs}; host steps {r['host_steps']}{tag}")
        elif name == "fl":
            lines.append(f"fl: {r['clients']} vmapped clients: GPU {r['gpu_ms']:.2f} ms vs numpy backend {r['numpy_backend_ms']:.2f} ms = {r['speedup']:.2f}x; "
                         f"max diff {r['max_abs_diff']:.2g}; host steps {r['host_steps']}{tag}")
            lines.append(f"  numpy backend baseline: {'with' if r.get('numpy_backend_native') else 'WITHOUT'} its C extension ({native})")
    switch = _read(out / "switch.txt")
    if switch is None:
        lines.append("switch: not run")
    else:
        lines.append("switch (fedarena run, engine_backend numpy vs " + ("cupy-emulated" if dry else "cupy") + f"; numpy runs: {native}):")
        lines.extend(f"  {row}" for row in switch.splitlines())
    if dry:
        lines.append("targets: not judged (CPU dry run)")
    else:
        lines.append(f"targets NOT met: {', '.join(missed)}" if missed else "targets: all met (gemm, gemm-bfloat16, gemm-float16, fused, ppo, ppo-graph)")
    return lines, missed


TARGETS = ("gemm", "fused", "ppo")
PARTS = {"smoke": part_smoke, "gemm": part_gemm, "fused": part_fused, "ppo": part_ppo, "cnn": part_cnn, "fl": part_fl}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=list(PARTS) + ["all", "tests-report", "summary"])
    ap.add_argument("--out", default="gpu_results", help="folder for <part>.json")
    ap.add_argument("--cpu-dry-run", action="store_true", help="toy sizes on the CPU (CUDA emulation): checks the plumbing only")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.part == "tests-report":
        return tests_report(out, args.cpu_dry_run)
    if args.part == "summary":
        lines, missed = summarize(out, args.cpu_dry_run)
        (out / "summary.txt").write_text("\n".join(lines) + "\n")
        (out / "targets_missed.txt").write_text("".join(f"{m}\n" for m in missed))
        print("\n".join(lines))
        return 0
    _import_engine()
    failed = 0
    names = [n for n in PARTS if n != "smoke"] if args.part == "all" else [args.part]
    try:
        env = Env(args.cpu_dry_run)
    except Exception as exc:  # noqa: BLE001 - no device: every part records why
        env, env_error = None, exc
        print(f"no device to run on: {type(exc).__name__}: {exc}", flush=True)
    for name in names:
        t = time.perf_counter()
        try:
            if env is None:
                raise env_error
            res = PARTS[name](env)
            res["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - record the failure, go on with the next part
            failed += 1
            res = exc.result if isinstance(exc, SmokeFailure) else {}
            res.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
            if env is None:
                res["device_info"] = f"none ({type(env_error).__name__}: {env_error})"
            print(f"{name}: FAILED {res['error']}", file=sys.stderr)
        res["seconds"] = time.perf_counter() - t
        res["dry_run"] = args.cpu_dry_run
        res["device"] = env.device.name if env is not None else None
        (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
