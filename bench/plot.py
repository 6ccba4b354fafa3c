#!/usr/bin/python3
"""Pictures from pdserve's JSON: SLO attainment against rate, latency CDFs, the simulator against
DistServe's A100 runs, and one request's timeline through the disaggregated path.

  plot.py attainment --out PREFIX [--measured LABEL=FILE]... [--simulated LABEL=FILE]...
      FILE: a `pdserve bench --request-rate R1,R2,... --slo ...` (or --goodput-search) rates
      document (pdserve-bench-rates-v1), a `pdserve simulate --rate ... --json` document
      (pdserve-simulate-v1, mode rates), or a single-rate `pdserve bench --goodput ...` JSON (one
      point). One curve per LABEL (its files' points together): measured solid, simulated dashed
      (a simulated curve takes the colour of the measured one with the same LABEL); the
      attainment target (default 90%) as a line and each curve's goodput marked on it.
  plot.py latency --out PREFIX LABEL=FILE...
      FILE: a single-rate `pdserve bench --save-result` JSON (with --goodput: its SLOs are drawn).
      TTFT and TPOT CDFs, one curve per deployment.
  plot.py traces --out PREFIX FILE
      FILE: `pdserve simulate --traces all --json` (pdserve-simulate-v1, mode traces): per
      system, attainment against rate, measured solid and simulated dashed; and simulated
      against measured, one point per trace.
  plot.py timeline --out PREFIX [--request ID] TRACE...
      TRACE: the files of `pdserve up --trace FILE` (FILE.prefill0.json, FILE.decode0.json, ...).
      One request (the first traced in full, or --request: its transfer id or decode engine id)
      from the decode instance sending it to prefill to its last token: prefill steps and
      each layer's compute, each layer's KV write from posting to completion, the decode
      instance's KV-ready signal, its decode steps and first and last token; one lane per
      instance and rank.

Each writes PREFIX.png and PREFIX.svg (--width and --height in inches, 100 dpi for the PNG) with
titles naming the model, hardware, workload and SLO as the JSON records them (--hardware names
the hardware where the JSON does not). Every curve is an SVG group whose id starts with
"curve-". Bad input exits 1 naming the file and the field; bad flags exit 2.
"""
import argparse
import json
import os
import re
import statistics
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def pyplot():
    """matplotlib.pyplot, imported once the inputs have been read and checked (a bad input fails
    fast)."""
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "pdserve"  # the same SVG ids every run
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text (searchable, smaller)
    import matplotlib.pyplot as plt
    return plt


class InputError(Exception):
    """A file that cannot be plotted: the message names the file and the field."""


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}")
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON: {e}")


def field(doc, path, name, kind=None):
    """doc[name] for each part of the dotted `name`; InputError naming path and field if absent
    or null, or (kind=list) not a list."""
    value = doc
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value or value[part] is None:
            raise InputError(f"{path}: field '{name}' is missing")
        value = value[part]
    if kind is list and not isinstance(value, list):
        raise InputError(f"{path}: field '{name}' is {json.dumps(value)[:40]}, expected a list")
    return value


def labelled(spec, flag):
    """LABEL=FILE -> (label, file); a bare FILE is labelled with its name."""
    if "=" in spec:
        label, path = spec.split("=", 1)
        if label and path:
            return label, path
        raise InputError(f"{flag} '{spec}': expected LABEL=FILE")
    return os.path.splitext(os.path.basename(spec))[0], spec


def gid(*parts):
    return "curve-" + "-".join(re.sub(r"[^A-Za-z0-9_.-]+", "_", p) for p in parts)


def slo_text(slo_ms):
    if not slo_ms:
        return "no SLO"
    order = {"ttft": 0, "tpot": 1, "e2el": 2}
    return ", ".join(f"{k.upper()} ≤ {v:g} ms"
                     for k, v in sorted(slo_ms.items(), key=lambda kv: order.get(kv[0], 3)))


def workload_text(doc):
    """The dataset and the mean request lengths where the JSON records them."""
    name = doc.get("dataset_name", "")
    prompts = doc.get("prompt_lens") or doc.get("input_lens")
    outputs = doc.get("output_lens")
    if prompts and outputs:
        name += f" (mean {statistics.mean(prompts):.0f} prompt / {statistics.mean(outputs):.0f} " \
                "output tokens)"
    return name


