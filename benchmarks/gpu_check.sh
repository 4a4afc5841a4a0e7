#!/usr/bin/env bash
# The cupy backend's GPU check, for a session lent a CUDA device (an H200): at most 430 s of step
# limits plus 5 s grace each for 9 steps (475 s < 8 minutes even if every step runs out its time),
# all written to one folder.
#
#   benchmarks/gpu_check.sh [OUT_DIR] [--cpu-dry-run]
#
# OUT_DIR defaults to $OUT, else ./gpu_results.  Steps (each under its own time limit, each
# logged to OUT_DIR/<step>.log; a failing step does not stop the others):
#   env      nvidia-smi, python/cupy/torch versions
#   tests    pytest -m gpu: tests/engine/gpu (generated kernels, SGEMM variants, PPO step, device
#            rules on the device), tests/envs/test_classic_control_cupy.py (batched CartPole/Acrobot
#            on cupy), tests/{rl,federated}/test_backend_switch.py (engine_backend: cupy)
#   gemm     tiled SGEMM variants vs cuBLAS at 1024-8192 (TFLOPS)
#   fused    a 10-op fused chain vs separate cupy calls at 1M elements
#   ppo      the PPO step at batch 4096 vs PyTorch CUDA eager
#   cnn      the CNN step vs PyTorch CUDA eager
#   fl       vmapped FL clients on the GPU vs the numpy backend
#   switch   the config switch: `fedarena run` of PPO on CartPole (ppo.engine_backend) and of fedsim
#            on digits (engine_backend), each with numpy and with cupy; OUT_DIR/switch.txt compares
#            wall time and final return / accuracy (run folders under OUT_DIR/runs)
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
    -h | --help) sed -n '2,25p' "$0"; exit 0 ;;
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

# the config switch: the same runs on numpy and on the device backend (cupy-emulated in a dry run),
# every run under its own limit (4 runs, 12 s each + 2 s to be killed: 56 s < the step's 62 s)
# shellcheck disable=SC2016  # expanded by the inner shell
switch_runs='
  runs="$OUT_DIR/runs"
  rm -rf "$runs"
  mkdir -p "$runs"
  if [ -n "$DRY" ]; then
    dev=cupy-emulated
    ppo=(--set total_steps=256 --set ppo.num_envs=2 --set ppo.update_epochs=1 --set ppo.hidden=[8])
    fl=(--set rounds=1 --set num_clients=10 --set clients_per_round=2 --set hidden=[4])
  else
    dev=cupy
    ppo=(--set total_steps=4096)
    fl=(--set rounds=5)
  fi
  run=(timeout --kill-after=2 12 "$PY" -m fedarena run --quiet --no-report)
  for b in numpy "$dev"; do
    "${run[@]}" experiments/ppo_cartpole.yaml --set ppo.engine_backend="$b" --set eval.every=0 \
      --set checkpoint.every=0 "${ppo[@]}" --out "$runs/ppo_$b"
    echo "ppo $b rc=$?"
    "${run[@]}" experiments/fedsim_digits.yaml --set engine_backend="$b" --set personalize_epochs=0 "${fl[@]}" \
      --out "$runs/fedsim_$b"
    echo "fedsim $b rc=$?"
  done
  "$PY" - "$runs" "$OUT_DIR/switch.txt" << "PYEOF"
import json
import sys
from pathlib import Path

runs, rows = Path(sys.argv[1]), []
for path in sorted(runs.glob("*/status.json")):
    st = json.loads(path.read_text())
    summary = st.get("summary") or {}
    keys = [k for k in ("final_return", "env_steps", "test_acc", "client_acc_mean") if k in summary]
    state, wall = st.get("state"), st.get("wall_time")
    rows.append(f"{path.parent.name}: {state} wall {wall} s " +
                " ".join(f"{k} {summary[k]}" for k in keys))
Path(sys.argv[2]).write_text("\n".join(rows) + "\n")
print("\n".join(rows))
PYEOF
'

cd "$root" || exit 1
step env 40 bash -c "$env_info"
step tests 110 "$py" -m pytest -q -m gpu -p no:cacheprovider -rs tests/engine/gpu tests/envs/test_classic_control_cupy.py \
  tests/rl/test_backend_switch.py tests/federated/test_backend_switch.py
for part in gemm fused ppo cnn fl; do
  case "$part" in
    gemm) limit=70 ;;
    fused) limit=25 ;;
    fl) limit=35 ;;
    *) limit=40 ;;
  esac
  step "$part" "$limit" "$py" "$here/gpu_bench.py" "$part" --out "$out" ${dry[@]+"${dry[@]}"}
done
DRY="${dry[*]+x}" OUT_DIR="$out" step switch 62 bash -c "$switch_runs"
step summary 8 "$py" "$here/gpu_bench.py" summary --out "$out"
echo "total $((SECONDS - start))s; results in $out" | tee -a "$summary"
cat "$out/summary.txt" "$out/switch.txt" 2> /dev/null
