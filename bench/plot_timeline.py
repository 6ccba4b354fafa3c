"""bench/plot.py timeline: one request's path through `pdserve up`, from its --trace files.

The events it reads (docs/messenger.md, "Metrics and traces"), all on the machine's steady clock:
  both:             "process labels" (args model, host: what ran where, for the title)
  decode instance:  "prefill request sent" (args request = the transfer id, engine_request),
                    "kv transfer" (sent -> every KV write landed), "kv ready", "metadata landed",
                    "step" (engine, args decodes), "layer" (compute, per rank thread),
                    "first token written" / "last token written" (args request = engine id)
  prefill instance: "prefill request", "step" (args step, prefill_chunks), "layer" (args step,
                    layer; one thread per rank), "post writes" (args request, layer, step),
                    "write layer" (posted -> completion: the write has landed on the decode
                    instance), "post metadata" / "metadata write", "transfer"
The request's prefill chunks are the prefill steps its layers' writes were posted in; its decode
steps are the decode instance's steps from its KV being ready to its last token. Lanes: per
instance, one per rank's compute thread (rank 0 is the engine's thread, the others in thread-id
order), then its messenger (the KV writes, one row per layer) and the decode instance's token
stream (one token per decode step from the first token written to the last).
"""
import os
import re


LAYER_COLORS = ("#4c72b0", "#8fb0de")
WRITE_COLOR = "#dd8452"
META_COLOR = "#937860"
DECODE_COLOR = "#55a868"
FIRST_DECODE_COLOR = "#c44e52"


class Instance:
    def __init__(self, path, doc, input_error):
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            raise input_error(f"{path}: field 'traceEvents' is missing (not a --trace file)")
        self.path = path
        self.events, self.labels, self.thread_names = [], {}, {}
        role = ""
        for i, e in enumerate(doc["traceEvents"]):
            if not isinstance(e, dict) or "name" not in e or "ph" not in e:
                raise input_error(f"{path}: traceEvents[{i}] has no 'name' or 'ph'")
            args = e.get("args") or {}
            if e["ph"] == "M":
                if e["name"] == "process_name":
                    role = args.get("name", "")
                elif e["name"] == "thread_name":
                    self.thread_names[e.get("tid")] = args.get("name", "")
                continue
            if not isinstance(e.get("ts"), (int, float)):
                raise input_error(f"{path}: traceEvents[{i}] ('{e['name']}') has no numeric 'ts'")
            if e["name"] == "process labels":  # what ran where: args model, host
                self.labels = {k: str(v) for k, v in args.items()}
            self.events.append(e)
        self.role = "prefill" if "prefill" in role else "decode" if "decode" in role else role
        m = re.search(r"\.((?:prefill|decode)\d+)\.json$", os.path.basename(path))
        self.name = m.group(1) if m else f"{self.role or 'process'} {os.path.basename(path)}"

    def named(self, name):
        return [e for e in self.events if e["name"] == name]

    def rank_of(self):
        """tid -> rank: the engine's thread is rank 0, the other compute threads follow by tid."""
        tids = sorted({e.get("tid") for e in self.named("layer")})
        engine = [t for t in tids if self.thread_names.get(t) == "engine"]
        rest = [t for t in tids if t not in engine]
        return {t: r for r, t in enumerate(engine + rest)}


def arg(e, key):
    return str((e.get("args") or {}).get(key, ""))


def end_us(e):
    return e["ts"] + e.get("dur", 0)


def find_request(decodes, prefills, wanted):
    """(decode instance, its 'prefill request sent' event, prefill instance) of the request:
    `wanted` (transfer or engine id), else the first traced in full."""
    transfers = {}
    for p in prefills:
        for e in p.named("transfer"):
            if arg(e, "status") in ("", "ok"):
                transfers[arg(e, "request")] = p
    candidates = []
    for d in decodes:
        ready = {arg(e, "request") for e in d.named("kv ready")}
        first = {arg(e, "request") for e in d.named("first token written")}
        for e in d.named("prefill request sent"):
            wire, engine_id = arg(e, "request"), arg(e, "engine_request")
            if wanted is not None:
                if wanted in (wire, engine_id) and wire in transfers:
                    return d, e, transfers[wire]
            elif wire in transfers and wire in ready and engine_id in first:
                candidates.append((e["ts"], d, e, transfers[wire]))
    if not candidates:
        return None
    _, d, e, p = min(candidates, key=lambda c: c[0])
    return d, e, p


