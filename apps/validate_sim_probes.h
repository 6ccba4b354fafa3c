// `pdserve validate-sim`'s probes through a running deployment: single requests, batches sent
// together, and the co-run probes that measure how much the prefill and decode instances slow
// each other down on one machine.
#pragma once

#include <sys/types.h>

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
#include "planner/cpu_contention.h"
#include "planner/validate.h"
#include "planner/validate_stats.h"

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
// (the two share this machine's caches and memory bandwidth). Both sides are measured as the
// CPU time of the instance's compute thread (schedstat: time on a CPU, not waiting for one), so
// that only the slowdown of the computation itself is counted; time the instance lost to other
// threads on its core is the background CPU the simulation models on its own (per request and
// token, BackgroundCpuStretch), and must not be counted twice.
// Decode: a 16-token prompt with 4x output_len tokens, alone and while a thread keeps the prefill
// instance busy with back-to-back 2L-token prompts. Its TPOT is kept for the report only: with
// the prefill instance busy it also holds the hand-overs of those prompts (the decode instance's
// HTTP, messenger and fabric threads receive each one on its core), which the own-thread stretch
// models (a TPOT ratio counted them twice: a trace at 37 req/s showed decode steps 4% slower
// while a prefill step ran, the TPOT ratio said 7%). Prefill: a 2L-token prompt, alone and while
// four requests with 16x output_len tokens decode (its TTFT would also count the client and
// router relaying the four streams on the prefill core). `pairs` alone/busy pairs, interleaved,
// so that a slow spell of the machine hits both sides of a pair; the factor is the median of the
// pairs' ratios (planner::CorunFactor).
struct CorunSample {
  double decode_alone = 0, decode_busy = 0, prefill_alone = 0, prefill_busy = 0;
  // The instances' compute-thread CPU time for the decode probe / the prompt.
  double decode_alone_cpu = 0, decode_busy_cpu = 0;
  double prefill_alone_cpu = 0, prefill_busy_cpu = 0;
};
// CPU seconds the busiest thread of `pid` (an instance's compute thread) spends while `run` runs.
template <typename F>
double ComputeThreadSeconds(pid_t pid, F&& run) {
  auto before = planner::ProcessThreadCpuTimes(pid);
  run();
  auto after = planner::ProcessThreadCpuTimes(pid);
  if (!before.ok() || !after.ok()) return 0.0;
  return planner::BusiestThreadRunSeconds(*before, *after);
}
// CPU seconds process `pid` spent on a CPU so far (schedstat); 0 when unreadable.
inline double RunSeconds(pid_t pid) {
  auto t = planner::ProcessCpuTimes(pid);
  return t.ok() ? t->run_s : 0.0;
}
inline Result<CorunSample> CorunPair(const bench::Endpoint& ep, const std::string& model,
                                     pid_t prefill_pid, pid_t decode_pid, int input_len,
                                     int output_len, uint64_t salt) {
  auto send = [&](int len, int max_tokens, uint64_t s) {
    bench::GenerationRequest r = ProbeRequest(len, max_tokens, s);
    r.model = model;
    return bench::SendStreaming(ep, r);
  };
  const int long_prompt = 2 * input_len;
  CorunSample out;
  out.decode_alone_cpu = ComputeThreadSeconds(
      decode_pid, [&] { out.decode_alone = TpotOf(send(16, 4 * output_len, salt)); });
  {
    std::atomic<bool> stop{false};
    std::thread prefill_load([&] {
      for (uint64_t s = salt + 1000; !stop.load(); ++s) send(long_prompt, 1, s);
    });
    out.decode_busy_cpu = ComputeThreadSeconds(
        decode_pid, [&] { out.decode_busy = TpotOf(send(16, 4 * output_len, salt + 1)); });
    stop = true;
    prefill_load.join();
  }
  double cpu0 = RunSeconds(prefill_pid);
  const bench::RequestResult alone = send(long_prompt, 2, salt + 2);
  if (!alone.success) return Unavailable("co-run probe failed: " + alone.error);
  out.prefill_alone_cpu = RunSeconds(prefill_pid) - cpu0;
  out.prefill_alone = alone.ttft;
  std::vector<std::thread> decode_load;
  for (int i = 0; i < 4; ++i) {
    decode_load.emplace_back([&, i] { send(16, 16 * output_len, salt + 2000 + i); });
  }
  // Let the four reach the decode instance (a 16-token prefill, the hand-over) first.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  cpu0 = RunSeconds(prefill_pid);
  out.prefill_busy = send(long_prompt, 2, salt + 3).ttft;
  out.prefill_busy_cpu = RunSeconds(prefill_pid) - cpu0;
  for (auto& t : decode_load) t.join();
  if (!(out.decode_alone > 0) || !(out.decode_busy > 0) || !(out.prefill_busy > 0) ||
      !(out.decode_alone_cpu > 0) || !(out.decode_busy_cpu > 0) || !(out.prefill_alone_cpu > 0) ||
      !(out.prefill_busy_cpu > 0)) {
    return Unavailable("co-run probes: no timing came back");
  }
  return out;
}

