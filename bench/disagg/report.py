#!/usr/bin/python3
"""Reports of bench/disagg/run.sh, from `pdserve bench` result JSON files.

  report.py side-by-side --title T A.json "label A" B.json "label B"
  report.py layer-bytes PREFILL.metrics MODEL_DIR
  report.py low-load DISAGG.json[,...] COLOCATED.json[,...] TRANSFER.json LAYER_BYTES
            [ROUTED.json[,...]]   (colocated behind `pdserve router`: the router's own share)
  report.py low-load-paired DISAGG.json,... COLOCATED.json,... TRANSFER.json LAYER_BYTES
            (pair i: the same one-request run on each side, back to back)
"""
import json
import os
import re
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


ROWS = [
    ("completed / failed", lambda r: f"{r['completed']} / {r['failed']}"),
    ("request throughput (req/s)", lambda r: fmt(r.get("request_throughput"))),
    ("goodput (req/s)", lambda r: fmt(r.get("request_goodput"))),
    ("SLO attainment (%)", lambda r: fmt(100 * r["slo_attainment"], 1)
     if r.get("slo_attainment") is not None else "-"),
]
for metric in ("ttft", "tpot", "itl"):
    for p in ("median", "p99"):
        key = f"{p}_{metric}_ms"
        label = f"{metric.upper()} {'p50' if p == 'median' else p} (ms)"
        ROWS.append((label, lambda r, key=key: fmt(r.get(key))))


def side_by_side(args):
    if len(args) != 6 or args[0] != "--title":
        sys.exit("usage: report.py side-by-side --title T A.json 'label A' B.json 'label B'")
    title, a_path, a_label, b_path, b_label = args[1:]
    a, b = load(a_path), load(b_path)
    w0, w1, w2 = 28, max(len(a_label), 12), max(len(b_label), 12)
    print(f"\n== {title}")
    print(f"{'':{w0}}  {a_label:>{w1}}  {b_label:>{w2}}  {'ratio':>7}")
    for label, get in ROWS:
        va, vb = get(a), get(b)
        ratio = "-"
        try:
            fa, fb = float(va), float(vb)
            if fb != 0:
                ratio = f"{fa / fb:.2f}"
        except ValueError:
            pass
        print(f"{label:{w0}}  {va:>{w1}}  {vb:>{w2}}  {ratio:>7}")


def metric_value(text, name):
    m = re.search(r"^" + re.escape(name) + r"(\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", text, re.M)
    return float(m.group(2)) if m else None


def layer_bytes(args):
    if len(args) != 2:
        sys.exit("usage: report.py layer-bytes PREFILL.metrics MODEL_DIR")
    with open(args[0]) as f:
        text = f.read()
    total = metric_value(text, "pdserve:kv_transfer_bytes_total")
    count = metric_value(text, "pdserve:kv_transfers_total")
    if not total or not count:
        sys.exit(f"report.py: {args[0]} has no completed KV transfers "
                 "(pdserve:kv_transfer_bytes_total / pdserve:kv_transfers_total)")
    layers = load(os.path.join(args[1], "config.json"))["num_hidden_layers"]
    print(int(total / count / layers))


def layer_goal(transfer_path, step_ms):
    """The goal: one layer's KV transfer (transfer-bench's p50 write) plus one decode step (ms)."""
    t = load(transfer_path)
    rows = [r for r in t["rows"] if r["workload"] == "pages" and r["domains"] == 1]
    if not rows:
        sys.exit(f"report.py: {transfer_path} has no single-domain 'pages' row")
    layer_ms = rows[0]["p50_us"] / 1000.0
    return layer_ms, layer_ms + step_ms


