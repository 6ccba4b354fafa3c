#!/usr/bin/env bash
# bench/disagg/recompute.sh: what recomputing a cached prefix on the prefill instance costs,
# against what sending its pages from the decode instance would cost. One `pdserve up` deployment
# (one prefill and one decode instance, every prompt sent to the prefill instance:
# --local-prefill-max-tokens -1). For each prefix length and pair, a fresh random prefix is sent
# once cold (both instances then hold it), and then two requests sharing it, in alternating order:
#   (a) both instances hold the prefix (P = H): the prefill instance computes only the suffix;
#   (b) the prefill instance was killed (`up` restarts it; a request of unrelated tokens then
#       reconnects it) so that its cache is empty while the decode instance's holds the prefix
#       (P = 0 < H): the prefill instance recomputes [0, H) and sends only [H, end).
# Each is the latency of a 1-token completion (its TTFT); beside it, the prefill instance's own
# time from the request to its last write (its kv_transfer_seconds). (c) is what sending the H
# cached pages would cost: `pdserve transfer-bench` over the same provider, with as many writes of
# the same size as the cold request's transfer used for H tokens (from the prefill instance's
# kv_transfer_* counters; the writes only, without the control round trip such a send needs).
# Prints per prefix length the medians of (a) and (b), (b) - (a) (the recompute cost), (c) and
# (b - a) / c. Every (a) and (b) is checked: one KV transfer, of no more tokens than the decode
# instance lacks, and the decode instance's cached_tokens covers the prefix.
# `up` restarts the killed instance with a growing backoff (0.5 s doubling to 30 s), so a run of
# the defaults takes a few minutes.
#
#   bench/disagg/recompute.sh [--model DIR] [--pdserve BIN] [--lengths "1024 2000"]
#                             [--pairs N] [--suffix-len N] [--out DIR]
#
# Defaults: models/demo-llama, prefixes of 1024 and 2000 tokens, 5 pairs, 32-token suffixes.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PDSERVE=$ROOT/build/pdserve
MODEL=$ROOT/models/demo-llama
LENGTHS="1024 2000"
PAIRS=5
SUFFIX=32
OUT=
PY=/usr/bin/python3

source "$(dirname "$0")/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --pdserve) PDSERVE=$2; shift 2 ;;
    --lengths) LENGTHS=$2; shift 2 ;;
    --pairs) PAIRS=$2; shift 2 ;;
    --suffix-len) SUFFIX=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "recompute: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
prepare recompute recompute

# The prefill instance is killed once per pair: `up` would give up after --max-restarts of
# those in a row.
start recompute --local-prefill-max-tokens -1 --max-restarts 1000
UP_PID=${PIDS[0]}

"$PY" - "$URL" "$UP_PID" "$PDSERVE" "$OUT" "$LENGTHS" "$PAIRS" "$SUFFIX" <<'PYEOF'
import json, os, random, re, signal, statistics, subprocess, sys, time, urllib.error
import urllib.request

url, up_pid, pdserve, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
lengths, pairs, suffix = [int(x) for x in sys.argv[5].split()], int(sys.argv[6]), int(sys.argv[7])
VOCAB = 2000  # below the demo model's special ids


def fail(msg):
    sys.exit(f"recompute: {msg}")


