// Speculative decoding as the server counts it (vLLM's pdserve:spec_decode_* counters on
// /metrics), read before and after a run: the mean acceptance length printed beside TPOT.
#pragma once

#include <optional>
#include <string_view>

#include "bench/client.h"
#include "bench/report.h"

namespace pd::bench {

struct SpecDecodeTotals {
  double num_drafts = 0;           // pdserve:spec_decode_num_drafts_total
  double num_draft_tokens = 0;     // pdserve:spec_decode_num_draft_tokens_total
  double num_accepted_tokens = 0;  // pdserve:spec_decode_num_accepted_tokens_total
};

// The three counters summed over their label sets from a Prometheus text exposition; nullopt
// when it has none of them (a server without speculative decoding metrics).
std::optional<SpecDecodeTotals> ParseSpecDecodeTotals(std::string_view metrics_text);

// GET /metrics and ParseSpecDecodeTotals; nullopt when the server does not answer it.
std::optional<SpecDecodeTotals> FetchSpecDecodeTotals(const Endpoint& endpoint);

// Adds what the run drafted (after - before) to the summary when it drafted anything: JSON
// spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens, _acceptance_rate (accepted /
// draft tokens) and _mean_acceptance_length (1 + accepted / drafts: tokens per verification step,
// as vLLM reports it), and a "Speculative Decoding" section after the latency ones.
void AddSpecDecodeSummary(const SpecDecodeTotals& before, const SpecDecodeTotals& after,
                          BenchmarkSummary* summary);

}  // namespace pd::bench
