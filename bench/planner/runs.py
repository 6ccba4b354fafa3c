#!/usr/bin/python3
"""Several `pdserve validate-sim` runs (issue #7) side by side, from their comparison.json files:
the simulator against each run, and the machine against itself across runs.

- Per run: its three rates, the cells (attainment, TTFT p50 / p90, TPOT p50 / p90 per rate)
  within 10% under the rule used and under the other rule (both are in every comparison.json),
  and the cells the rule used missed.
- Over the runs, per rule: the cells within 10%, the runs with all of them, and per cell the
  mean and spread of simulated / measured - 1.
- The machine against itself: every two runs whose rates all lie within --rate-tolerance of
  each other (the rates follow each run's probed capacity), their measured figures (each the
  median of the run's rounds) set one against the other as the simulator's are against a run's:
  the cells within 10% and the pairs with all of them. The simulator cannot be expected nearer a
  run than another run of the same deployment at the same rates comes.

- With --beside KEY (a variant validate-sim simulates beside the paired rule on the same
  rounds, saved per rate under paired_rounds[].KEY, e.g. rounds_with_arrival_work): the
  paired rule (each round's simulation, the median over the rounds) against that variant, run
  by run and over the runs: the cells within 10%, the runs with all of them, the rounds' cells
  within 10% and the mean error per cell. A change to the simulator is weighed so, on the same
  rounds over several runs, rather than one run against another.

- With --other-slo: every attainment cell is the attainment at the other SLO rule's SLO
  (validate-sim's --slo-rule; saved beside each attainment as other_attainment), so the two SLO
  rules are weighed on the same runs.

Usage: runs.py [--rate-tolerance 0.01] [--beside KEY] [--other-slo] COMPARISON_JSON...
"""
import argparse
import itertools
import json
import statistics
import sys

METRICS = ("attainment", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
SHORT = {"attainment": "att", "ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90",
         "tpot_p50_s": "TPOT p50", "tpot_p90_s": "TPOT p90"}
RULES = {"paired": "rows_paired", "per-rate median": "rows_per_rate_median"}
TOLERANCE = 0.10


def use_attainment(key):
    """The attainment cells read `key`: "attainment" (at the SLO the run used) or
    "other_attainment" (at the other SLO rule's)."""
    global METRICS
    METRICS = (key,) + METRICS[1:]
    SHORT[key] = "att" if key == "attainment" else "att other"


def check_figures(path, key, items, what):
    """Exits naming `path`, `key` and `what` unless every item has every simulated and measured
    figure."""
    for r in items:
        for side in ("simulated", "measured"):
            if not all(isinstance(r.get(side, {}).get(m), (int, float)) for m in METRICS):
                raise SystemExit(f"{path}: a '{key}' {what} lacks a {side} figure")


def rel_diff(a, b):
    """a / b - 1, as planner::RelDiff (0 when both are 0, infinite when only b is)."""
    if b == 0:
        return 0.0 if a == 0 else float("inf")
    return (a - b) / b


class Run:
    def __init__(self, path):
        self.path = path
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"{path}: cannot read a comparison.json: {e}")
        self.rule_used = doc.get("rule_used")
        if self.rule_used not in RULES:
            raise SystemExit(f"{path}: 'rule_used' is {self.rule_used!r}, not one of "
                             f"{sorted(RULES)}")
        self.rows = {}
        for rule, key in RULES.items():
            rows = doc.get(key)
            if not isinstance(rows, list) or not rows:
                raise SystemExit(f"{path}: no '{key}' rows")
            check_figures(path, key, rows, "row")
            self.rows[rule] = rows
        self.rates = [r["rate"] for r in self.rows["paired"]]
        if [r["rate"] for r in self.rows["per-rate median"]] != self.rates:
            raise SystemExit(f"{path}: the two rules' rates differ")
        self.paired_rounds = doc.get("paired_rounds", [])

    def round_rows(self, key):
        """Per rate, the list of rounds (each {simulated, measured}) under `key` of
        paired_rounds ("rounds": the paired rule's own)."""
        by_rate = []
        for i, rate in enumerate(self.rates):
            entry = next((e for e in self.paired_rounds
                          if isinstance(e, dict) and e.get("rate") == rate), None)
            rounds = entry.get(key) if entry else None
            if not isinstance(rounds, list) or not rounds:
                raise SystemExit(f"{self.path}: no paired rounds '{key}' at {rate:.3g} req/s")
            check_figures(self.path, key, rounds, "round")
            by_rate.append(rounds)
        return by_rate

    def errors(self, rule):
        """[(rate index, metric, simulated / measured - 1)] for every cell."""
        return [(i, m, rel_diff(r["simulated"][m], r["measured"][m]))
                for i, r in enumerate(self.rows[rule]) for m in METRICS]

    def within(self, rule):
        return sum(abs(e) <= TOLERANCE for _, _, e in self.errors(rule))


