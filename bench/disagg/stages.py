#!/usr/bin/python3
"""Per-stage time table of requests sent one at a time, from `--trace` files.

  stages.py disagg ROUTER.json DECODE.json PREFILL.json [BENCH.json]
  stages.py colocated SERVE.json [BENCH.json]
  stages.py overhead DISAGG_PREFIX[,...] COLOCATED_PREFIX[,...] DISAGG_BENCH[,...] COLO_BENCH[,...]
      (prefixes: the --trace FILE without .json; rounds in the same order in every list)
  stages.py paired-steps DISAGG_PREFIX COLOCATED_PREFIX
      (run.sh's pairs: request i of each trace is prompt i; the prefill step's duration, pair by
      pair: does the disaggregated prefill compute as fast as the colocated one?)

The trace files are those `pdserve up --trace FILE` (FILE.router.json, FILE.decode0.json,
FILE.prefill0.json) and `pdserve serve --trace FILE` write. Every file's timestamps are on the
machine's steady clock, so events of different processes compare. Requests must have run one at a
time (`pdserve bench --max-concurrency 1`): each request's events are those between its
"router request" (colocated: "http request") and the next one's.

For each milestone on the request's critical chain the table gives the median over requests of
the time from the milestone before it, and the running sum of those medians from the request
reaching the router (colocated: the HTTP server); milestones off the chain are listed with their
median offset. With a bench JSON, the client's TTFT median and the part of it outside the servers;
when the JSON has the steady-clock time each first token was read (`first_token_steady_times`,
pdserve bench), "client: first token read" joins the chain, so the client's read of the first
token is a per-request step like the others, and the time from the client's send (that read
less its TTFT) to the first server milestone is measured per request too.
"""
import json
import statistics
import sys


def load(path, tag):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    out = []
    for e in events:
        if e.get("ph") not in ("X", "i", "I"):
            continue
        ts = float(e["ts"])
        out.append({"tag": tag, "name": e["name"], "ts": ts, "end": ts + float(e.get("dur", 0)),
                    "args": e.get("args", {})})
    return out


def load_bench(path):
    """The bench client's first-token reads as events (tag C), if its JSON has their times."""
    with open(path) as f:
        times = json.load(f).get("first_token_steady_times", [])
    return [{"tag": "C", "name": "first token read", "ts": t * 1e6, "end": t * 1e6, "args": {}}
            for t in times if t and t > 0]


def bench_sends_us(path):
    """When the bench client sent each request, on the traces' steady clock (µs): its first-token
    read time less its TTFT; empty if the JSON lacks either."""
    with open(path) as f:
        j = json.load(f)
    reads, ttfts = j.get("first_token_steady_times", []), j.get("ttfts", [])
    return sorted((r - t) * 1e6 for r, t in zip(reads, ttfts) if r and r > 0 and t and t > 0)


def before_servers_ms(rows_per_request, sends_us):
    """Per request, the time from the client's send to the first server milestone (the latest
    send at or before it: requests ran one at a time); their median, or None."""
    gaps = []
    for rows in rows_per_request:
        t0 = rows[0][1]
        earlier = [s for s in sends_us if s <= t0]
        if earlier:
            gaps.append((t0 - earlier[-1]) / 1000.0)
    return statistics.median(gaps) if gaps else None


def first(events, tag, name, after, key="ts"):
    """The first event `name` of `tag` beginning at or after `after`: its `key` time, or None."""
    for e in events:
        if e["tag"] == tag and e["name"] == name and e["ts"] >= after:
            return e[key], e
    return None, None


