// Private to src/engine: the rank runner's class (rank_runner.h creates it). Its methods live in
// rank_runner.cc (the step, GQA attention, dense MLP) and in one file per model feature.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/trace.h"
#include "engine/cpu_features.h"
#include "engine/kernels.h"
#include "engine/kernels_ref.h"
#include "engine/layer_progress.h"
#include "engine/mla_kernels.h"
#include "engine/mla_parallel.h"
#include "engine/mla_rope.h"
#include "engine/model_runner.h"
#include "engine/model_runner_weights.h"
#include "engine/moe_block.h"
#include "engine/rank_runner.h"
#include "engine/thread_pool.h"

namespace pd::engine {

// The fast kernels of this CPU, the panel matmul the one `path` names (ChosenMatmulPath).
inline kernels::IsaKernels FastKernels(MatmulPath path) {
  kernels::IsaKernels k = kernels::KernelsFor(BestIsaLevel());
  if (path == MatmulPath::kBf16Dot) k.matmul_panel = k.matmul_panel_bf16_dot;
  if (path == MatmulPath::kAmxBf16)
    k.matmul_panel = kernels::AmxPanelDotMatmul(kernels::ChosenPanelStream());
  return k;
}

using kernels::AttnSeq;
using kernels::WeightMatrix;

// Buffers of one step, grown on demand and reused: steady-state steps allocate nothing.
struct Scratch {
  std::vector<float> x;                   // (T, hidden) residual stream
  std::vector<float> h;                   // (T, hidden) normed input of a sub-layer
  std::vector<float> qkv;                 // (T, q_size + 2*kv_size)
  std::vector<float> attn;                // (T, q_size)
  std::vector<float> tmp;                 // (T, hidden) sub-layer output
  std::vector<float> gate, up;            // (T, intermediate)
  std::vector<float> rope_cos, rope_sin;  // (T, head_dim/2)
  std::vector<float> attn_scratch;        // per-thread attention scratch
  std::vector<float> final_h;             // (L, hidden) last rows of seqs wanting logits
  std::vector<float> logits;              // (L, vocab)
  std::vector<int32_t> positions, token_seq, tokens;  // (T)
  std::vector<int32_t> final_slot;                    // (num_seqs) row of each seq in final_h
  std::vector<AttnSeq> seqs;
  MoeScratch moe;  // the MoE block's buffers (moe_block.h)
  // MLA (rank_runner_mla.cc): H heads, R = kv_lora_rank, L = latent_dim, dv = v_head_dim
  std::vector<float> mla_a;     // (T, q part + L): q (or q_a) then the latent of each token
  std::vector<float> mla_q;     // (T, H, qk_head_dim) when q_lora_rank > 0
  std::vector<float> mla_qabs;  // (T, H, L) absorbed queries
  std::vector<float> mla_olat;  // (T, H, R) attention output in the latent space
  std::vector<float> mla_out;   // (T, H, dv) per-head outputs
  std::vector<float> mtp_cat;   // (T, 2*hidden) an MTP runner's [enorm(e); hnorm(h)]
};

template <typename T>
void Ensure(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

class RankRunner final : public ModelRunner {
 public:
  RankRunner(std::unique_ptr<RunnerWeights> w, std::unique_ptr<KvRegion> region, int threads,
             KernelKind kind, MatmulPrecision matmul, const RankContext& rank)
      : w_(std::move(w)),
        c_(w_->config),
        region_(std::move(region)),
        pool_(threads),
        fast_(kind == KernelKind::kFast),
        bf16_dot_(MatmulBf16DotUsed(kind, matmul)),
        isa_(fast_ ? FastKernels(ChosenMatmulPath(kind, matmul)) : kernels::IsaKernels{}),
        rank_(rank),
        mla_rope_(c_.is_mla() ? ComputeMlaRope(c_) : MlaRope{}),
        mla_isa_(fast_ ? &kernels::MlaKernelsFor(BestIsaLevel()) : nullptr) {}

  Status Forward(const ForwardBatch& batch, ForwardOutput* out) override;
  const model::ModelConfig& config() const override { return c_; }
  KvRegion& region() override { return *region_; }
  const LayerProgress& progress() const override { return progress_; }
  uint64_t steps_done() const override { return steps_done_; }
  void AppendWarmRanges(std::span<const int32_t> pages, std::vector<MemRange>* out) override;
  void set_tracer(Tracer* tracer) { tracer_ = tracer; }

 private:
  Status Validate(const ForwardBatch& batch) const;
  void Prepare(const ForwardBatch& batch);
  void Layer(int l);  // AttentionBlock, then MlpBlock
  // x += attention(input_norm(x)) of layer l: GQA (this file's Attention over K/V pages).
  void AttentionBlock(int l);
  void Attention(int l);
  // x += MLA(input_norm(x)) of layer l in the weight-absorbed form (rank_runner_mla.cc).
  void MlaAttentionBlock(int l);
  void MlaAttention(int l);
  // Per-head products of a.w over the pool in one dispatch (or the reference kernels).
  void HeadMatmul(const kernels::HeadMatmulArgs& a);
  // x += mlp(post_attention_norm(x)) of layer l: the dense SwiGLU MLP, or MoeMlpBlock.
  void MlpBlock(int l);
  // The sparse MoE MLP of a MoE layer (rank_runner_moe.cc, moe_block.h), expert-parallel on a
  // data-parallel rank (moe_expert_parallel.h).
  void MoeMlpBlock(int l);
  // A data-parallel rank without tokens this step: its part of every MoE layer's exchange.
  void ServeExpertsOnly();
  MoeExec MakeMoeExec();
  void Finish(const ForwardBatch& batch, ForwardOutput* out);
  // With batch.all_hidden: every token's hidden state into out->hidden (model_runner.h).
  void AllHidden(const ForwardBatch& batch, ForwardOutput* out);
  // An MTP runner (rank_runner_mtp.cc): checks each seq's input_hidden, and replaces the
  // embedded tokens in x by eh_proj([enorm(embed(token_{t+1})); hnorm(h_t)]).
  Status ValidateMtpInput(const ForwardBatch& batch) const;
  void MtpInput(const ForwardBatch& batch);
  // x (n) += tmp, or with TP the sum of every rank's tmp in rank order. `attention`: tmp is the
  // attention output, so this layer's KV is final (on every rank) and progress_ is bumped.
  void AddResidual(float* x, const float* tmp, int64_t n, bool attention);

  // Kernel wrappers: reference kernels single-threaded, fast ones across the pool.
  void Matmul(const float* x, int64_t ldx, const WeightMatrix& w, float* out, int64_t ldo,
              int64_t rows);
  void RmsNorm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* w, float* o,
               int64_t ldo);
  // RMSNorm of rows on the calling thread: the ISA's row kernel, or the reference.
  void NormRows(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* w, float eps,
                float* o, int64_t ldo) const {
    for (int64_t r = 0; r < rows; ++r) {
      if (fast_) {
        isa_.rms_norm_row(x + r * ldx, w, dim, eps, o + r * ldo);
      } else {
        ref::RmsNorm(x + r * ldx, 1, dim, ldx, w, eps, o + r * ldo, ldo);
      }
    }
  }
  template <typename Fn>
  void Rows(int64_t rows, Fn&& fn);  // fn(begin, end) over row ranges
  template <typename Fn>
  void Elements(int64_t n, Fn&& fn);  // fn(begin, end) over [0, n), inline when n is small

  std::unique_ptr<RunnerWeights> w_;
  const model::ModelConfig& c_;
  std::unique_ptr<KvRegion> region_;
  ThreadPool pool_;
  const bool fast_;
  const bool bf16_dot_;            // matmuls over bf16 weights in bf16 (MatmulPrecision::kBf16)
  const kernels::IsaKernels isa_;  // fast_: FastKernels(ChosenMatmulPath(...)); else unused
  const RankContext rank_;
  LayerProgress progress_;
  uint64_t steps_done_ = 0;
  Tracer* tracer_ = nullptr;  // null: no trace
  Scratch s_;
  int64_t num_tokens_ = 0;
  int max_pos_ = 0;  // largest position in the step
  // MLA (deepseek_v3) only
  const MlaRope mla_rope_;
  const kernels::MlaIsaKernels* mla_isa_;  // fast_: the CPU's MLA kernels; else null
  kernels::MlaWorkspace mla_ws_;
};

// Element-wise work under this many floats runs on the calling thread: waking the pool costs more
// than adding a decode step's few rows (and each wake-up is a barrier between the matmuls).
constexpr int64_t kParallelElements = int64_t{1} << 15;

template <typename Fn>
void RankRunner::Elements(int64_t n, Fn&& fn) {
  if (n < kParallelElements) {
    fn(int64_t{0}, n);
  } else {
    Rows(n, fn);
  }
}

template <typename Fn>
void RankRunner::Rows(int64_t rows, Fn&& fn) {
  if (fast_) {
    pool_.ParallelFor(rows, fn);
  } else {
    fn(int64_t{0}, rows);
  }
}

}  // namespace pd::engine
