#!/usr/bin/python3
"""Durations of the first decode steps of each request against its steady steps, from a trace.

  first_steps.py colo SERVE.json          (pdserve serve --trace: step 0 is the prefill)
  first_steps.py dec  UP.decode0.json     (pdserve up --trace: step 0 is the first decode step)

Requests must have run one at a time (pdserve bench --max-concurrency 1) with at least 6 decode
steps each (e.g. --random-output-len 16); the first request (cold start) is skipped. Prints the
medians over requests of decode steps 1-4 and of each request's median over its later steps (ms).
A prompt long enough to be chunked (more than --max-num-batched-tokens) shifts colo's steps.
"""
import json
import statistics
import sys


def steps_per_request(path):
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") in ("X", "i", "I")]
    ev.sort(key=lambda e: float(e["ts"]))
    starts = [float(e["ts"]) for e in ev if e["name"] == "http request"]
    for i, s in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else float("inf")
        yield [float(e.get("dur", 0)) / 1000 for e in ev
               if e["name"] == "step" and s <= float(e["ts"]) < end]


def main():
    kind, path = sys.argv[1], sys.argv[2]
    off = 1 if kind == "colo" else 0
    cols, steady = [[] for _ in range(4)], []
    for st in list(steps_per_request(path))[1:]:
        d = st[off:]
        if len(d) < 6:
            continue
        for k in range(4):
            cols[k].append(d[k])
        steady.append(statistics.median(d[4:]))
    if not steady:
        sys.exit("first_steps.py: no request with 6 decode steps in " + path)
    print(kind, path.split("/")[-1], "requests=%d" % len(steady),
          " ".join("s%d=%.3f" % (k + 1, statistics.median(c)) for k, c in enumerate(cols)),
          "steady=%.3f" % statistics.median(steady))


if __name__ == "__main__":
    main()
