// The rank runner on a MoE model: a sequence's logits do not depend on the sequences batched with
// it (bit for bit), and chunked prefill gives whole prefill's logits.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/model_runner.h"
#include "engine/moe_test_util.h"

namespace pd::engine {
namespace {

std::unique_ptr<testing::TinyModel> Model(model::DType dtype) {
  testing::TinyModelOptions o;
  o.arch = model::Arch::kQwen3Moe;
  o.dtype = dtype;
  o.seed = 5;
  o.hidden = 40;
  o.layers = 3;
  model::MoeConfig moe;
  moe.num_experts = 7;
  moe.num_experts_per_tok = 3;
  moe.moe_intermediate_size = 24;
  moe.norm_topk_prob = true;
  moe.decoder_sparse_step = 1;
  moe.mlp_only_layers = {1};
  auto m = testing::MakeTinyModel(o);
  testing::AddMoeLayers(m.get(), moe, 17);
  return m;
}

std::vector<int32_t> Tokens(int n, int salt, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 31 + salt * 17 + 5) % vocab;
  return t;
}

// Logits of seq 0 (11 prompt tokens, then 2 decode steps), run with `others` more sequences in
// every step, prefill in chunks of `chunk` tokens.
std::vector<std::vector<float>> RunSeq0(const model::ModelWeights& w, int others, int chunk,
                                        MatmulPrecision matmul) {
  ModelRunnerOptions o;
  o.kv.page_size = 3;
  o.num_pages = 96;
  o.num_threads = 3;
  o.matmul = matmul;
  auto runner = ModelRunner::Create(w, o);
  PD_CHECK(runner.ok()) << runner.status().ToString();
  const int vocab = w.config.vocab_size;
  const int n = 1 + others;
  std::vector<std::vector<int32_t>> prompts, pages(n);
  for (int s = 0; s < n; ++s) {
    prompts.push_back(Tokens(11 + 2 * s, s, vocab));
    for (int p = 0; p < 10; ++p) pages[s].push_back(s * 10 + p);
  }
  std::vector<std::vector<float>> logits;
  ForwardOutput out;
  for (int begin = 0; begin < 11; begin += chunk) {  // seq 0's chunks; the others whole
    ForwardBatch b;
    const int len = std::min(chunk, 11 - begin);
    b.seqs.push_back(
        SeqStep{0, begin, std::span(prompts[0]).subspan(begin, len), pages[0], begin + len == 11});
    if (begin == 0)
      for (int s = 1; s < n; ++s) b.seqs.push_back(SeqStep{s, 0, prompts[s], pages[s], true});
    {
      const Status st = (*runner)->Forward(b, &out);
      PD_CHECK(st.ok()) << st.ToString();
    }
  }
  logits.push_back(out.logits[0]);
  std::vector<std::vector<int32_t>> next(n, std::vector<int32_t>(1));
  for (int step = 0; step < 2; ++step) {
    ForwardBatch b;
    for (int s = 0; s < n; ++s) {
      next[s][0] = (step * 7 + s * 3 + 1) % vocab;
      b.seqs.push_back(
          SeqStep{s, static_cast<int>(prompts[s].size()) + step, next[s], pages[s], true});
    }
    {
      const Status st = (*runner)->Forward(b, &out);
      PD_CHECK(st.ok()) << st.ToString();
    }
    logits.push_back(out.logits[0]);
  }
  return logits;
}

// With AMX the bf16 matmuls of many rows take tiles and those of few the vdpbf16ps chain, which
// differ in the last bits: batch invariance holds for the AVX-512 paths (amx_runner_test.cc
// compares the two).
TEST(MoeRunnerTest, LogitsIndependentOfBatchAndCloseAcrossChunking) {
  const testing::ScopedAmxAllowed no_amx(false);
  for (model::DType dtype : {model::DType::kF32, model::DType::kBF16}) {
    for (MatmulPrecision matmul : {MatmulPrecision::kF32, MatmulPrecision::kBf16}) {
      auto m = Model(dtype);
      const auto alone = RunSeq0(m->weights, 0, 11, matmul);
      EXPECT_EQ(RunSeq0(m->weights, 7, 11, matmul), alone) << "batched with 7 others";
      const auto chunked = RunSeq0(m->weights, 3, 4, matmul);
      for (size_t s = 0; s < alone.size(); ++s)
        for (size_t i = 0; i < alone[s].size(); ++i)
          ASSERT_NEAR(chunked[s][i], alone[s][i], 1e-4 * (1 + std::fabs(alone[s][i])))
              << "step " << s << " logit " << i;
    }
  }
}

}  // namespace
}  // namespace pd::engine
