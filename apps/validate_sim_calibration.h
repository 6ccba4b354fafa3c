// `pdserve validate-sim`'s calibration through the running deployment: probe sets (idle TTFT
// and decode probes, the client's, router's and instances' own CPU per request, co-run pairs)
// and their combination into the overheads, co-run factors and CPU costs the calibrated
// simulation uses.
#pragma once

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/validate_sim_flags.h"
#include "apps/validate_sim_probes.h"
#include "apps/validate_sim_up.h"
#include "bench/client.h"
#include "common/status.h"
#include "common/thread_util.h"
#include "planner/latency_model.h"
#include "planner/rate_calibration.h"
#include "planner/ttft_parts.h"
#include "planner/validate.h"
#include "planner/validate_stats.h"

namespace pd::apps::validate_sim {

inline double ModelledPrefillS(const planner::StepCoeffs& c, int prompt) {
  return c.PrefillMs(prompt, double(prompt) * prompt) * 1e-3;
}
// Modelled idle TTFT: the prefill step, then the decode step that samples the first token.
inline double ModelledTtftS(const planner::StepCoeffs& c, int prompt) {
  return ModelledPrefillS(c, prompt) + c.DecodeMs(1, prompt + 1) * 1e-3;
}

struct Calibration {
  planner::RealOverheads overheads;
  double idle_ttft_s = 0.0;  // at the mean prompt
  double idle_tpot_s = 0.0;
  double batch_tpot_s = 0.0;  // the largest decode probe's TPOT (`batch_probe` requests)
  int batch_probe = 0;
  planner::ClientCpuCost client_cpu;  // bench client + router, per request and output token
  planner::ClientCpuCost prefill_own_cpu, decode_own_cpu;  // instances' non-compute threads
  Stretches stretch;                                       // of the instances during the probes
  // The bench client's and router's cost measured under load (the load run), in the probes'
  // split; unset when not measured. The calibrated simulation's stretch uses it when set.
  std::optional<planner::ClientCpuCost> client_cpu_loaded;
  // The latency outside the engines added to each simulated request: the idle probes' fixed_s,
  // or drawn from the load run's traced per-request figures (apps/validate_sim_outside.h).
  planner::OutsideLatency outside;
  std::string outside_rule = "idle probes' constant";
  // The decode instance's steps under load, from the load run's traces
  // (apps/validate_sim_decode_load.h): when set, `stretch` measured at `rate` replaces the
  // schedstat CPU share's stretch of the decode steps (planner::StretchAtRate scales it to each
  // rate), and overheads.corun_decode holds the load run's co-run factor (`corun_probes`: the
  // probes' figure it replaced; equal when too few co-run steps were traced).
  // For the decode steps, `stretch` is that of their per-step part and `seq_stretch` of their
  // per-sequence part (planner::DecodeLoadFactors' split; equal when unsplit).
  struct DecodeUnderLoad {
    double stretch = 1.0, rate = 0.0, corun_probes = 1.0, seq_stretch = 1.0;
  };
  std::optional<DecodeUnderLoad> decode_load;
  // The prefill instance's steps under load (a rate's calibration runs,
  // apps/validate_sim_rate_cal.h): when set, `stretch` at `rate` replaces the schedstat CPU
  // share's stretch of the prefill steps (scaled to each rate by planner::StretchAtRate).
  std::optional<DecodeUnderLoad> prefill_load;
  // The decode and prefill instances' steps' factors in their traced order
  // (planner::DecodeStepFactors, PrefillStepFactors; a rate's calibration runs' in turn:
  // apps/validate_sim_rate_cal.h); the simulated decode instance replays its own step by step
  // (InstanceConfig::step_factors), the prefill instance's are printed beside; null when not
  // measured.
  std::shared_ptr<const std::vector<double>> decode_step_factors, prefill_step_factors;
  // The prefill engine's loop between back-to-back steps (planner::PrefillLoopGap; a rate's
  // calibration runs' median), the simulated prefill instance's InstanceConfig::loop_gap_s;
  // 0 when not measured.
  double prefill_loop_gap_s = 0.0;
  // The simulated prefill instance's InstanceConfig::arrival_work_s: 0 under the rule used.
  // `measured_arrival_work_s[m]`: the work a request brings the prefill instance's core when it
  // comes while a step runs by measure m (planner::MeasurePrefillArrivalWork,
  // PrefillArrivalWork::Work; a rate's calibration runs' median), and
  // `prefill_stretch_left_out[m]` the prefill stretch with that work left out of the traced busy
  // time; WithArrivalWork puts both in (printed beside, not used). Unset when not measured.
  double prefill_arrival_work_s = 0.0;
  planner::PerArrivalMeasure<std::optional<double>> measured_arrival_work_s,
      prefill_stretch_left_out;
  // A rate's pooled planner::DecodeBatchFactors (RateCalibration::pooled_decode_batch_factors):
  // not in the rule used's simulation; WithDecodeBatchFactors puts them in for the variant
  // printed beside it. Empty when not measured.
  std::vector<double> measured_batch_factors;
  // A rate's planner::PrefillChunkFactors over its runs together
  // (RateCalibration::prefill_chunk_factors): not in the rule used's simulation;
  // WithPrefillChunkFactors puts them in for the variant printed beside it. Empty when not
  // measured.
  std::vector<double> prefill_chunk_factors;
  const planner::ClientCpuCost& StretchCpu() const {
    return client_cpu_loaded ? *client_cpu_loaded : client_cpu;
  }
};

// The bench client's and router's CPU over the load run: an uncompared bench run at the highest
// compared rate.
struct LoadRunCpu {
  double rate = 0;
  int requests = 0;
  double mean_output_tokens = 0;
  double cpu_s = 0;   // client + router, /proc/PID/stat
  uint64_t seed = 0;  // the bench's seed: its requests
  // Per request (arrival, prompt, measured TTFT; empty when one failed) and the run's window on
  // the traces' clock: the outside latency's sample (apps/validate_sim_outside.h).
  std::vector<planner::ClientRequest> client;
  double begin_s = 0, end_s = 0;
};

// The client's and router's CPU per request under load beside the sequential probes' figure.
inline void PrintLoadRun(const ValidateFlags& f, const LoadRunCpu& load, const Calibration& cal) {
  const double loaded = cal.StretchCpu().Seconds(f.output_len);
  const double probes = cal.client_cpu.Seconds(f.output_len);
  std::printf(
      "bench client + router under load (the load run: %d requests at %.3g req/s, not compared): "
      "%.3f ms CPU per request of %d output tokens (%.3f ms + %.4f ms/token), vs %.3f ms from the "
      "sequential probes (x%.2f); the calibrated simulation's stretch uses the load run's "
      "(%.3f cores at the load run's rate, %.3f by the probes' figure)\n",
      load.requests, load.rate, loaded * 1e3, f.output_len, cal.StretchCpu().per_request_s * 1e3,
      cal.StretchCpu().per_token_s * 1e3, probes * 1e3, probes > 0 ? loaded / probes : 0.0,
      load.rate * loaded, load.rate * probes);
}

// Where the probes go and the salt of their synthetic prompts.
struct ProbeTarget {
  bench::Endpoint ep;
  std::string model;
  Deployment dep;
  uint64_t salt = 1;
  Result<bench::RequestResult> Send(int prompt_len, int max_tokens) {
    bench::GenerationRequest r = ProbeRequest(prompt_len, max_tokens, salt++);
    r.model = model;
    bench::RequestResult m = bench::SendStreaming(ep, r);
    if (!m.success) return Unavailable("probe failed: " + m.error);
    return m;
  }
};

constexpr int kTtftRounds = 12;  // the first warms up
constexpr int kTpotProbes = 7;
constexpr int kBatchProbes = 5;

// Idle TTFT probes: prompts of 16 tokens and of the dataset's mean and 2x mean, two tokens each,
// round-robin over the lengths (a burst of load from elsewhere hits every length alike); the
// median of 11 after a warm-up round, with how long the prompt held the prefill instance's
// compute thread (on its core or waiting for it: its own threads, pinned with it, send the KV
// during the step). Also the client's and router's CPU per such request.
inline Result<std::vector<planner::IdleProbe>> TtftProbes(const ValidateFlags& f,
                                                          const planner::StepCoeffs& c,
                                                          ProbeTarget& t, CpuPerRequest* cpu) {
  const std::vector<int> lens = {16, f.input_len, 2 * f.input_len};
  std::vector<std::vector<double>> ttft(lens.size());
  const CpuWindow window(t.dep);
  std::vector<std::vector<double>> held(lens.size()), run(lens.size());
  for (int round = 0; round < kTtftRounds; ++round) {
    for (size_t k = 0; k < lens.size(); ++k) {
      const planner::ThreadCpuTimes before = ThreadTimes(t.dep.prefill);
      ASSIGN_OR_RETURN(bench::RequestResult m, t.Send(lens[k], 2));
      const planner::CpuTimes c = planner::BusiestThreadTimes(before, ThreadTimes(t.dep.prefill));
      if (round > 0) {
        ttft[k].push_back(m.ttft);
        held[k].push_back(c.run_s + c.wait_s);
        run[k].push_back(c.run_s);
      }
    }
  }
  *cpu = window.PerRequest(kTtftRounds * lens.size());
  std::vector<planner::IdleProbe> probes;
  for (size_t k = 0; k < lens.size(); ++k) {
    probes.push_back({lens[k], planner::UpperMedian(ttft[k]), ModelledTtftS(c, lens[k]),
                      ModelledPrefillS(c, lens[k]), planner::UpperMedian(held[k]),
                      planner::UpperMedian(run[k])});
  }
  return probes;
}

// Decode probes: one request of the mean prompt with output_len tokens (the median of 7, and the
// client's and router's CPU per such request), and `batch` requests of 16-token prompts with
// 4x output_len tokens sent together (the median of 5).
inline Result<std::vector<planner::DecodeProbe>> DecodeProbes(const ValidateFlags& f,
                                                              const planner::StepCoeffs& c,
                                                              ProbeTarget& t, CpuPerRequest* cpu) {
  std::vector<double> tpot;
  const CpuWindow window(t.dep);
  for (int rep = 0; rep < kTpotProbes; ++rep) {
    ASSIGN_OR_RETURN(bench::RequestResult m, t.Send(f.input_len, f.output_len));
    if (m.output_len < 2) return Unavailable("idle TPOT probe: fewer than 2 tokens came back");
    tpot.push_back(TpotOf(m));
  }
  *cpu = window.PerRequest(kTpotProbes);
  std::vector<planner::DecodeProbe> decode = {
      {1, planner::UpperMedian(tpot), c.DecodeMs(1, f.input_len + f.output_len / 2) * 1e-3}};
  const int batch = std::min(8, f.max_num_seqs);
  if (batch > 1) {
    const int out = 4 * f.output_len;
    std::vector<double> batch_tpot;
    for (int rep = 0; rep < kBatchProbes; ++rep) {
      ASSIGN_OR_RETURN(double tp, BatchTpot(t.ep, t.model, batch, 16, out, t.salt));
      t.salt += batch;
      batch_tpot.push_back(tp);
    }
    decode.push_back({batch, planner::UpperMedian(batch_tpot),
                      c.DecodeMs(batch, int64_t(batch) * (16 + out / 2)) * 1e-3});
  }
  return decode;
}

inline void PrintCalibration(const std::vector<planner::IdleProbe>& probes,
                             const std::vector<planner::DecodeProbe>& decode,
                             const Calibration& cal) {
  std::printf("idle probes through the deployment (measured vs latency model):\n");
  for (const auto& p : probes) {
    std::printf(
        "  prompt %5d: TTFT %.2f ms measured, %.2f ms modelled; prefill step %.2f ms modelled, "
        "the prefill instance's compute thread held %.2f ms (%.2f ms on its core)\n",
        p.prompt_len, p.measured_ttft_s * 1e3, p.modelled_ttft_s * 1e3, p.modelled_prefill_s * 1e3,
        p.measured_prefill_cpu_s * 1e3, p.measured_prefill_run_s * 1e3);
  }
  for (const auto& d : decode) {
    std::printf("  batch %2d: TPOT %.3f ms measured, %.3f ms modelled (forward pass only)\n",
                d.batch, d.measured_tpot_s * 1e3, d.modelled_tpot_s * 1e3);
  }
  const planner::RealOverheads& o = cal.overheads;
  std::printf(
      "calibrated from these probes (fed to the calibrated simulation): prefill steps x%.3f "
      "(how long a prompt held this deployment's prefill compute thread vs the profile), fixed "
      "%.2f ms per "
      "request (HTTP, router, hand-over) and %.4f ms per prompt token (KV transfer; neither holds "
      "an instance), decode %.3f ms per step + %.3f ms per sequence per step (sampling, "
      "detokenising, streaming); bench client + router use %.3f ms CPU per request + %.4f ms per "
      "output token, the prefill instance's non-compute threads %.3f ms + %.4f ms/token, the "
      "decode instance's %.3f ms + %.4f ms/token (schedstat); waiting for a core stretched the "
      "prefill instance's work x%.3f, the decode instance's x%.3f (not used)\n",
      o.prefill_scale, o.fixed_s * 1e3, o.transfer_s_per_token * 1e3, o.decode_fixed_ms,
      o.decode_seq_ms, cal.client_cpu.per_request_s * 1e3, cal.client_cpu.per_token_s * 1e3,
      cal.prefill_own_cpu.per_request_s * 1e3, cal.prefill_own_cpu.per_token_s * 1e3,
      cal.decode_own_cpu.per_request_s * 1e3, cal.decode_own_cpu.per_token_s * 1e3,
      cal.stretch.prefill, cal.stretch.decode);
}

// One set of calibration probes: idle TTFT and decode probes, the client's and router's CPU, the
// co-run pairs. validate-sim takes three before the first bench round and one after each round, so
// the calibration spans the same stretch of time as the runs it is compared with (this machine
// drifts by 10-30% over minutes; a burst of probes catches one moment of it).
struct ProbeSet {
  std::vector<planner::IdleProbe> ttft;
  std::vector<planner::DecodeProbe> decode;
  CpuPerRequest cpu_short, cpu_long;  // per 2-token / output_len request
  std::vector<CorunSample> corun;
  Stretches stretch;
};

inline Result<ProbeSet> RunProbes(const ValidateFlags& f, const planner::StepCoeffs& c,
                                  const Deployment& dep, int set) {
  ProbeTarget t;
  t.ep.port = f.port;
  t.dep = dep;
  t.salt = 1 + 100000ull * set;
  ASSIGN_OR_RETURN(bench::ServerInfo info, bench::GetServerInfo(t.ep));
  t.model = info.model_id;
  ProbeSet ps;
  const ContentionWindow window(dep);
  ASSIGN_OR_RETURN(ps.ttft, TtftProbes(f, c, t, &ps.cpu_short));
  ASSIGN_OR_RETURN(ps.decode, DecodeProbes(f, c, t, &ps.cpu_long));
  ps.stretch = window.Finish();
  if (f.corun) {
    ASSIGN_OR_RETURN(ps.corun, MeasureCorun(t.ep, t.model, dep.prefill, dep.decode, f.input_len,
                                            f.output_len, f.corun_pairs, t.salt + 50000));
  }
  std::fprintf(stderr,
               "validate-sim: probe set %d: TTFT %.2f / %.2f / %.2f ms, TPOT %.3f (batch 1) / %.3f "
               "ms (batch %d)\n",
               set, ps.ttft[0].measured_ttft_s * 1e3, ps.ttft[1].measured_ttft_s * 1e3,
               ps.ttft[2].measured_ttft_s * 1e3, ps.decode[0].measured_tpot_s * 1e3,
               ps.decode.back().measured_tpot_s * 1e3, ps.decode.back().batch);
  return ps;
}

inline double MedianOver(const std::vector<ProbeSet>& sets, double (*get)(const ProbeSet&, size_t),
                         size_t k) {
  std::vector<double> v;
  for (const ProbeSet& s : sets) v.push_back(get(s, k));
  return planner::UpperMedian(v);
}

// A CPU cost per request and per output token from the probe sets' medians.
inline Result<planner::ClientCpuCost> CpuCost(const ValidateFlags& f,
                                              const std::vector<ProbeSet>& sets,
                                              double CpuPerRequest::*part) {
  std::vector<double> short_cost, long_cost;
  for (const ProbeSet& s : sets) {
    short_cost.push_back(s.cpu_short.*part);
    long_cost.push_back(s.cpu_long.*part);
  }
  return planner::SolveClientCpuCost(2, planner::UpperMedian(short_cost), f.output_len,
                                     planner::UpperMedian(long_cost));
}

// The calibration from probe sets: each probe's median over the sets, the co-run pairs pooled.
// With `load`, also the client's and router's cost under load, in the probes' split.
inline Result<Calibration> Combine(const ValidateFlags& f, const std::vector<ProbeSet>& sets,
                                   bool print, const LoadRunCpu* load = nullptr) {
  if (sets.empty()) return InvalidArgument("no calibration probes");
  std::vector<planner::IdleProbe> ttft = sets[0].ttft;
  std::vector<planner::DecodeProbe> decode = sets[0].decode;
  for (size_t k = 0; k < ttft.size(); ++k) {
    ttft[k].measured_ttft_s = MedianOver(
        sets, [](const ProbeSet& s, size_t i) { return s.ttft[i].measured_ttft_s; }, k);
    ttft[k].measured_prefill_cpu_s = MedianOver(
        sets, [](const ProbeSet& s, size_t i) { return s.ttft[i].measured_prefill_cpu_s; }, k);
    ttft[k].measured_prefill_run_s = MedianOver(
        sets, [](const ProbeSet& s, size_t i) { return s.ttft[i].measured_prefill_run_s; }, k);
  }
  for (size_t k = 0; k < decode.size(); ++k) {
    decode[k].measured_tpot_s = MedianOver(
        sets, [](const ProbeSet& s, size_t i) { return s.decode[i].measured_tpot_s; }, k);
  }
  Calibration cal;
  cal.stretch = sets[0].stretch;
  cal.idle_ttft_s = ttft[1].measured_ttft_s;
  cal.idle_tpot_s = decode[0].measured_tpot_s;
  cal.batch_tpot_s = decode.back().measured_tpot_s;
  cal.batch_probe = decode.back().batch;
  ASSIGN_OR_RETURN(cal.client_cpu, CpuCost(f, sets, &CpuPerRequest::client));
  ASSIGN_OR_RETURN(cal.prefill_own_cpu, CpuCost(f, sets, &CpuPerRequest::prefill_own));
  ASSIGN_OR_RETURN(cal.decode_own_cpu, CpuCost(f, sets, &CpuPerRequest::decode_own));
  ASSIGN_OR_RETURN(cal.overheads, planner::SolveOverheads(ttft, decode));
  cal.outside = planner::OutsideLatency::Constant(cal.overheads.fixed_s);
  if (load != nullptr) {
    ASSIGN_OR_RETURN(cal.client_cpu_loaded,
                     planner::LoadedClientCpuCost(cal.client_cpu, load->cpu_s, load->requests,
                                                  load->mean_output_tokens));
  }
  std::vector<CorunSample> pooled;
  for (const ProbeSet& s : sets) pooled.insert(pooled.end(), s.corun.begin(), s.corun.end());
  const std::string corun = CorunFactors(pooled, &cal.overheads);
  if (print) {
    std::printf(
        "calibration: the median of %zu probe sets (three before the first bench round and "
        "after each)\n%s",
        sets.size(), corun.c_str());
    PrintCalibration(ttft, decode, cal);
    if (load != nullptr) PrintLoadRun(f, *load, cal);
  }
  return cal;
}

inline int MachineCores() { return std::max<int>(1, CurrentThreadCpus().size()); }

}  // namespace pd::apps::validate_sim