def disagg_milestones(seg):
    m = []

    def add(label, value):
        if value is not None:
            m.append((label, value))
        return value

    t0 = add("router: request accepted", first(seg, "R", "router request", 0)[0])
    add("router: upstream send begins", first(seg, "R", "router upstream send", t0)[0])
    t = add("decode: HTTP request parsed", first(seg, "D", "http request", t0)[0])
    if t is None:
        return None
    t = add("decode: tokenized", first(seg, "D", "tokenized", t)[0])
    t = add("decode: engine submit returned", first(seg, "D", "engine submitted", t)[0])
    sent = add("decode: PrefillRequest sent", first(seg, "D", "prefill request sent", t0)[0])
    # Traced once the engine has it: its step may have begun already.
    add("prefill: PrefillRequest received", first(seg, "P", "prefill request", t0)[0])
    _, step = first(seg, "P", "step", sent if sent is not None else t0)
    if step is not None:
        add("prefill: engine step begins", step["ts"])
        layers = [e for e in seg if e["tag"] == "P" and e["name"] == "layer" and
                  step["ts"] <= e["ts"] <= step["end"]]
        if layers:
            add("prefill: layer 0 compute ends", min(e["end"] for e in layers))
        # The decode side waits for the KV writes only (the metadata is counted apart): the
        # chain goes from the last layer's writes to the KV counter; the step's end (the last
        # layer's MLP, the final norm) and the metadata are off it.
        posts = [e for e in seg if e["tag"] == "P" and e["name"] == "post writes" and
                 e["ts"] >= step["ts"]]
        if posts:
            add("prefill: last layer's writes posted", max(e["end"] for e in posts))
        if layers:
            add("prefill: last layer compute ends", max(e["end"] for e in layers))
        add("prefill: engine step ends", step["end"])
        add("prefill: metadata write posted", first(seg, "P", "post metadata", step["ts"], "end")[0])
    t = add("decode: imm counter fired (kv ready)", first(seg, "D", "kv ready", t0)[0])
    add("decode: metadata landed", first(seg, "D", "metadata landed", t0)[0])
    if t is not None:
        _, dstep = first(seg, "D", "step", t)
        if dstep is not None:
            add("decode: first decode step begins", dstep["ts"])
            add("decode: first decode step ends", dstep["end"])
    add("decode: first token written", first(seg, "D", "first token written", t0)[0])
    add("router: upstream status read", first(seg, "R", "router upstream status", t0)[0])
    add("router: first chunk read", first(seg, "R", "router first chunk read", t0)[0])
    add("router: first chunk written", first(seg, "R", "router first chunk written", t0)[0])
    add("client: first token read", first(seg, "C", "first token read", t0)[0])
    return m


def colocated_milestones(seg):
    m = []

    def add(label, value):
        if value is not None:
            m.append((label, value))
        return value

    t0 = add("server: HTTP request parsed", first(seg, "S", "http request", 0)[0])
    t = add("server: tokenized", first(seg, "S", "tokenized", t0)[0])
    t = add("server: engine submit returned", first(seg, "S", "engine submitted", t)[0])
    _, step = first(seg, "S", "step", t0)
    if step is not None:
        add("server: engine step begins", step["ts"])
        layers = [e for e in seg if e["tag"] == "S" and e["name"] == "layer" and
                  step["ts"] <= e["ts"] <= step["end"]]
        if layers:
            add("server: last layer compute ends", max(e["end"] for e in layers))
        add("server: engine step ends", step["end"])
    add("server: first token written", first(seg, "S", "first token written", t0)[0])
    add("client: first token read", first(seg, "C", "first token read", t0)[0])
    return m


def segments(events, start_tag, start_name):
    events.sort(key=lambda e: e["ts"])
    starts = [e["ts"] for e in events if e["tag"] == start_tag and e["name"] == start_name]
    for i, s in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else float("inf")
        yield [e for e in events if s <= e["ts"] < end]


# Milestones off the request's critical chain (shown by their offset, not summed).
SIDE = ("router: upstream status read", "prefill: PrefillRequest received",
        "prefill: layer 0 compute ends", "prefill: last layer compute ends",
        "prefill: engine step ends", "prefill: metadata write posted", "decode: metadata landed")


def p90_of(values):
    """numpy.percentile(values, 90) with linear interpolation."""
    v = sorted(values)
    x = 0.9 * (len(v) - 1)
    i = int(x)
    return v[i] + (v[min(i + 1, len(v) - 1)] - v[i]) * (x - i)


