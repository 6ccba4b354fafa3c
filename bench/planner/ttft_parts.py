#!/usr/bin/python3
"""The real TTFT parts per request from a `validate-sim --trace FILE` run (issue #7).

Usage: ttft_parts.py TRACE_BASE VALIDATE_LOG
  TRACE_BASE: the --trace FILE (FILE.prefill0.json and FILE.decode0.json are read)
  VALIDATE_LOG: validate-sim's stdout (its "round window RATE req/s: BEGIN END" lines, the
                traces' clock in seconds)

Per rate and bench round (its window; the traces hold their first 1,000,000 events each,
200,000 before 2026-11-30, so the later rounds may be missing), p50 / p90 in ms of each request's parts, joined by the
messenger's request id:
  front:     the decode instance sent the prefill request -> the prefill instance got it
             (admitted it: "transfer" begins; or its step began, if earlier)
  wait:      the prefill instance got it -> the engine step that computed it started
  step:      that step (the "post writes" events name the step of each request's KV)
  hand-over: the step ended -> the decode instance had all of the KV ("kv ready")
  decode:    "kv ready" -> the end of the decode instance's first step that started after it
Printed beside validate-sim's "simulated TTFT parts" line for the same rate.
"""
import json
import re
import sys


def events(path):
    d = json.load(open(path))
    return d['traceEvents'] if isinstance(d, dict) else d


def pct(v, q):
    if not v:
        return float('nan')
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    base, log = sys.argv[1], sys.argv[2]
    stem = base[:-5] if base.endswith('.json') else base
    pre = events(stem + '.prefill0.json')
    dec = events(stem + '.decode0.json')
    windows = {}
    for line in open(log):
        m = re.match(r'round window (\S+) req/s: (\S+) (\S+)', line)
        if m:
            windows.setdefault(m.group(1), []).append((float(m.group(2)), float(m.group(3))))
    sent, got, ready, step_of = {}, {}, {}, {}
    steps = {}
    for e in pre:
        a = e.get('args', {})
        if e['name'] == 'prefill request' or (e['name'] == 'transfer' and e.get('ph') == 'X'):
            # The earlier: "transfer" begins at admission, "prefill request" is traced after
            # the engine got the request (planner/ttft_parts.h).
            got[a['request']] = min(got.get(a['request'], float('inf')), e['ts'])
        elif e['name'] == 'post writes' and a.get('step') is not None:
            step_of.setdefault(a['request'], a['step'])
        elif e['name'] == 'step':
            steps[a['step']] = (e['ts'], e['ts'] + e['dur'])
    dsteps = []
    for e in dec:
        a = e.get('args', {})
        if e['name'] == 'prefill request sent':
            sent.setdefault(a['request'], e['ts'])
        elif e['name'] == 'kv ready':
            ready[a['request']] = e['ts']
        elif e['name'] == 'step':
            dsteps.append((e['ts'], e['ts'] + e['dur']))
    dsteps.sort()
    starts = [s for s, _ in dsteps]
    import bisect
    for rate, rounds in windows.items():
      for k, ws in enumerate([[w] for w in rounds]):
          parts = {'front': [], 'wait': [], 'step': [], 'hand-over': [], 'decode': []}
          for rid, b in got.items():
              t = b * 1e-6
              if not any(lo <= t <= hi for lo, hi in ws):
                  continue
              if rid not in step_of or step_of[rid] not in steps or rid not in ready:
                  continue
              s0, s1 = steps[step_of[rid]]
              b = min(b, s0)  # had arrived by its step's start at the latest
              d = ready[rid]
              if rid in sent:
                  parts['front'].append(b - sent[rid])
              parts['wait'].append(s0 - b)
              parts['step'].append(s1 - s0)
              parts['hand-over'].append(d - s1)
              i = bisect.bisect_left(starts, d)
              if i < len(dsteps):
                  parts['decode'].append(dsteps[i][1] - d)
          text = ', '.join('%s %.2f / %.2f' % (k, pct(v, 0.5) * 1e-3, pct(v, 0.9) * 1e-3)
                           for k, v in parts.items())
          print('real TTFT parts at %s req/s, round %d (%d requests traced, p50 / p90 ms): %s' %
                (rate, k + 1, len(parts['wait']), text))


if __name__ == '__main__':
    main()
