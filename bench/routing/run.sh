#!/bin/bash
# KV-aware routing on vLLM's prefix_repetition workload: two colocated `pdserve serve` instances
# behind `pdserve router`, routed kv-aware and then least-loaded, against one instance with both
# instances' KV cache together (the hit rate a cache that never splits a prefix gets). Each
# instance's cache holds about CACHE_PREFIXES of the NUM_PREFIXES prefixes: routed kv-aware, each
# prefix stays on one instance and both caches together hold them all; routed by load, every
# instance sees every prefix and evicts them in turn.
# Reports, per setup, the prefix cache hit rate (the instances' /metrics: cached prompt tokens
# over prompt tokens, warm-up excluded) and TTFT p50/p99 from `pdserve bench`.
#
#   bench/routing/run.sh
#   bench/routing/run.sh --workload spread
#   NUM_PROMPTS=100 RATE=2 PDSERVE=build/pdserve bench/routing/run.sh
#
# --workload five-of-eight (the default): 8 prefixes, each instance's cache about 5 of them.
# --workload spread: 16 prefixes, each instance's cache about 6 of them (both together 12): routed
# by load each instance sees every prefix and holds 6 of 16 (most prompts miss), routed kv-aware
# both caches together hold 12 of 16. (With 4 per instance both caches together hold half the
# prefixes, so the median prompt misses even on one instance with both caches: TTFT p50 then
# says nothing about the routing.) The variables below override either.
#
# Writes OUT (default: a new temporary directory): the logs, one bench JSON per setup and
# table.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
WORKLOAD=five-of-eight
while [ $# -gt 0 ]; do
  case $1 in
    --workload) WORKLOAD=$2; shift 2 ;;
    *) echo "usage: $0 [--workload five-of-eight|spread]" >&2; exit 2 ;;
  esac
done
case $WORKLOAD in
  five-of-eight) ;;
  spread) NUM_PREFIXES=${NUM_PREFIXES:-16}; CACHE_PREFIXES=${CACHE_PREFIXES:-6} ;;
  *) echo "$0: unknown --workload '$WORKLOAD' (five-of-eight or spread)" >&2; exit 2 ;;
esac
PDSERVE=${PDSERVE:-build/pdserve}
MODEL=${MODEL:-$here/../../models/demo-llama}
PREFIX_LEN=${PREFIX_LEN:-1024}
SUFFIX_LEN=${SUFFIX_LEN:-32}
OUTPUT_LEN=${OUTPUT_LEN:-4}
NUM_PREFIXES=${NUM_PREFIXES:-8}
CACHE_PREFIXES=${CACHE_PREFIXES:-5}  # prefixes one instance's KV cache holds
NUM_PROMPTS=${NUM_PROMPTS:-160}
RATE=${RATE:-3}
THREADS=${THREADS:-1}
OUT=${OUT:-$(mktemp -d /tmp/routing_bench.XXXXXX)}
mkdir -p "$OUT"
source "$here/../disagg/lib.sh"

