#include "bench/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "bench/spec_metrics.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/thread_util.h"

namespace pd::bench {

namespace {

// Limits requests in flight to max_concurrency (0: no limit). Thread safety: any thread.
class Gate {
 public:
  explicit Gate(int limit) : limit_(limit) {}
  void Enter() EXCLUDES(mu_) {
    if (limit_ <= 0) return;
    MutexLock lock(&mu_);
    while (in_flight_ >= limit_) cv_.Wait(&mu_);
    ++in_flight_;
  }
  void Leave() EXCLUDES(mu_) {
    if (limit_ <= 0) return;
    {
      MutexLock lock(&mu_);
      --in_flight_;
    }
    cv_.Signal();
  }

 private:
  const int limit_;
  Mutex mu_;
  CondVar cv_;
  int in_flight_ GUARDED_BY(mu_) = 0;
};

std::vector<GenerationRequest> BuildRequests(const BenchOptions& o, const std::string& model,
                                             const std::vector<LengthPair>& lengths) {
  std::mt19937_64 rng(o.seed * 7919 + 1);
  std::vector<GenerationRequest> out;
  const bool chat = o.endpoint_path.find("chat") != std::string::npos;
  for (const LengthPair& p : lengths) {
    GenerationRequest r;
    r.path = o.endpoint_path;
    r.model = model;
    r.prompt_len = p.prompt_len;
    r.max_tokens = p.output_len;
    r.ignore_eos = o.ignore_eos;
    if (chat) {
      r.prompt_text = SyntheticPromptText(p.prompt_len, rng);
    } else {
      r.prompt_ids = SyntheticPromptIds(p.prompt_len, rng);
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

Status CheckClientCpus(const std::vector<int>& cpus) {
  const std::vector<int> allowed = CurrentThreadCpus();
  for (int c : cpus) {
    if (std::find(allowed.begin(), allowed.end(), c) == allowed.end())
      return InvalidArgument("--cpus: CPU " + std::to_string(c) +
                             " is not one this process may use");
  }
  return OkStatus();
}

Result<PreparedRequests> PrepareRequests(const BenchOptions& o) {
  RETURN_IF_ERROR(CheckClientCpus(o.cpus));
  ASSIGN_OR_RETURN(ServerInfo info, GetServerInfo(o.endpoint));
  PreparedRequests p;
  p.model = o.model.empty() ? info.model_id : o.model;
  DatasetSpec spec = o.dataset;
  if (info.max_model_len > 0) {
    // Chat templates add a few tokens around the prompt: leave them room.
    const int margin = o.endpoint_path.find("chat") != std::string::npos ? 32 : 0;
    spec.max_total_len = std::min(spec.max_total_len, info.max_model_len - margin);
    spec.max_prompt_len = std::min(spec.max_prompt_len, info.max_model_len - margin - 1);
  }
  GenerationRequest base;
  base.path = o.endpoint_path;
  base.model = p.model;
  base.ignore_eos = o.ignore_eos;
  if (spec.name == "prefix_repetition") {
    ASSIGN_OR_RETURN(p.requests, PrefixRepetitionRequests(o.prefix_repetition, o.num_prompts,
                                                          o.seed, spec.max_total_len, base));
    return p;
  }
  if (spec.name == "multi_turn") {
    ASSIGN_OR_RETURN(p.requests, MultiTurnRequests(o.multi_turn, o.num_prompts, o.seed,
                                                   spec.max_total_len, base));
    return p;
  }
  ASSIGN_OR_RETURN(std::vector<LengthPair> lengths, SampleLengths(spec, o.num_prompts, o.seed));
  p.requests = BuildRequests(o, p.model, lengths);
  return p;
}

namespace {

// What is sent at one arrival: a request alone, or a multi-turn conversation's requests in turn
// order (each after the one before it completed).
std::vector<std::vector<size_t>> SendUnits(const std::vector<GenerationRequest>& requests) {
  std::vector<std::vector<size_t>> units;
  std::map<int, size_t> unit_of_conversation;
  for (size_t i = 0; i < requests.size(); ++i) {
    const int c = requests[i].conversation;
    if (c < 0) {
      units.push_back({i});
      continue;
    }
    auto [it, added] = unit_of_conversation.emplace(c, units.size());
    if (added) units.emplace_back();
    units[it->second].push_back(i);
  }
  for (auto& unit : units) {
    std::stable_sort(unit.begin(), unit.end(),
                     [&](size_t a, size_t b) { return requests[a].turn < requests[b].turn; });
  }
  return units;
}

}  // namespace

SentRequests SendAtRate(const BenchOptions& o, const std::vector<GenerationRequest>& requests,
                        double rate) {
  const std::vector<std::vector<size_t>> units = SendUnits(requests);
  const std::vector<double> arrivals =
      ArrivalTimes(static_cast<int>(units.size()), rate, o.burstiness, o.seed);
  SentRequests sent;
  sent.results.resize(requests.size());
  std::vector<RequestResult>& results = sent.results;
  Gate gate(o.max_concurrency);
  std::vector<std::thread> workers;
  workers.reserve(units.size());
  Clock& clock = SystemClock::Get();
  const double start = clock.NowSeconds();
  const auto start_tp = std::chrono::steady_clock::now();
  for (size_t u = 0; u < units.size(); ++u) {
    // The arrival process itself: wait until this unit's arrival time.
    std::this_thread::sleep_until(start_tp +
                                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(arrivals[u])));
    gate.Enter();
    workers.emplace_back([&, u] {
      if (!o.cpus.empty()) {
        if (Status s = PinCurrentThread(o.cpus); !s.ok()) PD_LOG_WARN("bench: {}", s.ToString());
      }
      std::vector<std::pair<std::string, std::string>> history;  // a conversation's, so far
      for (size_t i : units[u]) {
        GenerationRequest r = requests[i];
        r.history = history;
        const double sent_at = clock.NowSeconds();
        results[i] = SendStreaming(o.endpoint, r);
        results[i].start_time = sent_at - start;
        history.emplace_back(requests[i].prompt_text, results[i].text);
      }
      gate.Leave();
    });
  }
  for (auto& w : workers) w.join();
  sent.duration_s = clock.NowSeconds() - start;
  return sent;
}

RunInfo MakeRunInfo(const BenchOptions& o, const std::string& model, double rate,
                    double duration_s) {
  RunInfo run;
  run.model_id = model;
  run.endpoint = o.endpoint_path;
  run.dataset_name = o.dataset.name;
  run.num_prompts = o.num_prompts;
  run.request_rate = rate > 0 ? rate : INFINITY;
  run.burstiness = o.burstiness;
  run.max_concurrency = o.max_concurrency;
  run.duration = duration_s;
  return run;
}

Result<BenchmarkSummary> RunBenchmark(const BenchOptions& o) {
  ASSIGN_OR_RETURN(PreparedRequests prepared, PrepareRequests(o));
  const std::optional<SpecDecodeTotals> spec_before = FetchSpecDecodeTotals(o.endpoint);
  SentRequests sent = SendAtRate(o, prepared.requests, o.request_rate);
  BenchmarkSummary summary =
      Summarize(MakeRunInfo(o, prepared.model, o.request_rate, sent.duration_s), sent.results,
                o.percentile_metrics, o.metric_percentiles, o.goodput_ms);
  const std::optional<SpecDecodeTotals> spec_after =
      spec_before ? FetchSpecDecodeTotals(o.endpoint) : std::nullopt;
  if (spec_before && spec_after) AddSpecDecodeSummary(*spec_before, *spec_after, &summary);
  return summary;
}

}  // namespace pd::bench