def table(rows_per_request, ttft_ms=None, sends_us=None):
    """Each step of the chain is the median over requests of the time from the chain's previous
    milestone; `cumulative` sums those medians (so the steps add up to it). With the client's
    send times, the time before the servers is measured per request; without, it is the TTFT
    median less the cumulative (which carries the steps' variation: a sum of medians is not the
    median of the sums)."""
    chain = []
    for rows in rows_per_request:
        for label, _ in rows:
            if label not in chain and label not in SIDE:
                chain.append(label)
    steps = {label: [] for label in chain}
    side = {label: [] for label in SIDE}
    for rows in rows_per_request:
        d = dict(rows)
        t0 = rows[0][1]
        prev = None
        for label in chain:
            if label not in d:
                continue
            if prev is not None:
                steps[label].append((d[label] - d[prev]) / 1000.0)
            prev = label
        for label in SIDE:
            if label in d:
                side[label].append((d[label] - t0) / 1000.0)
    print(f"{len(rows_per_request)} requests; ms; step = median over requests of the time since "
          f"the milestone above")
    print(f"{'milestone':42s} {'step':>8s} {'cumulative':>11s} {'step p90':>9s}")
    total = 0.0
    for k, label in enumerate(chain):
        step = statistics.median(steps[label]) if steps[label] else 0.0
        total += step
        p90 = f"{p90_of(steps[label]):9.3f}" if k > 0 and steps[label] else ""
        print(f"{label:42s} {'' if k == 0 else f'{step:8.3f}':>8s} {total:11.3f} {p90}")
    for label in SIDE:
        if side[label]:
            print(f"  (side) {label:34s} at {statistics.median(side[label]):8.3f}")
    if ttft_ms is not None:
        print(f"{'client TTFT (bench, median)':42s} {'':8s} {ttft_ms:11.3f}")
        before = before_servers_ms(rows_per_request, sends_us or [])
        if before is not None:
            print(f"{'  client send -> first server milestone':42s} {'':8s} {before:11.3f}"
                  "  (median per request)")
        else:
            rest = ("  before the servers (connect, send)" if "client: first token read" in chain
                    else "  outside the servers (client side)")
            print(f"{rest:42s} {'':8s} {ttft_ms - total:11.3f}")


def bench_ttft_ms(path):
    with open(path) as f:
        j = json.load(f)
    if "ttfts" in j:
        vals = [v for v in j["ttfts"] if v and v > 0]
        if vals:
            return statistics.median(vals) * 1000.0
    return j.get("median_ttft_ms")


def prefill_steps_ms(reqs):
    """Each request's prefill engine step duration (None where not traced)."""
    out = []
    for rows in reqs:
        out.append(None)
        d = dict(rows)
        for a, b in (("prefill: engine step begins", "prefill: engine step ends"),
                     ("server: engine step begins", "server: engine step ends")):
            if a in d and b in d:
                out[-1] = (d[b] - d[a]) / 1000.0
    return out


def ttft_minus_step_ms(reqs, bench_path):
    """Median over requests of (client TTFT - prefill step). Requests ran one at a time, so the
    bench's TTFTs and the traced requests pair up in order; if their counts differ, the
    difference of the two medians."""
    steps = prefill_steps_ms(reqs)
    with open(bench_path) as f:
        ttfts = [v * 1000.0 for v in json.load(f).get("ttfts", []) if v and v > 0]
    if len(ttfts) == len(steps) and all(x is not None for x in steps):
        return statistics.median(t - x for t, x in zip(ttfts, steps))
    steps = [x for x in steps if x is not None]
    if not steps or not ttfts:
        return None
    return statistics.median(ttfts) - statistics.median(steps)


def complete(reqs):
    return [r for r in reqs if r and any("first token written" in label for label, _ in r)]


