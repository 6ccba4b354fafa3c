// Speculative decoding with deepseek_v3's MTP layer on the tiny random checkpoint (one MTP layer):
// greedy outputs token for token those without speculation (TP 1 and 2, a stop token and
// max_tokens landing mid-draft), proposals equal to a from-scratch MTP chain after rollbacks, the
// sampled output distribution the target's (chi-square), every page free after preemption and
// aborts, and the refusals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "engine/constraint_test_util.h"
#include "engine/engine.h"
#include "engine/engine_model_test_util.h"
#include "engine/model_runner_test_util.h"
#include "engine/sampler.h"
#include "engine/spec_draft_model.h"
#include "engine/spec_mtp.h"
#include "engine/spec_test_util.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;
using testing::Tokens;

const model::ModelWeights& Deepseek() {
  return testing::SyntheticTinyModel(model::Arch::kDeepseekV3);
}

using Outcome = testing::SpecOutcome;
using testing::SpecBaseOptions;
using testing::SpecGreedyRequests;

SpeculativeConfig MtpConfig(int k) {
  SpeculativeConfig c;
  c.method = SpecMethod::kMtp;
  c.num_speculative_tokens = k;
  return c;
}

// Runs the requests to the end (aborting aborts[step] before that step); checks the pages.
Outcome RunAll(const EngineOptions& eo, const std::vector<Request>& requests,
               const std::map<int, int64_t>& aborts = {}) {
  auto engine = Engine::Create(Deepseek(), eo);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return Outcome();
  return testing::RunToEnd(**engine, requests, aborts);
}

TEST(MtpEngineTest, GreedyOutputsEqualNoSpeculation) {
  const int vocab = Deepseek().config.vocab_size;
  for (int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    EngineOptions eo = SpecBaseOptions(tp, 96);
    std::vector<Request> requests = SpecGreedyRequests(vocab);
    const Outcome want = RunAll(eo, requests);
    // Request 3 stops at its 8th token (a stop id that did not occur before it).
    const std::vector<int32_t>& w3 = want.tokens.at(3);
    int stop_at = 7;
    while (std::find(w3.begin(), w3.begin() + stop_at, w3[stop_at]) != w3.begin() + stop_at)
      ++stop_at;
    requests[3].sampling.stop_token_ids = {w3[stop_at]};
    eo.speculative = MtpConfig(3);
    const Outcome got = RunAll(eo, requests);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(got.tokens.at(i), want.tokens.at(i)) << "request " << i;
      EXPECT_EQ(got.finish.at(i), FinishReason::kLength);
    }
    EXPECT_EQ(got.tokens.at(3), std::vector<int32_t>(w3.begin(), w3.begin() + stop_at + 1));
    EXPECT_EQ(got.finish.at(3), FinishReason::kStop);
    const SpecDecodeCounters& s = got.stats.spec_decode;
    EXPECT_GT(s.num_drafts, 0);
    EXPECT_GT(s.num_draft_tokens, s.num_drafts);  // K > 1: the MTP layer chains on itself
  }
}

// Constrained requests (one JSON object over the tiny vocabulary: constraint_test_util.h): the
// MTP layer proposes its unmasked argmax chain, the target's masked verification keeps only what
// the constraint allows. Greedy outputs equal those without speculation; sampled ones are whole
// objects too.
TEST(MtpEngineTest, ConstrainedOutputsEqualNoSpeculation) {
  const int vocab = Deepseek().config.vocab_size;
  const testing::ObjectOverVocab object(vocab, Deepseek().config.eos_token_id);
  std::vector<Request> requests = SpecGreedyRequests(vocab);
  object.Constrain(&requests);
  EngineOptions eo = SpecBaseOptions(1, 96);
  const Outcome want = RunAll(eo, requests);
  eo.speculative = MtpConfig(3);
  const Outcome got = RunAll(eo, requests);
  object.ExpectOutputs(got.tokens, want.tokens);
  EXPECT_GT(got.stats.spec_decode.num_drafts, 0);
}

