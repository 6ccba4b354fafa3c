#include "planner/fit.h"

#include <cmath>
#include <string>

namespace pd::planner {

Result<std::array<double, 3>> LeastSquares3(std::span<const std::array<double, 3>> x,
                                            std::span<const double> y) {
  if (x.size() != y.size()) return InvalidArgument("least squares: x and y differ in length");
  if (x.size() < 3) {
    return InvalidArgument("least squares: need at least 3 samples, got " +
                           std::to_string(x.size()));
  }
  // Columns are scaled to unit RMS first so tokens (~1e3) and tokens² (~1e6) condition well.
  std::array<double, 3> scale{};
  for (const auto& row : x)
    for (int j = 0; j < 3; ++j) scale[j] += row[j] * row[j];
  for (int j = 0; j < 3; ++j) {
    scale[j] = std::sqrt(scale[j] / x.size());
    if (scale[j] == 0.0) return InvalidArgument("least squares: a feature is zero in every sample");
  }
  // Normal equations A w = r, A (3,3) = Xᵀ X, r (3,) = Xᵀ y, solved with partial pivoting.
  double a[3][4] = {};
  for (size_t i = 0; i < x.size(); ++i) {
    for (int r = 0; r < 3; ++r) {
      const double xr = x[i][r] / scale[r];
      for (int c = 0; c < 3; ++c) a[r][c] += xr * x[i][c] / scale[c];
      a[r][3] += xr * y[i];
    }
  }
  for (int col = 0; col < 3; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 3; ++r)
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    if (std::fabs(a[pivot][col]) < 1e-9 * static_cast<double>(x.size())) {
      return InvalidArgument(
          "least squares: samples do not determine the coefficients "
          "(vary the batch shapes)");
    }
    for (int c = 0; c < 4; ++c) std::swap(a[col][c], a[pivot][c]);
    for (int r = 0; r < 3; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (int c = col; c < 4; ++c) a[r][c] -= f * a[col][c];
    }
  }
  std::array<double, 3> w{};
  for (int j = 0; j < 3; ++j) w[j] = a[j][3] / a[j][j] / scale[j];
  return w;
}

Result<std::array<double, 3>> FitPrefill(std::span<const PrefillSample> samples) {
  std::vector<std::array<double, 3>> x;
  std::vector<double> y;
  for (const auto& s : samples) {
    x.push_back({1.0, static_cast<double>(s.tokens), s.sq});
    y.push_back(s.ms);
  }
  auto w = LeastSquares3(x, y);
  if (!w.ok()) return w.status().WithContext("prefill fit");
  return w;
}

Result<std::array<double, 3>> FitDecode(std::span<const DecodeSample> samples) {
  std::vector<std::array<double, 3>> x;
  std::vector<double> y;
  for (const auto& s : samples) {
    x.push_back({1.0, static_cast<double>(s.context), static_cast<double>(s.batch)});
    y.push_back(s.ms);
  }
  auto w = LeastSquares3(x, y);
  if (!w.ok()) return w.status().WithContext("decode fit");
  return w;
}

Result<StepCoeffs> FitStepCoeffs(std::span<const PrefillSample> prefill,
                                 std::span<const DecodeSample> decode, int threshold) {
  if (threshold < 1) return InvalidArgument("decode threshold must be >= 1");
  StepCoeffs c;
  c.decode_threshold = threshold;
  ASSIGN_OR_RETURN(c.prefill, FitPrefill(prefill));
  std::vector<DecodeSample> small, large;
  for (const auto& s : decode) (s.batch < threshold ? small : large).push_back(s);
  auto fs = FitDecode(small);
  auto fl = FitDecode(large);
  if (!fs.ok() && !fl.ok()) {
    ASSIGN_OR_RETURN(c.decode_small, FitDecode(decode));
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
