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

double ModelShape::AttentionParamsPerLayer() const {
  const double h = hidden;
  const double heads = num_heads;
  if (is_mla()) {
    const double qk = qk_nope_head_dim + qk_rope_head_dim;
    const double q = q_lora_rank > 0 ? h * q_lora_rank + q_lora_rank * heads * qk : h * heads * qk;
    const double kv_a = h * (kv_lora_rank + qk_rope_head_dim);
    const double kv_b = double(kv_lora_rank) * heads * (qk_nope_head_dim + v_head_dim);
    return q + kv_a + kv_b + heads * v_head_dim * h;
  }
  const double q = heads * head_dim;
  const double kv = static_cast<double>(num_kv_heads) * head_dim;
  return h * q + 2.0 * h * kv + q * h;
}

double ModelShape::NonExpertParams() const {
  const int moe_layers = is_moe() ? num_moe_layers : 0;
  double p = num_layers * AttentionParamsPerLayer() + (num_layers - moe_layers) * DenseMlpParams();
  // Shared experts and the router of every MoE layer.
  p += moe_layers * (num_shared_experts * ExpertParams() + double(num_experts) * hidden);
  return p + (tie_embeddings ? 1.0 : 2.0) * vocab * hidden;
}

double ModelShape::ActiveParams() const {
  return NonExpertParams() - InputEmbeddingParams() +
         (is_moe() ? double(num_moe_layers) * top_k * ExpertParams() : 0.0);
}

double ModelShape::KvBytesPerToken() const {
  if (is_mla()) return double(num_layers) * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes;
  return 2.0 * num_layers * num_kv_heads * head_dim * dtype_bytes;
}

double ModelShape::KvBytesPerTokenPerRank(int tp) const {
  if (is_mla() || tp <= 1) return KvBytesPerToken();
  const int heads_per_rank = (num_kv_heads + tp - 1) / tp;
  return 2.0 * num_layers * heads_per_rank * head_dim * dtype_bytes;
}

namespace {

// DeepSeek-R1 has DeepSeek-V3's architecture; its config.json (huggingface.co/deepseek-ai/
// DeepSeek-R1, model_type deepseek_v3): 61 layers, hidden 7168, 128 heads, q_lora_rank 1536,
// kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128, 256 routed experts
// (top 8) of moe_intermediate_size 2048 and 1 shared, dense intermediate_size 18432 in the
// first_k_dense_replace = 3 layers, vocab 129280, untied. The published weights are FP8: 671B
// parameters (the MTP layer aside), 37B active per token.
ModelShape DeepseekR1() {
  ModelShape s;
  s.name = "deepseek-ai/DeepSeek-R1";
  s.num_layers = 61;
  s.hidden = 7168;
  s.ffn = 18432;
  s.num_heads = s.num_kv_heads = 128;
  s.head_dim = 64;  // transformers' head_dim for deepseek_v3: qk_rope_head_dim
  s.vocab = 129280;
  s.tie_embeddings = false;
  s.gated_mlp = true;
  s.weight_dtype_bytes = 1;
  s.q_lora_rank = 1536;
  s.kv_lora_rank = 512;
  s.qk_nope_head_dim = 128;
  s.qk_rope_head_dim = 64;
  s.v_head_dim = 128;
  s.num_experts = 256;
  s.top_k = 8;
  s.moe_ffn = 2048;
  s.num_shared_experts = 1;
  s.num_moe_layers = 61 - 3;
  return s;
}

// Qwen3-Coder-480B-A35B-Instruct's config.json (huggingface.co/Qwen/Qwen3-Coder-480B-A35B-
// Instruct, model_type qwen3_moe; the model card gives 480B total, 35B activated, 62 layers, 96
// query and 8 KV heads, 160 experts with 8 activated): hidden 6144, head_dim 128,
// moe_intermediate_size 2560, every layer sparse (decoder_sparse_step 1), no shared expert,
// vocab 151936, untied, bf16.
ModelShape Qwen3Coder480b() {
  ModelShape s;
  s.name = "Qwen/Qwen3-Coder-480B-A35B-Instruct";
  s.num_layers = 62;
  s.hidden = 6144;
  s.ffn = 8192;  // intermediate_size: unused, every layer is sparse
  s.num_heads = 96;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  s.vocab = 151936;
  s.tie_embeddings = false;
  s.gated_mlp = true;
  s.num_experts = 160;
  s.top_k = 8;
  s.moe_ffn = 2560;
  s.num_moe_layers = 62;
  return s;
}

}  // namespace

