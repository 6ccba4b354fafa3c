#!/usr/bin/env bash
# bench/disagg/goodput.sh: goodput per core of disaggregated (`pdserve up`: 1 prefill + 1 decode
# instance, each pinned to its own core) and colocated (`pdserve serve` on both cores, chunked
# prefill: --max-num-batched-tokens per step) serving, found by `pdserve bench --goodput-search`
# (doubling/halving from --start-rate, no lower than --min-rate, to a bracket, then bisection to
# --precision), per scenario and per SLO setting (a tight TPOT SLO where prefill interference
# matters, and a loose one),
# each repeated --repeats times: the median goodput per core with the spread (min..max). Each rate
# sends --num-prompts requests, or rate x --min-duration when more (a short burst at a high rate
# would otherwise fit within the SLOs and overstate goodput).
#
#   bench/disagg/goodput.sh [--model DIR] [--pdserve BIN] [--scenario chat|prefill-heavy|all]
#                           [--repeats N] [--num-prompts N] [--ttft MS] [--tpot-tight MS]
#                           [--tpot-loose MS] [--start-rate R] [--min-rate R] [--precision P]
#                           [--min-duration S] [--chunk TOKENS] [--out DIR]
#
# Scenarios: chat (sharegpt-like lengths x 0.25); prefill-heavy (longbench-like lengths x 0.25:
# long prompts, short outputs, as DistServe's summarization workload). Every search's rates
# document (pdserve-bench-rates-v1: the attainment curve it walked) goes to --out.
# Beside each measured goodput, the planner's prediction for the same deployment: `pdserve
# profile --quick` of this machine (1 thread on core 0 for `up`'s instances, 2 threads on both
# cores for colocated), then `pdserve simulate --hardware cpu` over the lengths the searches sent
# (the rates document's prompt_lens / output_lens), at the same SLOs. Reported, not asserted.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PDSERVE=$ROOT/build/pdserve
MODEL=$ROOT/models/demo-llama
SCENARIO=all
REPEATS=3
NUM_PROMPTS=60
TTFT=200
TPOT_TIGHT=2
TPOT_LOOSE=20
START_RATE=4
MIN_RATE=0.25
PRECISION=0.1
MIN_DURATION=10
CHUNK=512
OUT=
PY=/usr/bin/python3

source "$(dirname "$0")/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --pdserve) PDSERVE=$2; shift 2 ;;
    --scenario) SCENARIO=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --num-prompts) NUM_PROMPTS=$2; shift 2 ;;
    --ttft) TTFT=$2; shift 2 ;;
    --tpot-tight) TPOT_TIGHT=$2; shift 2 ;;
    --tpot-loose) TPOT_LOOSE=$2; shift 2 ;;
    --start-rate) START_RATE=$2; shift 2 ;;
    --min-rate) MIN_RATE=$2; shift 2 ;;
    --precision) PRECISION=$2; shift 2 ;;
    --chunk) CHUNK=$2; shift 2 ;;
    --min-duration) MIN_DURATION=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench/disagg: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$SCENARIO" in chat | prefill-heavy | all) ;;
  *) echo "bench/disagg: --scenario must be chat, prefill-heavy or all (got '$SCENARIO')" >&2; exit 2 ;;
esac
prepare bench/disagg goodput
NCPU=$(nproc)
both_cores=0-$((NCPU > 1 ? 1 : 0))
threads2=$((NCPU > 1 ? 2 : 1))


start_disagg() {
  local port log
  port=$(free_ports)
  log=$OUT/$RUN.up.log
  # Every prompt goes to the prefill instance: the goodput of the split itself.
  "$PDSERVE" --log-level warn up --model "$MODEL" --prefill 1 --decode 1 --port "$port" \
    --threads 1 --pin-cores --local-prefill-max-tokens -1 > "$log" 2>&1 &
  PIDS+=($!)
  wait_for "$log" "router (OpenAI API) on" $! > /dev/null
  URL=http://127.0.0.1:$port
}

