// Private to src/engine: the weights as the forward-pass kernels read them, laid out once at load.
// F16 checkpoints are converted to F32; BF16, F32 and FP8 (F8_E4M3 with block scales) matrices
// are read in place from the mapped checkpoint (which must outlive the runner); small vectors
// (norms, biases) become F32.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/kernels.h"
#include "model/weights.h"

namespace pd::engine {

class ThreadPool;

// One linear layer W (n, k), plus the F32 copy it owns when the checkpoint was F16.
struct LinearWeight {
  kernels::WeightMatrix w;
  std::vector<float> owned;          // (n, k) when converted (or a TP rank's dequantised slice)
  std::vector<uint16_t> owned_bf16;  // (n, k) bf16 copy (a TP rank's column slice)
  std::vector<uint8_t> owned_fp8;    // (n, k) FP8 codes (a TP rank's column slice) and
  std::vector<float> owned_scales;   // (ceil(n/128), ceil(k/128)) their block scales
};

// One SwiGLU expert of a MoE layer: a routed expert or the shared expert, its width `inter`
// (moe_intermediate_size; n_shared_experts times that for the shared one; a TP rank's slice).
struct RunnerExpert {
  LinearWeight gate, up;  // (inter, hidden)
  LinearWeight down;      // (hidden, inter); kPanel32 after PackRunnerWeights
  // After PackRunnerWeights: gate|up stacked (2*inter, hidden), kPanel32; data == nullptr before.
  kernels::WeightMatrix gate_up;
  int64_t inter() const { return gate.w.n; }
};

// The sparse MoE block of a layer (ModelConfig::IsMoeLayer); experts empty on a dense layer.
struct RunnerMoeWeights {
  LinearWeight router;                // (num_experts, hidden) mlp.gate; kPanel32 after packing
  std::vector<float> router_bias;     // (num_experts) e_score_correction_bias, or empty
  std::vector<RunnerExpert> experts;  // (num_experts)
  std::vector<RunnerExpert> shared;   // deepseek_v3 with n_shared_experts > 0: one, else none
};

// Multi-head Latent Attention of a deepseek_v3 layer (mla_weights.cc). Per rank: H query heads,
// R = kv_lora_rank, dn/dr/dv = qk_nope/qk_rope/v head dims, L = R + dr.
struct RunnerMlaWeights {
  LinearWeight q;                // (H*(dn+dr), hidden) when q_lora_rank == 0
  LinearWeight q_a;              // (q_lora_rank, hidden) when q_lora_rank > 0
  std::vector<float> q_a_norm;   // (q_lora_rank) when q_lora_rank > 0
  LinearWeight q_b;              // (H*(dn+dr), q_lora_rank) when q_lora_rank > 0
  LinearWeight kv_a;             // (L, hidden) kv_a_proj_with_mqa
  std::vector<float> kv_a_norm;  // (R)
  LinearWeight kv_b;      // (H*(dn+dv), R), the rows of head h at h*(dn+dv): W_UK[h], W_UV[h]
  LinearWeight uk_t_all;  // (num_heads*R, dn): W_UK[h]^T of every head, owned (transposed)
  std::vector<kernels::WeightMatrix> uk_t;  // (H) per head (R, dn): q_lat = W_UK[h]^T q_nope
  std::vector<kernels::WeightMatrix> uv;    // (H) per head (dv, R) views of kv_b: out = W_UV o_lat
  LinearWeight o;                           // (hidden, H*dv)
  // After PackRunnerWeights: q|kv_a (or q_a|kv_a) stacked, kPanel32; data == nullptr before.
  kernels::WeightMatrix a;
};

struct RunnerLayerWeights {
  std::vector<float> input_norm, post_norm;   // (hidden)
  std::vector<float> q_norm, k_norm;          // (head_dim) when qk_norm, else empty
  std::vector<float> q_bias, k_bias, v_bias;  // (q_size)/(kv_size) when attention_bias
  std::vector<float> o_bias;                  // (hidden) when model::HasOutputBias
  LinearWeight q, k, v, o, gate, up, down;
  // After PackRunnerWeights: q|k|v stacked (q_size + 2*kv_size, hidden) and gate|up stacked
  // (2*intermediate, hidden), kPanel32; data == nullptr before.
  kernels::WeightMatrix qkv, gate_up;
  RunnerMoeWeights moe;  // MoE layers: the router and experts; gate/up/down then empty
  std::unique_ptr<RunnerMlaWeights> mla;  // deepseek_v3: MLA instead of q/k/v/o
};

// Anonymous memory on 2 MiB boundaries advised MADV_HUGEPAGE: weights streamed every decode step
// then cost one TLB entry per 2 MiB. Freed on destruction.
class HugePageBuffer {
 public:
  static Result<std::unique_ptr<HugePageBuffer>> Create(size_t bytes);
  ~HugePageBuffer();
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;
  uint8_t* data() { return data_; }
  size_t size() const { return size_; }

