#!/usr/bin/python3
"""The Grafana dashboard (deploy/grafana/pdserve.json) against a live `pdserve up` under load,
scraped by Debian's Prometheus with the shipped config (deploy/prometheus/prometheus.yml).

  prometheus_dashboard_test.py PDSERVE [PROMETHEUS]

1. The dashboard parses, is what deploy/grafana/make_dashboard.py writes, and every panel has a
   PromQL expression.
2. `pdserve up` (models/demo-llama, 1 prefill + 1 decode) runs under a `pdserve bench` load; every
   metric the dashboard names is one its router or instances export on /metrics (the prefix-cache
   pair may be absent until pdserve exports it: then its panel is reported, not checked).
3. Prometheus (the binary, default `prometheus` on PATH; exit 77 when absent) starts on a free
   port with a temporary storage directory and a copy of the shipped config: its targets files
   point at this deployment's ports and its scrape interval is 1 s instead of 5 s. Every
   expression, with $__rate_interval set to 10s, must return data before a deadline.
"""
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "pdserve.json")
CONFIG = os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")
MODEL = os.path.join(ROOT, "models", "demo-llama")
# Named by the dashboard before pdserve exports them: checked when present, reported when not.
PENDING = {"pdserve:prefix_cache_queries_total", "pdserve:prefix_cache_hits_total"}
DEADLINE_S = 40


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def free_port_base(n):
    """A port P with P..P+n-1 free, below the ephemeral range (where clients' ports come from)."""
    for _ in range(200):
        p = random.randint(20000, 32000 - n)
        socks = []
        try:
            for q in range(p, p + n):
                t = socket.socket()
                t.bind(("127.0.0.1", q))
                socks.append(t)
            return p
        except OSError:
            pass
        finally:
            for t in socks:
                t.close()
    fail("no free ports")


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_until(what, check, deadline):
    """Polls check() until it returns a true value or the deadline passes (then fails)."""
    while True:
        try:
            value = check()
            if value:
                return value
        except OSError:
            pass
        if time.monotonic() > deadline:
            fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def dashboard_exprs():
    with open(DASHBOARD) as f:
        text = f.read()
    try:
        board = json.loads(text)
    except json.JSONDecodeError as e:
        fail(f"{DASHBOARD}: not JSON: {e}")
    made = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "grafana",
                                                        "make_dashboard.py")],
                          capture_output=True, text=True, check=True).stdout
    if json.loads(made) != board:
        fail(f"{DASHBOARD} differs from what deploy/grafana/make_dashboard.py writes: rerun it")
    exprs = []
    for p in board.get("panels", []):
        targets = p.get("targets", [])
        if not targets:
            fail(f"panel '{p.get('title')}' has no targets")
        for t in targets:
            if not t.get("expr"):
                fail(f"panel '{p.get('title')}' target {t.get('refId')} has no expr")
            exprs.append((p["title"], t["expr"]))
    if len(exprs) < 10:
        fail(f"only {len(exprs)} expressions in the dashboard")
    return exprs


def exported_names(text):
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, 1)[0]
            names.add(name)
            names.add(re.sub(r"_(bucket|sum|count)$", "", name))
    return names