// The MTP layer's logits from scratch for drafts 1..k after `tokens` (a fresh target over all
// tokens, a fresh MTP layer over positions 0 .. N-2 (token t+1, h_t), then k - 1 chained
// positions): draft j >= 2 is chained on given[j - 2], or on row j - 2's argmax where `given` is
// shorter (the greedy chain). Row j - 1 is what draft j was drawn from.
std::vector<std::vector<float>> FreshMtpLogits(const std::vector<int32_t>& tokens, int k,
                                               const std::vector<int32_t>& given = {}) {
  const model::ModelWeights& w = Deepseek();
  ModelRunnerOptions ro;
  ro.kv.page_size = 3;
  ro.num_pages = 32;
  ro.num_threads = 1;
  ro.kernels = KernelKind::kReference;
  auto target = ModelRunner::Create(w, ro);
  auto mtp = CreateMtpRunner(w, 0, ro);
  EXPECT_TRUE(target.ok() && mtp.ok());
  std::vector<int32_t> pages(32);
  for (int i = 0; i < 32; ++i) pages[i] = 31 - i;
  ForwardBatch tb;
  tb.all_hidden = true;
  tb.seqs = {{1, 0, tokens, pages, false}};
  ForwardOutput to;
  EXPECT_TRUE((*target)->Forward(tb, &to).ok());
  const int n = static_cast<int>(tokens.size()), hd = w.config.hidden_size;
  std::vector<int32_t> run(tokens.begin() + 1, tokens.end());
  std::vector<float> hidden(to.hidden[0].begin(), to.hidden[0].end() - hd);
  std::vector<std::vector<float>> rows;
  for (int j = 0; j < k; ++j) {
    ForwardBatch mb;
    mb.all_hidden = true;
    mb.seqs = {{1, j == 0 ? 0 : n - 2 + j, run, pages, true}};
    mb.seqs[0].input_hidden = hidden;
    ForwardOutput mo;
    EXPECT_TRUE((*mtp)->Forward(mb, &mo).ok());
    rows.push_back(mo.logits[0]);
    run = {j < static_cast<int>(given.size()) ? given[j] : ArgMax(rows.back())};
    hidden.assign(mo.hidden[0].end() - hd, mo.hidden[0].end());
  }
  return rows;
}

// The K greedy drafts of a from-scratch MTP chain after `tokens`.
std::vector<int32_t> FreshMtpDrafts(const std::vector<int32_t>& tokens, int k) {
  std::vector<int32_t> out;
  for (const std::vector<float>& row : FreshMtpLogits(tokens, k)) out.push_back(ArgMax(row));
  return out;
}