start_colocated() {
  local log line
  log=$OUT/$RUN.serve.log
  "$PDSERVE" --log-level warn serve --model "$MODEL" --port 0 --compute-cpus "$both_cores" \
    --threads "$threads2" --max-num-batched-tokens "$CHUNK" > "$log" 2>&1 &
  PIDS+=($!)
  line=$(wait_for "$log" "on http://127.0.0.1:" $!)
  URL=$(echo "$line" | sed -n 's|.*on \(http://127.0.0.1:[0-9]*\).*|\1|p')
}

# search NAME TPOT_MS DATASET_FLAGS...: the goodput search against $URL into $OUT/NAME.json.
search() {
  local name=$1 tpot=$2
  shift 2
  echo "bench/disagg: $name: goodput search, TTFT <= ${TTFT} ms, TPOT <= ${tpot} ms"
  "$PDSERVE" --log-level warn bench --base-url "$URL" --result-dir "$OUT" \
    --result-filename "$name.json" --num-prompts "$NUM_PROMPTS" --seed 1 --ignore-eos \
    --goodput-search "ttft:${TTFT}ms" "tpot:${tpot}ms" --devices 2 \
    --request-rate "$START_RATE" --precision "$PRECISION" --min-rate "$MIN_RATE" \
    --min-duration "$MIN_DURATION" "$@" > "$OUT/$name.bench.log" 2>&1 ||
    { echo "bench/disagg: $name failed:" >&2; cat "$OUT/$name.bench.log" >&2; exit 1; }
  grep "^goodput at" "$OUT/$name.bench.log" || true
}

scenarios=()
[ "$SCENARIO" = all ] || [ "$SCENARIO" = chat ] && scenarios+=(chat)
[ "$SCENARIO" = all ] || [ "$SCENARIO" = prefill-heavy ] && scenarios+=(prefill-heavy)
for sc in "${scenarios[@]}"; do
  case "$sc" in
    chat) FLAGS=(--dataset-name sharegpt-like --length-scale 0.25) ;;
    prefill-heavy) FLAGS=(--dataset-name longbench-like --length-scale 0.25) ;;
  esac
  for slo in tight loose; do
    tpot=$([ "$slo" = tight ] && echo "$TPOT_TIGHT" || echo "$TPOT_LOOSE")
    for r in $(seq "$REPEATS"); do
      # Alternating which deployment goes first, so drift on a shared host hits both alike.
      order=$([ $((r % 2)) = 1 ] && echo "disagg colocated" || echo "colocated disagg")
      for dep in $order; do
        RUN=$sc-$slo-$dep-$r
        if [ "$dep" = disagg ]; then start_disagg; else start_colocated; fi
        search "$RUN" "$tpot" "${FLAGS[@]}"
        cleanup
      done
    done
  done
done

# The planner's predictions: a latency model per deployment, then simulate at each SLO.
PIN1=() PIN2=()
if command -v taskset > /dev/null; then PIN1=(taskset -c 0) PIN2=(taskset -c "$both_cores"); fi
"${PIN1[@]}" "$PDSERVE" --log-level warn profile --model "$MODEL" --threads 1 --quick \
  --out "$OUT/profile-1thread.json" > "$OUT/profile-1thread.log" 2>&1
"${PIN2[@]}" "$PDSERVE" --log-level warn profile --model "$MODEL" --threads "$threads2" --quick \
  --out "$OUT/profile-2threads.json" > "$OUT/profile-2threads.log" 2>&1
SIM=(--model "$MODEL" --hardware cpu --nodes 1 --devices-per-node 2 --ttft "$(awk -v t="$TTFT" 'BEGIN { print t / 1000 }')")
for sc in "${scenarios[@]}"; do
  "$PY" -c 'import json, sys