def prefill_instance():
    """(pid, port) of the prefill instance `up` runs now (a child of `up`)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == up_pid and "serve" in argv and "prefill" in argv:
            return int(pid), int(argv[argv.index("--port") + 1])
    return None


def get(u, timeout=5):
    with urllib.request.urlopen(u, timeout=timeout) as f:
        return f.status, f.read().decode()


def counters(port):
    _, text = get(f"http://127.0.0.1:{port}/metrics")
    want = ("kv_transfers_total", "kv_transfer_writes_total", "kv_transfer_kv_bytes_total",
            "kv_transfer_tokens_total", "kv_transfer_seconds_sum")
    c = {k: 0.0 for k in want}
    for line in text.splitlines():
        m = re.match(r"pdserve:(\w+)(\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) in c:
            c[m.group(1)] += float(m.group(3))
    return c


def delta_after(port, before):
    """The counters' change over one request, once the prefill instance counted its transfer
    (which it may do after the reply)."""
    deadline = time.monotonic() + 10
    while True:
        after = counters(port)
        d = {k: after[k] - before[k] for k in before}
        if d["kv_transfers_total"] > 0 or time.monotonic() > deadline:
            return d
        time.sleep(0.05)


def complete(prompt):
    """Latency (ms) of a 1-token completion and the usage it reports."""
    body = json.dumps({"prompt": prompt, "max_tokens": 1}).encode()
    req = urllib.request.Request(url + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=120) as f:
        j = json.load(f)
    return (time.monotonic() - t0) * 1e3, j["usage"]


def restart_prefill(rng, length):
    """Kills the prefill instance, waits for `up` to restart it and for a request to pass."""
    old = prefill_instance()
    if old is None:
        fail(f"no prefill instance among the children of up (pid {up_pid})")
    os.kill(old[0], signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = prefill_instance()
        if now and now[0] != old[0]:
            try:
                if get(f"http://127.0.0.1:{now[1]}/health")[0] == 200:
                    break
            except (OSError, urllib.error.URLError):
                pass
        time.sleep(0.1)
    else:
        fail("the prefill instance did not come back within 120 s")
    # Unrelated tokens of the same length: reconnects the decode instance to the new process and
    # warms it, without putting the shared prefix in its cache.
    warm = [rng.randrange(VOCAB) for _ in range(length)]
    while True:
        try:
            complete(warm)
            delta_after(now[1], counters(now[1]) | {"kv_transfers_total": 0.0})
            return now[1]
        except (OSError, urllib.error.URLError) as e:
            if time.monotonic() > deadline:
                fail(f"no request passed after the prefill instance restarted: {e}")
            time.sleep(0.2)


def transfer_ms(writes, bytes_per_write):
    """Best-of-5 time of `writes` strided writes of `bytes_per_write` (transfer-bench, 1 domain)."""
    cmd = [pdserve, "--log-level", "warn", "transfer-bench", "--json", "--repeats", "5",
           "--min-bytes", "4096", "--max-bytes", "4096", "--bytes-per-row", "65536",
           "--kv-layers", "1", "--kv-pages", str(writes), "--kv-page-bytes",
           str(2 * bytes_per_write)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"transfer-bench failed: {p.stderr.strip()}")
    rows = json.loads(p.stdout[p.stdout.index("{"):])["rows"]
    kv = [r for r in rows if r["workload"].startswith("kv") and r["domains"] == 1][0]
    return kv["bytes_per_write"] * kv["writes"] / (kv["fabric_gbytes_per_s"] * 1e9) * 1e3


rows, log = [], []
complete([7] * 64)  # connects the instances
for length in lengths:
    a, b, shape = [], [], None
    for i in range(pairs):
        rng = random.Random(length * 1000 + i)
        prefix = [rng.randrange(VOCAB) for _ in range(length)]
        suf = lambda: [rng.randrange(VOCAB) for _ in range(suffix)]
        port = prefill_instance()[1]
        c0 = counters(port)
        complete(prefix + suf())
        cold = delta_after(port, c0)
        shape = shape or cold
        for case in (("a", "b") if i % 2 == 0 else ("b", "a")):
            if case == "b":
                port = restart_prefill(rng, length + suffix)
            c0 = counters(port)
            ms, usage = complete(prefix + suf())
            d = delta_after(port, c0)
            held = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
            prefill_ms = d["kv_transfer_seconds_sum"] * 1e3
            log.append({"length": length, "pair": i, "case": case, "ms": ms, "decode_cached": held,
                        "prefill_ms": prefill_ms, "sent_tokens": d["kv_transfer_tokens_total"]})
            if d["kv_transfers_total"] != 1:
                fail(f"{length}/{i}/{case}: {d['kv_transfers_total']} KV transfers, not 1")
            if held < length - 16:
                fail(f"{length}/{i}/{case}: the decode instance held {held} tokens, not the prefix")
            if d["kv_transfer_tokens_total"] > length + suffix - held:
                fail(f"{length}/{i}/{case}: {d['kv_transfer_tokens_total']} tokens sent, more "
                     f"than the {length + suffix - held} decode lacks")
            (a if case == "a" else b).append((ms, prefill_ms))
            h = held
    # (c): the writes the cold transfer used per token, for the H tokens decode holds.
    page_writes = shape["kv_transfer_writes_total"] - shape["kv_transfers_total"]  # less metadata
    bytes_per_write = round(shape["kv_transfer_kv_bytes_total"] / page_writes)
    writes = round(h * shape["kv_transfer_kv_bytes_total"] / shape["kv_transfer_tokens_total"]
                   / bytes_per_write)
    c = transfer_ms(writes, bytes_per_write)
    ma, mb = (statistics.median(x[0] for x in a), statistics.median(x[0] for x in b))
    pa, pb = (statistics.median(x[1] for x in a), statistics.median(x[1] for x in b))
    rows.append((length, h, ma, mb, mb - ma, c, pa, pb, writes, bytes_per_write))

with open(f"{out}/requests.json", "w") as f:
    json.dump(log, f, indent=1)
print(f"recompute: {pairs} pairs per prefix, {suffix}-token suffixes, medians (ms); "
      f"every request in {out}/requests.json")
print("prefix | H tokens | TTFT (a) P = H | (b) P = 0 | (b) - (a) recompute | (c) send H |"
      " ratio | prefill to last write (a) | (b) | (c) writes x bytes")
for length, h, ma, mb, rc, c, pa, pb, writes, bpw in rows:
    print(f"{length:6} | {h:8} | {ma:14.2f} | {mb:9.2f} | {rc:19.2f} | {c:10.3f} | {rc / c:5.1f}"
          f" | {pa:25.2f} | {pb:5.2f} | {writes} x {bpw}")
PYEOF