// The MTP layer's KV bookkeeping against a recomputation from scratch: a chunked prompt, then
// rounds of proposals whose verification keeps 0..K drafts: every proposal is the MTP chain of
// the sequence as it stands (the rejected drafts' and the chained positions' KV overwritten).
TEST(MtpDrafterTest, ProposalsAreAFreshMtpChain) {
  const model::ModelWeights& w = Deepseek();
  const int vocab = w.config.vocab_size;
  ModelRunnerOptions ro;
  ro.kv.page_size = 3;
  ro.num_pages = 16;
  ro.num_threads = 1;
  ro.kernels = KernelKind::kReference;
  auto target = ModelRunner::Create(w, ro);
  ASSERT_TRUE(target.ok());
  auto mtp_runner = CreateMtpRunner(w, 0, ro);
  ASSERT_TRUE(mtp_runner.ok()) << mtp_runner.status().ToString();
  auto drafter = MtpDrafter::Create(std::move(mtp_runner).value());
  ASSERT_TRUE(drafter.ok());
  Sequence seq;
  seq.id = 7;
  seq.token_ids = Tokens(8, 3, vocab);
  seq.num_prompt_tokens = 8;
  seq.page_table = {9, 3, 14, 0, 5, 11, 2, 7, 12, 1, 15, 4, 6, 8};  // 42 tokens
  // One target step over [start, start + n) (the drafts when verifying), then CatchUp; the
  // step samples `next` when it ends at the sequence's last token.
  auto step = [&](int start, int n, int drafts, int accepted, int32_t next) {
    std::vector<int32_t> run(seq.token_ids.begin() + start,
                             seq.token_ids.begin() + std::min<int>(start + n, seq.num_tokens()));
    run.insert(run.end(), seq.draft_token_ids.begin(), seq.draft_token_ids.begin() + drafts);
    ForwardBatch tb;
    tb.all_hidden = true;
    tb.seqs = {{seq.id, start, run, seq.page_table, false}};
    ForwardOutput to;
    ASSERT_TRUE((*target)->Forward(tb, &to).ok());
    ScheduledBatch batch;
    ScheduledSeq s;
    s.seq = &seq;
    s.seq_id = seq.id;
    s.start_pos = start;
    s.num_tokens = n;
    s.num_draft_tokens = drafts;
    s.samples = start + n - drafts == seq.num_tokens();
    batch.seqs = {s};
    const SeqUpdate update{seq.id, next, false, accepted};
    ASSERT_TRUE((*drafter)->CatchUp(batch, {&update, s.samples ? 1u : 0u}, to).ok());
  };
  step(0, 5, 0, 0, -1);  // the prompt in two chunks; the second samples 11
  step(5, 3, 0, 0, 11);
  seq.token_ids.push_back(11);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  constexpr int kK = 3;
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const DraftRequest request{&seq, kK, &greedy, 1};
    std::vector<std::vector<int32_t>> drafts;
    ASSERT_TRUE((*drafter)->Propose({&request, 1}, &drafts).ok());
    ASSERT_EQ(drafts.size(), 1u);
    EXPECT_EQ(drafts[0], FreshMtpDrafts(seq.token_ids, kK));
    EXPECT_TRUE((*drafter)->DraftProbs(seq.id, 0).empty());  // greedy: verified by equality
    const int accepted = (round * 2 + 1) % (kK + 1);
    seq.draft_token_ids = drafts[0];
    const int32_t bonus = accepted < kK ? (drafts[0][accepted] + 1) % vocab : 5;
    step(seq.num_tokens() - 1, 1 + kK, kK, accepted, bonus);
    seq.token_ids.insert(seq.token_ids.end(), drafts[0].begin(), drafts[0].begin() + accepted);
    seq.token_ids.push_back(bonus);
    seq.draft_token_ids.clear();
  }
}

