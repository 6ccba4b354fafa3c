// `pdserve validate-sim`'s probes through a running deployment: single requests, batches sent
// together, and the co-run probes that measure how much the prefill and decode instances slow
// each other down on one machine.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/client.h"
#include "bench/datasets.h"
#include "common/status.h"
#include "planner/validate.h"

namespace pd::apps::validate_sim {

inline bench::GenerationRequest ProbeRequest(int prompt_len, int max_tokens, uint64_t salt) {
  std::mt19937_64 rng(salt);
  bench::GenerationRequest r;
  r.prompt_ids = bench::SyntheticPromptIds(prompt_len, rng);
  r.prompt_len = prompt_len;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

inline double TpotOf(const bench::RequestResult& m) {
  return m.output_len > 1 ? (m.latency - m.ttft) / (m.output_len - 1) : 0.0;
}

// Mean TPOT of `batch` requests sent together (short prompts, long outputs: they decode side by
// side on the decode instance).
inline Result<double> BatchTpot(const bench::Endpoint& ep, const std::string& model, int batch,
                                int prompt_len, int output_len, uint64_t salt) {
  std::vector<bench::RequestResult> results(batch);
  std::vector<std::thread> senders;
  for (int i = 0; i < batch; ++i) {
    senders.emplace_back([&, i] {
      bench::GenerationRequest r = ProbeRequest(prompt_len, output_len, salt + i);
      r.model = model;
      results[i] = bench::SendStreaming(ep, r);
    });
  }
  for (auto& t : senders) t.join();
  double sum = 0;
  for (const auto& m : results) {
    if (!m.success || m.output_len < 2) return Unavailable("decode probe failed: " + m.error);
    sum += (m.latency - m.ttft) / (m.output_len - 1);
  }
  return sum / batch;
}

// Co-run probes: how much slower each instance's steps are while the other instance computes
// (the two share this machine's cores, caches and memory bandwidth, and the router and client
// relay the other's traffic). Decode: the TPOT of a 16-token prompt with 4x output_len tokens,
// alone and while a thread keeps the prefill instance busy with back-to-back 2L-token prompts.
// Prefill: the TTFT of 2L-token prompts (less the fixed cost), alone and while four requests with
// 16x output_len tokens decode. Medians of three; factors below 1 (noise) are taken as 1.
inline Result<planner::RealOverheads> MeasureCorun(const bench::Endpoint& ep,
                                                   const std::string& model, int input_len,
                                                   int output_len, planner::RealOverheads o) {
  const int long_prompt = 2 * input_len;
  auto send = [&](int len, int max_tokens, uint64_t salt) {
    bench::GenerationRequest r = ProbeRequest(len, max_tokens, salt);
    r.model = model;
    return bench::SendStreaming(ep, r);
  };
  std::vector<double> alone, busy;
  for (int rep = 0; rep < 3; ++rep) alone.push_back(TpotOf(send(16, 4 * output_len, 500 + rep)));
  {
    std::atomic<bool> stop{false};
    std::thread prefill_load([&] {
      for (uint64_t salt = 600; !stop.load(); ++salt) send(long_prompt, 1, salt);
    });
    for (int rep = 0; rep < 3; ++rep) busy.push_back(TpotOf(send(16, 4 * output_len, 700 + rep)));
    stop = true;
    prefill_load.join();
  }
  std::vector<double> p_alone, p_busy;
  for (int rep = 0; rep < 4; ++rep) {
    const bench::RequestResult m = send(long_prompt, 2, 800 + rep);
    if (!m.success) return Unavailable("co-run probe failed: " + m.error);
    if (rep > 0) p_alone.push_back(m.ttft);
  }
  {
    std::vector<std::thread> decode_load;
    for (int i = 0; i < 4; ++i) {
      decode_load.emplace_back([&, i] { send(16, 16 * output_len, 900 + i); });
    }
    // Let the four reach the decode instance (a 64-token prefill, the hand-over) first.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (int rep = 0; rep < 3; ++rep) p_busy.push_back(send(long_prompt, 2, 950 + rep).ttft);
    for (auto& t : decode_load) t.join();
  }
  const double d_alone = Median(alone), p_idle = Median(p_alone) - o.fixed_s;
  if (!(d_alone > 0) || !(p_idle > 0)) return Unavailable("co-run probes: no timing came back");
  o.corun_decode = std::clamp(Median(busy) / d_alone, 1.0, 4.0);
  o.corun_prefill = std::clamp((Median(p_busy) - o.fixed_s) / p_idle, 1.0, 4.0);
  std::printf(
      "co-run probes: decode TPOT %.3f ms alone, %.3f ms with the prefill instance busy "
      "(x%.3f); prefill TTFT %.2f ms alone, %.2f ms with four sequences decoding (x%.3f)\n",
      d_alone * 1e3, Median(busy) * 1e3, o.corun_decode, Median(p_alone) * 1e3,
      Median(p_busy) * 1e3, o.corun_prefill);
  return o;
}

}  // namespace pd::apps::validate_sim
