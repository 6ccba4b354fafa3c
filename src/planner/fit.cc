#include "planner/fit.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace pd::planner {

namespace {

// Least squares over the features j with use[j] (the others are 0 in the result).
Result<std::array<double, 3>> MaskedLeastSquares(std::span<const std::array<double, 3>> x,
                                                 std::span<const double> y,
                                                 std::array<bool, 3> use) {
  if (x.size() != y.size()) return InvalidArgument("least squares: x and y differ in length");
  int k = 0;
  int cols[3] = {};
  for (int j = 0; j < 3; ++j)
    if (use[j]) cols[k++] = j;
  if (static_cast<int>(x.size()) < k || k == 0) {
    return InvalidArgument("least squares: need at least " + std::to_string(std::max(k, 1)) +
                           " samples, got " + std::to_string(x.size()));
  }
  // Columns are scaled to unit RMS first so tokens (~1e3) and tokens² (~1e6) condition well.
  std::array<double, 3> scale{};
  for (const auto& row : x)
    for (int j = 0; j < k; ++j) scale[j] += row[cols[j]] * row[cols[j]];
  for (int j = 0; j < k; ++j) {
    scale[j] = std::sqrt(scale[j] / x.size());
    if (scale[j] == 0.0) return InvalidArgument("least squares: a feature is zero in every sample");
  }
  // Normal equations A w = r, A (k,k) = Xᵀ X, r (k,) = Xᵀ y, solved with partial pivoting.
  double a[3][4] = {};
  for (size_t i = 0; i < x.size(); ++i) {
    for (int r = 0; r < k; ++r) {
      const double xr = x[i][cols[r]] / scale[r];
      for (int c = 0; c < k; ++c) a[r][c] += xr * x[i][cols[c]] / scale[c];
      a[r][k] += xr * y[i];
    }
  }
  for (int col = 0; col < k; ++col) {
    int pivot = col;
    for (int r = col + 1; r < k; ++r)
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    if (std::fabs(a[pivot][col]) < 1e-9 * static_cast<double>(x.size())) {
      return InvalidArgument(
          "least squares: samples do not determine the coefficients "
          "(vary the batch shapes)");
    }
    for (int c = 0; c <= k; ++c) std::swap(a[col][c], a[pivot][c]);
    for (int r = 0; r < k; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (int c = col; c <= k; ++c) a[r][c] -= f * a[col][c];
    }
  }
  std::array<double, 3> w{};
  for (int j = 0; j < k; ++j) w[cols[j]] = a[j][k] / a[j][j] / scale[j];
  return w;
}

double SumSquaredError(std::span<const std::array<double, 3>> x, std::span<const double> y,
                       const std::array<double, 3>& w) {
  double sse = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = x[i][0] * w[0] + x[i][1] * w[1] + x[i][2] * w[2] - y[i];
    sse += e * e;
  }
  return sse;
}

Result<std::array<double, 3>> Solve(std::span<const std::array<double, 3>> x,
                                    std::span<const double> y, const FitOptions& o) {
  std::vector<std::array<double, 3>> wx(x.begin(), x.end());
  std::vector<double> wy(y.begin(), y.end());
  if (o.relative) {
    for (size_t i = 0; i < wy.size(); ++i) {
      if (!(wy[i] > 0)) return InvalidArgument("relative fit: a sample time is not positive");
      for (double& v : wx[i]) v /= wy[i];
      wy[i] = 1.0;
    }
  }
  if (x.size() < 3) {
    return InvalidArgument("least squares: need at least 3 samples, got " +
                           std::to_string(x.size()));
  }
  return o.non_negative ? NonNegativeLeastSquares3(wx, wy) : LeastSquares3(wx, wy);
}

}  // namespace

Result<std::array<double, 3>> LeastSquares3(std::span<const std::array<double, 3>> x,
                                            std::span<const double> y) {
  if (x.size() != y.size()) return InvalidArgument("least squares: x and y differ in length");
  if (x.size() < 3) {
    return InvalidArgument("least squares: need at least 3 samples, got " +
                           std::to_string(x.size()));
  }
  return MaskedLeastSquares(x, y, {true, true, true});
}

