#include "planner/hardware.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <sstream>
#include <thread>

#include "common/file_util.h"

namespace pd::planner {
namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string StripOrg(const std::string& name) {
  auto slash = name.rfind('/');
  return Lower(slash == std::string::npos ? name : name.substr(slash + 1));
}

ModelShape Opt(const char* name, int layers, int hidden, int heads) {
  ModelShape s;
  s.name = name;
  s.num_layers = layers;
  s.hidden = hidden;
  s.ffn = 4 * hidden;
  s.num_heads = s.num_kv_heads = heads;
  s.head_dim = hidden / heads;
  s.vocab = 50272;
  return s;
}

// Ring all-reduce of `bytes` over tp devices: 2(tp-1)/tp of the data crosses each link.
double RingAllReduceSeconds(double bytes, int tp, double bw) {
  if (tp <= 1) return 0.0;
  return 2.0 * (tp - 1) / tp * bytes / bw;
}

}  // namespace

double ModelShape::NumParams() const {
  const double h = hidden;
  const double q = static_cast<double>(num_heads) * head_dim;
  const double kv = static_cast<double>(num_kv_heads) * head_dim;
  const double attn = h * q + 2.0 * h * kv + q * h;
  const double mlp = (gated_mlp ? 3.0 : 2.0) * h * ffn;
  return num_layers * (attn + mlp) + static_cast<double>(vocab) * h;
}

Result<ModelShape> BuiltinModelShape(const std::string& name) {
  const std::string n = StripOrg(name);
  if (n == "opt-13b") return Opt("facebook/opt-13b", 40, 5120, 40);
  if (n == "opt-66b") return Opt("facebook/opt-66b", 64, 9216, 72);
  if (n == "opt-175b") return Opt("facebook/opt-175b", 96, 12288, 96);
  return NotFound("no built-in model shape '" + name + "' (have opt-13b, opt-66b, opt-175b)");
}

ModelShape ShapeFromConfig(const model::ModelConfig& config, const std::string& name) {
  ModelShape s;
  s.name = name;
  s.num_layers = config.num_layers;
  s.hidden = config.hidden_size;
  s.ffn = config.intermediate_size;
  s.num_heads = config.num_heads;
  s.num_kv_heads = config.num_kv_heads > 0 ? config.num_kv_heads : config.num_heads;
  s.head_dim = config.head_dim > 0 ? config.head_dim : config.hidden_size / config.num_heads;
  s.vocab = config.vocab_size;
  s.gated_mlp = true;
  return s;
}

Result<HardwareSpec> BuiltinHardware(const std::string& name) {
  const std::string n = Lower(name);
  HardwareSpec s;
  s.name = n;
  if (n == "a100-80gb" || n == "a100") {
    s.name = "a100-80gb";
    s.peak_flops = 312e12;
    s.mem_bw = 2.039e12;
    s.mem_bytes = 80.0 * (1ull << 30);
    s.intra_node_bw = 240e9;
    s.compute_eff = 0.8;
    s.mem_eff = 0.65;
    s.step_overhead_ms = 1.0;
    s.per_seq_overhead_ms = 0.0;
    s.score_bytes = 6.0;
    return s;
  }
  if (n == "h100") {
    s.peak_flops = 989e12;
    s.mem_bw = 3.35e12;
    s.mem_bytes = 80.0 * (1ull << 30);
    s.intra_node_bw = 360e9;
    s.compute_eff = 0.6;
    s.mem_eff = 0.7;
    s.step_overhead_ms = 1.0;
    s.per_seq_overhead_ms = 0.0;
    s.score_bytes = 0.0;  // flash attention: scores never reach memory
    return s;
  }
  if (n == "h200") {
    s.peak_flops = 989e12;
    s.mem_bw = 4.8e12;
    s.mem_bytes = 141e9;
    s.intra_node_bw = 360e9;
    s.compute_eff = 0.6;
    s.mem_eff = 0.7;
    s.step_overhead_ms = 1.0;
    s.per_seq_overhead_ms = 0.0;
    s.score_bytes = 0.0;
    return s;
  }
  if (n == "cpu") {
    s.peak_flops = 2e12;  // a 2-socket AVX-512 server, bf16 via fp32 FMA
    s.mem_bw = 300e9;
    s.mem_bytes = 512.0 * (1ull << 30);
    s.intra_node_bw = 20e9;  // shared memory between processes
    s.compute_eff = 0.5;
    s.mem_eff = 0.6;
    s.step_overhead_ms = 0.5;
    s.per_seq_overhead_ms = 0.02;
    s.score_bytes = 0.0;
    return s;
  }
  return NotFound("no hardware spec '" + name + "' (have a100-80gb, h100, h200, cpu)");
}

std::vector<std::string> BuiltinHardwareNames() { return {"a100-80gb", "h100", "h200", "cpu"}; }