// `pairs` co-run pairs after a warm-up request of the long prompt.
inline Result<std::vector<CorunSample>> MeasureCorun(const bench::Endpoint& ep,
                                                     const std::string& model, pid_t prefill_pid,
                                                     pid_t decode_pid, int input_len,
                                                     int output_len, int pairs, uint64_t salt) {
  if (pairs < 1) return InvalidArgument("co-run probes: at least one pair");
  (void)bench::SendStreaming(ep, [&] {
    bench::GenerationRequest r = ProbeRequest(2 * input_len, 2, salt);
    r.model = model;
    return r;
  }());
  std::vector<CorunSample> out;
  for (int k = 0; k < pairs; ++k) {
    ASSIGN_OR_RETURN(CorunSample s, CorunPair(ep, model, prefill_pid, decode_pid, input_len,
                                              output_len, salt + 1 + 10 * k));
    out.push_back(s);
  }
  return out;
}

// The co-run factors from pooled pairs: the median of the pairs' compute-CPU ratios, at least 1
// (below is noise), at most 4 (planner::CorunFactor). Returns the line that describes them (""
// without pairs).
inline std::string CorunFactors(const std::vector<CorunSample>& pairs, planner::RealOverheads* o) {
  std::vector<double> d_ratio, p_ratio, d_alone, d_busy, p_alone, p_busy, d_cpu_alone, d_cpu_busy,
      p_cpu_alone, p_cpu_busy;
  for (const CorunSample& s : pairs) {
    d_ratio.push_back(s.decode_busy_cpu / s.decode_alone_cpu);
    p_ratio.push_back(s.prefill_busy_cpu / s.prefill_alone_cpu);
    d_cpu_alone.push_back(s.decode_alone_cpu);
    d_cpu_busy.push_back(s.decode_busy_cpu);
    p_cpu_alone.push_back(s.prefill_alone_cpu);
    p_cpu_busy.push_back(s.prefill_busy_cpu);
    d_alone.push_back(s.decode_alone);
    d_busy.push_back(s.decode_busy);
    p_alone.push_back(s.prefill_alone);
    p_busy.push_back(s.prefill_busy);
  }
  if (pairs.empty()) return "";
  o->corun_decode = planner::CorunFactor(d_cpu_alone, d_cpu_busy);
  o->corun_prefill = planner::CorunFactor(p_cpu_alone, p_cpu_busy);
  char line[768];
  std::snprintf(
      line, sizeof(line),
      "co-run probes (%zu interleaved pairs, medians): decode compute thread %.2f ms CPU alone, "
      "%.2f ms with the prefill instance busy (x%.3f, pairs %.2f-%.2f; TPOT %.3f / %.3f ms, not "
      "used); prefill compute thread %.2f / %.2f ms CPU with four sequences decoding (x%.3f, pairs "
      "%.2f-%.2f; TTFT %.2f / %.2f ms, not used)\n",
      pairs.size(), planner::UpperMedian(d_cpu_alone) * 1e3, planner::UpperMedian(d_cpu_busy) * 1e3,
      o->corun_decode, *std::min_element(d_ratio.begin(), d_ratio.end()),
      *std::max_element(d_ratio.begin(), d_ratio.end()), planner::UpperMedian(d_alone) * 1e3,
      planner::UpperMedian(d_busy) * 1e3, planner::UpperMedian(p_cpu_alone) * 1e3,
      planner::UpperMedian(p_cpu_busy) * 1e3, o->corun_prefill,
      *std::min_element(p_ratio.begin(), p_ratio.end()),
      *std::max_element(p_ratio.begin(), p_ratio.end()), planner::UpperMedian(p_alone) * 1e3,
      planner::UpperMedian(p_busy) * 1e3);
  return line;
}

}  // namespace pd::apps::validate_sim
