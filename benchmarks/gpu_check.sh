#!/usr/bin/env bash
# The cupy backend's GPU check kit: ten steps, each under its own time limit (360 s in all, plus
# 2 s to kill a step that runs out), each logged to OUT_DIR/<step>.log, then one verdict line and
# a real exit status.
#
#   benchmarks/gpu_check.sh [OUT_DIR] [--cpu-dry-run] [--steps STEP,STEP,...]
#   benchmarks/gpu_check.sh --fetch-wheels     # here, before a device run (see "On a lent device")
#
# OUT_DIR defaults to $OUT, else ./gpu_results.  Steps, in order, with their limits in seconds:
#   smoke    90  gpu_bench.py smoke: gpu_unavailable_reason() is None; one fused elementwise kernel
#                and two reductions equal numpy; the PPO step equals the numpy backend to 1e-5 with
#                host_steps == []; the SGEMM variants equal a float64 product and are timed against
#                cuBLAS at 4096.  If it fails the script stops there: "VERDICT: FAIL: smoke", exit 1
#   env      25  nvidia-smi and versions; installs the wheels in .whl/ (if any) into a temporary
#                folder on PYTHONPATH for the later steps; builds the numpy backend's C extension
#                for this Python where it is missing (setuptools' build_ext, the settings of
#                pyproject.toml); OUT_DIR/native.txt says which, or why it is absent
#   tests    85  pytest -m gpu: tests/engine/gpu, tests/envs/test_classic_control_cupy.py,
#                tests/{rl,federated}/test_backend_switch.py; fails when a test fails or errs,
#                when none was collected, or, on a device, when any was skipped
#   gemm     30  tiled SGEMM variants vs cuBLAS at 1024-8192 (target: best >= 0.7x at 4096); the
#                bfloat16 and float16 GEMMs (cublasGemmEx, float32 accumulation) at 4096 vs torch's
#                bfloat16 / cupy's float16 matmul (target: within one rounding of the exact product)
#   fused    15  a 10-op fused chain vs separate cupy calls at 1M elements (target >= 2x)
#   ppo      25  the PPO step at batch 4096 vs PyTorch CUDA eager (target: faster); the same step
#                as one CUDA graph per call (target: captured, equal to the uncaptured step to 1e-5)
#   cnn      20  the CNN step vs PyTorch CUDA eager
#   fl       15  64 vmapped FL clients on the GPU vs the numpy backend
#   switch   50  `fedarena run` of PPO on CartPole (ppo.engine_backend) and of fedsim on digits
#                (execution.engine_backend), each with numpy and with cupy, every run under 11 s; a run that
#                fails fails the step (PPO needs gymnasium: on a device without it the step fails)
#   summary   5  OUT_DIR/summary.txt: one line per step against the issue's targets
# Exit status: 0 when every step passed and, on a device, every target was met; 1 otherwise, the
# last line ("VERDICT: FAIL: ...") naming the failed steps and the missed targets; 2 for bad usage.
#
# --cpu-dry-run  the same steps on the CPU: the kernels through the CUDA emulation, toy sizes,
#                cupy-emulated runs; gpu tests skip for want of a device, the switch step's PPO
#                runs for want of gymnasium; every limit x4 (the emulation is slower); timings
#                mean nothing and no target is judged.
# --steps        run only these steps (the summary reports the others as not run).
# GPU_CHECK_FAIL=STEP   a planted failure: smoke corrupts one value its comparison must catch;
#                any other step is replaced by a command that fails.  The script exits 1 naming it.
# PYTHON         the interpreter (default python3, else python); GPU_CHECK_LIMIT_SCALE multiplies
#                every limit (default 1, 4 with --cpu-dry-run).
#
# On a lent device (an H200 whose image has python3 3.12 with torch and cupy-cuda13x but no
# gymnasium, pettingzoo or ray, and no network): fedarena's RL needs gymnasium, so first run
# `benchmarks/gpu_check.sh --fetch-wheels` here: it downloads gymnasium and farama-notifications
# (pure Python) into .whl/ and adds /.whl/ to .git/info/exclude.  Then the device tool's call
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=420)
# runs everything (results under its $OUT; 360 s of limits + 20 s of kill grace < 420 s).
set -u

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }  # the header above
steps_all=(smoke env tests gemm fused ppo cnn fl switch summary)
wheels=(gymnasium==1.4.0 farama-notifications==0.0.6)  # what fedarena's RL needs beyond the device image