def title_of(what, docs, hardware):
    """'what: model on hardware; workload; SLO' from the first document that records each."""
    def first(key):
        for d in docs:
            if d.get(key):
                return d[key]
        return None
    model = first("model_id") or first("model") or "model not recorded"
    if model.startswith(("/", ".", "models/")):  # a served model directory: its name
        model = os.path.basename(model.rstrip("/"))
    hw = hardware or first("host") or first("hardware") or "hardware not recorded"
    workload = next((w for w in (workload_text(d) for d in docs) if w), "")
    lines = [what, f"{model} on {hw}", "; ".join(([workload] if workload else []) +
                                               ["SLO " + slo_text(first("slo_ms"))])]
    return "\n".join(lines)


def save(fig, out):
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out + ".png", dpi=100, metadata={"Software": None})
    fig.savefig(out + ".svg", metadata={"Date": None, "Creator": None})
    pyplot().close(fig)
    print(f"{out}.png\n{out}.svg")


# ------------------------------------------------------------------ attainment against rate

def rate_curve(path, doc):
    """[(rate, attainment of every SLO)] of a bench rates or simulate rates document, finite
    rates only, sorted; or the one point of a single-rate bench JSON run with --goodput."""
    schema = doc.get("schema")
    if schema is None and "ttfts" in doc:  # single rate: its slo_attainment at its rate
        rate, att = doc.get("request_rate"), doc.get("slo_attainment")
        if not isinstance(rate, (int, float)):
            raise InputError(f"{path}: field 'request_rate' is {json.dumps(rate)}, expected a "
                             "finite rate")
        if not isinstance(att, (int, float)):
            raise InputError(f"{path}: field 'slo_attainment' is missing (run it with --goodput)")
        return [(float(rate), float(att))]
    if schema not in ("pdserve-bench-rates-v1", "pdserve-simulate-v1"):
        raise InputError(f"{path}: field 'schema' is {json.dumps(schema)}, expected "
                         "pdserve-bench-rates-v1 or pdserve-simulate-v1")
    if schema == "pdserve-simulate-v1" and doc.get("mode") != "rates":
        raise InputError(f"{path}: field 'mode' is {json.dumps(doc.get('mode'))}, expected "
                         "\"rates\" (pdserve simulate --rate ... --json)")
    points = []
    for i, e in enumerate(field(doc, path, "rates", list)):
        rate = e.get("request_rate") if isinstance(e, dict) else None
        if rate == "inf":
            continue
        if not isinstance(rate, (int, float)):
            raise InputError(f"{path}: field 'rates[{i}].request_rate' is missing")
        att = e.get("attainment")
        both = att.get("both") if isinstance(att, dict) else None
        if not isinstance(both, (int, float)):
            raise InputError(f"{path}: field 'rates[{i}].attainment.both' is missing (a sweep "
                             "needs --slo)")
        points.append((float(rate), float(both)))
    if not points:
        raise InputError(f"{path}: field 'rates' has no finite rate")
    return sorted(points)


def goodput_of(doc, points, target):
    """The recorded goodput (a search's, the simulator's), else the highest swept rate whose
    attainment meets the target with every rate below it meeting it too; None if the first
    misses."""
    g = doc.get("goodput")
    if isinstance(g, dict) and isinstance(g.get("goodput"), (int, float)):
        return float(g["goodput"])
    best = None
    for rate, att in points:
        if att < target - 1e-12:
            break
        best = rate
    return best