 private:
  HugePageBuffer(void* map, size_t map_bytes, uint8_t* data, size_t size)
      : map_(map), map_bytes_(map_bytes), data_(data), size_(size) {}
  void* map_;
  size_t map_bytes_;
  uint8_t* data_;
  size_t size_;
};

// The input of a DeepSeek MTP layer (rank_runner_mtp.cc): x = eh_proj([enorm(e); hnorm(h)]).
struct RunnerMtpInput {
  std::vector<float> enorm, hnorm;  // (hidden)
  LinearWeight eh_proj;             // (hidden, 2*hidden), row-major
};

struct RunnerWeights {
  model::ModelConfig config;
  std::vector<RunnerLayerWeights> layers;
  std::vector<float> final_norm;              // (hidden)
  LinearWeight embed;                         // (vocab, hidden): row lookups
  LinearWeight lm_head;                       // (vocab, hidden)
  std::unique_ptr<HugePageBuffer> packed;     // every kPanel32 matrix, after PackRunnerWeights
  std::vector<model::KvScales> kv_scales;     // (num_layers) or empty: FP8 KV scales (kv_scales.h)
  std::unique_ptr<RunnerMtpInput> mtp_input;  // an MTP runner's; null for a model
};

// For the per-feature weight files (mla_weights.cc): InvalidArgument naming `name` when t is
// missing or not of `shape`; t (n) as f32; t (n, k) of `dtype`, or F8_E4M3 with its scales, as a
// LinearWeight (f16 converted).
Status CheckShape(const model::TensorView& t, const std::vector<int64_t>& shape,
                  const std::string& name);
Result<std::vector<float>> ToF32Vector(const model::TensorView& t, int64_t n,
                                       const std::string& name);
Status MakeLinear(const model::TensorView& t, int64_t n, int64_t k, model::DType dtype,
                  const std::string& name, LinearWeight* out);

// Checks shapes and dtypes against the config and lays the weights out for the kernels.
Result<std::unique_ptr<RunnerWeights>> PrepareRunnerWeights(const model::ModelWeights& weights);

// One matrix PackRunnerWeights lays out: row-major parts stacked, and where the result goes.
struct PackJob {
  std::vector<kernels::WeightMatrix> parts;
  kernels::WeightMatrix* dst;
};

// Lays every matrix the layers and lm_head multiply by out once in the kPanel32 layout, in one
// huge-page buffer, with q/k/v and gate/up fused: sets each layer's qkv and gate_up, and replaces
// o, down and lm_head by their packed forms (the row-major q/k/v/gate/up stay for reference).
Status PackRunnerWeights(ThreadPool& pool, RunnerWeights* w);

// Row `row` of an embedding-like matrix as f32 into out (k).
void LoadWeightRow(const kernels::WeightMatrix& w, int64_t row, float* out);

}  // namespace pd::engine
