#!/usr/bin/python3
"""Tests of bench/disagg's scripts on made-up bench and transfer-bench JSON: report.py's low-load
reports (the paired report's median of per-prompt differences and its verdict, the rounds'
verdict) and stages.py's per-request time before the servers."""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "disagg"))
import report  # noqa: E402
import stages  # noqa: E402


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def bench(dir_, name, ttft, tpot=0.6, completed=1, failed=0):
    return write(os.path.join(dir_, name + ".json"), {
        "completed": completed, "failed": failed, "median_ttft_ms": ttft, "p99_ttft_ms": ttft,
        "median_tpot_ms": tpot})


class LowLoadReports(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        # One 512 KiB layer written in 0.2 ms p50: with TPOT 0.6 the goal is 0.8 ms.
        self.transfer = write(os.path.join(self.dir, "t.json"), {"rows": [
            {"workload": "pages", "domains": 2, "p50_us": 900.0},
            {"workload": "pages", "domains": 1, "p50_us": 200.0}]})

    def tearDown(self):
        self.tmp.cleanup()

    def run_report(self, fn, args):
        out = io.StringIO()
        with redirect_stdout(out):
            fn(args)
        return out.getvalue()

    def paired(self, d_ttfts, c_ttfts):
        ds = [bench(self.dir, f"d{i}", t) for i, t in enumerate(d_ttfts)]
        cs = [bench(self.dir, f"c{i}", t) for i, t in enumerate(c_ttfts)]
        return self.run_report(report.low_load_paired,
                               [",".join(ds), ",".join(cs), self.transfer, "524288"])

    def test_paired_takes_the_median_of_the_per_prompt_differences(self):
        # Differences 0.5, -1, 3, 0.2, 10: median 0.5, while the medians differ by 3.0.
        text = self.paired([50.5, 60, 53, 40.2, 70], [50, 61, 50, 40, 60])
        self.assertIn("median of the per-prompt differences: 0.50 ms", text)
        self.assertIn("4 of 5 positive", text)
        self.assertIn("= 0.80 ms", text)
        self.assertIn("(met)", text)

    def test_paired_over_the_goal_is_not_met(self):
        text = self.paired([52, 62, 53], [50, 61, 50])
        self.assertIn("differences: 2.00 ms", text)
        self.assertIn("(NOT met)", text)

    def test_paired_refuses_a_run_that_lost_its_request(self):
        ds = [bench(self.dir, "d0", 50.0, completed=0, failed=1)]
        cs = [bench(self.dir, "c0", 50.0)]
        with self.assertRaises(SystemExit) as e:
            self.run_report(report.low_load_paired, [ds[0], cs[0], self.transfer, "1"])
        self.assertIn("completed 0 and failed 1", str(e.exception))

    def test_paired_refuses_unequal_sides(self):
        ds = [bench(self.dir, "d0", 50.0), bench(self.dir, "d1", 50.0)]
        cs = [bench(self.dir, "c0", 50.0)]
        with self.assertRaises(SystemExit):
            self.run_report(report.low_load_paired, [",".join(ds), cs[0], self.transfer, "1"])

    def test_rounds_inside_the_colocated_spread_are_inconclusive_either_way(self):
        # Colocated moves 10 ms between rounds, more than the 0.8 ms goal: an added 5 ms is as
        # inconclusive as an added -5 ms.
        for d in ([55, 65], [45, 55]):
            ds = [bench(self.dir, f"rd{i}", t) for i, t in enumerate(d)]
            cs = [bench(self.dir, f"rc{i}", t) for i, t in enumerate([50, 60])]
            text = self.run_report(report.low_load,
                                   [",".join(ds), ",".join(cs), self.transfer, "1"])
            self.assertIn("inconclusive", text)

    def test_rounds_over_the_goal_with_a_steady_colocated_side_are_not_met(self):
        ds = [bench(self.dir, f"rd{i}", t) for i, t in enumerate([52, 52])]
        cs = [bench(self.dir, f"rc{i}", t) for i, t in enumerate([50, 50.1])]
        text = self.run_report(report.low_load, [",".join(ds), ",".join(cs), self.transfer, "1"])
        self.assertIn("(NOT met)", text)


class BeforeTheServers(unittest.TestCase):
    def test_each_request_is_measured_from_its_own_send(self):
        with tempfile.TemporaryDirectory() as d:
            # Sent at 10.000 s and 10.100 s (read - TTFT), the second read before the first's
            # order would suggest; the TTFTs are 50 ms and 60 ms.
            path = write(os.path.join(d, "b.json"), {
                "first_token_steady_times": [10.050, 10.160], "ttfts": [0.050, 0.060]})
            sends = stages.bench_sends_us(path)
        self.assertEqual(len(sends), 2)
        self.assertAlmostEqual(sends[0], 10.000e6, delta=1)
        self.assertAlmostEqual(sends[1], 10.100e6, delta=1)
        # The servers first saw them 0.3 ms and 0.5 ms after their sends.
        rows = [[("router: request accepted", 10.0003e6)], [("router: request accepted", 10.1005e6)]]
        self.assertAlmostEqual(stages.before_servers_ms(rows, sends), 0.4, places=6)

    def test_a_request_seen_before_any_send_is_left_out(self):
        rows = [[("router: request accepted", 5.0e6)]]
        self.assertIsNone(stages.before_servers_ms(rows, [6.0e6]))
        self.assertIsNone(stages.before_servers_ms(rows, []))


if __name__ == "__main__":
    unittest.main()
