#!/usr/bin/env python3
"""`pdserve bench`'s sweep and goodput-search flags: each bad one exits 2 naming the flag, before
anything is sent (the base URL points at a port nothing listens on).  Usage: bench_flags_test.py PDSERVE"""
import subprocess
import sys

PDSERVE = sys.argv[1]
BASE = ["bench", "--base-url", "http://127.0.0.1:1"]
CASES = [
    (["--request-rate", "0"], "--request-rate: '0'"),
    (["--request-rate", "-2"], "--request-rate: '-2'"),
    (["--request-rate", "1,0,4"], "--request-rate: '0'"),
    (["--slo", "ttft:500"], "--slo: 'ttft:500' has no unit"),
    (["--slo", "foo:5ms"], "--slo: unknown SLO 'foo'"),
    (["--goodput-search", "ttft:500ms", "tpot:100"], "--goodput-search: 'tpot:100' has no unit"),
    (["--goodput-search", "ttft:500ms", "--attainment", "0"], "--attainment must be in (0, 1]"),
    (["--goodput-search", "ttft:500ms", "--attainment", "1.5"], "--attainment must be in (0, 1]"),
    (["--goodput-search", "ttft:500ms", "--precision", "0"], "--precision must be in (0, 1)"),
    (["--goodput-search", "ttft:500ms", "--request-rate", "1,2"], "--goodput-search takes one rate"),
    (["--goodput-search", "ttft:5ms", "--slo", "ttft:5ms"], "--slo and --goodput-search"),
    (["--devices", "2"], "--devices goes with --goodput-search"),
    (["--min-rate", "0.5"], "--min-rate goes with --goodput-search"),
    (["--goodput-search", "ttft:5ms", "--request-rate", "2", "--min-rate", "4"], "--min-rate must be in"),
    (["--goodput-search", "ttft:5ms", "--min-rate", "-1"], "--min-rate must be in"),
]
failed = 0
for flags, want in CASES:
    p = subprocess.run([PDSERVE] + BASE + flags, capture_output=True, text=True, timeout=30)
    if p.returncode != 2 or want not in p.stderr:
        failed += 1
        print(f"FAIL {flags}: exit {p.returncode}, stderr {p.stderr.strip()!r}, want {want!r}")
    else:
        print(f"ok   {flags}: {p.stderr.strip()}")
sys.exit(1 if failed else 0)
