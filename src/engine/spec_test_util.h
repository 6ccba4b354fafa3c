// Test helper for speculative decoding on real (tiny, random) models: the engine options, the
// greedy requests and the run to the end that the draft_model and mtp tests share.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "engine/engine.h"
#include "engine/model_runner_test_util.h"

namespace pd::engine::testing {

// What a run gave: each request's tokens and finish reason, and the engine's counters after it.
struct SpecOutcome {
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, FinishReason> finish;
  EngineStats stats;
};

// Page size 3, one thread per rank, 24-token steps of at most 4 sequences, 96-token contexts.
inline EngineOptions SpecBaseOptions(int tp, int num_pages) {
  EngineOptions eo;
  eo.runner.kv.page_size = 3;
  eo.runner.num_pages = num_pages;
  eo.runner.num_threads = 1;
  eo.runner.tensor_parallel_size = tp;
  eo.scheduler.max_num_batched_tokens = 24;
  eo.scheduler.max_num_seqs = 4;
  eo.scheduler.max_model_len = 96;
  return eo;
}

// Four greedy requests (ids 0..3) of 5, 8, 11 and 14 prompt tokens and 10, 13, 16 and 19
// output tokens: K = 3 drafts land mid-draft at max_tokens.
inline std::vector<Request> SpecGreedyRequests(int vocab) {
  std::vector<Request> requests;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.id = i;
    r.prompt_ids = Tokens(5 + 3 * i, 30 + i, vocab);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 10 + 3 * i;
    r.sampling.ignore_eos = true;
    requests.push_back(r);
  }
  return requests;
}

// Runs the requests on `engine` to the end (aborting aborts[step] before that step); checks that
// every page is free and the pool's counts match a recount.
inline SpecOutcome RunToEnd(Engine& engine, const std::vector<Request>& requests,
                            const std::map<int, int64_t>& aborts = {}) {
  SpecOutcome out;
  for (const Request& r : requests) EXPECT_TRUE(engine.AddRequest(r).ok());
  for (int step = 0; engine.HasWork() && step < 5000; ++step) {
    auto a = aborts.find(step);
    if (a != aborts.end()) engine.Abort(a->second);
    auto outputs = engine.Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status().ToString();
    if (!outputs.ok()) break;
    for (const RequestOutput& o : *outputs) {
      auto& t = out.tokens[o.request_id];
      t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished()) out.finish[o.request_id] = o.finish_reason;
    }
  }
  out.stats = engine.stats();
  EXPECT_EQ(out.stats.num_free_pages, out.stats.num_total_pages);
  const Status pages = engine.CheckPages();
  EXPECT_TRUE(pages.ok()) << pages.ToString();
  return out;
}

}  // namespace pd::engine::testing
