// Speculative decoding with a draft model on real (tiny, random) models: greedy outputs token
// for token those without speculation (TP 1 and 2, dense and MLA/MoE, stop tokens and max_tokens
// landing mid-draft, drafts from the target's first layers and from the target itself), the
// sampled output distribution the target's (chi-square), every page free after preemption and
// aborts, and the refusals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "common/clock.h"
#include "engine/constraint_test_util.h"
#include "engine/disagg_hooks.h"
#include "engine/engine.h"
#include "engine/engine_model_test_util.h"
#include "engine/model_runner_test_util.h"
#include "engine/sampler.h"
#include "engine/spec_draft_model.h"
#include "engine/spec_test_util.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;
using testing::MakeTinyModel;
using testing::TinyModelOptions;
using testing::Tokens;

using Outcome = testing::SpecOutcome;
using testing::SpecBaseOptions;
using testing::SpecGreedyRequests;

SpeculativeConfig DraftModelConfig(int k) {
  SpeculativeConfig c;
  c.method = SpecMethod::kDraftModel;
  c.num_speculative_tokens = k;
  c.model = "in-memory draft";  // a name: draft_weights holds the model
  return c;
}

// Runs the requests to the end (aborting aborts[step] before that step); checks the pages.
Outcome RunAll(const model::ModelWeights& target, const model::ModelWeights* draft,
               const EngineOptions& base, const std::vector<Request>& requests,
               const std::map<int, int64_t>& aborts = {}) {
  EngineOptions eo = base;
  if (draft != nullptr) {
    eo.speculative = DraftModelConfig(3);
    eo.draft_weights = draft;
  }
  auto engine = Engine::Create(target, eo);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return Outcome();
  return testing::RunToEnd(**engine, requests, aborts);
}

// Pages reserved for a sequence's drafts go back, drafts and all, when another running sequence
// needs one: drafts never cause a preemption.
TEST(DraftPagesTest, ReservedDraftPagesGoBackBeforeAnyPreemption) {
  PagePool pool(5, 0);
  SchedulerOptions so;
  so.max_num_batched_tokens = 16;
  so.enable_prefix_caching = false;
  Scheduler sched(so, &pool, 2, &SystemClock::Get());
  ASSERT_TRUE(sched.AddSequence(1, {1, 2}, 0).ok());        // a: 1 page
  ASSERT_TRUE(sched.AddSequence(2, {3, 4, 5, 6}, 0).ok());  // b: 2 pages
  ScheduledBatch batch = sched.Schedule();
  ASSERT_EQ(batch.seqs.size(), 2u);
  const std::vector<SeqUpdate> first = {{1, 7, false}, {2, 8, false}};
  sched.Update(batch, first);
  // a (3 tokens) reserves room for 3 drafts: positions up to 4, 3 pages; the pool is empty.
  EXPECT_EQ(sched.ReserveDraftPages(1, 3 + 3 - 1), 6);
  EXPECT_EQ(pool.num_free(), 0);
  ASSERT_TRUE(sched.SetDraftTokens(1, {9, 10, 11}));
  // b's next token (position 4) needs a third page: a's reservation goes, not b.
  batch = sched.Schedule();
  EXPECT_TRUE(batch.preempted_seq_ids.empty());
  ASSERT_EQ(batch.seqs.size(), 2u);
  for (const ScheduledSeq& s : batch.seqs) {
    EXPECT_TRUE(s.is_decode);
    EXPECT_EQ(s.num_draft_tokens, 0) << "sequence " << s.seq_id;
  }
  EXPECT_TRUE(sched.Find(1)->draft_token_ids.empty());
  EXPECT_EQ(sched.Find(1)->page_table.size(), 2u);
  EXPECT_EQ(sched.Find(2)->page_table.size(), 3u);
  EXPECT_TRUE(sched.CheckPages().ok());
}