// Across the split, in one process: a prefill-only sequence (the prompt less its last token)
// computes the MTP KV of its positions 0 .. P-3; a remote-KV sequence over the same pages, marked
// computed (MarkComputed) and given the prefilled hidden state, drafts at its first decode step
// from exactly the from-scratch MTP chain's distributions (sampled: q compared per draft); without
// the prefilled hidden state it does not draft.
TEST(MtpDrafterTest, RemoteKvSequenceDraftsFromThePrefilledHiddenState) {
  const model::ModelWeights& w = Deepseek();
  const int vocab = w.config.vocab_size, hd = w.config.hidden_size;
  ModelRunnerOptions ro;
  ro.kv.page_size = 3;
  ro.num_pages = 16;
  ro.num_threads = 1;
  ro.kernels = KernelKind::kReference;
  auto target = ModelRunner::Create(w, ro);
  ASSERT_TRUE(target.ok());
  auto mtp_runner = CreateMtpRunner(w, 0, ro);
  ASSERT_TRUE(mtp_runner.ok());
  auto drafter = MtpDrafter::Create(std::move(mtp_runner).value());
  ASSERT_TRUE(drafter.ok());
  const std::vector<int32_t> prompt = Tokens(9, 5, vocab);
  const std::vector<int32_t> pages = {6, 2, 11, 4, 9, 0};
  // One target step of `seq` over [start, start + n) and the drafter's catch-up.
  auto step = [&](Sequence& seq, int start, int n, const SeqUpdate& update,
                  std::vector<float>* hidden) {
    ForwardBatch tb;
    tb.all_hidden = true;
    tb.seqs = {{seq.id, start, std::span<const int32_t>(seq.token_ids).subspan(start, n),
                seq.page_table, false}};
    ForwardOutput to;
    ASSERT_TRUE((*target)->Forward(tb, &to).ok());
    if (hidden != nullptr) *hidden = to.hidden[0];
    ScheduledSeq s;
    s.seq = &seq;
    s.seq_id = seq.id;
    s.start_pos = start;
    s.num_tokens = n;
    s.samples = start + n == seq.num_tokens();
    ScheduledBatch batch;
    batch.seqs = {s};
    ASSERT_TRUE((*drafter)->CatchUp(batch, {&update, 1}, to).ok());
  };
  Sequence prefill;
  prefill.id = 1;
  prefill.prefill_only = true;
  prefill.token_ids.assign(prompt.begin(), prompt.end() - 1);
  prefill.num_prompt_tokens = prefill.num_tokens();
  prefill.page_table = pages;
  std::vector<float> chunk;
  step(prefill, 0, 5, {1, 0, false}, nullptr);
  step(prefill, 5, 3, {1, 0, true}, &chunk);  // finishes: its output carries the hidden state
  const std::vector<float> prefilled(chunk.end() - hd, chunk.end());
  (*drafter)->Forget(1);
  EXPECT_EQ((*drafter)->num_prompt_tokens(), 7);  // positions 0 .. P-3 of P = 9
  SamplingParams sampled;
  sampled.temperature = 1.0f;
  for (bool with_hidden : {true, false}) {
    SCOPED_TRACE(with_hidden ? "with the prefilled hidden state" : "without it");
    Sequence decode;
    decode.id = with_hidden ? 2 : 3;
    decode.remote_kv = true;
    decode.token_ids = prompt;
    decode.num_prompt_tokens = decode.num_tokens();
    decode.page_table = pages;
    (*drafter)->MarkComputed(decode.id, decode.num_tokens() - 1);
    if (with_hidden) (*drafter)->SetPrefilledHidden(decode.id, prefilled);
    step(decode, decode.num_tokens() - 1, 1, {decode.id, 17, false}, nullptr);
    decode.token_ids.push_back(17);
    const DraftRequest request{&decode, 3, &sampled, 99};
    std::vector<std::vector<int32_t>> drafts;
    ASSERT_TRUE((*drafter)->Propose({&request, 1}, &drafts).ok());
    if (!with_hidden) {
      EXPECT_TRUE(drafts[0].empty());
      continue;
    }
    ASSERT_EQ(drafts[0].size(), 3u);
    const std::vector<std::vector<float>> rows =
        FreshMtpLogits(decode.token_ids, static_cast<int>(drafts[0].size()), drafts[0]);
    RequestSampler reference(sampled, 0);
    for (int j = 0; j < 3; ++j) {
      std::vector<double> want;
      reference.Distribution(rows[j], &want);
      const std::span<const double> got = (*drafter)->DraftProbs(decode.id, j);
      ASSERT_EQ(got.size(), want.size());
      double err = 0.0;
      for (size_t v = 0; v < want.size(); ++v) err = std::max(err, std::abs(got[v] - want[v]));
      EXPECT_LT(err, 1e-6) << "draft " << j;
    }
    (*drafter)->Forget(decode.id);
  }
  EXPECT_EQ((*drafter)->num_prompt_tokens(), 9);  // and P-2, P-1 on decode (with the state)
}