Result<ModelShape> BuiltinModelShape(const std::string& name) {
  const std::string n = StripOrg(name);
  if (n == "opt-13b") return Opt("facebook/opt-13b", 40, 5120, 40);
  if (n == "opt-66b") return Opt("facebook/opt-66b", 64, 9216, 72);
  if (n == "opt-175b") return Opt("facebook/opt-175b", 96, 12288, 96);
  if (n == "deepseek-r1" || n == "deepseek-v3") return DeepseekR1();
  if (n == "qwen3-coder-480b-a35b" || n == "qwen3-coder-480b-a35b-instruct") {
    return Qwen3Coder480b();
  }
  return NotFound("no built-in model shape '" + name +
                  "' (have opt-13b, opt-66b, opt-175b, deepseek-r1, qwen3-coder-480b-a35b)");
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
  s.tie_embeddings = config.tie_word_embeddings;
  s.gated_mlp = true;
  if (config.is_mla()) {
    s.q_lora_rank = config.mla.q_lora_rank;
    s.kv_lora_rank = config.mla.kv_lora_rank;
    s.qk_nope_head_dim = config.mla.qk_nope_head_dim;
    s.qk_rope_head_dim = config.mla.qk_rope_head_dim;
    s.v_head_dim = config.mla.v_head_dim;
  }
  if (config.is_moe()) {
    s.num_experts = config.moe.num_experts;
    s.top_k = config.moe.num_experts_per_tok;
    s.moe_ffn = config.moe.moe_intermediate_size;
    s.num_shared_experts = config.moe.n_shared_experts;
    for (int i = 0; i < config.num_layers; ++i) s.num_moe_layers += config.IsMoeLayer(i) ? 1 : 0;
  }
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
    s.inter_node_bw = 25e9;
    s.compute_eff = 0.8;
    s.mem_eff = 0.65;
    s.step_overhead_ms = 1.0;
    s.per_seq_overhead_ms = 0.0;
    s.score_bytes = 6.0;
    return s;
  }
  // NVIDIA H100 SXM5 and H200 SXM datasheets: 989 TFLOPS dense BF16, 1979 TFLOPS dense FP8;
  // HBM3 3.35 TB/s and 80 GB (H100), HBM3e 4.8 TB/s and 141 GB (H200); NVLink 4 at 900 GB/s
  // per GPU both directions together (450 GB/s each way), 8 GPUs per HGX node. Between nodes the
  // stated network is one 400 Gb/s NIC per GPU (8 x 400 Gb/s per node): 50 GB/s per GPU.
  if (n == "h100" || n == "h100-80gb" || n == "h200" || n == "h200-141gb") {
    const bool h200 = n.rfind("h200", 0) == 0;
    s.name = h200 ? "h200-141gb" : "h100-80gb";
    s.peak_flops = 989e12;
    s.peak_fp8_flops = 1979e12;
    s.mem_bw = h200 ? 4.8e12 : 3.35e12;
    s.mem_bytes = h200 ? 141e9 : 80e9;
    s.intra_node_bw = 450e9;
    s.inter_node_bw = 50e9;
    s.devices_per_node = 8;
    s.compute_eff = 0.6;
    s.mem_eff = 0.7;
    s.step_overhead_ms = 1.0;
    s.per_seq_overhead_ms = 0.0;
    s.score_bytes = 0.0;  // flash attention: scores never reach memory
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
  return NotFound("no hardware spec '" + name + "' (have a100-80gb, h100-80gb, h200-141gb, cpu)");
}

std::vector<std::string> BuiltinHardwareNames() {
  return {"a100-80gb", "h100-80gb", "h200-141gb", "cpu"};
}

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

double AnalyticalLatencyModel::AllToAllSecondsPerToken(int ep) const {
  if (!shape_.is_moe() || ep <= 1) return 0.0;
  const double bw = moe_.all_to_all_bw > 0 ? moe_.all_to_all_bw : hw_.intra_node_bw;
  // Dispatch and combine: top_k copies of the hidden state each way, (ep-1)/ep of them remote.
  const double bytes = 2.0 * shape_.top_k * shape_.hidden * shape_.dtype_bytes * (ep - 1) / ep;
  return shape_.num_moe_layers * bytes / bw;
}