def plot_attainment(args):
    series = [(labelled(s, "--measured"), False) for s in args.measured] + \
             [(labelled(s, "--simulated"), True) for s in args.simulated]
    if not series:
        raise InputError("attainment: give at least one --measured or --simulated LABEL=FILE")
    loaded = {}  # (label, simulated) -> (docs, points): files with one label make one curve
    for (label, path), simulated in series:
        doc = load_json(path)
        docs_points = loaded.setdefault((label, simulated), ([], []))
        docs_points[0].append(doc)
        docs_points[1].extend(rate_curve(path, doc))
    docs = [d for ds, _ in loaded.values() for d in ds]
    target = next((d["attainment_target"] for d in docs if d.get("attainment_target")), 0.9)
    colors = {}
    fig, ax = pyplot().subplots(figsize=(args.width, args.height))
    for (label, simulated), (curve_docs, points) in loaded.items():
        points = sorted(points)
        doc = curve_docs[0] if len(curve_docs) == 1 else {}  # its own goodput, if alone
        color = colors.setdefault(label, COLORS[len(colors) % len(COLORS)])
        kind = "simulated" if simulated else "measured"
        xs, ys = [p[0] for p in points], [100 * p[1] for p in points]
        ax.plot(xs, ys, linestyle="--" if simulated else "-", marker="o", markersize=4,
                color=color, label=f"{label} ({kind})", gid=gid(kind, label))
        g = goodput_of(doc, points, target)
        if g is not None:  # on the target line
            # A sweep whose every rate met the target says only that the goodput is at least its
            # highest rate.
            at_least = "≥ " if g == points[-1][0] and not isinstance(doc.get("goodput"), dict) \
                else ""
            ax.plot([g], [100 * target], marker="*", markersize=13, color=color,
                    markeredgecolor="black", linestyle="none", gid=gid("goodput", kind, label))
            ax.annotate(f"{at_least}{g:.3g}", (g, 100 * target), textcoords="offset points",
                        xytext=(4, 8 if simulated else -16), fontsize=8, color=color)
    ax.axhline(100 * target, color="gray", linewidth=1, linestyle=":",
               label=f"{100 * target:.0f}% target (★ goodput, req/s)")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("SLO attainment (% of requests meeting every SLO)")
    ax.set_ylim(-3, 103)
    if args.log_x:
        from matplotlib.ticker import FuncFormatter
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(title_of("SLO attainment against request rate", docs, args.hardware), fontsize=10)
    fig.tight_layout()
    save(fig, args.out)


# ------------------------------------------------------------------ latency CDFs

def latencies_ms(path, doc):
    """Per-request TTFT and TPOT (the mean of its inter-token latencies), milliseconds."""
    ttfts = field(doc, path, "ttfts", list)
    itls = field(doc, path, "itls", list)
    if not ttfts:
        raise InputError(f"{path}: field 'ttfts' is empty (no request completed)")
    tpots = [1e3 * sum(r) / len(r) for r in itls if isinstance(r, list) and r]
    return [1e3 * t for t in ttfts if isinstance(t, (int, float))], tpots


def cdf(ax, values, **kw):
    xs = sorted(values)
    ys = [100 * (i + 1) / len(xs) for i in range(len(xs))]
    ax.step([xs[0]] + xs, [0] + ys, where="post", **kw)  # from 0% at the smallest value


def plot_latency(args):
    if not args.files:
        raise InputError("latency: give at least one LABEL=FILE")
    loaded = []
    for spec in args.files:
        label, path = labelled(spec, "latency")
        doc = load_json(path)
        if "schema" in doc:
            raise InputError(f"{path}: field 'schema' is {json.dumps(doc['schema'])}: latency "
                             "takes a single-rate `pdserve bench --save-result` JSON")
        loaded.append((label, doc, *latencies_ms(path, doc)))
    docs = [doc for _, doc, _, _ in loaded]
    fig, (a_ttft, a_tpot) = pyplot().subplots(1, 2, figsize=(args.width, args.height))
    for i, (label, doc, ttft, tpot) in enumerate(loaded):
        rate = doc.get("request_rate")
        text = f"{label} ({rate} req/s)" if rate is not None else label
        color = COLORS[i % len(COLORS)]
        cdf(a_ttft, ttft, color=color, label=text, gid=gid("ttft", label))
        if tpot:
            cdf(a_tpot, tpot, color=color, label=text, gid=gid("tpot", label))
    slo = next((d["slo_ms"] for d in docs if d.get("slo_ms")), {})
    for ax, metric, name in ((a_ttft, "ttft", "TTFT"), (a_tpot, "tpot", "TPOT")):
        if metric in slo:
            ax.axvline(slo[metric], color="gray", linestyle=":", label=f"SLO {slo[metric]:g} ms")
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (ms, log scale)")
        ax.set_ylabel("requests (%, cumulative)")
        ax.set_ylim(0, 101)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        ax.set_title(f"{name} CDF", fontsize=10)
    fig.suptitle(title_of("Latency distributions per deployment", docs, args.hardware), fontsize=10)
    fig.tight_layout()
    save(fig, args.out)


# ------------------------------------------------------------------ the simulator against A100 runs

