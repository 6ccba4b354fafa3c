#!/usr/bin/env bash
# bench/disagg/checksum_ttft.sh: the TTFT that --kv-checksum adds to a disaggregated request. Two
# `pdserve up` deployments of the same model (one prefill and one decode instance each), one of
# them with --kv-checksum, are up at once; prompts go one at a time, alternating between them
# (prompt i to both, the first side alternating), so the host's drift hits both sides of a pair
# alike. Prints the median TTFT of each side and the median of the per-prompt differences, and,
# from both deployments' traces (--trace), what the checksums cost directly: the decode instance's
# check of a request ("kv checksum", on the path to its first token) and the prefill instance's
# "post writes" per layer and chunk (with the checksum: that chunk's CRC, after its writes are
# posted) on each side.
#
#   bench/disagg/checksum_ttft.sh [--model DIR] [--pdserve BIN] [--input-len N] [--pairs N]
#                                 [--out DIR] [--control]
#
# Defaults: models/demo-llama, 2048-token prompts (random token ids), 20 pairs, 4 output tokens.
# --control: neither deployment gets --kv-checksum (an A/A run): the per-pair difference it
# prints is what the host's noise alone gives, the resolution of the A/B run.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PDSERVE=$ROOT/build/pdserve
MODEL=$ROOT/models/demo-llama
INPUT_LEN=2048
PAIRS=20
OUT=
CONTROL=0
PY=/usr/bin/python3

source "$(dirname "$0")/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --pdserve) PDSERVE=$2; shift 2 ;;
    --input-len) INPUT_LEN=$2; shift 2 ;;
    --pairs) PAIRS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --control) CONTROL=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "checksum_ttft: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
prepare checksum_ttft checksum


# Every prompt's KV crosses the wire (--local-prefill-max-tokens -1), whatever --input-len says.
start plain --local-prefill-max-tokens -1 --trace "$OUT/plain.json"; url_plain=$URL
if [ "$CONTROL" = 1 ]; then FLAG=(); else FLAG=(--kv-checksum); fi
start checksum --local-prefill-max-tokens -1 "${FLAG[@]}" --trace "$OUT/checksum.json"
url_checksum=$URL; port_checksum=$PORT

bench_once() {  # bench_once URL NAME SEED
  "$PDSERVE" --log-level warn bench --base-url "$1" --result-dir "$OUT" --result-filename "$2.json" \
    --dataset-name random --random-input-len "$INPUT_LEN" --random-output-len 4 --ignore-eos \
    --num-prompts 1 --max-concurrency 1 --seed "$3" > "$OUT/$2.bench.log" 2>&1 ||
    { echo "checksum_ttft: $2 failed:" >&2; cat "$OUT/$2.bench.log" >&2; exit 1; }
}

bench_once "$url_plain" warm-plain 1
bench_once "$url_checksum" warm-checksum 1
for i in $(seq "$PAIRS"); do
  if [ $((i % 2)) = 1 ]; then sides="plain checksum"; else sides="checksum plain"; fi
  for side in $sides; do
    if [ "$side" = plain ]; then url=$url_plain; else url=$url_checksum; fi
    bench_once "$url" "$side$i" $((1000 + i))
  done
done
# The decode instance of `up` listens on the router's port + 2.
curl -s "http://127.0.0.1:$((port_checksum + 2))/metrics" > "$OUT/checksum.decode.metrics" || true
cleanup  # the instances write their traces as they stop

"$PY" - "$OUT" "$PAIRS" "$INPUT_LEN" "$CONTROL" <<'PYEOF'
import json, statistics, sys
out, pairs, input_len, control = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
def ttft(name):
    with open(f"{out}/{name}.json") as f:
        j = json.load(f)
    assert j["completed"] == 1, f"{name}: request failed"
    return j["mean_ttft_ms"]
plain = [ttft(f"plain{i}") for i in range(1, pairs + 1)]
check = [ttft(f"checksum{i}") for i in range(1, pairs + 1)]
diff = [c - p for c, p in zip(check, plain)]
def durations_us(side, instance, name):
    try:
        with open(f"{out}/{side}.{instance}.json") as f:
            j = json.load(f)
    except OSError:
        return []
    events = j["traceEvents"] if isinstance(j, dict) else j
    return [e["dur"] for e in events if e.get("ph") == "X" and e.get("name") == name]
def median(xs):
    return f"{statistics.median(xs):8.1f}" if xs else "     n/a"
label = "control (A/A: neither side checks)" if control else "A/B"
print(f"checksum_ttft: {pairs} pairs of {input_len}-token prompts, {label}")
print(f"  median TTFT without --kv-checksum: {statistics.median(plain):8.2f} ms")
print(f"  median TTFT with    --kv-checksum: {statistics.median(check):8.2f} ms")
print(f"  median per-pair difference:        {statistics.median(diff):+8.2f} ms")
print(f"  decode 'kv checksum' per request:  {median(durations_us('checksum', 'decode0', 'kv checksum'))} us")
print(f"  prefill 'post writes' without:     {median(durations_us('plain', 'prefill0', 'post writes'))} us")
print(f"  prefill 'post writes' with:        {median(durations_us('checksum', 'prefill0', 'post writes'))} us")
try:
    for line in open(f"{out}/checksum.decode.metrics"):
        if line.startswith("pdserve:kv_transfer_checksum_mismatch_total"):
            print("  decode instance:", line.strip())
except OSError:
    pass
PYEOF
