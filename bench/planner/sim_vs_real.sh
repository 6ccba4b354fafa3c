#!/usr/bin/env bash
# The simulator against the real system here: a small model (unless MODEL is given), its latency
# model (`pdserve profile`, decode shapes over this workload's), `pdserve validate-sim`
# (src/planner/validate_sim.h). Environment: MODEL THREADS MATMUL INPUT_LEN OUTPUT_LEN RANGE
# MAX_PROMPTS OUT.  bench/planner/sim_vs_real.sh [PDSERVE] [validate-sim flags, e.g. --rounds 1]
set -euo pipefail
PDSERVE=${1:-build/pdserve}
shift || true
MODEL=${MODEL:-models/qwen3-small}
THREADS=${THREADS:-1}
MATMUL=${MATMUL:-f32}
INPUT_LEN=${INPUT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-32}
RANGE=${RANGE:-0.5}
MAX_PROMPTS=${MAX_PROMPTS:-600}
OUT=${OUT:-/tmp/pdserve-sim-vs-real}
# Contexts from the shortest prompt to the longest prompt plus its output.
CONTEXTS=$(awk -v i="$INPUT_LEN" -v o="$OUTPUT_LEN" -v r="$RANGE" \
  'BEGIN { printf "%d,%d,%d", i * (1 - r), i + o / 2, (i + o) * (1 + r) }')
mkdir -p "$OUT"
if [[ ! -f "$MODEL/config.json" ]]; then
  "$PDSERVE" make-model --arch qwen3 --preset small --out "$MODEL"
fi
# Pinned to core 0, where `up --pin-cores` puts the prefill instance.
PIN=()
if command -v taskset > /dev/null; then PIN=(taskset -c 0); fi
"${PIN[@]}" "$PDSERVE" profile --model "$MODEL" --threads "$THREADS" --quick \
  --decode-batches 1,2,4,8,16 --decode-contexts "$CONTEXTS" --matmul "$MATMUL" \
  --out "$OUT/profile.json"
"$PDSERVE" validate-sim --model "$MODEL" --threads "$THREADS" --profile "$OUT/profile.json" \
  --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --range-ratio "$RANGE" --matmul "$MATMUL" \
  --max-prompts "$MAX_PROMPTS" --out "$OUT/comparison.json" --trace "$OUT/trace.json" "$@"
echo "results: $OUT/profile.json $OUT/comparison.json"