def plot_traces(args):
    doc = load_json(args.file)
    if doc.get("schema") != "pdserve-simulate-v1" or doc.get("mode") != "traces":
        raise InputError(f"{args.file}: fields 'schema'/'mode' are {json.dumps(doc.get('schema'))}"
                         f"/{json.dumps(doc.get('mode'))}, expected pdserve-simulate-v1/traces "
                         "(pdserve simulate --traces all --json)")
    rows = field(doc, args.file, "traces", list)
    by_system = {}
    for i, t in enumerate(rows):
        for name in ("system", "request_rate", "simulated.attainment.both",
                     "measured.attainment.both"):
            field(t, f"{args.file}: traces[{i}]", name)
        by_system.setdefault(t["system"], []).append(t)
    if not by_system:
        raise InputError(f"{args.file}: field 'traces' is empty")
    fig, (a_rate, a_par) = pyplot().subplots(1, 2, figsize=(args.width, args.height))
    for i, (system, ts) in enumerate(sorted(by_system.items())):
        color = COLORS[i % len(COLORS)]
        ts = sorted(ts, key=lambda t: (t["request_rate"], t.get("num_requests", 0)))
        rates = [t["request_rate"] for t in ts]
        meas = [100 * t["measured"]["attainment"]["both"] for t in ts]
        sim = [100 * t["simulated"]["attainment"]["both"] for t in ts]
        # Every trace a marker; the line through the mean at each rate (a system's traces may
        # differ in length at one rate).
        line_rates = sorted(set(rates))
        for values, style, kind in ((meas, "-", "measured"), (sim, "--", "simulated")):
            means = [statistics.mean(v for r, v in zip(rates, values) if r == x)
                     for x in line_rates]
            a_rate.plot(line_rates, means, style, color=color, label=f"{system} {kind}",
                        gid=gid(kind, system))
            a_rate.plot(rates, values, "o" if kind == "measured" else "s", color=color,
                        markersize=4, fillstyle="full" if kind == "measured" else "none",
                        gid=gid("marks", kind, system))
        a_par.plot(meas, sim, "o", color=color, label=system, gid=gid("points", system))
    a_par.plot([0, 100], [0, 100], color="gray", linewidth=1, linestyle=":",
               label="simulated = measured")
    a_rate.axhline(100 * doc.get("attainment_target", 0.9), color="gray", linestyle=":",
                   linewidth=1)
    a_rate.set_xlabel("request rate (req/s)")
    a_rate.set_ylabel("SLO attainment (%)")
    a_rate.set_title("per system: measured (solid, ●) and simulated (dashed, □); line: "
                     "mean at each rate", fontsize=9)
    a_par.set_xlabel("measured SLO attainment (%)")
    a_par.set_ylabel("simulated SLO attainment (%)")
    a_par.set_title("one point per trace", fontsize=9)
    for ax in (a_rate, a_par):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    a_par.set_xlim(-3, 103)
    a_par.set_ylim(-3, 103)
    what = f"The simulator against DistServe's recorded A100 runs ({len(rows)} traces)"
    fig.suptitle(title_of(what, [{**doc, "dataset_name": "DistServe's ShareGPT traces"}],
                          args.hardware), fontsize=10)
    fig.tight_layout()
    save(fig, args.out)


def main():
    p = argparse.ArgumentParser(prog="plot.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)

    def common(q, width, height):
        q.add_argument("--out", required=True, help="PREFIX: writes PREFIX.png and PREFIX.svg")
        q.add_argument("--width", type=float, default=width, help="inches")
        q.add_argument("--height", type=float, default=height, help="inches")
        q.add_argument("--hardware", help="the hardware, where the JSON does not record it")
        return q

    a = common(sub.add_parser("attainment"), 8, 5)
    a.add_argument("--measured", action="append", default=[], metavar="LABEL=FILE")
    a.add_argument("--simulated", action="append", default=[], metavar="LABEL=FILE")
    a.add_argument("--log-x", action="store_true", help="rates on a log2 axis")
    lat = common(sub.add_parser("latency"), 10, 4.5)
    lat.add_argument("files", nargs="*", metavar="LABEL=FILE")
    common(sub.add_parser("traces"), 11, 4.5).add_argument("file", metavar="FILE")
    t = common(sub.add_parser("timeline"), 11, 5)
    t.add_argument("--request", help="transfer id (prefill side) or engine id (decode side)")
    t.add_argument("traces", nargs="+", metavar="TRACE")
    args = p.parse_args()
    for name in ("width", "height"):
        if not 1 <= getattr(args, name) <= 40:
            p.error(f"--{name} must be in [1, 40] inches")
    try:
        if args.what == "attainment":
            plot_attainment(args)
        elif args.what == "latency":
            plot_latency(args)
        elif args.what == "traces":
            plot_traces(args)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import plot_timeline
            plot_timeline.plot(args, load_json, InputError, save, gid, pyplot)
    except InputError as e:
        print(f"plot.py: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
