#!/usr/bin/env bash
# bench/disagg/run.sh: disaggregated (`pdserve up`: 1 prefill + 1 decode instance, the model threads
# of each pinned to its own core) against colocated (`pdserve serve`), the same `pdserve bench` workload on each,
# the reports side by side (bench/disagg/report.py).
#
#   bench/disagg/run.sh [--model DIR] [--pdserve BIN] [--scenario NAME] [--out DIR] [--quick]
#                       [--fabric-provider P] [--io-cpus auto|any|LIST] [--client-cpus auto|any]
#                       [--idle-poll-us N]
#
# Scenarios (default: all):
#   demo      a chat-like workload (sharegpt-like lengths scaled to this CPU, Poisson arrivals);
#             colocated uses both cores; TTFT, TPOT, ITL p50/p99 and goodput at the SLO.
#   low-load  one request at a time: the TTFT disaggregation adds over a colocated instance with
#             the prefill instance's resources (one core), against the goal "one layer's KV
#             transfer (measured with `pdserve transfer-bench`) plus one decode step"; in
#             alternating rounds, then in pairs (both up at once, requests alternating).
#   stall     long prompts arriving while others decode: colocated decode steps wait behind
#             prefill chunks; p99 ITL of the disaggregated deployment against colocated's.
#
# --fabric-provider: `up`'s libfabric provider (default tcp;ofi_rxm, the fabric over loopback;
# shm: one host, no TCP stack). --io-cpus: `up`'s CPUs for the instances' HTTP, fabric and KV
# messenger threads (default auto: those no prefill instance computes on).
# --idle-poll-us: `up`'s (default: up's own): an engine loop with a core to itself polls this
# long for work before it sleeps.
# --client-cpus (low-load): auto (default) runs the bench client (`bench --cpus`) on the core that
# is not running decode steps: disaggregated, the prefill instance's (CPU 0; not idle at the first
# token: the decode side starts on the last layer's KV while the prefill still computes that
# layer's MLP, ~4.5 ms more; perf sched shows the client's wake-up preempting it at once);
# colocated, the one its model thread does not use (CPU 1). any: the client unpinned.
# The model defaults to models/demo-qwen3-small (created with `pdserve make-model` if missing).
# Results (the bench JSON of every run and the instances' /metrics) go to --out.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PDSERVE=$ROOT/build/pdserve
MODEL=$ROOT/models/demo-qwen3-small
SCENARIO=all
OUT=
QUICK=0
PROVIDER="tcp;ofi_rxm"
IO_CPUS=auto
CLIENT_CPUS=auto
IDLE_POLL=
PY=/usr/bin/python3

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --pdserve) PDSERVE=$2; shift 2 ;;
    --scenario) SCENARIO=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --fabric-provider) PROVIDER=$2; shift 2 ;;
    --fabric-provider=*) PROVIDER=${1#*=}; shift ;;
    --io-cpus) IO_CPUS=$2; shift 2 ;;
    --io-cpus=*) IO_CPUS=${1#*=}; shift ;;
    --idle-poll-us) IDLE_POLL=$2; shift 2 ;;
    --idle-poll-us=*) IDLE_POLL=${1#*=}; shift ;;
    --client-cpus) CLIENT_CPUS=$2; shift 2 ;;
    --client-cpus=*) CLIENT_CPUS=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench/disagg: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$SCENARIO" in demo | low-load | stall | all) ;;
  *) echo "bench/disagg: --scenario must be demo, low-load, stall or all (got '$SCENARIO')" >&2; exit 2 ;;
esac
case "$CLIENT_CPUS" in auto | any) ;;
  *) echo "bench/disagg: --client-cpus must be auto or any (got '$CLIENT_CPUS')" >&2; exit 2 ;;
esac
[ -x "$PDSERVE" ] || { echo "bench/disagg: $PDSERVE is not built (make build)" >&2; exit 1; }
[ -x "$PY" ] || { echo "bench/disagg: $PY is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
if [ ! -f "$MODEL/config.json" ]; then
  echo "bench/disagg: creating $MODEL (qwen3 'small' preset, bf16, random weights)"
  "$PDSERVE" --log-level warn make-model --arch qwen3 --preset small --dtype bf16 --seed 1 --out "$MODEL"
fi
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/pdserve-disagg.XXXXXX)
mkdir -p "$OUT"
NCPU=$(nproc)
PROVIDER_FLAGS=()
[ "$PROVIDER" = "tcp;ofi_rxm" ] || PROVIDER_FLAGS=(--fabric-provider "$PROVIDER")
[ "$IO_CPUS" = auto ] || PROVIDER_FLAGS+=(--io-cpus "$IO_CPUS")
[ -z "$IDLE_POLL" ] || PROVIDER_FLAGS+=(--idle-poll-us "$IDLE_POLL")

PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

# A base port P with P..P+3 free (the router, the prefill and the decode instance).
free_ports() {
  "$PY" - <<'EOF'
import random, socket
for _ in range(200):
    p = random.randint(20000, 32000)  # below the ephemeral range (32768-)
    try:
        socks = []
        for q in range(p, p + 4):
            s = socket.socket(); s.bind(("127.0.0.1", q)); socks.append(s)
        print(p); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
EOF
}

# wait_for LOG PATTERN PID: until LOG has a line matching PATTERN (prints it), or PID is gone.
wait_for() {
  local log=$1 pattern=$2 pid=$3 i
  for i in $(seq 1 3000); do
    if grep -q "$pattern" "$log" 2>/dev/null; then grep -m1 "$pattern" "$log"; return 0; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "bench/disagg: the server did not start; its log ($log):" >&2
  cat "$log" >&2
  return 1
}

# start_disagg: `pdserve up` with one prefill and one decode instance, each pinned to its own core.
start_disagg() {
  local port log
  port=$(free_ports)
  log=$OUT/up.$RUN.log
  "$PDSERVE" --log-level warn up --model "$MODEL" --prefill 1 --decode 1 --port "$port" \
    --threads 1 --pin-cores "${PROVIDER_FLAGS[@]}" "$@" > "$log" 2>&1 &
  PIDS+=($!)
  wait_for "$log" "router (OpenAI API) on" $! > /dev/null
  URL=http://127.0.0.1:$port
  METRICS_URLS="prefill=http://127.0.0.1:$((port + 1))/metrics decode=http://127.0.0.1:$((port + 2))/metrics"
}

# start_colocated CORES THREADS: `pdserve serve` with its model threads on the given cores (its
# HTTP threads unpinned, as `up --pin-cores` leaves each instance's HTTP/fabric/messenger threads).
start_colocated() {
  local cores=$1 threads=$2 log line
  shift 2
  log=$OUT/serve.$RUN.log
  "$PDSERVE" --log-level warn serve --model "$MODEL" --port 0 --compute-cpus "$cores" \
    --threads "$threads" "$@" > "$log" 2>&1 &
  PIDS+=($!)
  line=$(wait_for "$log" "on http://127.0.0.1:" $!)
  URL=$(echo "$line" | sed -n 's|.*on \(http://127.0.0.1:[0-9]*\).*|\1|p')
  METRICS_URLS="colocated=$URL/metrics"
}

# start_router: `pdserve router` in front of $URL (as `up` puts it in front of its decode
# instances); URL becomes the router's.
start_router() {
  local port log
  port=$(free_ports)
  log=$OUT/router.$RUN.log
  "$PDSERVE" --log-level warn router --decode "$URL" --port "$port" > "$log" 2>&1 &
  PIDS+=($!)
  wait_for "$log" "router on http" $! > /dev/null
  URL=http://127.0.0.1:$port
}