j = json.load(open(sys.argv[1]))
print("prompt_len,output_len")
for p, o in zip(j["prompt_lens"], j["output_lens"]): print(f"{p},{o}")' \
    "$OUT/$sc-tight-disagg-1.json" > "$OUT/$sc-lengths.csv"
  for slo in tight loose; do
    tpot=$([ "$slo" = tight ] && echo "$TPOT_TIGHT" || echo "$TPOT_LOOSE")
    tpot_s=$(awk -v t="$tpot" 'BEGIN { print t / 1000 }')
    "$PDSERVE" --log-level warn simulate "${SIM[@]}" --tpot "$tpot_s" --lengths "$OUT/$sc-lengths.csv" \
      --profile "$OUT/profile-1thread.json" --prefill 1x1 --decode 1x1 --same-node \
      > "$OUT/$sc-$slo-sim-disagg.txt" 2>&1 || echo "bench/disagg: simulate failed ($OUT/$sc-$slo-sim-disagg.txt)" >&2
    "$PDSERVE" --log-level warn simulate "${SIM[@]}" --tpot "$tpot_s" --lengths "$OUT/$sc-lengths.csv" \
      --profile "$OUT/profile-2threads.json" --colocated 1x1 --chunked \
      > "$OUT/$sc-$slo-sim-colocated.txt" 2>&1 || echo "bench/disagg: simulate failed ($OUT/$sc-$slo-sim-colocated.txt)" >&2
  done
done

"$PY" - "$OUT" "$REPEATS" "$TTFT" "$TPOT_TIGHT" "$TPOT_LOOSE" "${scenarios[@]}" <<'PYEOF'
import json, os, re, statistics, sys

def simulated(path):
    """The simulator's goodput per core (2 cores) from `pdserve simulate`'s output, or None."""
    try:
        m = re.search(r"goodput at \S+ attainment: ([0-9.]+) req/s", open(path).read())
    except OSError:
        return None
    return float(m.group(1)) / 2 if m else None

def sim_text(v):
    return "-" if v is None else f"{v:.3f}"

out, repeats, ttft, tight, loose = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
print(f"\ngoodput per core (req/s per core, 2 cores each; median of {repeats}, min..max); "
      f"SLO TTFT <= {ttft} ms, attainment 90%")
print(f"{'scenario':<14} {'TPOT SLO':>9} {'disaggregated 1P+1D':>26} {'sim':>6} "
      f"{'colocated (chunked)':>26} {'sim':>6} {'ratio':>6} {'sim':>6}")
for sc in sys.argv[6:]:
    for slo, tpot in (("tight", tight), ("loose", loose)):
        cells, med, sim = [], {}, {}
        for dep in ("disagg", "colocated"):
            vals = []
            for r in range(1, repeats + 1):
                g = json.load(open(os.path.join(out, f"{sc}-{slo}-{dep}-{r}.json")))["goodput"]
                vals.append(g["goodput_per_device"])
            med[dep] = statistics.median(vals)
            cells.append(f"{med[dep]:.3f} ({min(vals):.3f}..{max(vals):.3f})")
            sim[dep] = simulated(os.path.join(out, f"{sc}-{slo}-sim-{dep}.txt"))
        ratio = med["disagg"] / med["colocated"] if med["colocated"] > 0 else float("inf")
        sim_ratio = (sim["disagg"] / sim["colocated"]
                     if sim["disagg"] is not None and sim["colocated"] else None)
        print(f"{sc:<14} {tpot + ' ms':>9} {cells[0]:>26} {sim_text(sim['disagg']):>6} "
              f"{cells[1]:>26} {sim_text(sim['colocated']):>6} {ratio:>6.2f} "
              f"{'-' if sim_ratio is None else f'{sim_ratio:.2f}':>6}")
print("sim: the planner's simulate prediction from a `pdserve profile --quick` of this machine")
PYEOF
echo "bench/disagg: results in $OUT"
