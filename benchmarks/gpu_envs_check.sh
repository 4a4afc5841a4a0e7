#!/bin/bash
# Device check for the cupy build of the batched classic-control environments (issue 9):
# runs the cupy-vs-numpy tests and times the cupy build at large batch sizes.
set -x
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
PY=${PYTHON:-python3}
$PY -c "import sys, numpy; print(sys.version, numpy.__version__)"
$PY -c "import cupy; print('cupy', cupy.__version__)" || { echo "cupy not importable"; exit 3; }
$PY -c "import gymnasium; print('gymnasium', gymnasium.__version__)" || echo "gymnasium not importable"
$PY -m pytest -q tests/envs/test_classic_control_cupy.py -p no:cacheprovider 2>&1 | tail -5
$PY benchmarks/rl_envs.py --num-envs 256 --steps 50 --seconds 1 --gpu-envs 4096 65536 1048576 2>&1 | tail -8