save_metrics() {
  local kv name url
  for kv in $METRICS_URLS; do
    name=${kv%%=*}
    url=${kv#*=}
    curl -s --max-time 10 "$url" > "$OUT/$RUN.$name.metrics" || true
  done
}

# bench_once NAME BENCH_FLAGS...: one `pdserve bench` against $URL, saved as $OUT/NAME.json; the
# servers stay up.
bench_once() {
  local name=$1
  shift
  "$PDSERVE" --log-level warn bench --base-url "$URL" --result-dir "$OUT" \
    --result-filename "$name.json" --metric-percentiles 50,90,99 "$@" > "$OUT/$name.bench.log" 2>&1 ||
    { echo "bench/disagg: $name failed:" >&2; cat "$OUT/$name.bench.log" >&2; exit 1; }
}

# run_bench NAME BENCH_FLAGS...: bench_once, then the servers' /metrics saved and the servers
# stopped.
run_bench() {
  echo "bench/disagg: $1: pdserve bench ${*:2}"
  bench_once "$@"
  save_metrics
  cleanup
}

both_cores=0-$((NCPU > 1 ? 1 : 0))
threads2=$((NCPU > 1 ? 2 : 1))
n() { if [ "$QUICK" = 1 ]; then echo "$2"; else echo "$1"; fi; }

if [ "$SCENARIO" = demo ] || [ "$SCENARIO" = all ]; then
  DEMO_FLAGS=(--dataset-name sharegpt-like --length-scale 0.25 --num-prompts "$(n 100 40)"
    --request-rate 4 --seed 1 --ignore-eos --goodput ttft:200 tpot:20)
  RUN=demo-disagg; start_disagg; run_bench demo-disagg "${DEMO_FLAGS[@]}"
  RUN=demo-colocated; start_colocated "$both_cores" "$threads2"; run_bench demo-colocated "${DEMO_FLAGS[@]}"
  "$PY" "$ROOT/bench/disagg/report.py" side-by-side --title "chat-like workload (demo): goodput at SLO TTFT <= 200 ms, TPOT <= 20 ms" \
    "$OUT/demo-disagg.json" "disaggregated 1P+1D (1 core each)" \
    "$OUT/demo-colocated.json" "colocated (2 cores)"
fi

if [ "$SCENARIO" = low-load ] || [ "$SCENARIO" = all ]; then
  LOW_BASE=(--dataset-name random --random-input-len 512 --random-output-len 16 --max-concurrency 1
    --ignore-eos)
  LOW_FLAGS=("${LOW_BASE[@]}" --num-prompts "$(n 30 10)" --seed 2)
  # Rounds alternate disaggregated and colocated, so drift on a shared machine hits both alike;
  # the report takes the median over rounds of each round's TTFT p50. The disaggregated and
  # colocated runs are traced (--trace) for bench/disagg/stages.py's per-stage table.
  # The bench client on the core not running decode steps (--client-cpus auto): else, woken onto
  # the decode core, it waits behind the decode compute thread for its first token.
  client_d=() client_c=()
  if [ "$CLIENT_CPUS" = auto ] && [ "$NCPU" -gt 1 ]; then
    client_d=(--cpus 0) client_c=(--cpus 1)
    echo "bench/disagg: low-load clients: disaggregated on CPU 0 (the prefill instance's core)," \
      "colocated on CPU 1 (the core its model thread does not use)"
  else
    echo "bench/disagg: low-load clients: not pinned"
  fi
  low_d=() low_c=() low_r=() low_dt=() low_ct=()
  for r in $(seq "$(n 3 2)"); do
    RUN=low-disagg$r; start_disagg --trace "$OUT/low-disagg$r.trace.json"
    run_bench low-disagg$r "${LOW_FLAGS[@]}" "${client_d[@]}"
    RUN=low-colocated$r; start_colocated 0 1 --trace "$OUT/low-colocated$r.trace.json"
    run_bench low-colocated$r "${LOW_FLAGS[@]}" "${client_c[@]}"
    RUN=low-routed$r; start_colocated 0 1; start_router
    run_bench low-routed$r "${LOW_FLAGS[@]}" "${client_c[@]}"
    low_d+=("$OUT/low-disagg$r.json") low_c+=("$OUT/low-colocated$r.json")
    low_r+=("$OUT/low-routed$r.json")
    low_dt+=("$OUT/low-disagg$r.trace") low_ct+=("$OUT/low-colocated$r.trace")
  done
  # Paired: both deployments up at once and the requests alternating between them one at a time
  # (prompt i to each, the first side alternating), so the host's drift, which moves a whole
  # round by up to ~15 ms, hits both sides of a pair alike; the median of the per-prompt TTFT
  # differences. The servers stay up across the pairs (bench_once, not run_bench).
  RUN=low-pair-disagg; start_disagg --trace "$OUT/low-pair-disagg.trace.json"; url_d=$URL
  RUN=low-pair-colocated; start_colocated 0 1 --trace "$OUT/low-pair-colocated.trace.json"; url_c=$URL
  pair_d=() pair_c=()
  for i in $(seq "$(n 40 12)"); do
    for side in $([ $((i % 2)) = 1 ] && echo "d c" || echo "c d"); do
      if [ "$side" = d ]; then
        URL=$url_d bench_once low-pair-d$i "${LOW_BASE[@]}" --num-prompts 1 --seed $((1000 + i)) "${client_d[@]}"
        pair_d+=("$OUT/low-pair-d$i.json")
      else
        URL=$url_c bench_once low-pair-c$i "${LOW_BASE[@]}" --num-prompts 1 --seed $((1000 + i)) "${client_c[@]}"
        pair_c+=("$OUT/low-pair-c$i.json")
      fi
    done
  done
  cleanup
  # One layer's KV of a 512-token prompt, written over the fabric as transfer-bench measures it.
  layer_bytes=$("$PY" "$ROOT/bench/disagg/report.py" layer-bytes "$OUT/low-disagg1.prefill.metrics" "$MODEL")
  "$PDSERVE" --log-level warn transfer-bench --min-bytes "$layer_bytes" --max-bytes "$layer_bytes" \
    --bytes-per-row $((layer_bytes * 64)) --repeats 5 --json > "$OUT/low-transfer.json"
  echo "bench/disagg: low-load: up --fabric-provider $PROVIDER --io-cpus $IO_CPUS" \
    "--idle-poll-us ${IDLE_POLL:-default}, --client-cpus $CLIENT_CPUS"
  "$PY" "$ROOT/bench/disagg/report.py" low-load "$(IFS=,; echo "${low_d[*]}")" \
    "$(IFS=,; echo "${low_c[*]}")" "$OUT/low-transfer.json" "$layer_bytes" \
    "$(IFS=,; echo "${low_r[*]}")"
  "$PY" "$ROOT/bench/disagg/report.py" low-load-paired "$(IFS=,; echo "${pair_d[*]}")" \
    "$(IFS=,; echo "${pair_c[*]}")" "$OUT/low-transfer.json" "$layer_bytes"
  "$PY" "$ROOT/bench/disagg/stages.py" paired-steps "$OUT/low-pair-disagg.trace" \
    "$OUT/low-pair-colocated.trace" || echo "bench/disagg: stages.py paired-steps failed" >&2
  # Where the time goes (bench/disagg/stages.py on the traces), and the added TTFT with the
  # prefill step's run-to-run variation taken out.
  "$PY" "$ROOT/bench/disagg/stages.py" overhead "$(IFS=,; echo "${low_dt[*]}")" \
    "$(IFS=,; echo "${low_ct[*]}")" "$(IFS=,; echo "${low_d[*]}")" "$(IFS=,; echo "${low_c[*]}")" ||
    echo "bench/disagg: stages.py overhead failed (traces in $OUT)" >&2
  echo "bench/disagg: per-stage table of round 1 (disaggregated):"
  "$PY" "$ROOT/bench/disagg/stages.py" disagg "$OUT/low-disagg1.trace.router.json" \
    "$OUT/low-disagg1.trace.decode0.json" "$OUT/low-disagg1.trace.prefill0.json" \
    "$OUT/low-disagg1.json" || echo "bench/disagg: stages.py disagg failed" >&2
  echo "bench/disagg: per-stage table of round 1 (colocated):"
  "$PY" "$ROOT/bench/disagg/stages.py" colocated "$OUT/low-colocated1.trace.json" \
    "$OUT/low-colocated1.json" || echo "bench/disagg: stages.py colocated failed" >&2
fi

if [ "$SCENARIO" = stall ] || [ "$SCENARIO" = all ]; then
  STALL_FLAGS=(--dataset-name random --random-input-len 1536 --random-output-len 64
    --random-range-ratio 0.5 --num-prompts "$(n 60 24)" --request-rate 1.5 --seed 3 --ignore-eos)
  RUN=stall-disagg; start_disagg; run_bench stall-disagg "${STALL_FLAGS[@]}"
  RUN=stall-colocated; start_colocated "$both_cores" "$threads2"; run_bench stall-colocated "${STALL_FLAGS[@]}"
  "$PY" "$ROOT/bench/disagg/report.py" side-by-side --title "prefills arriving during decodes (stall)" \
    "$OUT/stall-disagg.json" "disaggregated 1P+1D (1 core each)" \
    "$OUT/stall-colocated.json" "colocated (2 cores)"
fi
echo "bench/disagg: results in $OUT"