// The draft's greedy continuation of `tokens`, computed from scratch by a fresh runner.
std::vector<int32_t> FreshGreedy(const model::ModelWeights& w, std::vector<int32_t> tokens, int k) {
  ModelRunnerOptions ro;
  ro.kv.page_size = 3;
  ro.num_pages = 32;
  ro.num_threads = 1;
  auto runner = ModelRunner::Create(w, ro);
  EXPECT_TRUE(runner.ok());
  std::vector<int32_t> pages(32);
  for (int i = 0; i < 32; ++i) pages[i] = 31 - i;
  std::vector<int32_t> out;
  for (int start = 0; static_cast<int>(out.size()) < k;) {
    ForwardBatch batch;
    const int n = static_cast<int>(tokens.size()) - start;
    batch.seqs = {{1, start, std::span<const int32_t>(tokens).subspan(start, n), pages, true}};
    ForwardOutput fo;
    EXPECT_TRUE((*runner)->Forward(batch, &fo).ok());
    out.push_back(ArgMax(fo.logits[0]));
    start = static_cast<int>(tokens.size());
    tokens.push_back(out.back());
  }
  return out;
}

// The draft's KV bookkeeping against a recomputation from scratch: a chunked prompt, then rounds
// of proposals whose verification keeps 0..K drafts (the rest rejected): every proposal is the
// draft model's own greedy continuation of the sequence as it stands.
TEST(DraftModelTest, ProposalsAreTheDraftsOwnContinuation) {
  TinyModelOptions o;
  o.layers = 2;
  auto model = MakeTinyModel(o);
  auto draft_weights = FirstLayersOf(model->weights, 1);
  ASSERT_TRUE(draft_weights.ok());
  ModelRunnerOptions ro;
  ro.kv.page_size = 3;
  ro.num_pages = 16;
  ro.num_threads = 1;
  auto runner = ModelRunner::Create(*draft_weights, ro);
  ASSERT_TRUE(runner.ok());
  auto draft = DraftModel::Create(std::move(runner).value(), nullptr);
  ASSERT_TRUE(draft.ok());
  Sequence seq;
  seq.id = 7;
  seq.token_ids = Tokens(8, 3, o.vocab);
  seq.num_prompt_tokens = 8;
  seq.page_table = {9, 3, 14, 0, 5, 11, 2, 7, 12, 1, 15, 4, 6, 8};  // 42 tokens
  auto step = [&](int start, int n, int drafts, int accepted) {
    ScheduledBatch batch;
    ScheduledSeq s;
    s.seq = &seq;
    s.seq_id = seq.id;
    s.start_pos = start;
    s.num_tokens = n;
    s.num_draft_tokens = drafts;
    batch.seqs = {s};
    const SeqUpdate update{seq.id, 0, false, accepted};
    ASSERT_TRUE((*draft)->CatchUp(batch, {&update, 1}).ok());
  };
  step(0, 5, 0, 0);  // the prompt in two chunks
  step(5, 3, 0, 0);
  seq.token_ids.push_back(11);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  constexpr int kK = 3;
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const DraftRequest request{&seq, kK, &greedy, 1};
    std::vector<std::vector<int32_t>> drafts;
    ASSERT_TRUE((*draft)->Propose({&request, 1}, &drafts).ok());
    ASSERT_EQ(drafts.size(), 1u);
    EXPECT_EQ(drafts[0], FreshGreedy(*draft_weights, seq.token_ids, kK));
    EXPECT_TRUE((*draft)->DraftProbs(seq.id, 0).empty());  // greedy: verified by equality
    // Verification keeps `accepted` drafts and then a token of the target's.
    const int accepted = (round * 2 + 1) % (kK + 1);
    seq.draft_token_ids = drafts[0];
    step(seq.num_tokens() - 1, 1 + kK, kK, accepted);
    seq.token_ids.insert(seq.token_ids.end(), drafts[0].begin(), drafts[0].begin() + accepted);
    const int32_t bonus = accepted < kK ? (drafts[0][accepted] + 1) % o.vocab : 5;
    seq.token_ids.push_back(bonus);
    seq.draft_token_ids.clear();
  }
}

