#!/usr/bin/env bash
# Simulator against reality on this machine (issue #7, "Done when" #2):
#   1. a small model (make-model --arch qwen3 --preset small) unless MODEL is given,
#   2. `pdserve profile` on it with the instances' thread count (the simulator's latency model),
#   3. `pdserve validate-sim`: `pdserve up` (1 prefill + 1 decode, each pinned to its own core),
#      probes through the deployment that calibrate the latency model (fixed cost, prefill scale,
#      decode per-step/per-sequence costs, co-run slowdowns) and schedstat's CPU contention,
#      `pdserve bench` at three Poisson rates (fixed seed, random dataset) and the simulator on the
#      same requests, uncalibrated and calibrated, side by side (docs/planner.md).
# One run takes about 2 minutes. Usage:
#   bench/planner/sim_vs_real.sh [PDSERVE] [extra validate-sim flags, e.g. --rate 2 --rate 4]
set -euo pipefail
PDSERVE=${1:-build/apps/pdserve}
shift || true
MODEL=${MODEL:-models/qwen3-small}
THREADS=${THREADS:-1}
OUT=${OUT:-/tmp/pdserve-sim-vs-real}
mkdir -p "$OUT"
if [[ ! -f "$MODEL/config.json" ]]; then
  "$PDSERVE" make-model --arch qwen3 --preset small --out "$MODEL"
fi
# Pinned to core 0, where `up --pin-cores` puts the prefill instance.
PIN=()
if command -v taskset > /dev/null; then PIN=(taskset -c 0); fi
"${PIN[@]}" "$PDSERVE" profile --model "$MODEL" --threads "$THREADS" --quick --out "$OUT/profile.json"
"$PDSERVE" validate-sim --model "$MODEL" --threads "$THREADS" --profile "$OUT/profile.json" \
  --out "$OUT/comparison.json" "$@"
echo "results: $OUT/profile.json $OUT/comparison.json"
