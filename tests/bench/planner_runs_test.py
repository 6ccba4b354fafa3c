#!/usr/bin/python3
"""Tests of bench/planner/runs.py on made-up comparison.json files: the cells within 10% per run
and rule, the misses it names, the mean errors, the machine against itself over the runs at the
same rates, and its errors on bad input."""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "planner"))
import runs  # noqa: E402

BASE = {"attainment": 0.9, "ttft_p50_s": 0.013, "ttft_p90_s": 0.022, "tpot_p50_s": 0.00028,
        "tpot_p90_s": 0.0004}


def figures(scale=None):
    f = dict(BASE)
    for k, v in (scale or {}).items():
        f[k] = BASE[k] * v
    return f


def row(rate, sim=None, real=None):
    return {"rate": rate, "simulated": figures(sim), "measured": figures(real)}


def write(dir_, name, rows_paired, rows_median, rule="paired"):
    path = os.path.join(dir_, name)
    with open(path, "w") as f:
        json.dump({"rule_used": rule, "rows_paired": rows_paired,
                   "rows_per_rate_median": rows_median}, f)
    return path


def write_rounds(dir_, name, rates, rounds, variant):
    """A comparison.json whose paired rows and per-rate median rows are all BASE, with
    paired_rounds: per rate the made-up `rounds` and, under "rounds_variant", `variant`."""
    path = os.path.join(dir_, name)
    with open(path, "w") as f:
        json.dump({"rule_used": "paired", "rows_paired": [row(r) for r in rates],
                   "rows_per_rate_median": [row(r) for r in rates],
                   "paired_rounds": [{"rate": r, "rounds": rounds[i],
                                      "rounds_variant": variant[i]}
                                     for i, r in enumerate(rates)]}, f)
    return path


def beside(paths, key="rounds_variant"):
    out = io.StringIO()
    runs.report_beside([runs.Run(p) for p in paths], key, out)
    return out.getvalue()


def report(paths, tolerance=0.01):
    out = io.StringIO()
    runs.report([runs.Run(p) for p in paths], tolerance, out)
    return out.getvalue()