dry=()
only=""
fetch=""
out="${OUT:-gpu_results}"
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-dry-run) dry=(--cpu-dry-run) ;;
    --fetch-wheels) fetch=1 ;;
    --steps)
      [ $# -ge 2 ] || { echo "gpu_check.sh: --steps needs a comma-separated list of steps" >&2; exit 2; }
      only="$2"
      shift
      ;;
    --steps=*) only="${1#--steps=}" ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) out="$1" ;;
  esac
  shift
done

is_step() { [[ " ${steps_all[*]} " == *" $1 "* ]]; }
if [ -n "$only" ]; then
  IFS=, read -r -a chosen <<< "$only"
  for s in "${chosen[@]}"; do
    is_step "$s" || { echo "gpu_check.sh: --steps: unknown step '$s' (steps: ${steps_all[*]})" >&2; exit 2; }
  done
fi
if [ -n "${GPU_CHECK_FAIL:-}" ] && ! is_step "$GPU_CHECK_FAIL"; then
  echo "gpu_check.sh: GPU_CHECK_FAIL: unknown step '$GPU_CHECK_FAIL' (steps: ${steps_all[*]})" >&2
  exit 2
fi

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if command -v python3 > /dev/null 2>&1; then py=python3; else py=python; fi
fi

if [ -n "$fetch" ]; then
  "$py" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$root/.whl" "${wheels[@]}" || exit 1
  exclude="$(git -C "$root" rev-parse --path-format=absolute --git-path info/exclude)" || exit 1
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.whl/' "$exclude" 2> /dev/null || echo '/.whl/' >> "$exclude"
  ls -l "$root/.whl"
  echo "carry .whl: run(command=\"bash benchmarks/gpu_check.sh\", carry=[\".whl\"], timeout_s=420)"
  exit 0
fi

