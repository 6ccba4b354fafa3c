// Goodput search on the real system: the highest request rate at which the share of requests
// meeting the SLOs (the attainment) reaches a target, found as DistServe's search does: an
// exponential bracket from a start rate (doubling while the target is met, halving while it is
// not), then bisection of the bracket until it is narrower than a stated relative precision.
// The search is pure: it calls measure(rate) -> attainment, and knows nothing of HTTP.
#pragma once

#include <functional>
#include <vector>

#include "common/status.h"

namespace pd::bench {

struct GoodputSearchOptions {
  double attainment = 0.9;  // target, in (0, 1]
  double start_rate = 1.0;  // req/s: the first probe
  // Stop when hi - lo <= precision * lo: the threshold lies in [goodput, goodput * (1 +
  // precision)] when attainment is monotone in the rate.
  double precision = 0.05;
  double max_rate = 1e4;   // doubling stops here: goodput >= max_rate is reported as max_rate
  double min_rate = 1e-3;  // halving stops below this: goodput 0
  int max_probes = 64;     // a bound on measure() calls, whatever the precision
};

// One rate measured: its attainment and whether it met the target.
struct RateProbe {
  double rate = 0;
  double attainment = 0;
  bool meets = false;
};

struct GoodputSearchResult {
  double goodput = 0;  // the bracket's low end: a probed rate that met the target; 0 if none did
  double upper = 0;    // the bracket's high end: a probed rate that missed; 0 if none did
  bool bracketed = false;  // both ends found (else goodput is 0 or max_rate was reached)
  // The measured attainment never rose with the rate along the curve. The bracket itself is
  // always consistent (every probe at or below goodput met the target, every probe at or above
  // upper missed: the bisection only probes inside it), so noise shows here: false when some
  // higher rate measured a higher attainment, and then the goodput may sit anywhere the noise
  // could move the crossing to.
  bool monotone = true;
  std::vector<RateProbe> curve;  // every probe, sorted by rate (in probing order when equal)
};

using MeasureAttainment = std::function<Result<double>(double rate)>;

// InvalidArgument for options out of range; the first error of measure() is returned as is.
Result<GoodputSearchResult> SearchGoodput(const GoodputSearchOptions& options,
                                          const MeasureAttainment& measure);

}  // namespace pd::bench