class Runs(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_counts_cells_names_misses_and_compares_the_machine_with_itself(self):
        # Run a: the paired rule misses TPOT p90 at the first rate (+12%), the per-rate median
        # nothing. Run b at rates 0.5% away: all within; its measured TTFT p90 at the third rate
        # is 15% above run a's. Run c at rates 5% away: not paired with either.
        a = write(self.dir, "a.json",
                  [row(17.0, {"tpot_p90_s": 1.12}), row(34.0), row(51.0)],
                  [row(17.0, {"tpot_p90_s": 1.05}), row(34.0), row(51.0)])
        b_rows = [row(17.085), row(34.17), row(51.255, real={"ttft_p90_s": 1.15})]
        b = write(self.dir, "b.json", b_rows, b_rows, rule="per-rate median")
        c = write(self.dir, "c.json", [row(17.85), row(35.7), row(53.55)],
                  [row(17.85), row(35.7), row(53.55, {"attainment": 0.8})])
        text = report([a, b, c])
        self.assertIn("a.json: 17/34/51 req/s: 14 (paired), 15 (per-rate median): "
                      "TPOT p90 at 17 req/s +12.0%", text)
        # Run b's simulated TTFT p90 at 51 req/s is BASE against a measured 1.15 x BASE: -13%.
        self.assertIn("b.json: 17.1/34.2/51.3 req/s: 14 (per-rate median), 14 (paired): "
                      "TTFT p90 at 51.3 req/s -13.0%", text)
        self.assertIn("c.json: 17.9/35.7/53.5 req/s: 15 (paired), 14 (per-rate median)\n", text)
        self.assertIn("paired: 43 of 45 cells within 10%, all 15 in 1 of 3 runs", text)
        self.assertIn("per-rate median: 43 of 45 cells within 10%, all 15 in 1 of 3 runs", text)
        # The paired rule's TPOT p90 at the first rate: +12%, 0, 0 -> mean +4.0%.
        self.assertRegex(text, r"paired: .*\n(?:.*\n){4}  TPOT p90\s+\+4\.0% ")
        self.assertIn("the machine against itself: 1 pairs of runs with rates within 1.0%, their "
                      "measured figures within 10% of each other in 14 of 15 cells (93.3%), "
                      "all 15 in 0 pairs (0%)", text)
        # A wider tolerance pairs all three runs.
        self.assertIn("3 pairs of runs with rates within 6.0%", report([a, b, c], 0.06))
        self.assertIn("no two runs have rates within 0.1%", report([a, b, c], 0.001))

    def test_weighs_a_variant_against_the_paired_rule_on_the_same_rounds(self):
        # Three rounds a rate. The paired rule: every round's simulation is BASE; the measured
        # TTFT p90 at the first rate runs 1.00, 1.20, 1.05 x BASE (upper median 1.05: -4.8%).
        # The variant puts the simulated TTFT p90 there at 1.09, 1.30, 1.15 x BASE (median 1.15:
        # +9.5%) and its TPOT p50 at the second rate at 1.2 x BASE in every round (+20%).
        rates = [17.0, 34.0]
        real = [{"ttft_p90_s": 1.00}, {"ttft_p90_s": 1.20}, {"ttft_p90_s": 1.05}]
        own = [[row(17.0, real=m) for m in real], [row(34.0)] * 3]
        variant = [[row(17.0, {"ttft_p90_s": k}, m) for k, m in zip((1.09, 1.30, 1.15), real)],
                   [row(34.0, {"tpot_p50_s": 1.2})] * 3]
        a = write_rounds(self.dir, "a.json", rates, own, variant)
        text = beside([a])
        self.assertIn("a.json: 10 against 9\n", text)
        # Per round: the own rule misses the round at 1.20 (-16.7%); the variant misses the
        # second rate's three TPOT p50 cells and none of the TTFT p90 (+9.0%, +8.3%, +9.5%).
        self.assertIn("rounds: 10 of 10 cells within 10%, all 10 in 1 of 1 runs; per round 29 "
                      "of 30", text)
        self.assertIn("rounds_variant: 9 of 10 cells within 10%, all 10 in 0 of 1 runs; per "
                      "round 27 of 30", text)
        self.assertRegex(text, r"TTFT p90\s+-4\.8% ->  \+9\.5%\s+\+0\.0% ->  \+0\.0%")
        self.assertRegex(text, r"TPOT p50\s+\+0\.0% ->  \+0\.0%\s+\+0\.0% -> \+20\.0%")
        # A key no run saved is named.
        with self.assertRaises(SystemExit) as e:
            beside([a], "rounds_without_something")
        self.assertIn("no paired rounds 'rounds_without_something' at 17 req/s", str(e.exception))

    def test_weighs_the_attainment_at_the_other_slo_when_asked(self):
        # The attainment at the SLO used is 30% high at the first rate; at the other SLO it is
        # within 10% everywhere. A comparison without other_attainment is refused by name.
        rows = [row(17.0, {"attainment": 1.3}), row(34.0), row(51.0)]
        for r in rows:
            r["simulated"]["other_attainment"] = 0.95
            r["measured"]["other_attainment"] = 0.97
        a = write(self.dir, "a.json", rows, rows)
        self.assertIn("14 (paired)", report([a]))
        self.assertIn("att at 17 req/s +30.0%", report([a]))
        try:
            runs.use_attainment("other_attainment")
            text = report([a])
            self.assertIn("15 (paired)", text)
            self.assertIn("att other  -2.1% (0.0)", text)
            bare = write(self.dir, "bare.json", [row(17.0)], [row(17.0)])
            with self.assertRaisesRegex(SystemExit, "bare.json: a 'rows_paired' row lacks a "
                                        "simulated figure"):
                runs.Run(bare)
        finally:
            runs.use_attainment("attainment")
        self.assertIn("14 (paired)", report([a]))

    def test_rejects_what_is_not_a_comparison(self):
        bad = os.path.join(self.dir, "bad.json")
        with open(bad, "w") as f:
            f.write("{")
        with self.assertRaises(SystemExit) as e:
            runs.Run(bad)
        self.assertIn("bad.json: cannot read a comparison.json", str(e.exception))
        no_rule = write(self.dir, "r.json", [row(1.0)], [row(1.0)], rule="best")
        with self.assertRaises(SystemExit) as e:
            runs.Run(no_rule)
        self.assertIn("'rule_used' is 'best'", str(e.exception))
        missing = write(self.dir, "m.json", [row(1.0)], [])
        with self.assertRaises(SystemExit) as e:
            runs.Run(missing)
        self.assertIn("no 'rows_per_rate_median' rows", str(e.exception))
        r = row(1.0)
        del r["measured"]["ttft_p90_s"]
        lacking = write(self.dir, "l.json", [r], [row(1.0)])
        with self.assertRaises(SystemExit) as e:
            runs.Run(lacking)
        self.assertIn("a 'rows_paired' row lacks a measured figure", str(e.exception))
        with redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            runs.main(["--rate-tolerance", "0", missing])


if __name__ == "__main__":
    unittest.main()
