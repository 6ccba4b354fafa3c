// `pdserve profile`'s library part: times this engine's ModelRunner on synthetic batches and fits
// DistServe's step-time forms (prefill a + b·Σtokens + c·Σtokens²; decode a + b·Σcontext +
// c·batch) to the timings.
//
// Every shape is timed as the median of `repeats` forward passes after one warm-up pass. Prefill
// shapes are `batch` prompts of `tokens` tokens each starting at position 0; decode shapes are
// `batch` sequences decoding one token at position context-1 (attending over `context` cached
// positions). Every sequence computes its last token's logits, as the engine does.
//
// The fit minimises the relative error of each shape with non-negative coefficients, and one
// decode form serves every batch size (the threshold is above the largest batch profiled).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/fit.h"
#include "planner/latency_model.h"

namespace pd::engine {
class ModelRunner;
}

namespace pd::planner {

struct ShapeSpec {
  int batch = 1;
  int length = 0;  // prefill: tokens per prompt; decode: context per sequence
};

struct ProfileOptions {
  std::vector<ShapeSpec> prefill_shapes;
  std::vector<ShapeSpec> decode_shapes;
  int repeats = 3;
  // Called before each shape is timed (progress lines); may be empty.
  std::function<void(const std::string&)> progress;
};

// The default sweep, or a shorter one with `quick` (both stay within max_tokens tokens per
// prefill step and max_context positions per sequence).
ProfileOptions DefaultProfileOptions(bool quick, int max_tokens = 1024, int max_context = 2048);

// Replaces the sweep's decode shapes with the grid batches × contexts (so that the fit describes
// the shapes a workload produces: the linear decode form cannot follow this engine's steps from
// batch 1 to 32 at once). InvalidArgument when either list is empty or holds a value < 1, or a
// context exceeds max_context.
Status SetDecodeGrid(ProfileOptions* options, const std::vector<int>& batches,
                     const std::vector<int>& contexts, int max_context);

// KV pages the largest shape of the sweep needs with distinct pages per sequence.
int PagesNeeded(const ProfileOptions& options, int page_size);

// One timed shape beside the fit's prediction.
struct ProfilePoint {
  std::string phase;  // "prefill" | "decode"
  ShapeSpec shape;
  double measured_ms = 0.0;
  double fitted_ms = 0.0;
  double rel_error() const { return measured_ms > 0 ? (fitted_ms - measured_ms) / measured_ms : 0; }
};

struct ProfileResult {
  StepCoeffs coeffs;
  std::vector<PrefillSample> prefill;
  std::vector<DecodeSample> decode;
  std::vector<ProfilePoint> points;
  double prefill_rel_rmse = 0.0;
  double decode_rel_rmse = 0.0;
};

// Fits the samples (relative, non-negative) and fills points with each shape's fitted time.
// `prefill_shapes` / `decode_shapes` name the samples' shapes in order (for the report).
Result<ProfileResult> FitProfile(std::vector<PrefillSample> prefill,
                                 std::vector<DecodeSample> decode,
                                 const std::vector<ShapeSpec>& prefill_shapes,
                                 const std::vector<ShapeSpec>& decode_shapes);

// Times every shape on `runner` and fits. InvalidArgument for an empty or out-of-range shape
// (a sequence longer than the model's positions), or a sweep too small to fit.
Result<ProfileResult> ProfileRunner(engine::ModelRunner& runner, const ProfileOptions& options);

// The pdserve-profile-v1 JSON (TP 1) with, beside the coefficients, every sample and its
// residual: {"samples": [{"phase", "batch", "length", "measured_ms", "fitted_ms",
// "rel_error"}], "fit": {"prefill_rel_rmse", "decode_rel_rmse"}, "threads": N}.
std::string ProfileToJson(const ProfileResult& result, const std::string& model_name,
                          const std::string& device, int threads);

// A human-readable table of the fit and its residuals.
std::string FormatProfile(const ProfileResult& result);

}  // namespace pd::planner
