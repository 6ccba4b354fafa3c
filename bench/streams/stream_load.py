#!/usr/bin/python3
"""Many concurrent streaming clients against an OpenAI-compatible server (the router of
`pdserve up`), each checked against a reference answer, while the servers' threads and memory are
sampled from /proc.

  stream_load.py --url http://127.0.0.1:8000 --model M --clients 2000 --max-tokens 8 \\
      --watch router=PID --watch prefill=PID --watch decode=PID

First one non-streamed request (greedy, temperature 0) gives the reference text; then --clients
streamed requests of the same prompt all open their connections and send at once (asyncio, one
thread), each reading its SSE stream to "data: [DONE]". A client passes when its text equals the
reference and its finish_reason is set. Every --watch process's /proc/PID/status is sampled every
--sample-ms: the report gives its peak Threads and its VmHWM (peak resident memory) at the end
(and, with --router-metrics, the peak of the router's open streams).
Exit status 0 only when every client passed. Standard library only.
"""
import argparse
import asyncio
import json
import resource
import sys
import time
import urllib.parse
import urllib.request


def request_body(args, stream):
    return json.dumps({
        "model": args.model,
        "prompt": args.prompt,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": stream,
    }).encode()


def reference_text(args):
    req = urllib.request.Request(args.url + "/v1/completions", data=request_body(args, False),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=args.timeout_s) as r:
        body = json.load(r)
    return body["choices"][0]["text"], body["choices"][0]["finish_reason"]


async def read_chunked(reader):
    """The decoded body of a chunked response."""
    out = bytearray()
    while True:
        size_line = await reader.readline()
        if not size_line:
            raise ConnectionError("connection closed inside the chunked body")
        size = int(size_line.split(b";")[0].strip(), 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readexactly(2)


async def one_client(args, host, port, start, results):
    """One streamed request; appends (ok, detail) to results."""
    await start.wait()
    try:
        reader, writer = await asyncio.open_connection(host, port)
        body = request_body(args, True)
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        writer.write(head.encode() + body)
        await writer.drain()
        status_line = await reader.readline()
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(status_line.split()[1]) if status_line else 0
        if headers.get("transfer-encoding", "").lower() == "chunked":
            payload = await read_chunked(reader)
        else:
            payload = await reader.read()
        writer.close()
        if status != 200:
            results.append((False, f"HTTP {status}: {payload[:200]!r}"))
            return
        text, finish, done = "", None, False
        for event in payload.decode().split("\n\n"):
            if not event.startswith("data: "):
                continue
            data = event[6:]
            if data == "[DONE]":
                done = True
                continue
            obj = json.loads(data)
            if "error" in obj:
                results.append((False, f"error event: {data[:200]}"))
                return
            choice = obj["choices"][0]
            text += choice.get("text", "")
            finish = choice.get("finish_reason") or finish
        if not done or finish is None:
            results.append((False, f"stream did not end: done={done} finish={finish}"))
        elif text != args.expected:
            results.append((False, f"text {text!r} != reference {args.expected!r}"))
        else:
            results.append((True, ""))
    except Exception as e:  # any failure of this client is reported, not raised
        results.append((False, f"{type(e).__name__}: {e}"))


def read_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("Threads", "VmHWM", "VmRSS"):
                    out[name] = int(value.split()[0])
    except OSError:
        pass
    return out


def open_streams(metrics_url):
    """The router's pdserve:router_open_streams gauge, or None."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("pdserve:router_open_streams "):
                    return int(float(line.split()[1]))
    except OSError:
        pass
    return None


async def sample(args, watch, peaks, stop, period_s):
    while not stop.is_set():
        for name, pid in watch.items():
            s = read_status(pid)
            if "Threads" in s:
                peaks[name] = max(peaks.get(name, 0), s["Threads"])
        if args.router_metrics:
            n = await asyncio.to_thread(open_streams, args.router_metrics)
            if n is not None:
                peaks["open_streams"] = max(peaks.get("open_streams", 0), n)
        try:
            await asyncio.wait_for(stop.wait(), period_s)
        except asyncio.TimeoutError:
            pass


async def run(args):
    url = urllib.parse.urlparse(args.url)
    host, port = url.hostname, url.port or 80
    watch = dict(w.split("=", 1) for w in args.watch)
    peaks, results = {}, []
    stop, start = asyncio.Event(), asyncio.Event()
    sampler = asyncio.create_task(sample(args, watch, peaks, stop, args.sample_ms / 1000))
    clients = [asyncio.create_task(one_client(args, host, port, start, results))
               for _ in range(args.clients)]
    await asyncio.sleep(0)  # every client waits on `start`
    t0 = time.monotonic()
    start.set()
    await asyncio.wait_for(asyncio.gather(*clients), args.timeout_s)
    wall = time.monotonic() - t0
    stop.set()
    await sampler
    return results, peaks, watch, wall


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--prompt", default="The quick brown fox")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--clients", type=int, default=2000)
    p.add_argument("--watch", action="append", default=[], metavar="NAME=PID",
                   help="a process to sample (repeatable)")
    p.add_argument("--sample-ms", type=float, default=50)
    p.add_argument("--router-metrics", metavar="URL",
                   help="the router's /metrics: report the peak of its open streams")
    p.add_argument("--timeout-s", type=float, default=600)
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.clients + 64:
        sys.exit(f"stream_load: {args.clients} clients need more descriptors than {hard}")
    args.expected, finish = reference_text(args)
    results, peaks, watch, wall = asyncio.run(run(args))
    passed = sum(1 for ok, _ in results if ok)
    failures = [d for ok, d in results if not ok]
    report = {"clients": args.clients, "passed": passed, "failed": len(failures),
              "wall_s": round(wall, 3), "reference": args.expected,
              "reference_finish_reason": finish, "peak_open_streams": peaks.get("open_streams"),
              "processes": {}}
    for name, pid in watch.items():
        s = read_status(pid)
        report["processes"][name] = {"pid": int(pid), "peak_threads": peaks.get(name),
                                     "vm_hwm_kib": s.get("VmHWM"), "vm_rss_kib": s.get("VmRSS")}
    print(f"{passed}/{args.clients} streams correct in {wall:.2f} s "
          f"(reference {args.expected!r}, finish_reason {finish}); "
          f"router's peak open streams {peaks.get('open_streams')}")
    for name, r in report["processes"].items():
        print(f"  {name:8s} pid {r['pid']}: peak threads {r['peak_threads']}, "
              f"peak RSS (VmHWM) {r['vm_hwm_kib'] / 1024 if r['vm_hwm_kib'] else 0:.1f} MiB")
    for d in failures[:10]:
        print("  failed:", d)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    sys.exit(0 if not failures else 1)


if __name__ == "__main__":
    main()