# KV bytes per token (all layers, K and V, f32 cache) from the model's config.
token_bytes=$("$PY" -c "
import json, sys
c = json.load(open('$MODEL/config.json'))
hd = c.get('head_dim') or c['hidden_size'] // c['num_attention_heads']
print(c['num_hidden_layers'] * 2 * c['num_key_value_heads'] * hd * 4)")
# Room for CACHE_PREFIXES prefixes plus the requests in flight (16 of SUFFIX+OUTPUT+1 page each).
cache_bytes=$(( token_bytes * (CACHE_PREFIXES * PREFIX_LEN + 16 * (SUFFIX_LEN + OUTPUT_LEN + 16)) ))

# Started in this shell (not in a command substitution's subshell), so that PIDS holds them and
# cleanup stops them.
start_instance() {  # NAME CACHE_BYTES: sets STARTED_URL
  local log="$OUT/$1.log"
  "$PDSERVE" serve --model "$MODEL" --served-model-name m --port 0 --threads "$THREADS" \
    --kv-cache-dtype float32 --kv-cache-bytes "$2" --max-model-len $((PREFIX_LEN + SUFFIX_LEN + 64)) \
    > "$log" 2>&1 &
  PIDS+=($!)
  STARTED_URL=$(wait_for "$log" "on http://127.0.0.1:" $! |
    sed 's|.*on \(http://127.0.0.1:[0-9]*\).*|\1|')
}

start_router() {  # NAME ROUTING BACKENDS: sets STARTED_URL
  local log="$OUT/router-$1.log"
  "$PDSERVE" router --decode "$3" --port 0 --routing "$2" --model "$MODEL" > "$log" 2>&1 &
  PIDS+=($!)
  STARTED_URL=$(wait_for "$log" "router on http://127.0.0.1:" $! |
    sed 's|.*router on \(http://127.0.0.1:[0-9]*\).*|\1|')
}

cache_counters() {  # URL...: "queries hits" summed over the instances
  for u in "$@"; do curl -s "$u/metrics"; done | "$PY" -c "
import re, sys
q = h = 0.0
for line in sys.stdin:
    m = re.match(r'pdserve:prefix_cache_(queries|hits)_total\{[^}]*\} (\S+)', line)
    if m and m.group(1) == 'queries': q += float(m.group(2))
    elif m: h += float(m.group(2))
print(q, h)"
}

run_setup() {  # NAME ROUTING CACHE_BYTES NUM_INSTANCES
  local name=$1 routing=$2 bytes=$3 n=$4 urls=() u
  for i in $(seq 1 "$n"); do
    start_instance "$name-$i" "$bytes"
    urls+=("$STARTED_URL")
  done
  start_router "$name" "$routing" "$(IFS=,; echo "${urls[*]}")"
  local router_url=$STARTED_URL
  sleep 2  # the router's KV event streams connect (they snapshot an empty cache)
  local before after
  before=$(cache_counters "${urls[@]}")
  "$PDSERVE" bench --base-url "$router_url" --model m --dataset-name prefix_repetition \
    --prefix-repetition-prefix-len "$PREFIX_LEN" --prefix-repetition-suffix-len "$SUFFIX_LEN" \
    --prefix-repetition-num-prefixes "$NUM_PREFIXES" \
    --prefix-repetition-output-len "$OUTPUT_LEN" --num-prompts "$NUM_PROMPTS" \
    --request-rate "$RATE" --seed 1 --metric-percentiles 50,99 \
    --result-dir "$OUT" --result-filename "$name.json" > "$OUT/bench-$name.log" 2>&1
  after=$(cache_counters "${urls[@]}")
  curl -s "$router_url/metrics" > "$OUT/router-$name.metrics"
  echo "$name $routing $n $before $after" >> "$OUT/runs.txt"
  cleanup
}

: > "$OUT/runs.txt"
run_setup one least-loaded $((cache_bytes * 2)) 1
run_setup kv-aware kv-aware "$cache_bytes" 2
run_setup least-loaded least-loaded "$cache_bytes" 2

"$PY" - "$OUT" <<'PYEOF' | tee "$OUT/table.md"
import json, sys
out = sys.argv[1]
rows = []
for line in open(f"{out}/runs.txt"):
    name, routing, n, q0, h0, q1, h1 = line.split()
    b = json.load(open(f"{out}/{name}.json"))
    hit = (float(h1) - float(h0)) / max(1.0, float(q1) - float(q0))
    rows.append((name, routing, n, hit, b["median_ttft_ms"], b["p99_ttft_ms"],
                 b["completed"], b["request_throughput"]))
print("| setup | routing | instances | hit rate | TTFT p50 ms | TTFT p99 ms | completed | req/s |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1%} | {r[4]:.1f} | {r[5]:.1f} | {r[6]} | {r[7]:.2f} |")
by = {r[0]: r for r in rows}
if "kv-aware" in by and "least-loaded" in by and "one" in by:
    print(f"\nkv-aware hit rate / one instance's: {by['kv-aware'][3] / max(1e-9, by['one'][3]):.2f}; "
          f"TTFT p50 least-loaded / kv-aware: {by['least-loaded'][4] / by['kv-aware'][4]:.2f}")
PYEOF
