#!/bin/bash
# Many concurrent streaming clients through `pdserve up` (1 prefill, 1 decode, the router in the
# up process) on a tiny random-weight model; every stream checked against a non-streamed greedy
# reference; peak threads and peak RSS of the router, prefill and decode processes reported.
#
#   bench/streams/run.sh                 # 2000 clients, 8 tokens each
#   CLIENTS=500 MAX_TOKENS=4 PORT=18500 PDSERVE=build/pdserve bench/streams/run.sh
#
# Writes OUT (default: a new temporary directory): up.log, report.json.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PDSERVE=${PDSERVE:-build/pdserve}
CLIENTS=${CLIENTS:-2000}
MAX_TOKENS=${MAX_TOKENS:-8}
PORT=${PORT:-18400}
OUT=${OUT:-$(mktemp -d /tmp/stream_load.XXXXXX)}
mkdir -p "$OUT"

"$PDSERVE" make-model --arch qwen3 --preset tiny --out "$OUT/model" > /dev/null
"$PDSERVE" up --model "$OUT/model" --served-model-name tiny --prefill 1 --decode 1 \
  --port "$PORT" --max-pending-requests $((CLIENTS + 64)) > "$OUT/up.log" 2>&1 &
up=$!
trap 'kill "$up" 2> /dev/null; wait "$up" 2> /dev/null || true' EXIT
for _ in $(seq 600); do
  grep -q "router (OpenAI API)" "$OUT/up.log" && break
  kill -0 "$up" 2> /dev/null || { cat "$OUT/up.log"; exit 1; }
  sleep 0.5
done
prefill=$(sed -n 's/.*prefill 0 on .* (pid \([0-9]*\)).*/\1/p' "$OUT/up.log")
decode=$(sed -n 's/.*decode 0 on .* (pid \([0-9]*\)).*/\1/p' "$OUT/up.log")
echo "up: router pid $up, prefill pid $prefill, decode pid $decode; output in $OUT"
/usr/bin/python3 "$here/stream_load.py" --url "http://127.0.0.1:$PORT" --model tiny \
  --clients "$CLIENTS" --max-tokens "$MAX_TOKENS" \
  --watch "router=$up" --watch "prefill=$prefill" --watch "decode=$decode" \
  --router-metrics "http://127.0.0.1:$PORT/metrics" --prompt "${PROMPT:-Once upon a time}" \
  --json "$OUT/report.json"
