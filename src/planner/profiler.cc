#include "planner/profiler.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace pd::planner {

ProfileOptions DefaultProfileOptions(bool quick, int max_tokens, int max_context) {
  ProfileOptions o;
  auto add_prefill = [&](int batch, int tokens) {
    if (batch * tokens <= max_tokens && tokens <= max_context) {
      o.prefill_shapes.push_back({batch, tokens});
    }
  };
  auto add_decode = [&](int batch, int context) {
    if (context <= max_context) o.decode_shapes.push_back({batch, context});
  };
  if (quick) {
    for (int t : {16, 64, 256, 512}) add_prefill(1, t);
    add_prefill(2, 128);
    add_prefill(4, 32);
    for (int b : {1, 4, 16})
      for (int c : {64, 512}) add_decode(b, c);
    add_decode(32, 256);
    o.repeats = 5;
  } else {
    for (int t : {16, 32, 64, 128, 256, 512, 1024}) add_prefill(1, t);
    for (int t : {64, 256, 512}) add_prefill(2, t);
    for (int t : {32, 128, 256}) add_prefill(4, t);
    for (int b : {1, 2, 4, 8, 16, 32, 64})
      for (int c : {64, 256, 1024, 2048}) add_decode(b, c);
    o.repeats = 7;
  }
  return o;
}

Status SetDecodeGrid(ProfileOptions* options, const std::vector<int>& batches,
                     const std::vector<int>& contexts, int max_context) {
  if (batches.empty() || contexts.empty()) {
    return InvalidArgument("decode grid: give both the batches and the contexts");
  }
  for (int b : batches) {
    if (b < 1) return InvalidArgument("decode grid: batch " + std::to_string(b) + " < 1");
  }
  for (int c : contexts) {
    if (c < 1 || c > max_context) {
      return InvalidArgument("decode grid: context " + std::to_string(c) + " outside [1, " +
                             std::to_string(max_context) + "]");
    }
  }
  options->decode_shapes.clear();
  for (int b : batches)
    for (int c : contexts) options->decode_shapes.push_back({b, c});
  return OkStatus();
}

int PagesNeeded(const ProfileOptions& options, int page_size) {
  int64_t pages = 1;
  auto per_seq = [&](int len) { return (len + page_size - 1) / page_size; };
  for (const ShapeSpec& s : options.prefill_shapes)
    pages = std::max<int64_t>(pages, int64_t(s.batch) * per_seq(s.length));
  for (const ShapeSpec& s : options.decode_shapes)
    pages = std::max<int64_t>(pages, int64_t(s.batch) * per_seq(s.length));
  return static_cast<int>(pages);
}

Result<ProfileResult> FitProfile(std::vector<PrefillSample> prefill,
                                 std::vector<DecodeSample> decode,
                                 const std::vector<ShapeSpec>& prefill_shapes,
                                 const std::vector<ShapeSpec>& decode_shapes) {
  if (prefill.size() != prefill_shapes.size() || decode.size() != decode_shapes.size()) {
    return InvalidArgument("profile fit: samples and shapes differ in number");
  }
  ProfileResult r;
  int max_batch = 1;
  for (const ShapeSpec& s : decode_shapes) max_batch = std::max(max_batch, s.batch);
  FitOptions fo;
  fo.relative = true;
  fo.non_negative = true;
  // One decode form: every profiled batch is below the threshold.
  ASSIGN_OR_RETURN(r.coeffs, FitStepCoeffs(prefill, decode, max_batch + 1, fo));
  r.coeffs.decode_threshold = std::max(max_batch + 1, 1 << 20);
  r.coeffs.decode_large = r.coeffs.decode_small;
  for (size_t i = 0; i < prefill.size(); ++i) {
    r.points.push_back({"prefill", prefill_shapes[i], prefill[i].ms,
                        r.coeffs.PrefillMs(prefill[i].tokens, prefill[i].sq)});
  }
  for (size_t i = 0; i < decode.size(); ++i) {
    r.points.push_back({"decode", decode_shapes[i], decode[i].ms,
                        r.coeffs.DecodeMs(decode[i].batch, decode[i].context)});
  }
  r.prefill_rel_rmse = PrefillRelRmse(r.coeffs, prefill);
  r.decode_rel_rmse = DecodeRelRmse(r.coeffs, decode);
  r.prefill = std::move(prefill);
  r.decode = std::move(decode);
  return r;
}

std::string ProfileToJson(const ProfileResult& result, const std::string& model_name,
                          const std::string& device, int threads) {
  using nlohmann::json;
  TableLatencyModel table(model_name, {{1, result.coeffs}});
  json j = json::parse(ToPdserveProfileJson(table, device));
  j["threads"] = threads;
  j["fit"] = {{"prefill_rel_rmse", result.prefill_rel_rmse},
              {"decode_rel_rmse", result.decode_rel_rmse}};
  json samples = json::array();
  for (const ProfilePoint& p : result.points) {
    samples.push_back({{"phase", p.phase},
                       {"batch", p.shape.batch},
                       {"length", p.shape.length},
                       {"measured_ms", p.measured_ms},
                       {"fitted_ms", p.fitted_ms},
                       {"rel_error", p.rel_error()}});
  }
  j["samples"] = samples;
  return j.dump(2) + "\n";
}

std::string FormatProfile(const ProfileResult& r) {
  std::string out;
  char line[256];
  const auto& p = r.coeffs.prefill;
  const auto& d = r.coeffs.decode_small;
  std::snprintf(line, sizeof(line),
                "prefill step ms = %.4g + %.4g * tokens + %.4g * tokens^2   (rel RMSE %.1f%%)\n",
                p[0], p[1], p[2], 100 * r.prefill_rel_rmse);
  out += line;
  std::snprintf(line, sizeof(line),
                "decode step ms  = %.4g + %.4g * context + %.4g * batch     (rel RMSE %.1f%%)\n",
                d[0], d[1], d[2], 100 * r.decode_rel_rmse);
  out += line;
  std::snprintf(line, sizeof(line), "%-8s %6s %8s %12s %12s %9s\n", "phase", "batch", "length",
                "measured ms", "fitted ms", "rel err");
  out += line;
  for (const ProfilePoint& pt : r.points) {
    std::snprintf(line, sizeof(line), "%-8s %6d %8d %12.3f %12.3f %8.1f%%\n", pt.phase.c_str(),
                  pt.shape.batch, pt.shape.length, pt.measured_ms, pt.fitted_ms,
                  100 * pt.rel_error());
    out += line;
  }
  return out;
}

}  // namespace pd::planner
