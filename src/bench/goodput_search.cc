#include "bench/goodput_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace pd::bench {
namespace {

// A flag's value as the user wrote it, near enough ("1.5", not "1.500000").
std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

Status CheckOptions(const GoodputSearchOptions& o) {
  if (!(o.attainment > 0 && o.attainment <= 1))
    return InvalidArgument("--attainment must be in (0, 1], got " + Num(o.attainment));
  if (!(o.precision > 0 && o.precision < 1))
    return InvalidArgument("--precision must be in (0, 1), got " + Num(o.precision));
  if (!(o.start_rate > 0) || std::isinf(o.start_rate))
    return InvalidArgument("goodput search: the start rate must be a positive number, got " +
                           Num(o.start_rate));
  if (!(o.min_rate > 0 && o.min_rate <= o.start_rate && o.start_rate <= o.max_rate))
    return InvalidArgument("goodput search: needs 0 < min_rate <= start_rate <= max_rate");
  if (o.max_probes < 1) return InvalidArgument("goodput search: max_probes must be positive");
  return OkStatus();
}

// Attainment never rising with the rate along the curve.
bool IsMonotone(const std::vector<RateProbe>& sorted) {
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i].attainment > sorted[i - 1].attainment + 1e-12) return false;
  return true;
}

}  // namespace

Result<GoodputSearchResult> SearchGoodput(const GoodputSearchOptions& o,
                                          const MeasureAttainment& measure) {
  RETURN_IF_ERROR(CheckOptions(o));
  GoodputSearchResult r;
  auto probe = [&](double rate) -> Result<bool> {
    ASSIGN_OR_RETURN(double attainment, measure(rate));
    const bool meets = attainment >= o.attainment - 1e-12;
    r.curve.push_back({rate, attainment, meets});
    return meets;
  };
  double lo = 0, hi = 0;  // lo met the target, hi missed it (0: not found yet)
  // The bracket: double while the target is met, halve while it is not.
  double rate = o.start_rate;
  ASSIGN_OR_RETURN(bool meets, probe(rate));
  (meets ? lo : hi) = rate;
  while (static_cast<int>(r.curve.size()) < o.max_probes) {
    if (lo > 0 && hi > 0) break;
    if (meets) {
      if (rate >= o.max_rate) break;
      rate = std::min(rate * 2, o.max_rate);
    } else {
      rate /= 2;
      if (rate < o.min_rate) break;
    }
    ASSIGN_OR_RETURN(meets, probe(rate));
    (meets ? lo : hi) = rate;
  }
  // Bisection, trusting each probe as it comes (as DistServe's does): a noisy miss below the
  // threshold moves hi down, a noisy meet above it moves lo up.
  r.bracketed = lo > 0 && hi > 0;
  while (r.bracketed && hi - lo > o.precision * lo &&
         static_cast<int>(r.curve.size()) < o.max_probes) {
    const double mid = 0.5 * (lo + hi);
    ASSIGN_OR_RETURN(bool ok, probe(mid));
    (ok ? lo : hi) = mid;
  }
  r.goodput = lo;
  r.upper = hi;
  std::stable_sort(r.curve.begin(), r.curve.end(),
                   [](const RateProbe& a, const RateProbe& b) { return a.rate < b.rate; });
  r.monotone = IsMonotone(r.curve);
  return r;
}

}  // namespace pd::bench