// The distributions of the second generated token after `prompt` under `params`, each averaged
// over the first (drawn from the target): the target's (p) and the MTP layer's draft (q), whose
// position prompt.size() - 1 reads the target's last prompt hidden state and the first token.
struct SecondTokenMarginals {
  std::vector<double> p, q;  // (vocab)
};
SecondTokenMarginals Marginals(const std::vector<int32_t>& prompt, const SamplingParams& params) {
  const model::ModelWeights& w = Deepseek();
  const int vocab = w.config.vocab_size, hd = w.config.hidden_size;
  const int n = static_cast<int>(prompt.size()), pages_per_seq = (n + 1 + 2) / 3;
  ModelRunnerOptions ro;
  ro.kv.page_size = 3;
  ro.num_pages = pages_per_seq * (vocab + 1);
  ro.num_threads = 1;
  auto target = ModelRunner::Create(w, ro);
  auto mtp = CreateMtpRunner(w, 0, ro);
  EXPECT_TRUE(target.ok() && mtp.ok());
  std::vector<std::vector<int32_t>> pages(vocab + 1), tokens(vocab + 1);
  for (int i = 0; i <= vocab; ++i)
    for (int j = 0; j < pages_per_seq; ++j) pages[i].push_back(i * pages_per_seq + j);
  ForwardBatch first;  // the prompt: p1 and the hidden states
  first.all_hidden = true;
  first.seqs = {{0, 0, prompt, pages[vocab], true}};
  ForwardOutput fo;
  EXPECT_TRUE((*target)->Forward(first, &fo).ok());
  RequestSampler sampler(params, 0);
  std::vector<double> p1, dist;
  sampler.Distribution(fo.logits[0], &p1);
  ForwardBatch second, drafts;  // per first token a: the target after prompt + a; the MTP layer
  for (int a = 0; a < vocab; ++a) {
    tokens[a] = prompt;
    tokens[a].push_back(a);
    second.seqs.push_back({a, 0, tokens[a], pages[a], true});
    drafts.seqs.push_back({a, 0, std::span<const int32_t>(tokens[a]).subspan(1), pages[a], true});
    drafts.seqs.back().input_hidden = fo.hidden[0];
  }
  ForwardOutput so, mo;
  EXPECT_TRUE((*target)->Forward(second, &so).ok());
  EXPECT_TRUE((*mtp)->Forward(drafts, &mo).ok());
  EXPECT_EQ(fo.hidden[0].size(), static_cast<size_t>(n) * hd);
  SecondTokenMarginals m{std::vector<double>(vocab), std::vector<double>(vocab)};
  for (int a = 0; a < vocab; ++a) {
    sampler.Distribution(so.logits[a], &dist);
    for (int b = 0; b < vocab; ++b) m.p[b] += p1[a] * dist[b];
    sampler.Distribution(mo.logits[a], &dist);
    for (int b = 0; b < vocab; ++b) m.q[b] += p1[a] * dist[b];
  }
  return m;
}

// Pearson's chi-square of counts against n * expect over the cells expected >= 5, the others
// pooled into one; *df receives the degrees of freedom.
double ChiSquare(const std::vector<int64_t>& counts, const std::vector<double>& expect, int64_t n,
                 int* df) {
  double chi2 = 0.0, pooled_e = 0.0, pooled_o = 0.0;
  int cells = 0;
  for (size_t b = 0; b < expect.size(); ++b) {
    const double e = n * expect[b];
    if (e < 5.0) {
      pooled_e += e;
      pooled_o += static_cast<double>(counts[b]);
      continue;
    }
    chi2 += (counts[b] - e) * (counts[b] - e) / e;
    ++cells;
  }
  if (pooled_e > 0.0) {
    chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  }
  *df = cells - 1;
  return chi2;
}

