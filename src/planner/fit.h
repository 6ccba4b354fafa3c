// Least-squares fits of DistServe's step-time forms from measured (shape, time) samples.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "planner/latency_model.h"

namespace pd::planner {

struct PrefillSample {
  int64_t tokens = 0;  // Σ prompt lengths in the step
  double sq = 0.0;     // Σ prompt lengths²
  double ms = 0.0;     // measured step time
};

struct DecodeSample {
  int batch = 0;
  int64_t context = 0;  // Σ (context + 1)
  double ms = 0.0;
};

// Ordinary least squares for y ≈ x·w with 3 features per row. InvalidArgument when there are
// fewer than 3 rows or the columns are linearly dependent (the normal matrix is singular).
Result<std::array<double, 3>> LeastSquares3(std::span<const std::array<double, 3>> x,
                                            std::span<const double> y);

// Least squares with every coefficient >= 0: the unconstrained solution when it is
// non-negative, else the best over the subsets of features with the others held at 0 (3
// features: 7 subsets). InvalidArgument when no subset gives a non-negative solution.
Result<std::array<double, 3>> NonNegativeLeastSquares3(std::span<const std::array<double, 3>> x,
                                                       std::span<const double> y);

struct FitOptions {
  // Minimise the relative error of each sample (rows weighted by 1/time) instead of the absolute
  // error: step times of a profile span orders of magnitude and the small ones matter as much.
  bool relative = false;
  // Coefficients >= 0 (a step cannot get faster with more work); a noisy profile otherwise
  // yields e.g. a negative quadratic term.
  bool non_negative = false;
};

// Fits [a, b, c] of a + b·tokens + c·sq.
Result<std::array<double, 3>> FitPrefill(std::span<const PrefillSample> samples,
                                         const FitOptions& options = {});
// Fits [a, b, c] of a + b·context + c·batch.
Result<std::array<double, 3>> FitDecode(std::span<const DecodeSample> samples,
                                        const FitOptions& options = {});

// Fits all three forms; samples with batch < threshold go to the small-batch fit, the others to
// the large-batch fit. If one side has too few samples it reuses the other side's coefficients.
Result<StepCoeffs> FitStepCoeffs(std::span<const PrefillSample> prefill,
                                 std::span<const DecodeSample> decode, int threshold,
                                 const FitOptions& options = {});

// Root-mean-square relative error of the coefficients on the samples (a fit's quality figure).
double PrefillRelRmse(const StepCoeffs& c, std::span<const PrefillSample> samples);
double DecodeRelRmse(const StepCoeffs& c, std::span<const DecodeSample> samples);

}  // namespace pd::planner
