#!/usr/bin/env bash
# Several runs of bench/planner/sim_vs_real.sh back to back, then bench/planner/runs.py on them
# (issue #7): the simulator against each run, and the machine against itself (every two runs
# at the same rates, their measured figures one against the other).
#   bench/planner/sim_vs_real_runs.sh N [PDSERVE] [validate-sim flags...]
# Each run's comparison.json and log are kept in $OUT/run-K/ (OUT: /tmp/pdserve-sim-vs-real-runs
# unless set); its traces (~300 MB) are removed once it has finished. About 7.5 minutes a run on
# the 2-core Zen 4 host, about 22 on a 2-core Zen 3 host without AVX-512; the environment (MODEL,
# MATMUL, MAX_PROMPTS, ...) passes to every run.
set -euo pipefail
N=${1:?usage: sim_vs_real_runs.sh N [PDSERVE] [validate-sim flags...]}
shift
if ! [[ "$N" =~ ^[1-9][0-9]*$ ]]; then
  echo "sim_vs_real_runs.sh: N must be a positive whole number, not '$N'" >&2
  exit 2
fi
PDSERVE=${1:-build/pdserve}
shift || true
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/pdserve-sim-vs-real-runs}
runs=()
for k in $(seq 1 "$N"); do
  dir="$OUT/run-$k"
  mkdir -p "$dir"
  echo "run $k of $N: $dir ($(date -u +%H:%M) UTC)"
  OUT="$dir" "$HERE/sim_vs_real.sh" "$PDSERVE" "$@" > "$dir/log.txt" 2>&1 || {
    echo "run $k failed: see $dir/log.txt" >&2
    exit 1
  }
  rm -f "$dir"/trace*.json
  grep -h "cells within 10% of 15: per-rate median" "$dir/log.txt" || true
  runs+=("$dir/comparison.json")
done
/usr/bin/python3 "$HERE/runs.py" "${runs[@]}"