// Seeded sampled requests (temperature 3, no top-k: the MTP layer's q and the target's p overlap,
// so both outcomes of rejection sampling occur) drafting one token with the MTP layer: the second
// generated token, verified by rejection sampling against q, has the target's marginal
// distribution. The threshold is chi-square's 0.999 quantile (Wilson-Hilferty) at the test's
// degrees of freedom: a correct sampler fails one choice of seeds in a thousand. The same counts
// against the MTP layer's own marginal fail by far: the test tells the two apart.
TEST(MtpEngineTest, SampledOutputFollowsTheTargetDistribution) {
  const int vocab = Deepseek().config.vocab_size;
  SamplingParams params;
  params.temperature = 3.0f;
  params.max_tokens = 3;
  params.ignore_eos = true;
  const std::vector<int32_t> prompt = Tokens(6, 11, vocab);
  EngineOptions eo = SpecBaseOptions(1, 600);
  eo.scheduler.max_num_seqs = 64;
  eo.scheduler.max_num_batched_tokens = 256;
  eo.speculative = MtpConfig(2);
  auto engine = Engine::Create(Deepseek(), eo);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  constexpr int64_t kN = 20000;
  for (int64_t i = 0; i < kN; ++i) {
    Request r;
    r.id = i;
    r.prompt_ids = prompt;
    r.sampling = params;
    r.sampling.seed = 1000 + i;
    ASSERT_TRUE((*engine)->AddRequest(r).ok());
  }
  std::map<int64_t, std::vector<int32_t>> tokens;
  while ((*engine)->HasWork()) {
    auto outputs = (*engine)->Step();
    ASSERT_TRUE(outputs.ok()) << outputs.status().ToString();
    for (const RequestOutput& out : *outputs) {
      tokens[out.request_id].insert(tokens[out.request_id].end(), out.new_token_ids.begin(),
                                    out.new_token_ids.end());
    }
  }
  std::vector<int64_t> counts(vocab, 0);
  for (const auto& [id, t] : tokens) {
    ASSERT_EQ(t.size(), 3u) << "request " << id;
    ++counts[t[1]];
  }
  const SpecDecodeCounters& spec = (*engine)->stats().spec_decode;
  EXPECT_EQ(spec.num_draft_tokens, kN);          // one draft each: max_tokens 3 leaves room for one
  EXPECT_GT(spec.num_accepted_tokens, kN / 10);  // both outcomes occur (about a third kept)
  EXPECT_LT(spec.num_accepted_tokens, kN * 9 / 10);
  const SecondTokenMarginals m = Marginals(prompt, params);
  int df = 0;
  const double chi2 = ChiSquare(counts, m.p, kN, &df);
  ASSERT_GT(df, 30);
  const double z = 3.090, h = 2.0 / (9.0 * df);  // z: the normal's 0.999 quantile
  const double threshold = df * std::pow(1.0 - h + z * std::sqrt(h), 3);
  EXPECT_LT(chi2, threshold) << "df " << df;
  int df_q = 0;
  EXPECT_GT(ChiSquare(counts, m.q, kN, &df_q), 5 * threshold);
}

// A pool too small for all four: sequences with MTP KV are preempted and recomputed, two are
// aborted mid-run; the others' outputs stay those without speculation and every page comes back.
TEST(MtpEngineTest, PreemptionAndAbortsLeaveEveryPageFree) {
  EngineOptions eo = SpecBaseOptions(1, 16);
  std::vector<Request> requests = SpecGreedyRequests(Deepseek().config.vocab_size);
  const Outcome want = RunAll(eo, requests);
  eo.speculative = MtpConfig(3);
  const Outcome got = RunAll(eo, requests, {{4, 1}, {9, 2}});
  EXPECT_GT(got.stats.num_preemptions, 0);
  EXPECT_GT(got.stats.spec_decode.num_drafts, 0);
  for (int i : {0, 3}) EXPECT_EQ(got.tokens.at(i), want.tokens.at(i)) << "request " << i;
  for (int i : {1, 2}) EXPECT_EQ(got.finish.at(i), FinishReason::kAbort) << "request " << i;
}

// A checkpoint without MTP layers, a budget without a page, a given runner: named refusals. The
// budget of a page covers the target's layers and the MTP layer's one.
TEST(MtpEngineTest, RefusalsAndPageBudget) {
  auto no_mtp = FirstLayersOf(Deepseek(), Deepseek().config.num_layers);  // drops the MTP layer
  ASSERT_TRUE(no_mtp.ok());
  EngineOptions eo = SpecBaseOptions(1, 32);
  eo.speculative = MtpConfig(2);
  auto e = Engine::Create(*no_mtp, eo);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("num_nextn_predict_layers 0"));
  auto runner = ModelRunner::Create(Deepseek(), eo.runner);
  ASSERT_TRUE(runner.ok());
  e = Engine::CreateWithRunner(std::move(runner).value(), eo);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("\"mtp\" runs in an engine made by"));
  eo.runner.num_pages = 0;
  auto page = KvPageBytesAllRanks(Deepseek().config, eo.runner);
  ASSERT_TRUE(page.ok());
  const int layers = Deepseek().config.num_layers;  // 3: a page then costs 4/3 target pages
  eo.runner.kv_cache_bytes = *page * 40;
  auto spec = Engine::Create(Deepseek(), eo);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ((*spec)->stats().num_total_pages, 40 * layers / (layers + 1));
  eo.runner.kv_cache_bytes = 100;
  e = Engine::Create(Deepseek(), eo);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("for the MTP layer"));
}

}  // namespace
}  // namespace pd::engine
