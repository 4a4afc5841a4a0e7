#!/usr/bin/env bash
# The cupy backend's GPU check, for a session lent a CUDA device (an H200): at most 435 s of step
# limits plus 5 s grace each (< 8 minutes even if every step runs out its time), all written to one folder.
#
#   benchmarks/gpu_check.sh [OUT_DIR] [--cpu-dry-run]
#
# OUT_DIR defaults to $OUT, else ./gpu_results.  Steps (each under its own time limit, each
# logged to OUT_DIR/<step>.log; a failing step does not stop the others):
#   env      nvidia-smi, python/cupy/torch versions
#   tests    pytest -m gpu: tests/engine/gpu (generated kernels, SGEMM variants, PPO step on the
#            device) and tests/envs/test_classic_control_cupy.py (batched CartPole/Acrobot on cupy)
#   gemm     tiled SGEMM variants vs cuBLAS at 1024-8192 (TFLOPS)
#   fused    a 10-op fused chain vs separate cupy calls at 1M elements
#   ppo      the PPO step at batch 4096 vs PyTorch CUDA eager
#   cnn      the CNN step vs PyTorch CUDA eager
#   fl       vmapped FL clients on the GPU vs the numpy backend
#   summary  OUT_DIR/summary.txt: one line per part against the issue's targets
# --cpu-dry-run runs the same plumbing on the CPU (kernels through the CUDA emulation, toy sizes).
# Needs: fedarena importable (pip install -e . or PYTHONPATH), cupy matching the driver
# (pip install 'fedarena[gpu]' or cupy-cuda13x), torch with CUDA for the comparisons.
set -u

dry=()
out="${OUT:-gpu_results}"
for arg in "$@"; do
  case "$arg" in
    --cpu-dry-run) dry=(--cpu-dry-run) ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) out="$arg" ;;
  esac
done
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
py="${PYTHON:-python}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
summary="$out/steps.txt"
: > "$summary"
start=$SECONDS

step() {  # step NAME SECONDS COMMAND...
  local name="$1" limit="$2"
  shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=5 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 5 "$out/$name.log"
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$summary"
}

# shellcheck disable=SC2016  # expanded by the inner shell
env_info='
  if command -v nvidia-smi > /dev/null 2>&1; then nvidia-smi; else echo "nvidia-smi: not found"; fi
  "$PY" - << "PYEOF"
import sys
import numpy
print("python", sys.version.split()[0], "numpy", numpy.__version__)
for name in ("cupy", "torch"):
    try:
        mod = __import__(name)
        extra = f" cuda {mod.cuda.is_available()}" if name == "torch" else ""
        print(name, mod.__version__ + extra)
    except Exception as exc:  # noqa: BLE001
        print(name, "not importable:", exc)
from fedarena.engine.backends import cupy as cb
print("cupy backend:", cb.gpu_unavailable_reason() or "device available")
PYEOF
'
export PY="$py"

cd "$root" || exit 1
step env 40 bash -c "$env_info"
step tests 130 "$py" -m pytest -q -m gpu -p no:cacheprovider -rs tests/engine/gpu tests/envs/test_classic_control_cupy.py
for part in gemm fused ppo cnn fl; do
  case "$part" in
    gemm) limit=90 ;;
    fused) limit=30 ;;
    fl) limit=35 ;;
    *) limit=50 ;;
  esac
  step "$part" "$limit" "$py" "$here/gpu_bench.py" "$part" --out "$out" ${dry[@]+"${dry[@]}"}
done
step summary 10 "$py" "$here/gpu_bench.py" summary --out "$out"
echo "total $((SECONDS - start))s; results in $out" | tee -a "$summary"
cat "$out/summary.txt" 2> /dev/null