// Greedy: token for token the outputs without speculation, for drafts that mostly miss (the
// target's first layer) and that always hit (the target itself), also when a stop token ends a
// request in the middle of an accepted run of drafts.
TEST(DraftModelEngineTest, GreedyOutputsEqualNoSpeculation) {
  TinyModelOptions o;
  o.layers = 3;
  auto dense = MakeTinyModel(o);
  struct Case {
    const char* name;
    const model::ModelWeights* weights;
    int tp;
  };
  const Case cases[] = {
      {"qwen3 tp1", &dense->weights, 1},
      {"qwen3 tp2", &dense->weights, 2},
      {"deepseek_v3 tp1", &testing::SyntheticTinyModel(model::Arch::kDeepseekV3), 1},
      {"deepseek_v3 tp2", &testing::SyntheticTinyModel(model::Arch::kDeepseekV3), 2}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int vocab = c.weights->config.vocab_size;
    auto first = FirstLayersOf(*c.weights, 1);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    const EngineOptions eo = SpecBaseOptions(c.tp, 96);
    std::vector<Request> requests = SpecGreedyRequests(vocab);
    const Outcome want = RunAll(*c.weights, nullptr, eo, requests);
    // Request 3 stops at its 8th token (a stop id that did not occur before it).
    const std::vector<int32_t>& w3 = want.tokens.at(3);
    int stop_at = 7;
    while (std::find(w3.begin(), w3.begin() + stop_at, w3[stop_at]) != w3.begin() + stop_at)
      ++stop_at;
    requests[3].sampling.stop_token_ids = {w3[stop_at]};
    for (const model::ModelWeights* draft :
         {static_cast<const model::ModelWeights*>(&*first), c.weights}) {
      SCOPED_TRACE(draft == c.weights ? "draft = target" : "draft = first layer");
      const Outcome got = RunAll(*c.weights, draft, eo, requests);
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(got.tokens.at(i), want.tokens.at(i)) << "request " << i;
        EXPECT_EQ(got.finish.at(i), FinishReason::kLength);
      }
      EXPECT_EQ(got.tokens.at(3), std::vector<int32_t>(w3.begin(), w3.begin() + stop_at + 1));
      EXPECT_EQ(got.finish.at(3), FinishReason::kStop);
      const SpecDecodeCounters& s = got.stats.spec_decode;
      EXPECT_GT(s.num_drafts, 0);
      if (draft == c.weights) {  // the target drafts its own greedy tokens: all are kept
        EXPECT_EQ(s.num_accepted_tokens, s.num_draft_tokens);
      }
    }
  }
}

// Constrained requests (one JSON object over the tiny vocabulary: constraint_test_util.h): the
// draft proposes its own unmasked argmax, the target's masked verification keeps only what the
// constraint allows. Greedy outputs equal those without speculation token for token; sampled
// ones (rejection sampling against the masked target) are whole objects too.
TEST(DraftModelEngineTest, ConstrainedOutputsEqualNoSpeculation) {
  const model::ModelWeights& target = testing::SyntheticTinyModel(model::Arch::kDeepseekV3);
  const int vocab = target.config.vocab_size;
  const testing::ObjectOverVocab object(vocab, target.config.eos_token_id);
  std::vector<Request> requests = SpecGreedyRequests(vocab);
  object.Constrain(&requests);
  const EngineOptions eo = SpecBaseOptions(1, 96);
  const Outcome want = RunAll(target, nullptr, eo, requests);
  auto first = FirstLayersOf(target, 1);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  for (const model::ModelWeights* draft :
       {static_cast<const model::ModelWeights*>(&*first), &target}) {
    SCOPED_TRACE(draft == &target ? "draft = target" : "draft = first layer");
    const Outcome got = RunAll(target, draft, eo, requests);
    object.ExpectOutputs(got.tokens, want.tokens);
    EXPECT_GT(got.stats.spec_decode.num_drafts, 0);
  }
}

// The sampler's distribution of the token after `tokens` under `params`, from a fresh runner.
std::vector<double> TargetDistribution(const model::ModelWeights& w,
                                       const std::vector<int32_t>& tokens,
                                       const SamplingParams& params) {
  ModelRunnerOptions ro;
  ro.kv.page_size = 3;
  ro.num_pages = 8;
  ro.num_threads = 1;
  auto runner = ModelRunner::Create(w, ro);
  EXPECT_TRUE(runner.ok());
  const std::vector<int32_t> pages = {0, 1, 2, 3, 4, 5, 6, 7};
  ForwardBatch batch;
  batch.seqs = {{1, 0, tokens, pages, true}};
  ForwardOutput fo;
  EXPECT_TRUE((*runner)->Forward(batch, &fo).ok());
  RequestSampler sampler(params, 0);
  std::vector<double> p;
  sampler.Distribution(fo.logits[0], &p);
  return p;
}