def bars(ax, y, height, spans, **kw):
    """Horizontal bars [(start, width)] in lane y (a band of `height` around it)."""
    if spans:
        ax.broken_barh(spans, (y - height / 2, height), **kw)


def prefill_lanes(p, wire, t0, lanes):
    """The prefill instance's compute lanes (its chunks' layers, per rank) and KV-write lane."""
    posts = [e for e in p.named("post writes") if arg(e, "request") == wire]
    steps = {arg(e, "step") for e in posts}
    ranks = p.rank_of()
    by_rank = {}
    for e in p.named("layer"):
        if arg(e, "step") in steps:
            by_rank.setdefault(ranks.get(e.get("tid"), 0), []).append(e)
    chunks = [e for e in p.named("step") if arg(e, "step") in steps]
    for rank in sorted(by_rank):
        def draw(ax, y, layers=by_rank[rank], rank=rank):
            if rank == 0:
                bars(ax, y, 0.8, [((e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in chunks],
                     facecolors="none", edgecolors="black", linewidth=0.8)
            for parity in (0, 1):
                sel = [e for e in layers if int(arg(e, "layer") or 0) % 2 == parity]
                bars(ax, y, 0.6, [((e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in sel],
                     facecolors=LAYER_COLORS[parity])
        lanes.append((f"{p.name} rank {rank}\ncompute", f"{p.name}-rank{rank}", draw))
    writes = [e for e in p.named("write layer") if arg(e, "request") == wire]
    meta = [e for e in p.named("metadata write") if arg(e, "request") == wire]
    num_layers = max([int(arg(e, "layer") or 0) for e in writes] + [0]) + 1

    def draw_writes(ax, y):
        h = 0.8 / (num_layers + 1)
        for e in writes:  # layer 0 on top, the metadata below the last layer
            layer = int(arg(e, "layer") or 0)
            row = y + 0.4 - h * (layer + 0.5)
            bars(ax, row, h * 0.8, [((e["ts"] - t0) / 1e3, e["dur"] / 1e3)],
                 facecolors=WRITE_COLOR, edgecolors=WRITE_COLOR, linewidth=1.5)  # short: seen
            if num_layers <= 8:
                ax.text((e["ts"] - t0) / 1e3, row, f"L{layer} ", fontsize=6, ha="right",
                        va="center")
        for e in meta:
            bars(ax, y - 0.4 + h / 2, h * 0.8, [((e["ts"] - t0) / 1e3, e["dur"] / 1e3)],
                 facecolors=META_COLOR, edgecolors=META_COLOR, linewidth=1.5)
    lanes.append((f"{p.name}\nKV writes\n(by layer)", f"{p.name}-kv-writes", draw_writes))
    return len(chunks), num_layers, chunks


def decode_lanes(d, sent, t0, lanes):
    wire, engine_id = arg(sent, "request"), arg(sent, "engine_request")
    ready = min((e["ts"] for e in d.named("kv ready") if arg(e, "request") == wire), default=None)
    transfer = [e for e in d.named("kv transfer") if arg(e, "request") == wire]
    first = min((e["ts"] for e in d.named("first token written")
                 if arg(e, "request") == engine_id), default=None)
    last = max((e["ts"] for e in d.named("last token written")
                if arg(e, "request") == engine_id), default=first)

    def draw_messenger(ax, y):
        bars(ax, y, 0.3, [((e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in transfer],
             facecolors="#cccccc")
        ax.plot([0], [y], marker=">", color="black", markersize=7)
        if ready is not None:
            ax.plot([(ready - t0) / 1e3], [y], marker="D", color=FIRST_DECODE_COLOR, markersize=6)
    lanes.append((f"{d.name}\nKV messenger", f"{d.name}-messenger", draw_messenger))
    steps = [e for e in d.named("step") if ready is not None and last is not None
             and ready <= e["ts"] <= last and int(arg(e, "decodes") or 0) > 0]
    ranks = d.rank_of()
    rank_ids = sorted(set(ranks.values()) or {0})
    for rank in rank_ids:
        def draw(ax, y, rank=rank):
            if rank == 0:
                spans = [((e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in steps]
                bars(ax, y, 0.6, spans[1:], facecolors=DECODE_COLOR)
                bars(ax, y, 0.6, spans[:1], facecolors=FIRST_DECODE_COLOR)
            else:
                tids = [t for t, r in ranks.items() if r == rank]
                sel = [e for e in d.named("layer") if e.get("tid") in tids and steps and
                       steps[0]["ts"] <= e["ts"] <= end_us(steps[-1])]
                bars(ax, y, 0.6, [((e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in sel],
                     facecolors=DECODE_COLOR)
        lanes.append((f"{d.name} rank {rank}\ndecode steps", f"{d.name}-rank{rank}", draw))

    def draw_stream(ax, y):
        if first is None:
            return
        ticks = [(end_us(e) - t0) / 1e3 for e in steps if end_us(e) <= last + 1]
        ax.plot([(first - t0) / 1e3, (last - t0) / 1e3], [y, y], color="black", linewidth=1)
        ax.plot(ticks, [y] * len(ticks), linestyle="none", marker="|", color="black",
                markersize=8)
        ax.plot([(first - t0) / 1e3], [y], marker="o", color=FIRST_DECODE_COLOR, markersize=7)
    lanes.append((f"{d.name}\ntoken stream", f"{d.name}-tokens", draw_stream))
    return ready, first, last, steps


def labels_of(instances):
    out = {}
    for inst in instances:
        for k, v in inst.labels.items():
            out.setdefault(k, v)
    return out


def plot(args, load_json, input_error, save, gid, pyplot):
    """Parses and checks the traces, then draws (matplotlib is imported only then)."""
    instances = [Instance(path, load_json(path), input_error) for path in args.traces]
    prefills = [i for i in instances if i.role == "prefill"]
    decodes = [i for i in instances if i.role == "decode"]
    if not prefills or not decodes:
        raise input_error("timeline: needs a prefill and a decode instance's trace (the "
                          "FILE.prefill0.json and FILE.decode0.json of `pdserve up --trace FILE`); "
                          f"got roles {[i.role or '?' for i in instances]} from {args.traces}")
    found = find_request(decodes, prefills, args.request)
    if found is None:
        what = f"request '{args.request}'" if args.request else "a request traced in full"
        raise input_error(f"{', '.join(args.traces)}: no {what} (its 'prefill request sent' on "
                          "the decode side and its 'transfer' on the prefill side)")
    d, sent, p = found
    wire, t0 = arg(sent, "request"), sent["ts"]
    lanes = []
    num_chunks, num_layers, chunks = prefill_lanes(p, wire, t0, lanes)
    ready, first, last, steps = decode_lanes(d, sent, t0, lanes)
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    fig, ax = plt.subplots(figsize=(args.width, args.height))
    for k, (_, lane_id, draw) in enumerate(lanes):
        y = len(lanes) - 1 - k
        before = set(ax.get_children())
        draw(ax, y)
        new = [c for c in ax.get_children() if c not in before]
        for n, child in enumerate(new):  # SVG groups curve-lane-ID-N
            child.set_gid(gid("lane", lane_id, str(n)))
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([name for name, _, _ in reversed(lanes)], fontsize=8)
    ax.set_ylim(-0.7, len(lanes) - 0.3)
    ax.set_xlabel("time since the decode instance sent the prefill request (ms)")
    ax.grid(axis="x", alpha=0.3)
    legend = [Patch(facecolor=LAYER_COLORS[0], label="prefill: a layer's compute"),
              Patch(facecolor="none", edgecolor="black", label="prefill chunk (engine step)"),
              Patch(facecolor=WRITE_COLOR, label="a layer's KV write, posted → completed"),
              Patch(facecolor=META_COLOR, label="metadata write"),
              Patch(facecolor="#cccccc", label="KV transfer as the decode side waits"),
              Patch(facecolor=FIRST_DECODE_COLOR, label="first decode step"),
              Patch(facecolor=DECODE_COLOR, label="decode step"),
              Line2D([], [], marker="D", color=FIRST_DECODE_COLOR, linestyle="none",
                     label="decode: KV ready"),
              Line2D([], [], marker="o", color=FIRST_DECODE_COLOR, linestyle="none",
                     label="first token written"),
              Line2D([], [], marker="|", color="black", linestyle="none", label="a token")]
    ax.legend(handles=legend, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    labels = labels_of(instances)
    tokens = arg(sent, "tokens")
    ttft = f"; first token at {(first - t0) / 1e3:.1f} ms" if first is not None else ""
    out_tokens = f", {len(steps)} decode steps" if steps else ""
    fig.suptitle(
        f"One request through disaggregated serving (prefill → KV over the fabric → decode)\n"
        f"{labels.get('model', 'model not recorded')} on "
        f"{args.hardware or labels.get('host', 'hardware not recorded')}; "
        f"{tokens} prompt tokens in {num_chunks} chunk(s) × {num_layers} layers{out_tokens}{ttft}",
        fontsize=10)
    fig.tight_layout()
    save(fig, args.out)
