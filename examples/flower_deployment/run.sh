#!/usr/bin/env bash
# Flower's deployment runtime on loopback with a fedarena strategy and fedarena clients: a SuperLink, three
# SuperNodes (partition-id 0..2), `flwr run`, then a comparison of the final model with fedarena's simulation of
# the same federation. Needs fedarena importable (pip install -e ".[flower]" or PYTHONPATH) and free port 18000
# (and 18100..18122 for the SuperNodes' runtime APIs). Run from anywhere: examples/flower_deployment/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
export FLWR_HOME="$work/flwr"
mkdir -p "$FLWR_HOME"
printf '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:18000"\ninsecure = true\n' \
  > "$FLWR_HOME/config.toml"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
flower-superlink --insecure --port 18000 --database "$work/state.db" > "$work/superlink.log" 2>&1 &
pids+=($!)
python - <<'PY'  # wait until the SuperLink accepts connections (slow to start on a busy machine)
import socket, sys, time
for _ in range(300):
    try:
        socket.create_connection(("127.0.0.1", 18000), timeout=1).close()
        sys.exit(0)
    except OSError:
        time.sleep(1)
sys.exit("the SuperLink did not start listening on 127.0.0.1:18000 within 300 s")
PY
for i in 0 1 2; do
  flower-supernode --insecure --superlink 127.0.0.1:18000 --node-config "partition-id=$i num-partitions=3" \
    --port "181$i$i" > "$work/supernode$i.log" 2>&1 &
  pids+=($!)
done
flwr run "$here" local --stream --run-config "result-path='$work/model.npz'"
for _ in $(seq 600); do [ -f "$work/model.npz" ] && break; sleep 1; done
python - "$here" "$work/model.npz" <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import fedarena_app
got = np.load(sys.argv[2])
want = fedarena_app.simulate(3)
err = max(float(np.abs(got[k] - want[k]).max()) for k in want)
print(f"deployment vs fedarena simulation: max abs difference {err:.2e}")
sys.exit(0 if err < 1e-6 else 1)
PY