HardwareSpec MeasureCpuSpec(int num_threads) {
  num_threads = std::max(
      1, num_threads > 0 ? num_threads : static_cast<int>(std::thread::hardware_concurrency()));
  using Clock = std::chrono::steady_clock;
  // FMA throughput: 16 independent accumulators per thread, 20M iterations.
  constexpr int64_t kIters = 20'000'000;
  std::vector<double> sink(num_threads);
  auto t0 = Clock::now();
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < num_threads; ++t) {
      threads.emplace_back([&sink, t] {
        float acc[16];
        for (int i = 0; i < 16; ++i) acc[i] = 1.0f + i * 1e-3f;
        const float m = 0.9999999f, a = 1e-7f;
        for (int64_t it = 0; it < kIters / 16; ++it)
          for (int i = 0; i < 16; ++i) acc[i] = acc[i] * m + a;
        double s = 0;
        for (float v : acc) s += v;
        sink[t] = s;
      });
    }
    for (auto& th : threads) th.join();
  }
  const double flop_s =
      2.0 * kIters * num_threads / std::chrono::duration<double>(Clock::now() - t0).count();
  // Memory bandwidth: copy 64 MiB per thread, 4 times.
  constexpr size_t kBytes = 64ull << 20;
  std::vector<std::unique_ptr<char[]>> src, dst;
  for (int t = 0; t < num_threads; ++t) {
    src.emplace_back(new char[kBytes]);
    dst.emplace_back(new char[kBytes]);
    std::memset(src.back().get(), t + 1, kBytes);
    std::memset(dst.back().get(), 0, kBytes);
  }
  t0 = Clock::now();
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < num_threads; ++t) {
      threads.emplace_back([&, t] {
        for (int r = 0; r < 4; ++r) std::memcpy(dst[t].get(), src[t].get(), kBytes);
      });
    }
    for (auto& th : threads) th.join();
  }
  const double bw =
      2.0 * 4 * kBytes * num_threads / std::chrono::duration<double>(Clock::now() - t0).count();
  HardwareSpec s = *BuiltinHardware("cpu");
  s.name = "cpu-measured-" + std::to_string(num_threads) + "t";
  s.peak_flops = flop_s + sink[0] * 0.0;
  s.mem_bw = bw;
  s.compute_eff = 1.0;  // measured values are already achieved rates
  s.mem_eff = 1.0;
  return s;
}

Result<StepCoeffs> AnalyticalLatencyModel::Coeffs(int tp) const {
  if (tp < 1) return InvalidArgument("TP degree must be >= 1");
  if (shape_.num_heads % tp != 0 && tp > shape_.num_heads) {
    return InvalidArgument(shape_.name + ": TP " + std::to_string(tp) + " exceeds the head count");
  }
  const double flops = hw_.peak_flops * hw_.compute_eff;
  const double bw = hw_.mem_bw * hw_.mem_eff;
  const int layers = shape_.num_layers;
  const double act_bytes = static_cast<double>(shape_.hidden) * shape_.dtype_bytes;
  const double comm_per_token_s =
      2.0 * layers * RingAllReduceSeconds(act_bytes, tp, hw_.intra_node_bw);
  const double comm_fixed_ms = tp > 1 ? 2.0 * layers * hw_.allreduce_latency_ms : 0.0;
  const double weights_ms = shape_.WeightBytes() / tp / bw * 1e3;
  const double token_flops_ms = 2.0 * shape_.NumParams() / tp / flops * 1e3;

  StepCoeffs c;
  c.prefill = {hw_.step_overhead_ms + weights_ms + comm_fixed_ms,
               token_flops_ms + comm_per_token_s * 1e3,
               // Causal attention: 2·2·head_dim flops per (query, key) pair per head, halved,
               // plus the score matrix traffic of unfused kernels.
               (2.0 * layers * shape_.num_heads * shape_.head_dim / tp / flops +
                layers * (static_cast<double>(shape_.num_heads) / tp) * hw_.score_bytes / bw) *
                   1e3};
  c.decode_small = {hw_.step_overhead_ms + weights_ms + comm_fixed_ms,
                    shape_.KvBytesPerToken() / tp / bw * 1e3,
                    hw_.per_seq_overhead_ms + token_flops_ms + comm_per_token_s * 1e3};
  c.decode_large = c.decode_small;
  c.decode_threshold = 1 << 30;
  return c;
}

int64_t AnalyticalKvCapacityTokens(const ModelShape& shape, const HardwareSpec& hw, int tp, int pp,
                                   double util) {
  const double total = hw.mem_bytes * util * tp * pp;
  // Activations and workspace: 5% of each device, at least 1 GiB.
  const double reserve = std::max(0.05 * hw.mem_bytes, double(1ull << 30)) * tp * pp;
  const double free = total - shape.WeightBytes() - reserve;
  if (free <= 0) return 0;
  return static_cast<int64_t>(free / shape.KvBytesPerToken());
}

int64_t KvCapacityTable::Lookup(const std::string& model, int tp, int pp) const {
  const std::string m = StripOrg(model);
  for (const auto& r : rows)
    if (StripOrg(r.model) == m && r.tp == tp && r.pp == pp) return r.tokens;
  return -1;
}

bool KvCapacityTable::HasModel(const std::string& model) const {
  const std::string m = StripOrg(model);
  for (const auto& r : rows)
    if (StripOrg(r.model) == m) return true;
  return false;
}

Result<KvCapacityTable> LoadKvCapacityCsv(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  KvCapacityTable table;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line.rfind("model,", 0) == 0) continue;
    KvCapacityTable::Row row;
    char model[256];
    long long tokens = 0;
    if (std::sscanf(line.c_str(), "%255[^,],%d,%d,%lld", model, &row.tp, &row.pp, &tokens) != 4 ||
        row.tp < 1 || row.pp < 1 || tokens < 0) {
      return InvalidArgument(path + ":" + std::to_string(line_no) +
                             ": expected model,tp,pp,max_num_tokens, got '" + line + "'");
    }
    row.model = model;
    row.tokens = tokens;
    table.rows.push_back(row);
  }
  if (table.rows.empty()) return InvalidArgument(path + ": no rows");
  return table;
}

}  // namespace pd::planner
