# Shared by the bench/disagg scripts (sourced): the servers they start are stopped on exit or
# interrupt, free ports for a deployment, and waiting for a server's start line.
# Needs PY (a python3) set by the caller.

PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

# prepare NAME TMP: PDSERVE is built and MODEL a checkpoint (else exit 1, the message starting with
# NAME), and OUT a folder (a fresh /tmp/pdserve-TMP.XXXXXX when unset).
prepare() {
  [ -x "$PDSERVE" ] || { echo "$1: $PDSERVE is not built (make build)" >&2; exit 1; }
  [ -f "$MODEL/config.json" ] || { echo "$1: $MODEL/config.json is missing" >&2; exit 1; }
  [ -n "$OUT" ] || OUT=$(mktemp -d "/tmp/pdserve-$2.XXXXXX")
  mkdir -p "$OUT"
}

# The calling script's help: its header comment, less the first line.
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

# free_ports [N]: a base port P with P..P+N-1 free (default 4: the router, the prefill and the
# decode instance, one spare).
free_ports() {
  "$PY" - "${1:-4}" <<'PYEOF'
import random, socket, sys
for _ in range(200):
    p = random.randint(20000, 32000)  # below the ephemeral range (32768-)
    socks = []
    try:
        for q in range(p, p + int(sys.argv[1])):
            s = socket.socket(); s.bind(("127.0.0.1", q)); socks.append(s)
        print(p); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
PYEOF
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

# start NAME UP_FLAGS...: `pdserve up` of $MODEL (1 prefill + 1 decode instance, one thread each)
# in the background, logging to $OUT/up.NAME.log; sets URL and PORT once its router answers.
start() {
  local name=$1 port log
  shift
  port=$(free_ports)
  log=$OUT/up.$name.log
  "$PDSERVE" --log-level warn up --model "$MODEL" --prefill 1 --decode 1 --port "$port" \
    --threads 1 "$@" > "$log" 2>&1 &
  PIDS+=($!)
  wait_for "$log" "router (OpenAI API) on" $! > /dev/null || exit 1
  URL=http://127.0.0.1:$port
  PORT=$port
}
