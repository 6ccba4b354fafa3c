// A DeepSeek-V3 multi-token-prediction (MTP) layer as a one-layer rank runner: the input
// projection that replaces the embedding, and CreateMtpRunner (rank_runner.h).
//
// Position t of the MTP layer reads the target's hidden state h_t (after the target's final norm)
// and the embedding of token_{t+1}:
//   x_t = eh_proj([enorm(embed(token_{t+1})); hnorm(h_t)])   eh_proj (hidden, 2*hidden)
// then runs its decoder layer (MLA over its own latent KV, MoE or dense MLP) at position t, and
// shared_head.norm and shared_head.head give the logits of token_{t+2} (docs/engine.md cites the
// implementations this order follows).
#include <algorithm>
#include <string>

#include "engine/rank_runner.h"
#include "engine/rank_runner_impl.h"
#include "engine/tp_model_runner.h"

namespace pd::engine {

Status RankRunner::ValidateMtpInput(const ForwardBatch& batch) const {
  for (const SeqStep& s : batch.seqs) {
    const size_t want = s.token_ids.size() * static_cast<size_t>(c_.hidden_size);
    if (s.input_hidden.size() != want)
      return InvalidArgument("seq " + std::to_string(s.seq_id) + ": the MTP layer needs " +
                             std::to_string(want) + " floats of the target's hidden state, got " +
                             std::to_string(s.input_hidden.size()));
  }
  return OkStatus();
}

void RankRunner::MtpInput(const ForwardBatch& batch) {
  const RunnerMtpInput& m = *w_->mtp_input;
  const int64_t t = num_tokens_, hd = c_.hidden_size;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  Ensure(s_.mtp_cat, t * 2 * hd);
  float* cat = s_.mtp_cat.data();  // (T, 2*hidden): enorm(e) | hnorm(h)
  int64_t row = 0;
  for (const SeqStep& s : batch.seqs) {
    const int64_t n = static_cast<int64_t>(s.token_ids.size());
    NormRows(s_.x.data() + row * hd, n, hd, hd, m.enorm.data(), eps, cat + row * 2 * hd, 2 * hd);
    NormRows(s.input_hidden.data(), n, hd, hd, m.hnorm.data(), eps, cat + row * 2 * hd + hd,
             2 * hd);
    row += n;
  }
  Matmul(cat, 2 * hd, m.eh_proj.w, s_.x.data(), hd, t);
}

namespace {

// The MTP layer as a one-layer model: its decoder layer at index 0 (MoE exactly when the
// checkpoint's layer num_layers + index is), its embedding, and shared_head as norm and lm_head.
model::ModelWeights MtpView(const model::ModelWeights& weights, int index) {
  const model::MtpWeights& m = weights.mtp[index];
  model::ModelWeights view;
  view.config = weights.config;
  view.config.num_layers = 1;
  view.config.num_nextn_predict_layers = 0;
  view.config.moe.first_k_dense_replace =
      weights.config.IsMoeLayer(weights.config.num_layers + index) ? 0 : 1;
  view.dtype = weights.dtype;
  view.fp8 = weights.fp8;
  view.embed_tokens = m.embed_tokens;
  view.layers = {m.layer};
  view.final_norm = m.shared_head_norm;
  view.lm_head = m.shared_head_head;
  if (!weights.kv_scales.empty()) view.kv_scales = {model::KvScales{}};
  return view;
}

}  // namespace

Result<std::unique_ptr<ModelRunner>> CreateMtpRunner(const model::ModelWeights& weights, int index,
                                                     const ModelRunnerOptions& options) {
  const model::ModelConfig& c = weights.config;
  if (c.arch != model::Arch::kDeepseekV3 || index < 0 ||
      index >= static_cast<int>(weights.mtp.size())) {
    return InvalidArgument(
        "--speculative-config: method \"mtp\" needs a deepseek_v3 checkpoint with its MTP layers: "
        "this one has num_nextn_predict_layers " +
        std::to_string(c.num_nextn_predict_layers) + " and " + std::to_string(weights.mtp.size()) +
        " MTP layers in its files");
  }
  if (options.num_pages <= 0)
    return InvalidArgument("the MTP layer's KV region needs the target's num_pages");
  const model::ModelWeights view = MtpView(weights, index);
  Result<std::unique_ptr<RunnerWeights>> prepared = PrepareRunnerWeights(view);
  if (!prepared.ok()) return prepared.status().WithContext("MTP layer " + std::to_string(index));
  std::unique_ptr<RunnerWeights> rw = std::move(prepared).value();
  const model::MtpWeights& m = weights.mtp[index];
  const std::string p = "model.layers." + std::to_string(c.num_layers + index) + ".";
  auto input = std::make_unique<RunnerMtpInput>();
  ASSIGN_OR_RETURN(input->enorm, ToF32Vector(m.enorm, c.hidden_size, p + "enorm.weight"));
  ASSIGN_OR_RETURN(input->hnorm, ToF32Vector(m.hnorm, c.hidden_size, p + "hnorm.weight"));
  RETURN_IF_ERROR(MakeLinear(m.eh_proj, c.hidden_size, 2 * int64_t{c.hidden_size}, weights.dtype,
                             p + "eh_proj.weight", &input->eh_proj));
  rw->mtp_input = std::move(input);
  ModelRunnerOptions mtp_options = options;
  mtp_options.tracer = nullptr;  // the target's layers stand for the step
  if (options.tensor_parallel_size > 1) return CreateTpModelRunner(std::move(rw), mtp_options);
  return CreateRankRunner(std::move(rw), mtp_options, options.num_pages, RankContext{});
}

}  // namespace pd::engine