def main():
    if len(sys.argv) not in (2, 3):
        fail("usage: prometheus_dashboard_test.py PDSERVE [PROMETHEUS]")
    pdserve = sys.argv[1]
    prometheus = shutil.which(sys.argv[2] if len(sys.argv) == 3 else "prometheus")
    exprs = dashboard_exprs()
    print(f"ok   dashboard: {len(exprs)} expressions in "
          f"{len({t for t, _ in exprs})} panels, as make_dashboard.py writes it")
    tmp = tempfile.mkdtemp(prefix="pdserve-prom-")
    procs = []
    try:
        run(pdserve, prometheus, exprs, tmp, procs)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def run(pdserve, prometheus, exprs, tmp, procs):
    deadline = time.monotonic() + DEADLINE_S
    port = free_port_base(3)
    log = open(os.path.join(tmp, "up.log"), "w+")
    procs.append(subprocess.Popen(
        [pdserve, "--log-level", "warn", "up", "--model", MODEL, "--prefill", "1", "--decode", "1",
         "--port", str(port), "--threads", "1"], stdout=log, stderr=subprocess.STDOUT))

    def router_up():
        if procs[0].poll() is not None:
            log.seek(0)
            fail(f"pdserve up exited {procs[0].returncode}: {log.read()[-2000:]}")
        log.seek(0)
        return "router (OpenAI API) on" in log.read()
    wait_until("pdserve up's router", router_up, deadline)
    procs.append(subprocess.Popen(
        [pdserve, "--log-level", "warn", "bench", "--base-url", f"http://127.0.0.1:{port}",
         "--dataset-name", "random", "--random-input-len", "48", "--random-output-len", "8",
         "--num-prompts", "1000", "--request-rate", "5", "--ignore-eos", "--seed", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    urls = {"router": port, "prefill": port + 1, "decode": port + 2}
    wait_until("a finished request", lambda: re.search(
        r"^pdserve:request_success_total\{.*\} [1-9]",
        get(f"http://127.0.0.1:{urls['decode']}/metrics"), re.M), deadline)
    exported = set()
    for role, p in urls.items():
        exported |= exported_names(get(f"http://127.0.0.1:{p}/metrics"))
    named = {m for _, e in exprs for m in re.findall(r"pdserve:[a-zA-Z0-9_:]+", e)}
    named = {re.sub(r"_bucket$", "", m) for m in named}
    unknown = sorted(named - exported - PENDING)
    if unknown:
        fail(f"the dashboard names metrics pdserve does not export: {unknown}")
    pending = sorted((named & PENDING) - exported)
    note = f" (not yet exported, their panel unchecked: {pending})" if pending else ""
    print(f"ok   dashboard names {len(named)} metrics, each exported by the router or an "
          f"instance{note}")
    if prometheus is None:
        print("SKIP: no prometheus binary (Debian's `prometheus`; scripts/install-deps.sh "
              "installs it): the queries were not run")
        sys.exit(77)
    query_all(prometheus, exprs, urls, pending, tmp, procs)


def query_all(prometheus, exprs, urls, pending, tmp, procs):
    deadline = time.monotonic() + DEADLINE_S
    with open(CONFIG) as f:
        config = f.read()
    if "scrape_interval: 5s" not in config:
        fail(f"{CONFIG}: expected 'scrape_interval: 5s' (the test sets it to 1s)")
    os.makedirs(os.path.join(tmp, "targets"))
    with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
        f.write(config.replace("scrape_interval: 5s", "scrape_interval: 1s"))
    for role in ("router", "prefill", "decode", "colocated"):
        targets = [{"targets": [f"127.0.0.1:{urls[role]}"]}] if role in urls else []
        with open(os.path.join(tmp, "targets", f"{role}.json"), "w") as f:
            json.dump(targets, f)
    prom_port = free_port_base(1)
    procs.append(subprocess.Popen(
        [prometheus, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/data",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=open(os.path.join(tmp, "prometheus.log"), "w"), stderr=subprocess.STDOUT))
    api = f"http://127.0.0.1:{prom_port}/api/v1/query?query="

    def query(expr):
        reply = json.loads(get(api + urllib.parse.quote(expr)))
        if reply.get("status") != "success":
            fail(f"Prometheus rejected {expr!r}: {reply}")
        return reply["data"]["result"]

    def all_up():
        if procs[-1].poll() is not None:
            fail(f"prometheus exited {procs[-1].returncode}: "
                 f"{open(os.path.join(tmp, 'prometheus.log')).read()[-2000:]}")
        jobs = {r["metric"]["job"] for r in query("up == 1")}
        return jobs >= {"pdserve-router", "pdserve-prefill", "pdserve-decode"}
    wait_until("Prometheus scraping the router, prefill and decode jobs", all_up, deadline)
    print("ok   prometheus scrapes pdserve-router, pdserve-prefill and pdserve-decode")
    todo = [(title, e) for title, e in exprs
            if not any(m in e for m in pending)]
    results = {}

    def every_expr_has_data():
        for title, e in todo:
            if not results.get(e):
                results[e] = query(e.replace("$__rate_interval", "10s"))
        return all(results[e] for _, e in todo)
    try:
        wait_until("every expression to return data", every_expr_has_data, deadline)
    finally:
        for title, e in todo:
            print(f"{'ok  ' if results.get(e) else 'FAIL'} {title}: {e} -> "
                  f"{len(results.get(e) or [])} series")
    for title, e in exprs:
        if (title, e) not in todo:
            print(f"skip {title}: {e} (its metrics are not exported yet)")


if __name__ == "__main__":
    main()