def machine_pairs(runs, rate_tolerance):
    """Cells within 10% and pairs with all of them, over the pairs of runs at the same rates."""
    pairs = within = cells = all_within = 0
    for a, b in itertools.combinations(runs, 2):
        if len(a.rates) != len(b.rates) or any(
                abs(rel_diff(x, y)) > rate_tolerance for x, y in zip(a.rates, b.rates)):
            continue
        n = sum(abs(rel_diff(ra["measured"][m], rb["measured"][m])) <= TOLERANCE
                for ra, rb in zip(a.rows["paired"], b.rows["paired"]) for m in METRICS)
        pairs += 1
        within += n
        cells += len(a.rates) * len(METRICS)
        all_within += n == len(a.rates) * len(METRICS)
    return pairs, within, cells, all_within


def upper_median(values):
    """As planner::UpperMedian: the upper of the two middle values for an even count."""
    v = sorted(values)
    return v[len(v) // 2]


def paired_errors(rounds_by_rate):
    """[(rate index, metric, error)] of the paired rule built from rounds: per rate and metric,
    the median over the rounds of the simulated figure against the median of the measured."""
    out = []
    for i, rounds in enumerate(rounds_by_rate):
        for m in METRICS:
            sim = upper_median(r["simulated"][m] for r in rounds)
            real = upper_median(r["measured"][m] for r in rounds)
            out.append((i, m, rel_diff(sim, real)))
    return out


def round_cells(rounds_by_rate):
    return sum(abs(rel_diff(r["simulated"][m], r["measured"][m])) <= TOLERANCE
               for rounds in rounds_by_rate for r in rounds for m in METRICS)


def report_beside(runs, key, out):
    """The paired rule against the variant `key` on the same rounds, per run and over the runs."""
    cells = len(runs[0].rates) * len(METRICS)
    errors = {"rounds": [], key: []}
    counts = {"rounds": [], key: []}
    rounds_within = {"rounds": 0, key: 0}
    rounds_total = 0
    out.write(f"the paired rule (rounds) beside {key}, on the same rounds: cells within "
              f"{TOLERANCE:.0%} of {cells} per run:\n")
    for run in runs:
        parts = []
        for k in ("rounds", key):
            rows = run.round_rows(k)
            e = paired_errors(rows)
            errors[k].append(e)
            counts[k].append(sum(abs(x) <= TOLERANCE for _, _, x in e))
            rounds_within[k] += round_cells(rows)
            parts.append(str(counts[k][-1]))
        rounds_total += sum(len(r) for r in run.round_rows("rounds")) * len(METRICS)
        out.write(f"  {run.path}: {parts[0]} against {parts[1]}\n")
    for k in ("rounds", key):
        out.write(f"{k}: {sum(counts[k])} of {cells * len(runs)} cells within {TOLERANCE:.0%}, "
                  f"all {cells} in {sum(c == cells for c in counts[k])} of {len(runs)} runs; "
                  f"per round {rounds_within[k]} of {rounds_total}\n")
    out.write(f"simulated / measured - 1, mean per load (rounds -> {key}):\n")
    for m in METRICS:
        parts = []
        for i in range(len(runs[0].rates)):
            mean = {k: statistics.mean(x for e in errors[k] for j, n, x in e if j == i and n == m)
                    for k in ("rounds", key)}
            parts.append(f"{100 * mean['rounds']:+5.1f}% -> {100 * mean[key]:+5.1f}%")
        out.write(f"  {SHORT[m]:<9} " + "  ".join(parts) + "\n")


def report(runs, rate_tolerance, out):
    cells = len(runs[0].rates) * len(METRICS)
    out.write(f"{len(runs)} runs; cells within {TOLERANCE:.0%} of {cells} "
              "(rule used, other rule) and the rule used's misses:\n")
    for run in runs:
        other = next(r for r in RULES if r != run.rule_used)
        misses = [f"{SHORT[m]} at {run.rates[i]:.3g} req/s {100 * e:+.1f}%"
                  for i, m, e in run.errors(run.rule_used) if abs(e) > TOLERANCE]
        rates = "/".join(f"{r:.3g}" for r in run.rates)
        out.write(f"  {run.path}: {rates} req/s: {run.within(run.rule_used)} ({run.rule_used}), "
                  f"{run.within(other)} ({other})"
                  f"{': ' + ', '.join(misses) if misses else ''}\n")
    for rule in RULES:
        total = sum(run.within(rule) for run in runs)
        whole = sum(run.within(rule) == cells for run in runs)
        out.write(f"{rule}: {total} of {cells * len(runs)} cells within {TOLERANCE:.0%}, all "
                  f"{cells} in {whole} of {len(runs)} runs; simulated / measured - 1, mean "
                  "(spread) per load:\n")
        for m in METRICS:
            parts = []
            for i in range(len(runs[0].rates)):
                errs = [e for run in runs for j, n, e in run.errors(rule) if j == i and n == m]
                spread = statistics.pstdev(errs) if len(errs) > 1 else 0.0
                parts.append(f"{100 * statistics.mean(errs):+5.1f}% ({100 * spread:.1f})")
            out.write(f"  {SHORT[m]:<9} " + "  ".join(parts) + "\n")
    pairs, within, total, all_within = machine_pairs(runs, rate_tolerance)
    if pairs == 0:
        out.write(f"the machine against itself: no two runs have rates within "
                  f"{rate_tolerance:.1%} of each other\n")
    else:
        out.write(f"the machine against itself: {pairs} pairs of runs with rates within "
                  f"{rate_tolerance:.1%}, their measured figures within {TOLERANCE:.0%} of each "
                  f"other in {within} of {total} cells ({within / total:.1%}), all {cells} in "
                  f"{all_within} pairs ({all_within / pairs:.0%})\n")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate-tolerance", type=float, default=0.01)
    p.add_argument("--beside", metavar="KEY",
                   help="a paired_rounds variant to weigh against the paired rule, e.g. "
                        "rounds_with_arrival_work")
    p.add_argument("--other-slo", action="store_true",
                   help="the attainment cells at the other SLO rule's SLO (other_attainment)")
    p.add_argument("comparisons", nargs="+", metavar="COMPARISON_JSON")
    a = p.parse_args(argv)
    if a.other_slo:
        use_attainment("other_attainment")
        sys.stdout.write("attainment at the other SLO rule's SLO (other_attainment)\n")
    if not a.rate_tolerance > 0:
        p.error("--rate-tolerance must be positive")
    runs = [Run(path) for path in a.comparisons]
    if len({len(r.rates) for r in runs}) != 1:
        raise SystemExit("the runs compare different numbers of rates")
    report(runs, a.rate_tolerance, sys.stdout)
    if a.beside:
        report_beside(runs, a.beside, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