def quantile(values, q):
    """The q-quantile of values by linear interpolation between order statistics."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def low_load_paired(args):
    if len(args) != 4:
        sys.exit("usage: report.py low-load-paired DISAGG.json,... COLOCATED.json,... "
                 "TRANSFER.json LAYER_BYTES")
    ds = [load(p) for p in args[0].split(",")]
    cs = [load(p) for p in args[1].split(",")]
    if len(ds) != len(cs) or not ds:
        sys.exit(f"report.py: {len(ds)} disaggregated runs but {len(cs)} colocated ones")
    for r in ds + cs:
        if r["completed"] != 1 or r["failed"] != 0:
            sys.exit(f"report.py: a paired run completed {r['completed']} and failed "
                     f"{r['failed']} requests (one each expected)")
    diffs = [d["median_ttft_ms"] - c["median_ttft_ms"] for d, c in zip(ds, cs)]
    step_ms = statistics.median(d["median_tpot_ms"] for d in ds)
    layer_ms, goal = layer_goal(args[2], step_ms)
    added = statistics.median(diffs)
    lo, hi = quantile(diffs, 0.25), quantile(diffs, 0.75)
    print(f"\n== low load, paired: {len(diffs)} prompts, each run on both deployments back to back "
          f"(both up at once, the first side alternating)")
    print(f"TTFT p50 (ms): disaggregated {statistics.median(d['median_ttft_ms'] for d in ds):.2f}, "
          f"colocated {statistics.median(c['median_ttft_ms'] for c in cs):.2f}")
    print(f"added TTFT, median of the per-prompt differences: {added:.2f} ms "
          f"(quartiles {lo:.2f} .. {hi:.2f}; {sum(x > 0 for x in diffs)} of {len(diffs)} positive)")
    print(f"goal: one layer's transfer ({int(args[3])} bytes, fabric write p50 {layer_ms:.3f} ms) "
          f"+ one decode step (TPOT p50 {step_ms:.2f} ms) = {goal:.2f} ms")
    print(f"added / goal = {added / goal:.2f} ({'met' if added <= goal else 'NOT met'})")


def low_load(args):
    if len(args) not in (4, 5):
        sys.exit("usage: report.py low-load DISAGG.json[,...] COLOCATED.json[,...] TRANSFER.json "
                 "LAYER_BYTES [ROUTED.json[,...]]")
    ds = [load(p) for p in args[0].split(",")]
    cs = [load(p) for p in args[1].split(",")]
    if len(ds) != len(cs):
        sys.exit(f"report.py: {len(ds)} disaggregated runs but {len(cs)} colocated ones")
    nbytes = int(args[3])
    med = lambda runs, key: statistics.median(r[key] for r in runs)
    step_ms = med(ds, "median_tpot_ms")
    layer_ms, goal = layer_goal(args[2], step_ms)
    added = med(ds, "median_ttft_ms") - med(cs, "median_ttft_ms")
    print(f"\n== low load (one request at a time): the TTFT disaggregation adds "
          f"(median over {len(ds)} alternating rounds)")
    print(f"{'':34}  {'disaggregated':>13}  {'colocated':>13}")
    for label, key in (("TTFT p50 (ms)", "median_ttft_ms"), ("TTFT p99 (ms)", "p99_ttft_ms"),
                       ("TPOT p50 (ms)", "median_tpot_ms")):
        print(f"{label:34}  {med(ds, key):13.2f}  {med(cs, key):13.2f}")
    rounds = ", ".join(f"{d['median_ttft_ms']:.1f}/{c['median_ttft_ms']:.1f}" for d, c in zip(ds, cs))
    print(f"TTFT p50 per round (disaggregated/colocated, ms): {rounds}")
    print(f"added TTFT p50: {added:.2f} ms")
    print(f"goal: one layer's transfer ({nbytes} bytes, fabric write p50 {layer_ms:.3f} ms) "
          f"+ one decode step (TPOT p50 {step_ms:.2f} ms) = {goal:.2f} ms")
    # The colocated side alone moves between rounds; a figure inside that spread shows nothing.
    noise = max(c["median_ttft_ms"] for c in cs) - min(c["median_ttft_ms"] for c in cs)
    if len(cs) > 1 and noise > goal:
        verdict = (f"inconclusive: colocated TTFT p50 alone moved {noise:.2f} ms between rounds, "
                   f"more than the goal")
    else:
        verdict = "met" if added <= goal else "NOT met"
    print(f"added / goal = {added / goal:.2f} ({verdict})")
    if len(args) == 5:
        rs = [load(p) for p in args[4].split(",")]
        routed = med(rs, "median_ttft_ms") - med(cs, "median_ttft_ms")
        print(f"colocated behind the same router (`pdserve router`), TTFT p50: "
              f"{med(rs, 'median_ttft_ms'):.2f} ms; the router's own share of the added TTFT: "
              f"{routed:.2f} ms (median over {len(rs)} rounds; not part of the goal's figure)")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    commands = {"side-by-side": side_by_side, "layer-bytes": layer_bytes, "low-load": low_load,
                "low-load-paired": low_load_paired}
    if sys.argv[1] not in commands:
        sys.exit(f"report.py: unknown command '{sys.argv[1]}'\n{__doc__}")
    commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