// Pearson's chi-square of counts[cell] against n * expect[cell] over the cells expected > 0.
double ChiSquare(const std::map<std::pair<int, int>, int64_t>& counts,
                 const std::map<std::pair<int, int>, double>& expect, int64_t n) {
  double chi2 = 0.0;
  for (const auto& [cell, e] : expect) {
    if (e <= 0.0) continue;
    auto it = counts.find(cell);
    const double observed = it == counts.end() ? 0.0 : static_cast<double>(it->second);
    chi2 += (observed - n * e) * (observed - n * e) / (n * e);
  }
  return chi2;
}

// Seeded sampled requests (temperature 1.5, top-k 4) with a draft model of the target's first
// layer: the second token, the one verified by rejection sampling against the draft's q, has
// the target's distribution. Cells: (first token, second token), 16 of them; their exact
// probabilities come from the target's logits. The threshold is chi-square's 0.999 quantile at
// 15 degrees of freedom: a correct sampler fails one choice of seeds in a thousand. The same
// counts against the draft's own distribution for the second token (over the cells it gives
// mass) fail by far: the test tells the two apart. (It caught the draft drawing from the
// request's own seeded stream, which correlates the draft with the acceptance draw.)
TEST(DraftModelEngineTest, SampledOutputFollowsTheTargetDistribution) {
  TinyModelOptions o;
  o.layers = 2;
  auto model = MakeTinyModel(o);
  auto draft = FirstLayersOf(model->weights, 1);
  ASSERT_TRUE(draft.ok());
  SamplingParams params;
  params.temperature = 1.5f;
  params.top_k = 4;
  params.max_tokens = 3;
  params.ignore_eos = true;
  const std::vector<int32_t> prompt = Tokens(6, 11, o.vocab);
  EngineOptions eo = SpecBaseOptions(1, 600);
  eo.scheduler.max_num_seqs = 64;
  eo.scheduler.max_num_batched_tokens = 256;
  eo.speculative = DraftModelConfig(2);
  eo.draft_weights = &*draft;
  auto engine = Engine::Create(model->weights, eo);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  constexpr int64_t kN = 4000;
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
  std::map<std::pair<int, int>, int64_t> counts;
  for (const auto& [id, t] : tokens) {
    ASSERT_EQ(t.size(), 3u) << "request " << id;
    ++counts[{t[0], t[1]}];
  }
  const SpecDecodeCounters& spec = (*engine)->stats().spec_decode;
  EXPECT_EQ(spec.num_draft_tokens, kN);
  EXPECT_GT(spec.num_accepted_tokens, kN / 10);  // both outcomes of rejection sampling occur
  EXPECT_LT(spec.num_accepted_tokens, kN * 9 / 10);
  std::map<std::pair<int, int>, double> target, drafted;
  const std::vector<double> p1 = TargetDistribution(model->weights, prompt, params);
  for (int a = 0; a < o.vocab; ++a) {
    if (p1[a] <= 0.0) continue;
    std::vector<int32_t> context = prompt;
    context.push_back(a);
    const std::vector<double> p2 = TargetDistribution(model->weights, context, params);
    const std::vector<double> q2 = TargetDistribution(*draft, context, params);
    for (int b = 0; b < o.vocab; ++b) {
      if (p2[b] > 0.0) target[{a, b}] = p1[a] * p2[b];
      if (q2[b] > 0.0) drafted[{a, b}] = p1[a] * q2[b];
    }
  }
  constexpr double kChi2Df15At999 = 37.697;
  EXPECT_EQ(target.size(), 16u);
  for (const auto& [cell, c] : counts) {
    EXPECT_EQ(target.count(cell), 1u) << cell.first << " then " << cell.second << " has p = 0";
  }
  EXPECT_LT(ChiSquare(counts, target, kN), kChi2Df15At999);
  EXPECT_GT(ChiSquare(counts, drafted, kN), 10 * kChi2Df15At999);
}

