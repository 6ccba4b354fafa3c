// Model shapes, accelerator specs and the analytical step-time model built from them.
//
// The analytical model gives DistServe's coefficient forms for any TP degree:
//   prefill a = overhead + weights/(tp·BW) + 2·L·allreduce_latency
//           b = 2·params/(tp·FLOPS) + 2·L·ring_allreduce(hidden bytes)      (per token)
//           c = L·(heads/tp)·score_bytes/BW                                 (per token², the
//               attention score matrix written and read: OPT on A100 is dominated by it)
//   decode  a = overhead + weights/(tp·BW) + 2·L·allreduce_latency
//           b = kv_bytes_per_token/(tp·BW)                                   (per context token)
//           c = per_seq_overhead + 2·params/(tp·FLOPS) + 2·L·ring_allreduce  (per sequence)
// FLOPS and BW are the spec's peaks times its efficiencies, which for A100-80GB were chosen so the
// model reproduces DistServe's measured OPT-13B profile within ~20% (see docs/planner.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"
#include "planner/latency_model.h"

namespace pd::planner {

struct ModelShape {
  std::string name;
  int num_layers = 0;
  int hidden = 0;
  int ffn = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab = 0;
  bool gated_mlp = false;  // llama/qwen: gate, up and down projections
  int dtype_bytes = 2;

  double NumParams() const;
  double WeightBytes() const { return NumParams() * dtype_bytes; }
  // K and V of one token over all layers.
  double KvBytesPerToken() const {
    return 2.0 * num_layers * num_kv_heads * head_dim * dtype_bytes;
  }
};

// "opt-13b", "opt-66b", "opt-175b" (with or without the "facebook/" prefix).
Result<ModelShape> BuiltinModelShape(const std::string& name);
ModelShape ShapeFromConfig(const model::ModelConfig& config, const std::string& name);

struct HardwareSpec {
  std::string name;
  double peak_flops = 0.0;        // dense 16-bit FLOP/s
  double mem_bw = 0.0;            // bytes/s
  double mem_bytes = 0.0;         // device memory
  double intra_node_bw = 0.0;     // bytes/s per device, one direction (NVLink)
  double compute_eff = 0.8;       // achieved / peak
  double mem_eff = 0.65;          // achieved / peak
  double step_overhead_ms = 3.0;  // launch + framework cost per step
  double per_seq_overhead_ms = 0.04;
  double allreduce_latency_ms = 0.03;
  double score_bytes = 8.0;  // attention-score bytes moved per (query, key) pair per head
};

// "a100-80gb", "h100", "h200", "cpu" (the CPU entry is a 2-socket server guess; see
// MeasureCpuSpec for this machine's).
Result<HardwareSpec> BuiltinHardware(const std::string& name);
std::vector<std::string> BuiltinHardwareNames();
// Measures this machine's FMA throughput and memory bandwidth with short loops (~0.2 s).
HardwareSpec MeasureCpuSpec(int num_threads);

class AnalyticalLatencyModel final : public LatencyModel {
 public:
  AnalyticalLatencyModel(ModelShape shape, HardwareSpec hw) : shape_(shape), hw_(hw) {}
  Result<StepCoeffs> Coeffs(int tp) const override;
  std::string Describe() const override { return "analytical:" + shape_.name + "@" + hw_.name; }

 private:
  ModelShape shape_;
  HardwareSpec hw_;
};

// KV capacity (tokens) of an instance: memory left after the weights, at memory utilisation
// `util`, over the KV bytes per token; 0 when the weights do not fit.
int64_t AnalyticalKvCapacityTokens(const ModelShape& shape, const HardwareSpec& hw, int tp, int pp,
                                   double util = 0.9);

// DistServe's max_num_tokens.csv (model,tp,pp,max_num_tokens) for A100-80GB.
struct KvCapacityTable {
  struct Row {
    std::string model;
    int tp = 0, pp = 0;
    int64_t tokens = 0;
  };
  std::vector<Row> rows;
  // -1 when the table has no row for the model at (tp, pp).
  int64_t Lookup(const std::string& model, int tp, int pp) const;
  bool HasModel(const std::string& model) const;
};
Result<KvCapacityTable> LoadKvCapacityCsv(const std::string& path);

}  // namespace pd::planner
