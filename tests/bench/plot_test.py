#!/usr/bin/python3
"""bench/plot.py on the recorded files in tests/data/plots (made by a `pdserve bench` sweep and
single-rate runs of the demo model on `pdserve up` and `pdserve serve`, `pdserve simulate --json`,
and the `--trace` files of one request through `up`, each cut down to a few entries):

- every picture is a PNG of the requested size in pixels (100 dpi) and an SVG of the requested
  size in points, with one SVG group per curve (ids curve-...) as many as the input has series,
  the titles naming the model, hardware, workload and SLO, and the axes their units;
- with PDSERVE (plot_test.py [PDSERVE]): `pdserve simulate --json` as it writes now is drawn;
- a missing file, a file that is not JSON, a missing field and the wrong kind of document exit 1
  with a message naming the file and the field; a bad flag exits 2.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PLOT = os.path.join(ROOT, "bench", "plot.py")
DATA = os.path.join(ROOT, "tests", "data", "plots")
failed = 0


def check(ok, what):
    global failed
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    failed += 0 if ok else 1
    return ok


def data(name):
    return os.path.join(DATA, name)


def run(*args):
    return subprocess.run([sys.executable, PLOT, *args], capture_output=True, text=True,
                          timeout=120)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def svg_info(path):
    """(width pt, height pt, [group ids], all text) of an SVG."""
    root = ET.parse(path).getroot()
    ids = [e.get("id") for e in root.iter() if e.get("id")]
    text = " ".join(t for e in root.iter() if e.tag.endswith("text") for t in e.itertext())
    w, h = (float(root.get(k).removesuffix("pt")) for k in ("width", "height"))
    return w, h, ids, text


def check_picture(name, out, width_in, height_in, curves, words):
    """curves: {id prefix: expected count of distinct curves}; words: text the SVG must hold."""
    size = png_size(out + ".png")
    check(size == (round(100 * width_in), round(100 * height_in)),
          f"{name}: PNG {size}, want {100 * width_in:.0f}x{100 * height_in:.0f}")
    w, h, ids, text = svg_info(out + ".svg")
    check((w, h) == (72 * width_in, 72 * height_in), f"{name}: SVG {w}x{h} pt")
    for prefix, want in curves.items():
        got = sorted({re.sub(r"-\d+$", "", i) if prefix.startswith("curve-lane") else i
                      for i in ids if i.startswith(prefix)})
        check(len(got) == want, f"{name}: {len(got)} curves '{prefix}*' (want {want}): {got}")
    for word in words:
        check(word in text, f"{name}: the SVG's text has {word!r}")


def first_meeting(path, target=0.9):
    """How many curves of a bench or simulate rates document have a goodput point."""
    with open(path) as f:
        doc = json.load(f)
    if isinstance(doc.get("goodput"), dict):
        return 1
    first = [e for e in doc["rates"] if e["request_rate"] != "inf"][0]
    return 1 if first["attainment"]["both"] >= target else 0


def main():
    tmp = tempfile.mkdtemp(prefix="plot-test-")
    measured = ["bench-rates-disagg.json", "bench-rates-colocated.json"]
    simulated = ["simulate-rates-disagg.json", "simulate-rates-colocated.json"]

    out = os.path.join(tmp, "attainment")
    p = run("attainment", "--out", out, "--measured", "disagg=" + data(measured[0]),
            "--measured", "colocated=" + data(measured[1]),
            "--simulated", "disagg=" + data(simulated[0]),
            "--simulated", "colocated=" + data(simulated[1]))
    if check(p.returncode == 0, f"attainment: exit {p.returncode} {p.stderr.strip()}"):
        stars = sum(first_meeting(data(f)) for f in measured + simulated)
        check_picture("attainment", out, 8, 5,
                      {"curve-measured-": 2, "curve-simulated-": 2, "curve-goodput-": stars},
                      ["request rate (req/s)", "SLO attainment", "demo-llama", "TTFT ≤ 200 ms",
                       "TPOT ≤ 20 ms", "sharegpt-like", "CPUs"])
        check(p.stdout.split() == [out + ".png", out + ".svg"], "attainment: prints its paths")

    out = os.path.join(tmp, "merged")  # a sweep and a single-rate run under one label
    p = run("attainment", "--out", out, "--log-x", "--measured", "d=" + data(measured[0]),
            "--measured", "d=" + data("bench-disagg.json"))
    if check(p.returncode == 0, f"merged attainment: exit {p.returncode} {p.stderr.strip()}"):
        check_picture("merged attainment", out, 8, 5, {"curve-measured-": 1}, ["demo-llama"])

    out = os.path.join(tmp, "latency")
    p = run("latency", "--out", out, "--width", "9", "--height", "4",
            "disagg=" + data("bench-disagg.json"), "colocated=" + data("bench-colocated.json"))
    if check(p.returncode == 0, f"latency: exit {p.returncode} {p.stderr.strip()}"):
        check_picture("latency", out, 9, 4, {"curve-ttft-": 2, "curve-tpot-": 2},
                      ["TTFT (ms, log scale)", "TPOT (ms, log scale)", "requests (%, cumulative)",
                       "demo-llama", "TTFT ≤ 200 ms"])

    out = os.path.join(tmp, "traces")
    p = run("traces", "--out", out, data("simulate-traces.json"))
    with open(data("simulate-traces.json")) as f:
        systems = len({t["system"] for t in json.load(f)["traces"]})
    if check(p.returncode == 0, f"traces: exit {p.returncode} {p.stderr.strip()}"):
        check_picture("traces", out, 11, 4.5, {"curve-measured-": systems,
                                               "curve-simulated-": systems,
                                               "curve-points-": systems},
                      ["opt-13b on a100-80gb", "TTFT ≤ 250 ms", "measured SLO attainment (%)"])

    out = os.path.join(tmp, "timeline")
    p = run("timeline", "--out", out, data("trace.prefill0.json"), data("trace.decode0.json"))
    if check(p.returncode == 0, f"timeline: exit {p.returncode} {p.stderr.strip()}"):
        check_picture("timeline", out, 11, 5, {"curve-lane-": 5},
                      ["prefill0 rank 0", "KV writes", "decode0 rank 0", "token stream",
                       "time since the decode instance sent the prefill request (ms)",
                       "demo-llama"])

    if len(sys.argv) > 1:
        live_simulate(sys.argv[1], tmp)
    errors(tmp)
    sys.exit(1 if failed else 0)


def live_simulate(pdserve, tmp):
    """`pdserve simulate --json` as it writes now, drawn: the traces of one system, and one
    deployment at three rates."""
    traces = os.path.join(tmp, "live-traces.json")
    with open(traces, "w") as f:
        p = subprocess.run([pdserve, "simulate", "--traces", "distserve-c21d12-*", "--json"],
                           stdout=f, stderr=subprocess.PIPE, text=True, timeout=120)
    check(p.returncode == 0, f"pdserve simulate --traces ... --json: exit {p.returncode} "
                             f"{p.stderr.strip()}")
    out = os.path.join(tmp, "live-traces")
    p = run("traces", "--out", out, traces)
    if check(p.returncode == 0, f"traces of live simulate JSON: exit {p.returncode} {p.stderr}"):
        check_picture("live traces", out, 11, 4.5, {"curve-measured-": 1, "curve-simulated-": 1},
                      ["c21d12", "a100-80gb"])
    rates = os.path.join(tmp, "live-rates.json")
    with open(rates, "w") as f:
        p = subprocess.run([pdserve, "simulate", "--prefill", "2x1", "--decode", "1x1", "--rate",
                            "1", "4", "8", "--requests", "100", "--json"], stdout=f,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    check(p.returncode == 0, f"pdserve simulate --rate ... --json: exit {p.returncode}")
    out = os.path.join(tmp, "live-rates")
    p = run("attainment", "--out", out, "--simulated", "disagg=" + rates)
    if check(p.returncode == 0, f"attainment of live simulate JSON: exit {p.returncode} "
                                f"{p.stderr}"):
        check_picture("live rates", out, 8, 5, {"curve-simulated-": 1}, ["opt-13b", "a100-80gb"])
    p = subprocess.run([pdserve, "simulate", "--scenario", "r1", "--json"], capture_output=True,
                       text=True, timeout=60)
    check(p.returncode == 2 and "--json goes with" in p.stderr,
          f"simulate --scenario r1 --json: exit {p.returncode} {p.stderr.strip()}")


def errors(tmp):
    out = os.path.join(tmp, "bad")
    bad_json = os.path.join(tmp, "bad.json")
    with open(bad_json, "w") as f:
        f.write("{\"rates\": [")
    no_slo = os.path.join(tmp, "no-slo.json")
    with open(data("bench-rates-disagg.json")) as f:
        doc = json.load(f)
    for e in doc["rates"]:
        e["attainment"] = {"ttft": None, "tpot": None, "both": None}
    with open(no_slo, "w") as f:
        json.dump(doc, f)
    no_ttfts = os.path.join(tmp, "no-ttfts.json")
    with open(data("bench-disagg.json")) as f:
        doc = json.load(f)
    del doc["ttfts"]
    with open(no_ttfts, "w") as f:
        json.dump(doc, f)
    no_goodput = os.path.join(tmp, "no-goodput.json")
    doc["ttfts"] = [0.1]
    doc["slo_attainment"] = None
    with open(no_goodput, "w") as f:
        json.dump(doc, f)
    missing = os.path.join(tmp, "missing.json")
    cases = [
        (["attainment", "--out", out, "--measured", "a=" + missing], 1,
         [missing, "cannot read"]),
        (["attainment", "--out", out, "--measured", "a=" + bad_json], 1, [bad_json, "not JSON"]),
        (["attainment", "--out", out, "--measured", "a=" + no_slo], 1,
         [no_slo, "'rates[0].attainment.both' is missing"]),
        (["attainment", "--out", out, "--measured", "a=" + no_goodput], 1,
         [no_goodput, "'slo_attainment' is missing (run it with --goodput)"]),
        (["attainment", "--out", out, "--measured", "a=" + data("trace.decode0.json")], 1,
         ["trace.decode0.json", "field 'schema'"]),
        (["attainment", "--out", out, "--simulated", "a=" + data("simulate-traces.json")], 1,
         ["simulate-traces.json", "field 'mode'"]),
        (["attainment", "--out", out], 1, ["at least one"]),
        (["latency", "--out", out, "a=" + no_ttfts], 1, [no_ttfts, "'ttfts' is missing"]),
        (["latency", "--out", out, "a=" + data("bench-rates-disagg.json")], 1,
         ["bench-rates-disagg.json", "single-rate"]),
        (["traces", "--out", out, data("simulate-rates-disagg.json")], 1,
         ["simulate-rates-disagg.json", "'schema'/'mode'"]),
        (["timeline", "--out", out, data("trace.decode0.json")], 1,
         ["needs a prefill and a decode instance's trace"]),
        (["timeline", "--out", out, "--request", "12345", data("trace.prefill0.json"),
          data("trace.decode0.json")], 1, ["no request '12345'"]),
        (["timeline", "--out", out, bad_json, data("trace.decode0.json")], 1,
         [bad_json, "not JSON"]),
        (["timeline", "--out", out, data("bench-disagg.json"), data("trace.decode0.json")], 1,
         ["bench-disagg.json", "'traceEvents' is missing"]),
        (["latency", "--out", out, "--width", "0", "a=" + data("bench-disagg.json")], 2,
         ["--width"]),
        (["pie", "--out", out], 2, ["invalid choice"]),
    ]
    for args, code, words in cases:
        p = run(*args)
        ok = p.returncode == code and all(w in p.stderr for w in words)
        check(ok, f"{' '.join(a.replace(tmp, '$TMP').replace(DATA, '$DATA') for a in args)}: "
                  f"exit {p.returncode}, {p.stderr.strip().splitlines()[-1:]}")
        check(not os.path.exists(out + ".png"), "  no picture written")


if __name__ == "__main__":
    main()