scale="${GPU_CHECK_LIMIT_SCALE:-$([ ${#dry[@]} -gt 0 ] && echo 4 || echo 1)}"
if ! [[ "$scale" =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu_check.sh: GPU_CHECK_LIMIT_SCALE: expected a positive integer, got '$scale'" >&2
  exit 2
fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
base_pythonpath="${PYTHONPATH:-}"
export PYTHONPATH="$root${base_pythonpath:+:$base_pythonpath}"
export PY="$py" ROOT="$root" OUT_DIR="$out" SITE="$work/site" DRY="${dry[*]+x}"
export RUN_LIMIT=$((11 * scale)) PYTHONUNBUFFERED=1  # unbuffered: a step killed at its limit keeps its log
steps="$out/steps.txt"
: > "$steps"
rm -f "$out"/*.json "$out"/tests.xml "$out"/switch.txt "$out"/native.txt "$out"/summary.txt "$out"/targets_missed.txt
start=$SECONDS
last_rc=0

selected() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

step() {  # step NAME SECONDS COMMAND...: run COMMAND under the limit, log to OUT_DIR/NAME.log
  local name="$1" limit=$(($2 * scale))
  shift 2
  last_rc=0
  selected "$name" || return 0
  if [ "${GPU_CHECK_FAIL:-}" = "$name" ] && [ "$name" != smoke ]; then
    # shellcheck disable=SC2016  # $1 is the inner shell's
    set -- bash -c 'echo "planted failure: GPU_CHECK_FAIL=$1"; exit 1' planted "$name"
  fi
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=2 "$limit" "$@" > "$out/$name.log" 2>&1
  last_rc=$?
  [ "$name" = summary ] || tail -n 8 "$out/$name.log"
  local how="rc=$last_rc"
  if [ "$last_rc" -eq 124 ] || [ "$last_rc" -eq 137 ]; then how="rc=$last_rc,timed-out-after-${limit}s"; fi
  echo "$name $how $((SECONDS - t0))s" | tee -a "$steps"
}

# The bodies of the env, tests and switch steps: functions run by `bash -c` under `timeout`
# (they read the exported PY, ROOT, OUT_DIR, SITE, DRY and RUN_LIMIT)
# shellcheck disable=SC2329  # invoked through bash -c "$(declare -f env_step); env_step"
env_step() {
  if command -v nvidia-smi > /dev/null 2>&1; then nvidia-smi; else echo "nvidia-smi: not found"; fi
  shopt -s nullglob
  whl=("$ROOT"/.whl/*.whl)
  if [ ${#whl[@]} -gt 0 ]; then
    echo "installing ${#whl[@]} carried wheels into $SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${whl[@]}" || exit 1
    export PYTHONPATH="$PYTHONPATH:$SITE"
  else
    echo "no wheels in .whl/ (gpu_check.sh --fetch-wheels puts them there)"
  fi
  "$PY" - "$ROOT" "$OUT_DIR" << "PYEOF"
import importlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy

root, out = Path(sys.argv[1]), Path(sys.argv[2])
print("python", sys.version.split()[0], sys.executable, "numpy", numpy.__version__)
for name in ("cupy", "torch", "gymnasium", "pettingzoo", "ray"):
    try:
        mod = importlib.import_module(name)
        extra = f" cuda {mod.cuda.is_available()}" if name == "torch" else ""
        print(name, mod.__version__ + extra)
    except Exception as exc:  # noqa: BLE001
        print(name, "not importable:", exc)
from fedarena.engine.backends import cupy as cb

print("cupy backend:", cb.gpu_unavailable_reason() or "device available")

CHECK = "from fedarena.engine.core import cext; import sys; print(cext.available()); sys.exit(0 if cext.available() else 1)"
ver = sys.version.split()[0]
if subprocess.run([sys.executable, "-c", CHECK], capture_output=True).returncode == 0:
    line = f"C extension present for Python {ver}"
else:
    t = time.perf_counter()
    try:  # the extension as pyproject.toml declares it, built into a temporary folder
        import tomllib

        from setuptools import Distribution, Extension
        from setuptools.command.build_ext import build_ext

        spec = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"][0]
        kw = {k.replace("-", "_"): v for k, v in spec.items() if k not in ("name", "sources", "optional")}
        ext = Extension(spec["name"], [str(root / s) for s in spec["sources"]], **kw)
        tmp = Path(tempfile.mkdtemp(prefix="fedarena_native_"))
        cmd = build_ext(Distribution({"name": "fedarena", "ext_modules": [ext]}))
        cmd.build_temp, cmd.build_lib = str(tmp / "temp"), str(tmp / "lib")
        cmd.ensure_finalized()
        cmd.run()
        so = Path(cmd.get_ext_fullpath(ext.name))
        shutil.copy2(so, root / "fedarena" / "engine" / so.name)
        ok = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
        if ok.returncode != 0:
            raise RuntimeError(f"built {so.name} but it does not load: {ok.stderr.strip()[-300:]}")
        line = f"C extension built here for Python {ver} ({so.name}, {time.perf_counter() - t:.1f} s)"
    except BaseException as exc:  # noqa: BLE001 - distutils errors are SystemExit
        line = f"C extension ABSENT for Python {ver} (build failed: {type(exc).__name__}: {str(exc)[-300:]}): numpy-backend baselines run without it"
print(line)
(out / "native.txt").write_text(line + "\n")
PYEOF
}

# shellcheck disable=SC2329  # invoked through bash -c "$(declare -f tests_step); tests_step"
tests_step() {
  "$PY" -m pytest -q -m gpu -p no:cacheprovider -rs --junitxml="$OUT_DIR/tests.xml" tests/engine/gpu \
    tests/envs/test_classic_control_cupy.py tests/rl/test_backend_switch.py tests/federated/test_backend_switch.py
  rc=$?
  echo "pytest rc=$rc"
  "$PY" benchmarks/gpu_bench.py tests-report --out "$OUT_DIR" ${DRY:+--cpu-dry-run} || rc=1
  exit "$rc"
}

# the config switch: the same runs on numpy and on the device backend (cupy-emulated in a dry run),
# every run under RUN_LIMIT s (4 runs of 11 s + 1 s to be killed: 48 s < the step's 50 s)
# shellcheck disable=SC2329  # invoked through bash -c "$(declare -f switch_step); switch_step"
switch_step() {
  runs="$OUT_DIR/runs"
  rm -rf "$runs"
  mkdir -p "$runs"
  if [ -n "$DRY" ]; then
    dev=cupy-emulated
    ppo=(--set total_steps=256 --set ppo.num_envs=2 --set ppo.update_epochs=1 --set ppo.hidden=[8] --set eval.episodes=2)
    fl=(--set rounds=1 --set data.num_clients=10 --set clients.per_round=2 --set model.hidden=[4])
  else
    dev=cupy
    ppo=(--set total_steps=4096)
    fl=(--set rounds=5)
  fi
  run=(timeout --kill-after=1 "$RUN_LIMIT" "$PY" -m fedarena run --quiet --no-report)
  gym=""
  "$PY" -c "import gymnasium" 2> /dev/null && gym=1
  : > "$runs/rc.txt"
  for b in numpy "$dev"; do
    if [ -n "$gym" ]; then
      "${run[@]}" experiments/ppo_cartpole.yaml --set ppo.engine_backend="$b" --set eval.every=0 \
        --set checkpoint.every=0 "${ppo[@]}" --out "$runs/ppo_$b"
      echo "ppo_$b $?" >> "$runs/rc.txt"
    else
      echo "ppo_$b skip" >> "$runs/rc.txt"
    fi
    "${run[@]}" experiments/fedsim_digits.yaml --set execution.engine_backend="$b" --set evaluation.personalize_epochs=0 "${fl[@]}" \
      --out "$runs/fedsim_$b"
    echo "fedsim_$b $?" >> "$runs/rc.txt"
  done
  "$PY" - "$runs" "$OUT_DIR/switch.txt" "$RUN_LIMIT" "${DRY:-}" << "PYEOF"
import json
import sys
from pathlib import Path

runs, dest, limit, dry = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], bool(sys.argv[4])
rows, bad = [], []
for line in (runs / "rc.txt").read_text().splitlines():
    name, rc = line.split()
    if rc == "skip":
        rows.append(f"{name}: SKIPPED: gymnasium is not importable (fedarena.rl needs it: carry its wheels, "
                    "gpu_check.sh --fetch-wheels and carry=[\".whl\"])")
        if not dry:
            bad.append(name)
        continue
    status = runs / name / "status.json"
    st = json.loads(status.read_text()) if status.exists() else {}
    summary = st.get("summary") or {}
    keys = [k for k in ("final_return", "env_steps", "test_acc", "client_acc_mean") if k in summary]
    why = f"timed out after {limit} s" if rc in ("124", "137") else f"exit status {rc}"
    rows.append(f"{name}: {st.get('state', 'no status.json')} wall {st.get('wall_time')} s "
                + " ".join(f"{k} {summary[k]}" for k in keys) + ("" if rc == "0" else f" FAILED: {why}"))
    if rc != "0":
        bad.append(name)
dest.write_text("\n".join(rows) + "\n")
print("\n".join(rows))
if bad:
    print("switch: failed runs:", ", ".join(bad))
sys.exit(1 if bad else 0)
PYEOF
}

cd "$root" || exit 1
step smoke 90 "$py" benchmarks/gpu_bench.py smoke --out "$out" ${dry[@]+"${dry[@]}"}
if [ "$last_rc" -ne 0 ]; then
  why="$(grep -E 'FAILED|no device' "$out/smoke.log" | tail -n 1)"
  {
    grep -E '^smoke' "$out/smoke.log"
    echo "VERDICT: FAIL: smoke (rc=$last_rc): ${why:-see smoke.log}; the check stopped after the smoke step"
  } > "$out/summary.txt"
  tail -n 1 "$out/summary.txt"
  exit 1
fi
step env 25 bash -c "$(declare -f env_step); env_step"
[ -d "$SITE" ] && export PYTHONPATH="$PYTHONPATH:$SITE"
step tests 85 bash -c "$(declare -f tests_step); tests_step"
for part in gemm fused ppo cnn fl; do
  case "$part" in
    gemm) limit=30 ;;
    fused | fl) limit=15 ;;
    ppo) limit=25 ;;
    cnn) limit=20 ;;
  esac
  step "$part" "$limit" "$py" benchmarks/gpu_bench.py "$part" --out "$out" ${dry[@]+"${dry[@]}"}
done
step switch 50 bash -c "$(declare -f switch_step); switch_step"
step summary 5 "$py" benchmarks/gpu_bench.py summary --out "$out" ${dry[@]+"${dry[@]}"}

failed=()
while read -r name how _; do
  [ "$how" = rc=0 ] || failed+=("$name (${how})")
done < "$steps"
missed=()
[ -f "$out/targets_missed.txt" ] && mapfile -t missed < "$out/targets_missed.txt"
if [ ${#failed[@]} -eq 0 ] && [ ${#missed[@]} -eq 0 ]; then
  if [ -n "$DRY" ]; then
    verdict="VERDICT: PASS (CPU dry run: every step passed; no target judged)"
  elif [ -n "$only" ]; then
    verdict="VERDICT: PASS: every step run passed and no target measured was missed"
  else
    verdict="VERDICT: PASS: every step passed and every target was met"
  fi
  status=0
else
  verdict="VERDICT: FAIL:"
  if [ ${#failed[@]} -gt 0 ]; then
    joined="$(printf '%s, ' "${failed[@]}")"
    verdict="$verdict failed steps: ${joined%, };"
  fi
  [ ${#missed[@]} -gt 0 ] && verdict="$verdict targets not met: ${missed[*]};"
  verdict="${verdict%;}"
  status=1
fi
[ -n "$only" ] && verdict="$verdict (steps run: $only)"
[ -f "$out/summary.txt" ] && cat "$out/summary.txt"
echo "total $((SECONDS - start))s; results in $out"
echo "$verdict" | tee -a "$out/summary.txt"
exit "$status"