def overhead(argv):
    """TTFT minus the prefill step's compute, per round, for both deployments: the prefill's
    compute time varies from run to run on a shared machine by more than what disaggregation
    adds, and subtracting it leaves what the goal is about."""
    d_pre, c_pre, d_bench, c_bench = (a.split(",") for a in argv)
    d_over, c_over = [], []
    for dp, cp, db, cb in zip(d_pre, c_pre, d_bench, c_bench):
        d = ttft_minus_step_ms(disagg_requests(dp), db)
        c = ttft_minus_step_ms(colocated_requests(cp), cb)
        if d is None or c is None:
            print("stages: a round's traces have no complete request", file=sys.stderr)
            return 1
        d_over.append(d)
        c_over.append(c)
    rounds = ", ".join(f"{d:.2f}/{c:.2f}" for d, c in zip(d_over, c_over))
    added = statistics.median(d_over) - statistics.median(c_over)
    print(f"TTFT p50 minus the prefill step's compute (traced; disaggregated/colocated per round, "
          f"ms): {rounds}")
    print(f"added TTFT p50 outside the prefill's compute: {added:.2f} ms (median over "
          f"{len(d_over)} rounds; the prefill step's run-to-run variation removed)")
    return 0


def disagg_requests(prefix):
    events = load(prefix + ".router.json", "R") + load(prefix + ".decode0.json", "D") + \
        load(prefix + ".prefill0.json", "P")
    return complete([disagg_milestones(s) for s in segments(events, "R", "router request")])


def colocated_requests(prefix):
    return complete([colocated_milestones(s) for s in
                     segments(load(prefix + ".json", "S"), "S", "http request")])


def paired_steps(argv):
    """Pair i's prefill steps (disaggregated / colocated): the pairs ran back to back, so the
    host's drift cancels in each ratio, and their median says whether the prefill instance
    computes slower than a colocated one (e.g. disturbed by the KV it sends)."""
    d = prefill_steps_ms(disagg_requests(argv[0]))
    c = prefill_steps_ms(colocated_requests(argv[1]))
    if len(d) != len(c):
        print(f"stages: {len(d)} disaggregated requests traced but {len(c)} colocated ones",
              file=sys.stderr)
        return 1
    ratios = sorted(a / b for a, b in zip(d, c) if a and b)
    if not ratios:
        print("stages: no pair has both prefill steps traced", file=sys.stderr)
        return 1
    q = lambda f: ratios[int(f * (len(ratios) - 1))]
    print(f"prefill step per pair, disaggregated / colocated: median {statistics.median(ratios):.3f}"
          f" (quartiles {q(0.25):.3f} .. {q(0.75):.3f}; {sum(r > 1 for r in ratios)} of "
          f"{len(ratios)} above 1); step p50 {statistics.median(x for x in d if x):.2f} / "
          f"{statistics.median(x for x in c if x):.2f} ms")
    return 0


def main(argv):
    if len(argv) == 6 and argv[1] == "overhead":
        return overhead(argv[2:])
    if len(argv) == 4 and argv[1] == "paired-steps":
        return paired_steps(argv[2:])
    if len(argv) >= 5 and argv[1] == "disagg":
        events = load(argv[2], "R") + load(argv[3], "D") + load(argv[4], "P")
        bench = argv[5] if len(argv) > 5 else None
        events += load_bench(bench) if bench else []
        reqs = [disagg_milestones(s) for s in segments(events, "R", "router request")]
    elif len(argv) >= 3 and argv[1] == "colocated":
        events = load(argv[2], "S")
        bench = argv[3] if len(argv) > 3 else None
        events += load_bench(bench) if bench else []
        reqs = [colocated_milestones(s) for s in segments(events, "S", "http request")]
    else:
        print(__doc__, file=sys.stderr)
        return 2
    reqs = complete(reqs)
    if not reqs:
        print("stages: no complete request in the traces", file=sys.stderr)
        return 1
    table(reqs, bench_ttft_ms(bench) if bench else None, bench_sends_us(bench) if bench else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
