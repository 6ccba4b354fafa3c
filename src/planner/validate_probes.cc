#include "planner/validate_probes.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>

#include "bench/datasets.h"
#include "common/file_util.h"

namespace pd::planner {
namespace {

constexpr int kTtftRounds = 12;  // the first warms up
constexpr int kTpotProbes = 7;
constexpr int kBatchProbes = 5;
constexpr int kCorunPairs = 3;

bench::Endpoint Endpoint(const ValidateSimOptions& o) {
  bench::Endpoint ep;
  ep.port = o.port;
  return ep;
}

// Live processes whose parent is `ppid`: pid and NUL-separated argv.
std::vector<std::pair<pid_t, std::string>> ChildrenOf(pid_t ppid) {
  std::vector<std::pair<pid_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto stat = ReadFileToString(e.path().string() + "/stat");
    if (!stat.ok()) continue;
    const size_t close = stat->rfind(')');  // the command name may hold spaces and parentheses
    int parent = 0;
    char state = 0;
    if (close == std::string::npos ||
        std::sscanf(stat->c_str() + close + 1, " %c %d", &state, &parent) != 2 || parent != ppid) {
      continue;
    }
    auto cmdline = ReadFileToString(e.path().string() + "/cmdline");
    out.push_back({static_cast<pid_t>(std::stol(name)), cmdline.ok() ? *cmdline : ""});
  }
  return out;
}

double TpotOf(const bench::RequestResult& m) {
  return m.output_len > 1 ? (m.latency - m.ttft) / (m.output_len - 1) : 0.0;
}

ThreadCpuTimes Threads(pid_t pid) {
  auto t = ProcessThreadCpuTimes(pid);
  return t.ok() ? *t : ThreadCpuTimes{};
}
// Seconds every thread of process `pid` spent on a CPU so far; 0 when unreadable.
double RunSeconds(pid_t pid) {
  double sum = 0;
  if (auto threads = ProcessThreadCpuTimes(pid); threads.ok()) {
    for (const auto& [tid, t] : *threads) sum += t.run_s;
  }
  return sum;
}
// The bench client (this process) and the router (the `up` process).
double ClientRouterSeconds(const Deployment& d) { return RunSeconds(getpid()) + RunSeconds(d.up); }

// Sends probe requests with synthetic prompts, each its own salt.
class Prober {
 public:
  Prober(const ValidateSimOptions& o, std::string model, uint64_t salt)
      : o_(o), model_(std::move(model)), salt_(salt) {}
  bench::RequestResult Send(int prompt_len, int max_tokens) {
    std::mt19937_64 rng(salt_++);
    bench::GenerationRequest r;
    r.model = model_;
    r.prompt_ids = bench::SyntheticPromptIds(prompt_len, rng);
    r.prompt_len = prompt_len;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return bench::SendStreaming(Endpoint(o_), r);
  }
  Result<bench::RequestResult> SendOk(int prompt_len, int max_tokens) {
    bench::RequestResult m = Send(prompt_len, max_tokens);
    if (!m.success || m.output_len < std::min(2, max_tokens)) {
      return Unavailable("probe failed: " + m.error);
    }
    return m;
  }