// A pool too small for all four: sequences with drafts (and draft KV) are preempted and
// recomputed, two are aborted mid-run; the others' outputs stay those without speculation, and
// every page (target and draft side share them) comes back.
TEST(DraftModelEngineTest, PreemptionAndAbortsLeaveEveryPageFree) {
  TinyModelOptions o;
  o.layers = 2;
  auto model = MakeTinyModel(o);
  auto draft = FirstLayersOf(model->weights, 1);
  ASSERT_TRUE(draft.ok());
  const EngineOptions eo = SpecBaseOptions(1, 16);
  std::vector<Request> requests = SpecGreedyRequests(o.vocab);
  const Outcome want = RunAll(model->weights, nullptr, eo, requests);
  const Outcome got = RunAll(model->weights, &*draft, eo, requests, {{4, 1}, {9, 2}});
  EXPECT_GT(got.stats.num_preemptions, 0);
  EXPECT_GT(got.stats.spec_decode.num_drafts, 0);
  EXPECT_LT(got.stats.spec_decode.num_accepted_tokens, got.stats.spec_decode.num_draft_tokens);
  for (int i : {0, 3}) EXPECT_EQ(got.tokens.at(i), want.tokens.at(i)) << "request " << i;
  for (int i : {1, 2}) EXPECT_EQ(got.finish.at(i), FinishReason::kAbort) << "request " << i;
}

// Copies pages src[k] -> dst[k] of every rank and layer of one runner's region into another's.
void CopyPages(ModelRunner& from, const std::vector<int32_t>& src, ModelRunner& to,
               const std::vector<int32_t>& dst) {
  ASSERT_EQ(from.num_ranks(), to.num_ranks());
  for (int r = 0; r < from.num_ranks(); ++r) {
    KvRegion& a = from.rank_region(r);
    KvRegion& b = to.rank_region(r);
    ASSERT_EQ(a.spec().page_bytes(), b.spec().page_bytes());
    for (int l = 0; l < from.config().num_layers; ++l) {
      for (size_t k = 0; k < src.size(); ++k)
        std::memcpy(b.Block(l, dst[k]), a.Block(l, src[k]), a.spec().page_bytes());
    }
  }
}

// Disaggregated by hand: a prefill engine computes each prompt less its last token, its draft
// model's KV included; both regions' pages go into a decode engine that takes remote draft KV.
// With the target as its own draft, every draft is kept only when the draft's KV of the prompt is
// right; decode's draft computes one prompt token per request (the last), the prefill's the rest;
// the greedy outputs are those without speculation.
TEST(DraftModelEngineTest, RemoteDraftKvSkipsTheDraftsPromptOnDecode) {
  TinyModelOptions o;
  o.layers = 2;
  auto model = MakeTinyModel(o);
  for (int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    EngineOptions eo = SpecBaseOptions(tp, 64);
    eo.scheduler.max_num_batched_tokens = 8;  // chunked prefill on the prefill engine
    std::vector<Request> requests = SpecGreedyRequests(o.vocab);
    const Outcome want = RunAll(model->weights, nullptr, eo, requests);
    eo.speculative = DraftModelConfig(3);
    eo.draft_weights = &model->weights;
    auto prefill = Engine::Create(model->weights, eo);
    auto decode = Engine::Create(model->weights, eo);
    ASSERT_TRUE(prefill.ok() && decode.ok());
    DisaggHooks& ph = *(*prefill)->disagg_hooks();
    DisaggHooks& dh = *(*decode)->disagg_hooks();
    ASSERT_NE(ph.DraftKvRunner(), nullptr);
    dh.SetRemoteDraftKv(true);
    int64_t prompt_tokens = 0;
    for (const Request& r : requests) {
      ASSERT_TRUE(dh.AddRemoteKvRequest(r).ok());
      std::vector<KvReservation> res = dh.TakeKvReservations();
      ASSERT_EQ(res.size(), 1u);
      Request head = r;
      head.prompt_ids.pop_back();
      prompt_tokens += static_cast<int64_t>(head.prompt_ids.size());
      ASSERT_TRUE(ph.AddPrefillOnlyRequest(head).ok());
      std::shared_ptr<const PrefillResult> result;
      while ((*prefill)->HasWork()) {
        auto outs = (*prefill)->Step();
        ASSERT_TRUE(outs.ok());
        for (const RequestOutput& out : *outs) result = out.prefill_result;
      }
      ASSERT_NE(result, nullptr);
      CopyPages((*prefill)->runner(), result->page_table, (*decode)->runner(), res[0].page_table);
      CopyPages(*ph.DraftKvRunner(), result->page_table, *dh.DraftKvRunner(), res[0].page_table);
      ph.ReleasePages(result->page_table);
      ASSERT_TRUE(dh.MarkKvReady(r.id).ok());
    }
    std::map<int64_t, std::vector<int32_t>> got;
    while ((*decode)->HasWork()) {
      auto outs = (*decode)->Step();
      ASSERT_TRUE(outs.ok());
      for (const RequestOutput& out : *outs)
        got[out.request_id].insert(got[out.request_id].end(), out.new_token_ids.begin(),
                                   out.new_token_ids.end());
    }
    for (const Request& r : requests) EXPECT_EQ(got[r.id], want.tokens.at(r.id)) << r.id;
    const SpecDecodeCounters d = (*decode)->stats().spec_decode;
    EXPECT_GT(d.num_drafts, 0);
    EXPECT_EQ(d.num_accepted_tokens, d.num_draft_tokens);
    EXPECT_EQ(d.num_draft_prompt_tokens, static_cast<int64_t>(requests.size()));
    EXPECT_EQ((*prefill)->stats().spec_decode.num_draft_prompt_tokens, prompt_tokens);
    EXPECT_EQ((*decode)->stats().num_free_pages, (*decode)->stats().num_total_pages);
    EXPECT_EQ((*prefill)->stats().num_free_pages, (*prefill)->stats().num_total_pages);
  }
}