Result<std::array<double, 3>> NonNegativeLeastSquares3(std::span<const std::array<double, 3>> x,
                                                       std::span<const double> y) {
  ASSIGN_OR_RETURN(auto full, LeastSquares3(x, y));
  if (full[0] >= 0 && full[1] >= 0 && full[2] >= 0) return full;
  bool found = false;
  std::array<double, 3> best{};
  double best_sse = 0.0;
  for (int mask = 1; mask < 7; ++mask) {  // the proper subsets; 7 is the full set
    auto w = MaskedLeastSquares(x, y, {(mask & 1) != 0, (mask & 2) != 0, (mask & 4) != 0});
    if (!w.ok() || (*w)[0] < 0 || (*w)[1] < 0 || (*w)[2] < 0) continue;
    const double sse = SumSquaredError(x, y, *w);
    if (!found || sse < best_sse) {
      found = true;
      best = *w;
      best_sse = sse;
    }
  }
  if (!found) return InvalidArgument("least squares: no non-negative solution");
  return best;
}

Result<std::array<double, 3>> FitPrefill(std::span<const PrefillSample> samples,
                                         const FitOptions& options) {
  std::vector<std::array<double, 3>> x;
  std::vector<double> y;
  for (const auto& s : samples) {
    x.push_back({1.0, static_cast<double>(s.tokens), s.sq});
    y.push_back(s.ms);
  }
  auto w = Solve(x, y, options);
  if (!w.ok()) return w.status().WithContext("prefill fit");
  return w;
}

Result<std::array<double, 3>> FitDecode(std::span<const DecodeSample> samples,
                                        const FitOptions& options) {
  std::vector<std::array<double, 3>> x;
  std::vector<double> y;
  for (const auto& s : samples) {
    x.push_back({1.0, static_cast<double>(s.context), static_cast<double>(s.batch)});
    y.push_back(s.ms);
  }
  auto w = Solve(x, y, options);
  if (!w.ok()) return w.status().WithContext("decode fit");
  return w;
}

Result<StepCoeffs> FitStepCoeffs(std::span<const PrefillSample> prefill,
                                 std::span<const DecodeSample> decode, int threshold,
                                 const FitOptions& options) {
  if (threshold < 1) return InvalidArgument("decode threshold must be >= 1");
  StepCoeffs c;
  c.decode_threshold = threshold;
  ASSIGN_OR_RETURN(c.prefill, FitPrefill(prefill, options));
  std::vector<DecodeSample> small, large;
  for (const auto& s : decode) (s.batch < threshold ? small : large).push_back(s);
  auto fs = FitDecode(small, options);
  auto fl = FitDecode(large, options);
  if (!fs.ok() && !fl.ok()) {
    ASSIGN_OR_RETURN(c.decode_small, FitDecode(decode, options));
    c.decode_large = c.decode_small;
    return c;
  }
  c.decode_small = fs.ok() ? *fs : *fl;
  c.decode_large = fl.ok() ? *fl : *fs;
  return c;
}

double PrefillRelRmse(const StepCoeffs& c, std::span<const PrefillSample> samples) {
  double sum = 0.0;
  for (const auto& s : samples) {
    const double e = (c.PrefillMs(s.tokens, s.sq) - s.ms) / s.ms;
    sum += e * e;
  }
  return samples.empty() ? 0.0 : std::sqrt(sum / samples.size());
}

double DecodeRelRmse(const StepCoeffs& c, std::span<const DecodeSample> samples) {
  double sum = 0.0;
  for (const auto& s : samples) {
    const double e = (c.DecodeMs(s.batch, s.context) - s.ms) / s.ms;
    sum += e * e;
  }
  return samples.empty() ? 0.0 : std::sqrt(sum / samples.size());
}

}  // namespace pd::planner