 private:
  const ValidateSimOptions& o_;
  const std::string model_;
  std::atomic<uint64_t> salt_;
};

// Idle TTFT probes, round-robin over the lengths; the median of 11 after a warm-up round, with
// how long the prompt held the prefill instance's busiest thread (on its core or waiting).
Status TtftProbes(const ValidateSimOptions& o, const StepCoeffs& c, const Deployment& d, Prober& p,
                  ProbeSet* out) {
  const int lens[] = {16, o.input_len, 2 * o.input_len};
  std::vector<double> ttft[3], held[3];
  for (int round = 0; round < kTtftRounds; ++round) {
    for (int k = 0; k < 3; ++k) {
      const ThreadCpuTimes before = Threads(d.prefill);
      ASSIGN_OR_RETURN(bench::RequestResult m, p.SendOk(lens[k], 2));
      const CpuTimes t = BusiestThreadTimes(before, Threads(d.prefill));
      if (round == 0) continue;
      ttft[k].push_back(m.ttft);
      held[k].push_back(t.run_s + t.wait_s);
    }
  }
  for (int k = 0; k < 3; ++k) {
    const double prefill_s = c.PrefillMs(lens[k], double(lens[k]) * lens[k]) * 1e-3;
    out->ttft.push_back({lens[k], UpperMedian(ttft[k]),
                         prefill_s + c.DecodeMs(1, lens[k] + 1) * 1e-3, prefill_s,
                         UpperMedian(held[k])});
  }
  return OkStatus();
}

// The mean TPOT of `batch` requests of 16-token prompts sent together.
Result<double> BatchTpot(Prober& p, int batch, int output_len) {
  std::vector<bench::RequestResult> results(batch);
  std::vector<std::thread> senders;
  for (int i = 0; i < batch; ++i) {
    senders.emplace_back([&, i] { results[i] = p.Send(16, output_len); });
  }
  for (auto& t : senders) t.join();
  double sum = 0;
  for (const auto& m : results) {
    if (!m.success || m.output_len < 2) return Unavailable("decode probe failed: " + m.error);
    sum += TpotOf(m);
  }
  return sum / batch;
}

Status DecodeProbes(const ValidateSimOptions& o, const StepCoeffs& c, const Deployment& d,
                    Prober& p, ProbeSet* out) {
  std::vector<double> tpot;
  const double cpu0 = ClientRouterSeconds(d);
  for (int rep = 0; rep < kTpotProbes; ++rep) {
    ASSIGN_OR_RETURN(bench::RequestResult m, p.SendOk(o.input_len, o.output_len));
    tpot.push_back(TpotOf(m));
  }
  out->client_cpu_s = (ClientRouterSeconds(d) - cpu0) / kTpotProbes;
  out->decode.push_back(
      {1, UpperMedian(tpot), c.DecodeMs(1, o.input_len + o.output_len / 2) * 1e-3});
  const int batch = std::min(8, o.max_num_seqs);
  if (batch < 2) return OkStatus();
  const int len = 4 * o.output_len;
  std::vector<double> batch_tpot;
  for (int rep = 0; rep < kBatchProbes; ++rep) {
    ASSIGN_OR_RETURN(double t, BatchTpot(p, batch, len));
    batch_tpot.push_back(t);
  }
  out->decode.push_back(
      {batch, UpperMedian(batch_tpot), c.DecodeMs(batch, int64_t(batch) * (16 + len / 2)) * 1e-3});
  return OkStatus();
}

// One co-run pair. Decode: a 16-token prompt with 4x output_len tokens alone, then while a thread
// keeps the prefill instance busy with 2L-token prompts (its decode compute thread's CPU).
// Prefill: a 2L-token prompt alone, then while four long answers decode (the prefill process's
// CPU). Compute CPU rather than latency: the time an instance loses to other threads on its core
// is not the other instance's doing.
Status CorunPair(const ValidateSimOptions& o, const Deployment& d, Prober& p, ProbeSet* out) {
  const int long_prompt = 2 * o.input_len;
  const auto decode_cpu = [&] {
    const ThreadCpuTimes before = Threads(d.decode);
    p.Send(16, 4 * o.output_len);
    return BusiestThreadTimes(before, Threads(d.decode)).run_s;
  };
  const auto prefill_cpu = [&] {
    const double cpu0 = RunSeconds(d.prefill);
    p.Send(long_prompt, 2);
    return RunSeconds(d.prefill) - cpu0;
  };
  const double decode_alone = decode_cpu();
  std::atomic<bool> stop{false};
  std::thread prefill_load([&] {
    while (!stop.load()) p.Send(long_prompt, 1);
  });
  const double decode_busy = decode_cpu();
  stop = true;
  prefill_load.join();
  const double prefill_alone = prefill_cpu();
  std::vector<std::thread> decode_load;
  for (int i = 0; i < 4; ++i) decode_load.emplace_back([&] { p.Send(16, 16 * o.output_len); });
  // Let the four reach the decode instance (a 16-token prefill and the hand-over) first.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double prefill_busy = prefill_cpu();
  for (auto& t : decode_load) t.join();
  if (!(decode_alone > 0 && decode_busy > 0 && prefill_alone > 0 && prefill_busy > 0)) {
    return Unavailable("co-run probes: no CPU time came back");
  }
  out->corun_decode.push_back(decode_busy / decode_alone);
  out->corun_prefill.push_back(prefill_busy / prefill_alone);
  return OkStatus();
}

}  // namespace

Result<ThreadCpuTimes> ProcessThreadCpuTimes(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return NotFound(dir + ": " + ec.message());
  ThreadCpuTimes out;
  for (const auto& task : it) {
    auto text = ReadFileToString(task.path().string() + "/schedstat");
    if (!text.ok()) continue;                    // the thread exited meanwhile
    unsigned long long run_ns = 0, wait_ns = 0;  // "RUN_NS WAIT_NS SLICES"
    if (std::sscanf(text->c_str(), "%llu %llu", &run_ns, &wait_ns) != 2) {
      return InvalidArgument(task.path().string() + "/schedstat: '" + *text + "'");
    }
    const auto tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    out[tid] = {run_ns * 1e-9, wait_ns * 1e-9};
  }
  if (out.empty()) return NotFound(dir + ": no thread has a readable schedstat");
  return out;
}

