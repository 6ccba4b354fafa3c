// Model shapes, accelerator specs and the analytical step-time model built from them.
//
// MoE models (DeepSeek-V3/R1, Qwen3-MoE) read per decode step only the experts the batch
// activates: StepCoeffs::moe adds expert_ms × ExpectedActivatedExperts(tokens) to the linear form
// below, whose weights term then holds only the non-expert weights; FLOPs come from the active
// parameters per token. MLA models cache one latent per token per layer, whole on every TP rank.
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
  int ffn = 0;  // dense MLP width (the dense layers of an MoE model)
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab = 0;
  bool tie_embeddings = true;  // one vocab x hidden matrix for embedding and LM head (OPT)
  bool gated_mlp = false;      // llama/qwen: gate, up and down projections
  int dtype_bytes = 2;         // activations and KV cache
  int weight_dtype_bytes = 0;  // 0: dtype_bytes (1 for an FP8 checkpoint such as DeepSeek-R1)
  // MLA (kv_lora_rank > 0): the KV cache holds one latent of kv_lora_rank + qk_rope_head_dim
  // values per token per layer, the same on every TP rank.
  int q_lora_rank = 0;  // 0: plain q projection
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  // MoE (num_experts > 0): num_moe_layers of the layers route each token to top_k of num_experts
  // gated experts of width moe_ffn, beside num_shared_experts always-on experts of that width; the
  // other layers have a dense MLP of width ffn.
  int num_experts = 0;
  int top_k = 0;
  int moe_ffn = 0;
  int num_shared_experts = 0;
  int num_moe_layers = 0;

  bool is_mla() const { return kv_lora_rank > 0; }
  bool is_moe() const { return num_experts > 0 && num_moe_layers > 0; }
  int WeightDtypeBytes() const { return weight_dtype_bytes > 0 ? weight_dtype_bytes : dtype_bytes; }
  double AttentionParamsPerLayer() const;
  double DenseMlpParams() const { return (gated_mlp ? 3.0 : 2.0) * hidden * ffn; }
  double ExpertParams() const { return (gated_mlp ? 3.0 : 2.0) * hidden * moe_ffn; }  // one
  // Every parameter but the routed experts' (attention, dense MLPs, shared experts, router,
  // embeddings and LM head): what every token reads.
  double NonExpertParams() const;
  double RoutedExpertParams() const {
    return is_moe() ? double(num_moe_layers) * num_experts * ExpertParams() : 0.0;
  }
  double NumParams() const { return NonExpertParams() + RoutedExpertParams(); }
  // The input embedding table when it is not the LM head: a step reads one row per token of it.
  double InputEmbeddingParams() const { return tie_embeddings ? 0.0 : double(vocab) * hidden; }
  // Parameters one token computes with: the non-expert ones but the input embedding (a lookup),
  // plus top_k routed experts per MoE layer. DeepSeek-R1: 36.6B (published: 37B).
  double ActiveParams() const;
  double WeightBytes() const { return NumParams() * WeightDtypeBytes(); }
  // KV of one token over all layers: K and V of every KV head, or MLA's latent.
  double KvBytesPerToken() const;
  // The KV bytes of one token that one of `tp` ranks holds: MLA's latent is whole on every rank;
  // GQA heads are split (a head is replicated when tp exceeds the KV heads).
  double KvBytesPerTokenPerRank(int tp) const;
};

// "opt-13b", "opt-66b", "opt-175b" (with or without the "facebook/" prefix), "deepseek-r1"
// (DeepSeek-V3's architecture, FP8 weights) and "qwen3-coder-480b-a35b".
Result<ModelShape> BuiltinModelShape(const std::string& name);
ModelShape ShapeFromConfig(const model::ModelConfig& config, const std::string& name);

struct HardwareSpec {
  std::string name;
  double peak_flops = 0.0;      // dense 16-bit FLOP/s
  double peak_fp8_flops = 0.0;  // dense FP8 FLOP/s (0: none; FP8 weights then run at 16-bit)
  double mem_bw = 0.0;          // bytes/s
  double mem_bytes = 0.0;       // device memory
  double intra_node_bw = 0.0;   // bytes/s per device, one direction (NVLink)
  double inter_node_bw = 0.0;   // bytes/s per device between nodes, one direction (its NIC)
  int devices_per_node = 8;
  double compute_eff = 0.8;       // achieved / peak
  double mem_eff = 0.65;          // achieved / peak
  double step_overhead_ms = 3.0;  // launch + framework cost per step
  double per_seq_overhead_ms = 0.04;
  double allreduce_latency_ms = 0.03;  // also each all-to-all's (dispatch, combine) fixed cost
  double score_bytes = 8.0;            // attention-score bytes moved per (query, key) pair per head
};

// "a100-80gb", "h100-80gb" (or "h100"), "h200-141gb" (or "h200"), "cpu" (the CPU entry is a
// 2-socket server guess; see MeasureCpuSpec for this machine's).
Result<HardwareSpec> BuiltinHardware(const std::string& name);
std::vector<std::string> BuiltinHardwareNames();
// Measures this machine's FMA throughput and memory bandwidth with short loops (~0.2 s).
HardwareSpec MeasureCpuSpec(int num_threads);

// How an instance's MoE layers are spread. dp == 1: every MoE layer is split over the instance's
// tp devices like the rest (all-reduce after it). dp > 1: the instance is one of dp
// data-parallel attention ranks (each with its own requests and KV, non-expert weights
// replicated) that run every MoE layer together, experts spread over all dp·tp devices
// (expert parallelism): each token is dispatched to and combined from its top_k experts'
// devices (all-to-all), and the experts a step reads are those all dp ranks' tokens activate
// (modelled as dp times this rank's tokens: balanced ranks).
struct MoeParallelism {
  int dp = 1;
  double all_to_all_bw = 0.0;  // bytes/s per device for dispatch/combine (0: intra_node_bw)
};

class AnalyticalLatencyModel final : public LatencyModel {
 public:
  AnalyticalLatencyModel(ModelShape shape, HardwareSpec hw, MoeParallelism moe = {})
      : shape_(shape), hw_(hw), moe_(moe) {}
  Result<StepCoeffs> Coeffs(int tp) const override;
  std::string Describe() const override { return "analytical:" + shape_.name + "@" + hw_.name; }

 private:
  double AllToAllSecondsPerToken(int ep) const;

  ModelShape shape_;
  HardwareSpec hw_;
  MoeParallelism moe_;
};

// KV capacity (tokens) of an instance: memory left after the weights, at memory utilisation
// `util`, over the KV bytes per token its tp ranks hold together (an MLA latent is on every rank);
// 0 when the weights do not fit. `moe_dp` > 1: the instance holds 1/moe_dp of the routed
// experts (MoeParallelism::dp).
int64_t AnalyticalKvCapacityTokens(const ModelShape& shape, const HardwareSpec& hw, int tp, int pp,
                                   double util = 0.9, int moe_dp = 1);

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
