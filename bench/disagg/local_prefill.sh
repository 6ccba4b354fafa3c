#!/usr/bin/env bash
# bench/disagg/local_prefill.sh: the measurement behind --local-prefill-max-tokens' default. Two
# `pdserve up` deployments of the same model (one prefill and one decode instance each) are up at
# once: "remote" sends every prompt to the prefill instance (--local-prefill-max-tokens -1),
# "local" computes every prompt on the decode instance (--local-prefill-max-tokens 1000000). For
# each uncached prompt length, on each deployment in turn, a foreground client sends prompts of
# that length one at a time (1 output token: the latency is the TTFT) while a background client
# keeps 2 decoding requests running (16-token prompts, 64 output tokens); prints the foreground's
# median TTFT and the background's mean TPOT (what a local prefill costs the requests decoding
# beside it) for both.
#
#   bench/disagg/local_prefill.sh [--model DIR] [--pdserve BIN] [--lengths "16 64 ..."]
#                                 [--prompts N] [--out DIR]
#
# Defaults: models/demo-llama, lengths 16 32 64 128 256 512, 8 foreground prompts per point.
# Random token ids: no prompt shares a prefix with another, so every token is uncached.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PDSERVE=$ROOT/build/pdserve
MODEL=$ROOT/models/demo-llama
LENGTHS="16 32 64 128 256 512"
PROMPTS=8
OUT=
PY=/usr/bin/python3

source "$(dirname "$0")/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --pdserve) PDSERVE=$2; shift 2 ;;
    --lengths) LENGTHS=$2; shift 2 ;;
    --prompts) PROMPTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "local_prefill: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
prepare local_prefill local-prefill

start remote --local-prefill-max-tokens -1; url_remote=$URL
start local --local-prefill-max-tokens 1000000; url_local=$URL

bench() {  # bench URL NAME INPUT_LEN OUTPUT_LEN NUM CONCURRENCY SEED
  "$PDSERVE" --log-level warn bench --base-url "$1" --result-dir "$OUT" --result-filename "$2.json" \
    --dataset-name random --random-input-len "$3" --random-output-len "$4" --ignore-eos \
    --num-prompts "$5" --max-concurrency "$6" --seed "$7" > "$OUT/$2.bench.log" 2>&1 ||
    { echo "local_prefill: $2 failed:" >&2; cat "$OUT/$2.bench.log" >&2; exit 1; }
}

bench "$url_remote" warm-remote 64 4 2 1 1
bench "$url_local" warm-local 64 4 2 1 1
for len in $LENGTHS; do
  for side in remote local; do
    if [ "$side" = remote ]; then url=$url_remote; else url=$url_local; fi
    bench "$url" "bg-$side-$len" 16 64 $((PROMPTS * 2)) 2 $((2000 + len)) &
    bg=$!
    bench "$url" "fg-$side-$len" "$len" 1 "$PROMPTS" 1 $((1000 + len))
    wait "$bg"
  done
done

"$PY" - "$OUT" "$LENGTHS" <<'PYEOF'
import json, sys
out, lengths = sys.argv[1], sys.argv[2].split()
def get(name, key):
    with open(f"{out}/{name}.json") as f:
        j = json.load(f)
    assert j["failed"] == 0 if "failed" in j else True, f"{name}: requests failed"
    return j[key]
print("uncached tokens | TTFT p50 remote | TTFT p50 local | co-running TPOT remote | local (ms)")
for n in lengths:
    print(f"{n:>15} | {get(f'fg-remote-{n}', 'median_ttft_ms'):15.2f} | "
          f"{get(f'fg-local-{n}', 'median_ttft_ms'):14.2f} | "
          f"{get(f'bg-remote-{n}', 'mean_tpot_ms'):22.2f} | {get(f'bg-local-{n}', 'mean_tpot_ms'):.2f}")
PYEOF