CpuTimes BusiestThreadTimes(const ThreadCpuTimes& before, const ThreadCpuTimes& after) {
  CpuTimes best;
  bool any = false;
  for (const auto& [tid, t] : after) {
    auto b = before.find(tid);
    const CpuTimes from = b != before.end() ? b->second : CpuTimes{};
    const CpuTimes d{t.run_s - from.run_s, t.wait_s - from.wait_s};
    if (!any || d.run_s > best.run_s) best = d;
    any = true;
  }
  return best;
}

Result<Deployment> FindInstances(pid_t up) {
  Deployment d;
  d.up = up;
  for (const auto& [pid, cmdline] : ChildrenOf(up)) {
    const auto has = [&cl = cmdline](const std::string& role) {
      return cl.find(std::string("--role") + '\0' + role + '\0') != std::string::npos;
    };
    if (has("prefill")) d.prefill = pid;
    if (has("decode")) d.decode = pid;
  }
  if (d.prefill < 0 || d.decode < 0) return NotFound("pdserve up's prefill and decode processes");
  return d;
}

Result<ProbeSet> RunProbes(const ValidateSimOptions& o, const StepCoeffs& model,
                           const Deployment& dep, int set) {
  ASSIGN_OR_RETURN(bench::ServerInfo info, bench::GetServerInfo(Endpoint(o)));
  Prober p(o, info.model_id, 1 + 100000ull * set);
  ProbeSet ps;
  RETURN_IF_ERROR(TtftProbes(o, model, dep, p, &ps));
  RETURN_IF_ERROR(DecodeProbes(o, model, dep, p, &ps));
  if (o.corun) p.Send(2 * o.input_len, 2);  // warms the long prompt up
  for (int k = 0; o.corun && k < kCorunPairs; ++k) {
    RETURN_IF_ERROR(CorunPair(o, dep, p, &ps));
  }
  std::fprintf(stderr,
               "validate-sim: probe set %d: TTFT %.2f / %.2f / %.2f ms, TPOT %.3f / %.3f ms\n", set,
               ps.ttft[0].measured_ttft_s * 1e3, ps.ttft[1].measured_ttft_s * 1e3,
               ps.ttft[2].measured_ttft_s * 1e3, ps.decode[0].measured_tpot_s * 1e3,
               ps.decode.back().measured_tpot_s * 1e3);
  return ps;
}

Result<ProbeCalibration> CombineProbes(const std::vector<ProbeSet>& sets) {
  if (sets.empty()) return InvalidArgument("no probe sets");
  const auto median = [&](auto get) {
    std::vector<double> v;
    for (const ProbeSet& s : sets) v.push_back(get(s));
    return UpperMedian(std::move(v));
  };
  std::vector<IdleProbe> ttft = sets[0].ttft;
  std::vector<DecodeProbe> decode_probes = sets[0].decode;
  for (size_t k = 0; k < ttft.size(); ++k) {
    ttft[k].measured_ttft_s = median([k](const ProbeSet& s) { return s.ttft[k].measured_ttft_s; });
    ttft[k].measured_prefill_cpu_s =
        median([k](const ProbeSet& s) { return s.ttft[k].measured_prefill_cpu_s; });
  }
  for (size_t k = 0; k < decode_probes.size(); ++k) {
    decode_probes[k].measured_tpot_s =
        median([k](const ProbeSet& s) { return s.decode[k].measured_tpot_s; });
  }
  ProbeCalibration c;
  ASSIGN_OR_RETURN(c.overheads, SolveOverheads(ttft, decode_probes));
  c.idle_ttft_s = ttft[1].measured_ttft_s;
  c.idle_tpot_s = decode_probes[0].measured_tpot_s;
  c.batch_tpot_s = decode_probes.back().measured_tpot_s;
  c.client_cpu_s = median([](const ProbeSet& s) { return s.client_cpu_s; });
  std::vector<double> decode, prefill;
  for (const ProbeSet& s : sets) {
    decode.insert(decode.end(), s.corun_decode.begin(), s.corun_decode.end());
    prefill.insert(prefill.end(), s.corun_prefill.begin(), s.corun_prefill.end());
  }
  c.overheads.corun_decode = CorunFactor(decode);
  c.overheads.corun_prefill = CorunFactor(prefill);
  return c;
}

}  // namespace pd::planner