// The refusals name what is wrong.
TEST(DraftModelEngineTest, RefusesAnotherTokenizerMissingCheckpointAndGivenRunner) {
  TinyModelOptions o;
  auto target = MakeTinyModel(o);
  o.vocab = 61;
  auto other = MakeTinyModel(o);
  EngineOptions eo = SpecBaseOptions(1, 32);
  eo.speculative = DraftModelConfig(2);
  eo.draft_weights = &other->weights;
  auto e = Engine::Create(target->weights, eo);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("vocab_size 61 differs from the target's 67"));
  eo.draft_weights = nullptr;
  eo.speculative.model = ::testing::TempDir() + "no_such_draft_model";
  e = Engine::Create(target->weights, eo);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("draft model " + eo.speculative.model));
  eo.draft_weights = &target->weights;
  eo.runner.num_pages = 0;
  eo.runner.kv_cache_bytes = 100;
  e = Engine::Create(target->weights, eo);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("for the draft model"));
  auto short_draft = FirstLayersOf(target->weights, 1);
  ASSERT_TRUE(short_draft.ok());
  short_draft->config.max_position_embeddings = 64;  // below max_model_len 96
  eo.draft_weights = &*short_draft;
  eo.runner.num_pages = 32;
  e = Engine::Create(target->weights, eo);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("max_position_embeddings 64 is below max_model_len"));
  // A given runner (and so the data-parallel engine) has no draft model to run.
  auto runner = ModelRunner::Create(target->weights, SpecBaseOptions(1, 32).runner);
  ASSERT_TRUE(runner.ok());
  e = Engine::CreateWithRunner(std::move(runner).value(), eo);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("\"draft_model\" runs in an engine made by"));
}

// kv_cache_bytes is split so that the target and the draft have one page count: a draft of one
// of two layers makes each page cost 1.5 target pages.
TEST(DraftModelEngineTest, PageBudgetCoversBothModels) {
  TinyModelOptions o;
  o.layers = 2;
  auto model = MakeTinyModel(o);
  auto draft = FirstLayersOf(model->weights, 1);
  ASSERT_TRUE(draft.ok());
  EngineOptions eo = SpecBaseOptions(1, 0);
  auto page = KvPageBytesAllRanks(model->weights.config, eo.runner);
  ASSERT_TRUE(page.ok());
  eo.runner.kv_cache_bytes = *page * 30;  // 30 target-only pages
  auto plain = Engine::Create(model->weights, eo);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->stats().num_total_pages, 30);
  eo.speculative = DraftModelConfig(2);
  eo.draft_weights = &*draft;
  auto spec = Engine::Create(model->weights, eo);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ((*spec)->stats().num_total_pages, 20);
}

}  // namespace
}  // namespace pd::engine