Result<StepCoeffs> AnalyticalLatencyModel::Coeffs(int tp) const {
  if (tp < 1) return InvalidArgument("TP degree must be >= 1");
  if (shape_.num_heads % tp != 0 && tp > shape_.num_heads) {
    return InvalidArgument(shape_.name + ": TP " + std::to_string(tp) + " exceeds the head count");
  }
  const int dp = shape_.is_moe() ? std::max(1, moe_.dp) : 1;
  const bool fp8 = shape_.WeightDtypeBytes() == 1 && hw_.peak_fp8_flops > 0;
  const double gemm_flops = (fp8 ? hw_.peak_fp8_flops : hw_.peak_flops) * hw_.compute_eff;
  const double flops = hw_.peak_flops * hw_.compute_eff;  // attention: 16-bit
  const double bw = hw_.mem_bw * hw_.mem_eff;
  const int layers = shape_.num_layers;
  const double wb = shape_.WeightDtypeBytes();
  const double act_bytes = static_cast<double>(shape_.hidden) * shape_.dtype_bytes;
  const double comm_per_token_s =
      2.0 * layers * RingAllReduceSeconds(act_bytes, tp, hw_.intra_node_bw) +
      (dp > 1 ? AllToAllSecondsPerToken(tp * dp) : 0.0);
  double comm_fixed_ms = tp > 1 ? 2.0 * layers * hw_.allreduce_latency_ms : 0.0;
  if (dp > 1) comm_fixed_ms += 2.0 * shape_.num_moe_layers * hw_.allreduce_latency_ms;
  // Non-expert weights every step reads whole; routed experts through StepCoeffs::moe.
  const double weights_ms =
      (shape_.NonExpertParams() - shape_.InputEmbeddingParams()) * wb / tp / bw * 1e3;
  const double token_flops_ms = 2.0 * shape_.ActiveParams() / tp / gemm_flops * 1e3;
  // Attention per (query, key) pair per head: scores over the key width and the weighted sum
  // over the value width, 2 flops each. Prefill (causal: halved) uses MLA's expanded heads;
  // decode MLA attends over the latent (weights absorbed): kv_lora_rank + rope, then kv_lora_rank.
  const double heads = static_cast<double>(shape_.num_heads) / tp;
  const double prefill_pair_flops =
      shape_.is_mla() ? shape_.qk_nope_head_dim + shape_.qk_rope_head_dim + shape_.v_head_dim
                      : 2.0 * shape_.head_dim;
  const double decode_pair_flops = shape_.is_mla()
                                       ? 2.0 * (2.0 * shape_.kv_lora_rank + shape_.qk_rope_head_dim)
                                       : 4.0 * shape_.head_dim;
  const double kv_ms =
      std::max(shape_.KvBytesPerTokenPerRank(tp) / bw, layers * heads * decode_pair_flops / flops) *
      1e3;

  StepCoeffs c;
  c.prefill = {
      hw_.step_overhead_ms + weights_ms + comm_fixed_ms, token_flops_ms + comm_per_token_s * 1e3,
      // plus the score matrix traffic of unfused kernels.
      (layers * heads * prefill_pair_flops / flops + layers * heads * hw_.score_bytes / bw) * 1e3};
  c.decode_small = {hw_.step_overhead_ms + weights_ms + comm_fixed_ms, kv_ms,
                    hw_.per_seq_overhead_ms + token_flops_ms + comm_per_token_s * 1e3};
  c.decode_large = c.decode_small;
  c.decode_threshold = 1 << 30;
  if (shape_.is_moe()) {
    c.moe.num_experts = shape_.num_experts;
    c.moe.top_k = shape_.top_k;
    c.moe.expert_ms = shape_.num_moe_layers * shape_.ExpertParams() * wb / (tp * dp) / bw * 1e3;
    c.moe.token_multiplier = dp;
  }
  return c;
}

int64_t AnalyticalKvCapacityTokens(const ModelShape& shape, const HardwareSpec& hw, int tp, int pp,
                                   double util, int moe_dp) {
  const double total = hw.mem_bytes * util * tp * pp;
  // Activations and workspace: 5% of each device, at least 1 GiB.
  const double reserve = std::max(0.05 * hw.mem_bytes, double(1ull << 30)) * tp * pp;
  const double weights =
      (shape.NonExpertParams() + shape.RoutedExpertParams() / std::max(1, moe_dp)) *
      shape.WeightDtypeBytes();
  const double free = total - weights - reserve;
  if (free <= 0) return 0;
  // Per token the instance holds each rank's share: the whole latent on every rank for MLA.
  return static_cast<int64_t>(free / (shape.KvBytesPerTokenPerRank(tp) * tp));
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
