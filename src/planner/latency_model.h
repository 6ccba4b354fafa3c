// Step-time models: how long one forward step of an instance takes for a batch shape.
//
// DistServe's forms (all coefficients in milliseconds):
//   prefill step = a + b·Σ tokens + c·Σ tokens²
//   decode step  = a + b·Σ (context + 1) + c·batch      (small-batch coefficients below a batch
//                                                        threshold, large-batch ones above)
// A mixed step (chunked prefill riding with decodes) costs the prefill form plus the decode form
// without its constant: one launch, both kinds of work.
//
// Pipeline parallelism splits a step into pp stages of step/pp each (plus kPpStageOverheadMs per
// stage for prefill); a new batch may enter the first stage once the previous one left it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "common/status.h"

namespace pd::planner {

inline constexpr double kPpStageOverheadMs = 1.0;

// The work of one step, summed over its sequences.
struct StepShape {
  int64_t prefill_tokens = 0;  // Σ chunk lengths of prefilling sequences
  double prefill_sq = 0.0;     // Σ chunk·(start + chunk): Σ len² for whole prompts
  int decode_seqs = 0;         // sequences decoding one token
  int64_t decode_context = 0;  // Σ (context_len + 1) over decoding sequences
  int prefill_chunks = 0;      // prompts (or their chunks) prefilling
  bool empty() const { return prefill_tokens == 0 && decode_seqs == 0; }
};

// Expected distinct experts that `tokens` tokens touch when each picks top_k of num_experts
// uniformly at random: E·(1 − (1 − k/E)^tokens). 0 for no tokens or no experts.
double ExpectedActivatedExperts(double tokens, int num_experts, int top_k);

// An MoE model's expert weights read per step: expert_ms for every distinct expert the step's
// tokens activate (one expert of every MoE layer, this instance's share of its bytes). The tokens
// are token_multiplier times this instance's: data-parallel ranks that share each MoE layer.
struct MoeStepTerm {
  int num_experts = 0;  // 0: not an MoE model
  int top_k = 0;
  double expert_ms = 0.0;
  double token_multiplier = 1.0;
  double Ms(int64_t tokens) const {
    return num_experts == 0 || tokens == 0
               ? 0.0
               : expert_ms * ExpectedActivatedExperts(token_multiplier * double(tokens),
                                                      num_experts, top_k);
  }
};

// The coefficient form of one instance's (TP) step times.
inline constexpr double kDistServeOverheadMs = 2.0;
inline constexpr double kDistServeOverheadPerTokenMs = 1e-4;
struct StepCoeffs {
  std::array<double, 3> prefill{};       // a, b, c (ms)
  std::array<double, 3> decode_small{};  // a, b, c (ms)
  std::array<double, 3> decode_large{};  // a, b, c (ms)
  int decode_threshold = 95;             // batch >= threshold uses decode_large
  // Framework cost on the first pipeline stage, outside the fitted kernels: DistServe's simulator
  // adds 2 ms + 0.0001 ms × Σ context to every step of its A100 profiles. 0 for pdserve's own
  // profiles, whose step times were measured end to end.
  double overhead_ms = 0.0;
  double overhead_per_token_ms = 0.0;
  MoeStepTerm moe;  // added to every step (profiles: none)

  double PrefillMs(int64_t tokens, double sq) const;
  double DecodeMs(int batch, int64_t context) const;
  // Whole step, PP = 1.
  double StepMs(const StepShape& shape) const;
};

// Time per pipeline stage and per step of an instance with `pp` stages.
struct StageTimes {
  double stage_s = 0.0;  // time the first stage is busy: the next batch may start after it
  double step_s = 0.0;   // time until the batch leaves the last stage
};
StageTimes PipelineTimes(const StepCoeffs& coeffs, const StepShape& shape, int pp);

// A family of per-TP step models for one model, e.g. one entry of DistServe's profile file.
// Missing TP degrees are NotFound.
class LatencyModel {
 public:
  virtual ~LatencyModel() = default;
  virtual Result<StepCoeffs> Coeffs(int tp) const = 0;
  virtual std::string Describe() const = 0;
};

// Coefficients given per TP degree (from a profile file or a fit).
class TableLatencyModel final : public LatencyModel {
 public:
  explicit TableLatencyModel(std::string name, std::map<int, StepCoeffs> by_tp = {})
      : name_(std::move(name)), by_tp_(std::move(by_tp)) {}
  Result<StepCoeffs> Coeffs(int tp) const override;
  std::string Describe() const override { return name_; }
  void Set(int tp, const StepCoeffs& coeffs) { by_tp_[tp] = coeffs; }
  const std::map<int, StepCoeffs>& by_tp() const { return by_tp_; }

 private:
  std::string name_;
  std::map<int, StepCoeffs> by_tp_;
};

// Loads one model (e.g. "facebook/opt-13b") from DistServe's profile JSON text, the format of
// profiler-a100-80g.{distserve,vllm}.json. `source` names the file in errors.
Result<std::unique_ptr<TableLatencyModel>> ParseDistServeProfile(const std::string& json_text,
                                                                 const std::string& model,
                                                                 const std::string& source);
Result<std::unique_ptr<TableLatencyModel>> LoadDistServeProfile(const std::string& path,
                                                                const std::string& model);

// pdserve's own profile format (written by `pdserve profile`):
//   {"format": "pdserve-profile-v1", "model": NAME, "device": TEXT,
//    "tp": {"1": {"prefill": [a,b,c], "decoding_smallbs": [...], "decoding_largebs": [...],
//                 "decoding_large_small_bs_threshold": N}}}
// The per-TP objects are DistServe's, so one parser reads both.
std::string ToPdserveProfileJson(const TableLatencyModel& model, const std::string& device);
Result<std::unique_ptr<TableLatencyModel>> ParsePdserveProfile(const std::string& json_text,
                                                               const std::string& source);
// Reads either format: a pdserve profile, or a DistServe profile (then `model` picks the entry).
Result<std::unique_ptr<TableLatencyModel>> LoadProfile(const std::string& path,
                                                       const std::string& model);

}  // namespace pd::planner
