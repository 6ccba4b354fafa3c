#!/usr/bin/python3
"""Per traced bench run of a `validate-sim --trace` run (issue #7), offline: the load run, each
calibration run ('c' + rate) and each round ('r' + rate), in time order: the prefill steps over the
calibrated model for their tokens (the probes' prefill scale; no co-run factor; a step's tokens as
one prompt), p50 / p90, and the decode-only steps of 1-3 sequences (step + engine loop, gaps over
2 ms left out), alone and while a prefill step ran, mean ms (count).

Usage: run_steps.py OUT_DIR VALIDATE_LOG
  OUT_DIR: sim_vs_real.sh's OUT (profile.json, comparison.json, trace.{prefill0,decode0}.json)
  VALIDATE_LOG: validate-sim's stdout (its "round window" / "calibration window" lines); the load
                run is taken as the 300 requests sent before the first window.
"""
import json
import re
import sys


def events(path):
    d = json.load(open(path))
    return d['traceEvents'] if isinstance(d, dict) else d


def steps(evs):
    out = [(e['ts'] * 1e-6, e['dur'] * 1e-6, e['args'].get('decodes', 0),
            e['args'].get('prefill_tokens', 0))
           for e in evs if e['name'] == 'step' and e.get('ph') == 'X']
    return sorted(out)


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float('nan')


def main():
    base, log = sys.argv[1], sys.argv[2]
    coeffs = json.load(open(base + '/profile.json'))['tp']['1']['prefill']
    scale = json.load(open(base + '/comparison.json'))['calibration']['prefill_scale']
    pre, dec = events(base + '/trace.prefill0.json'), events(base + '/trace.decode0.json')
    wins = []
    for line in open(log):
        m = re.match(r'\s*(round|calibration) window (\S+) req/s: (\S+) (\S+)', line)
        if m:
            wins.append((float(m.group(3)), float(m.group(4)), m.group(1)[0] + m.group(2)))
    wins.sort()
    sent = sorted(e['ts'] * 1e-6 for e in dec if e['name'] == 'prefill request sent')
    before = [t for t in sent if t < wins[0][0]]
    runs = [(before[-300] - 0.01, wins[0][0] - 0.001, 'load')] + wins
    ps, ds = steps(pre), steps(dec)

    def model_ms(tokens):
        return (coeffs[0] + coeffs[1] * tokens + coeffs[2] * tokens * tokens) * scale

    for b, e, name in runs:
        pst = [s for s in ps if b <= s[0] <= e and s[3] > 0]
        ratios = [s[1] * 1e3 / model_ms(s[3]) for s in pst]
        dst = [s for s in ds if b <= s[0] <= e and s[2] > 0 and s[3] == 0]
        rows = {}
        for i, s in enumerate(dst):
            gap = dst[i + 1][0] - (s[0] + s[1]) if i + 1 < len(dst) else 1
            if gap > 0.002:
                continue
            corun = any(p[0] <= s[0] < p[0] + p[1] for p in pst)
            rows.setdefault((min(s[2], 4), corun), []).append(s[1] + gap)

        def m(k):
            v = rows.get(k, [])
            return '%.3f(%d)' % (sum(v) / len(v) * 1e3, len(v)) if v else '-'

        print('%-6s %5.1fs prefill n=%3d step/model p50 %.2f p90 %.2f | decode alone b1 %s b2 %s '
              'b3 %s | corun b1 %s b2 %s' % (name, e - b, len(pst), pct(ratios, .5),
                                             pct(ratios, .9), m((1, False)), m((2, False)),
                                             m((3, False)), m((1, True)), m((2, True))))


if __name__ == '__main__':
    main()
