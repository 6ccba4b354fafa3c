// The rank runner's sparse MoE MLP (qwen3_moe, deepseek_v3): MoeForward over the step's tokens.
#include "engine/moe_block.h"
#include "engine/moe_expert_parallel.h"
#include "engine/rank_runner_impl.h"

namespace pd::engine {

MoeExec RankRunner::MakeMoeExec() {
  MoeExec exec;
  exec.pool = &pool_;
  exec.bf16_dot = bf16_dot_;
  if (fast_) {
    exec.isa = &isa_;
    exec.router_isa = &kernels::KernelsFor(BestIsaLevel());  // f32 router logits
  }
  return exec;
}

void RankRunner::MoeMlpBlock(int l) {
  const RunnerLayerWeights& L = w_->layers[l];
  const int64_t t = num_tokens_, hd = c_.hidden_size;
  float* x = s_.x.data();
  float* h = s_.h.data();
  RmsNorm(x, t, hd, hd, L.post_norm.data(), h, hd);
  if (rank_.experts != nullptr) {
    MoeForwardExpertParallel(MakeMoeExec(), c_.moe, L.moe, rank_.experts, rank_.rank, h, t, hd,
                             s_.tmp.data(), &s_.moe);
  } else {
    MoeForward(MakeMoeExec(), c_.moe, L.moe, h, t, hd, s_.tmp.data(), &s_.moe);
  }
  AddResidual(x, s_.tmp.data(), t * hd, /*attention=*/false);
}

void RankRunner::ServeExpertsOnly() {
  for (int l = 0; l < c_.num_layers; ++l) {
    if (!c_.IsMoeLayer(l)) continue;
    MoeForwardExpertParallel(MakeMoeExec(), c_.moe, w_->layers[l].moe, rank_.experts, rank_.rank,
                             nullptr, 0, c_.hidden_size, nullptr, &s_.moe);
  }
}

void AppendMoeWarmRanges(const RunnerMoeWeights& moe, std::vector<MemRange>* out) {
  auto add = [&](const kernels::WeightMatrix& m) {
    if (m.data == nullptr) return;
    out->push_back({static_cast<const uint8_t*>(m.data), kernels::RowMajorBytes(m)});
  };
  add(moe.router.w);
  for (const std::vector<RunnerExpert>* v : {&moe.experts, &moe.shared})
    for (const RunnerExpert& x : *v)
      for (const LinearWeight* m : {&x.gate, &x.up, &x.down}) add(m->w);
}

}  // namespace pd::engine
