// pdserve bench-engine: the CPU engine's decode and prefill speed against what this machine can do,
// measured in the same run (docs/benchmarks.md#bench-engine is the manual).
//
//   pdserve bench-engine [--model DIR | --preset NAME] [--json] [--threads N]
//                        [--tensor-parallel-size N] [--phase all|decode|prefill|tp|spec]
//                        [--batches B...] [--contexts C...] [--matmul f32|bf16|both]
//                        [--amx on|off|both] [--dtype bf16|fp8|both]
//
// Decode rows are --pairs alternating (read probe, decode) pairs, prefill rows (FMA probe,
// prefill) pairs, each reporting the pair with the median ratio: the host's bandwidth and FMA rate
// drift within a run. A MoE model's decode bytes count what a step reads (attention, router, the
// experts its tokens chose, shared experts, lm_head), and its rows are followed by its dense
// twin's (engine/moe_dense_twin.h). The runner is driven directly with synthetic page tables whose
// KV pages are filled once; the same decode step is then timed repeatedly. --phase tp: TP 2 with
// one thread per rank beside TP 1 on one thread, alternating; --phase spec: bench_engine_spec.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "apps/bench_engine_counts.h"
#include "apps/bench_engine_spec.h"
#include "apps/command.h"
#include "engine/machine_probe.h"
#include "engine/model_runner.h"
#include "engine/moe_dense_twin.h"
#include "engine/thread_pool.h"
#include "model/model_writer.h"
#include "model/weights.h"

namespace pd::apps {
namespace {

using engine::ForwardBatch;
using engine::ForwardOutput;
using engine::ModelRunner;
using engine::SeqStep;
using namespace bench_counts;  // NOLINT(build/namespaces): this command's own helpers

struct BenchEngineFlags {
  std::string model_dir;
  std::string preset;
  bool json = false;
  int threads = 2;
  double seconds = 3.0;                // least time measured per decode row (all pairs together)
  std::string decode_stream = "auto";  // engine::SetDecodeStream
  int pairs = 5;                       // (read probe, decode) pairs per decode row
  int prefill_tokens = 512;
  int kv_gib = 2;  // cap on the KV region: sequences beyond it share pages (still far over the LLC)
  std::string models_root = "models";
  std::string phase = "all";  // all | decode | prefill | tp
  int tensor_parallel_size = 1;
  std::vector<int> batches = {1, 8, 32};    // decode rows measured
  std::vector<int> contexts = {128, 2048};  // decode rows measured
  std::string matmul = "both";              // f32 | bf16 | both
  std::string dtype = "bf16";               // preset checkpoints: bf16 | fp8 | both
  std::string amx = "on";                   // on | off | both (the bf16 rows)
  std::string draft_model;                  // --phase spec: a draft_model row from DIR
  int draft_layers = 0;                     // ... or from the target's first N layers
};

// One set of rows of a model: the matmul precision, and for bf16 whether AMX is allowed.
struct Variant {
  engine::MatmulPrecision precision = engine::MatmulPrecision::kF32;
  bool amx = true;
};

struct TpRow {
  std::string model;
  int batch = 0, context = 0;
  double tp1_tokens_per_s = 0, tp2_tokens_per_s = 0;  // TP 1 x 1 thread, TP 2 x 1 thread
  // Process CPU time per token (all threads; spin-waits included): on a machine shared with other
  // work, wall-clock TP speedup needs idle cores, while this shows the work TP adds.
  double tp1_cpu_ms_per_token = 0, tp2_cpu_ms_per_token = 0;
};

double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct Row {
  std::string model, phase;
  int batch = 0, context = 0;
  std::string matmul = "f32";  // the engine's matmul precision
  std::string dtype = "bf16";  // the checkpoint's weights: bf16 or fp8
  std::string path = "f32";    // the kernel its matmuls took (engine::MatmulPathName)
  double tokens_per_s = 0, bytes_per_s = 0, flops_per_s = 0;
  double read_gbytes_per_s = 0;  // the read probe measured just before this row
  double peak_gflops = 0;        // prefill: the FMA probe measured just before this row
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// K and V bytes of one cached token over all layers.
double KvBytesPerToken(const ModelRunner& r) {
  engine::ModelRunner& mr = const_cast<ModelRunner&>(r);
  return static_cast<double>(mr.region().spec().page_bytes()) * mr.config().num_layers /
         mr.region().spec().page_size;
}

// Bounded random bf16/f32 values in every KV page, written by the pool's threads.
void FillKv(engine::KvRegion& region, engine::ThreadPool& pool) {
  std::vector<uint8_t> pattern(1 << 16);
  std::mt19937 rng(7);
  const bool bf16 = region.spec().dtype == engine::KvDType::kBF16;
  for (size_t i = 0; i < pattern.size(); i += bf16 ? 2 : 4) {
    const float v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if (bf16) {
      const uint16_t h = static_cast<uint16_t>(bits >> 16);
      std::memcpy(&pattern[i], &h, 2);
    } else {
      std::memcpy(&pattern[i], &bits, 4);
    }
  }
  const int64_t blocks = static_cast<int64_t>(region.size_bytes() / pattern.size());
  uint8_t* base = region.base();
  pool.ParallelFor(blocks, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      std::memcpy(base + i * pattern.size(), pattern.data(), pattern.size());
  });
}

// Page tables of `batch` sequences of `tokens` tokens each; distinct pages while the region has
// them, wrapping around after.
std::vector<std::vector<int32_t>> PageTables(int batch, int tokens, int page_size, int num_pages) {
  const int per_seq = (tokens + page_size - 1) / page_size;
  std::vector<std::vector<int32_t>> tables(batch);
  int next = 0;
  for (auto& t : tables)
    for (int p = 0; p < per_seq; ++p) t.push_back(next++ % num_pages);
  return tables;
}

Result<Row> BenchDecode(ModelRunner& runner, const std::string& name, bool fp8, int batch,
                        int context, double seconds) {
  const model::ModelConfig& c = runner.config();
  auto tables =
      PageTables(batch, context, runner.region().spec().page_size, runner.region().num_pages());
  std::vector<std::vector<int32_t>> tokens(batch);
  ForwardBatch fb;
  for (int i = 0; i < batch; ++i) {
    tokens[i] = {(i * 131 + 7) % c.vocab_size};
    fb.seqs.push_back(SeqStep{i, context - 1, tokens[i], tables[i], true});
  }
  ForwardOutput out;
  RETURN_IF_ERROR(runner.Forward(fb, &out));  // warm-up
  int steps = 0;
  const double t0 = Now();
  double elapsed = 0;
  while (steps < 2 || elapsed < seconds) {
    RETURN_IF_ERROR(runner.Forward(fb, &out));
    ++steps;
    elapsed = Now() - t0;
  }
  Row r{name, "decode", batch, context};
  const double steps_per_s = steps / elapsed;
  r.tokens_per_s = batch * steps_per_s;
  const double kv_bytes = batch * static_cast<double>(context) * KvBytesPerToken(runner);
  r.bytes_per_s = (WeightBytes(c, fp8, batch) + kv_bytes) * steps_per_s;
  r.flops_per_s =
      batch *
      (2 * (LayerMatrixParams(c, ExpertsPerToken(c)) + double(c.vocab_size) * c.hidden_size) +
       AttnFlops(c, context - 1)) *
      steps_per_s;
  return r;
}

// A decode row as `pairs` alternating (read probe, decode) pairs of seconds/pairs each: the pair
// whose decode/probe ratio is the median, so drift of the host's bandwidth hits both sides alike.
Result<Row> BenchDecodePaired(ModelRunner& runner, engine::ReadBandwidthProbe& probe,
                              const std::string& name, bool fp8, int batch, int context,
                              double seconds, int pairs) {
  std::vector<Row> rows;
  for (int i = 0; i < pairs; ++i) {
    const double read = probe.Measure();
    ASSIGN_OR_RETURN(Row r, BenchDecode(runner, name, fp8, batch, context, seconds / pairs));
    r.read_gbytes_per_s = read;
    rows.push_back(r);
  }
  auto ratio = [](const Row& r) { return r.bytes_per_s / 1e9 / r.read_gbytes_per_s; };
  std::sort(rows.begin(), rows.end(),
            [&](const Row& a, const Row& b) { return ratio(a) < ratio(b); });
  return rows[rows.size() / 2];
}

// One timed prefill of `tokens` tokens (the runner warmed up by the caller).
Result<Row> BenchPrefill(ModelRunner& runner, const std::string& name, bool fp8, int tokens) {
  const model::ModelConfig& c = runner.config();
  auto tables =
      PageTables(1, tokens, runner.region().spec().page_size, runner.region().num_pages());
  std::vector<int32_t> ids(tokens);
  for (int i = 0; i < tokens; ++i) ids[i] = (i * 37 + 11) % c.vocab_size;
  ForwardBatch fb;
  fb.seqs.push_back(SeqStep{0, 0, ids, tables[0], true});
  ForwardOutput out;
  const double t0 = Now();
  RETURN_IF_ERROR(runner.Forward(fb, &out));
  const double best = Now() - t0;
  Row r{name, "prefill", 1, tokens};
  r.tokens_per_s = tokens / best;
  double flops =
      2 * LayerMatrixParams(c, ExpertsPerToken(c)) * tokens + 2.0 * c.vocab_size * c.hidden_size;
  for (int p = 0; p < tokens; ++p) flops += AttnFlops(c, p);
  r.flops_per_s = flops / best;
  r.bytes_per_s = (WeightBytes(c, fp8, tokens) + tokens * KvBytesPerToken(runner)) / best;
  return r;
}

// A prefill row as `pairs` alternating (FMA probe, prefill) pairs after one warm-up prefill: the
// pair whose prefill/probe flops ratio is the median, so a phase in which the host's FMA rate
// drops hits both sides alike and the fraction of peak compares between runs.
// bf16_dot: the probe is the bf16 dot product's peak (the runner multiplies in bf16).
Result<Row> BenchPrefillPaired(ModelRunner& runner, engine::ThreadPool& pool,
                               const std::string& name, bool fp8, int tokens, int pairs,
                               bool bf16_dot) {
  RETURN_IF_ERROR(BenchPrefill(runner, name, fp8, tokens));  // warm-up
  std::vector<Row> rows;
  for (int i = 0; i < pairs; ++i) {
    double peak = 0;
    if (bf16_dot) {
      ASSIGN_OR_RETURN(peak, engine::MeasurePeakBf16DotGflops(pool));
    } else {
      peak = engine::MeasurePeakGflops(pool);
    }
    ASSIGN_OR_RETURN(Row r, BenchPrefill(runner, name, fp8, tokens));
    r.peak_gflops = peak;
    rows.push_back(r);
  }
  auto ratio = [](const Row& r) { return r.flops_per_s / 1e9 / r.peak_gflops; };
  std::sort(rows.begin(), rows.end(),
            [&](const Row& a, const Row& b) { return ratio(a) < ratio(b); });
  return rows[rows.size() / 2];
}

// The model of a preset in models/ (dtype bf16 or fp8), written with the synthetic writer when
// missing.
Result<std::string> EnsureModel(const std::string& root, const std::string& preset,
                                const std::string& dtype) {
  const std::string dir = root + "/" + preset + "-" + dtype;
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  model::SyntheticModelOptions o;
  auto starts_with = [&](const char* prefix) { return preset.rfind(prefix, 0) == 0; };
  o.arch = starts_with("llama")        ? model::Arch::kLlama
           : starts_with("deepseek-")  ? model::Arch::kDeepseekV3
           : starts_with("qwen3-moe-") ? model::Arch::kQwen3Moe
                                       : model::Arch::kQwen3;
  o.preset = preset;
  o.dtype = dtype == "fp8" ? model::DType::kF8E4M3 : model::DType::kBF16;
  o.seed = 1;
  o.out_dir = dir;
  std::fprintf(stderr, "bench-engine: writing %s ...\n", dir.c_str());
  RETURN_IF_ERROR(model::WriteSyntheticModel(o));
  return dir;
}

Status BenchModel(const model::ModelWeights& weights, const std::string& name, const Variant& v,
                  const BenchEngineFlags& f, engine::ThreadPool& probe_pool,
                  engine::ReadBandwidthProbe& probe, std::vector<Row>* rows) {
  const engine::MatmulPrecision matmul = v.precision;
  const std::string precision(engine::MatmulPrecisionName(matmul));
  const bool fp8 = weights.fp8;
  engine::SetAmxAllowed(v.amx);  // read by the runner created below
  const std::string path(
      engine::MatmulPathName(engine::ChosenMatmulPath(engine::KernelKind::kFast, matmul)));
  engine::ModelRunnerOptions o;
  o.matmul = matmul;
  o.num_threads = f.threads;
  o.tensor_parallel_size = f.tensor_parallel_size;
  o.kv.dtype = engine::KvDType::kBF16;
  o.kv.layout = engine::KvLayout::kHND;
  o.kv.page_size = 16;
  o.kv_cache_bytes = static_cast<size_t>(f.kv_gib) << 30;
  std::fprintf(stderr, "bench-engine: %s: laying out weights (matmul %s, path %s) ...\n",
               name.c_str(), precision.c_str(), path.c_str());
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, ModelRunner::Create(weights, o));
  {
    engine::ThreadPool fill_pool(f.threads);
    for (int r = 0; r < runner->num_ranks(); ++r) FillKv(runner->rank_region(r), fill_pool);
  }
  for (int context : f.contexts)
    for (int batch : f.batches) {
      if (f.phase == "prefill") break;
      std::fprintf(stderr, "bench-engine: %s: decode batch %d context %d\n", name.c_str(), batch,
                   context);
      ASSIGN_OR_RETURN(
          Row r, BenchDecodePaired(*runner, probe, name, fp8, batch, context, f.seconds, f.pairs));
      r.matmul = precision;
      r.dtype = fp8 ? "fp8" : "bf16";
      r.path = fp8 ? "fp8" : path;
      std::fprintf(stderr, "bench-engine:   %.1f tokens/s, %.1f GB/s\n", r.tokens_per_s,
                   r.bytes_per_s / 1e9);
      rows->push_back(r);
    }
  if (f.phase == "decode") return OkStatus();
  std::fprintf(stderr, "bench-engine: %s: prefill %d tokens\n", name.c_str(), f.prefill_tokens);
  const double read = probe.Measure();
  ASSIGN_OR_RETURN(Row r, BenchPrefillPaired(*runner, probe_pool, name, fp8, f.prefill_tokens,
                                             f.pairs, matmul == engine::MatmulPrecision::kBf16));
  r.read_gbytes_per_s = read;
  r.matmul = precision;
  r.dtype = fp8 ? "fp8" : "bf16";
  r.path = !fp8 ? path : path == "amx-bf16" ? "amx-fp8" : "fp8";  // fp8 prefill takes AMX too
  std::fprintf(stderr, "bench-engine:   %.1f tokens/s, %.3f of the FMA probe beside it\n",
               r.tokens_per_s, r.flops_per_s / 1e9 / r.peak_gflops);
  rows->push_back(r);
  return OkStatus();
}

// The rows of a MoE model's dense twin (moe_dense_twin.h: same attention, lm_head and active MLP
// parameters), named NAME-dense, measured right after the MoE model's rows.
Status BenchDenseTwin(const model::ModelWeights& moe, const std::string& name,
                      const std::vector<Variant>& variants, const BenchEngineFlags& f,
                      engine::ThreadPool& probe_pool, engine::ReadBandwidthProbe& probe,
                      std::vector<Row>* rows) {
  ASSIGN_OR_RETURN(std::unique_ptr<engine::DenseTwin> twin, engine::MakeDenseTwin(moe));
  for (size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    if (moe.fp8 && i > 0 && v.precision == engine::MatmulPrecision::kBf16 && !v.amx)
      continue;  // as for the MoE model's rows: FP8 weights repeat the f32 rows there
    RETURN_IF_ERROR(BenchModel(twin->weights, name + "-dense", v, f, probe_pool, probe, rows));
  }
  return OkStatus();
}

Result<std::unique_ptr<ModelRunner>> MakeTpRunner(const model::ModelWeights& weights, int tp) {
  engine::ModelRunnerOptions o;
  o.num_threads = 1;  // per rank: TP 1 on one core, TP 2 on two
  o.tensor_parallel_size = tp;
  o.kv.dtype = engine::KvDType::kBF16;
  o.kv.layout = engine::KvLayout::kHND;
  o.kv.page_size = 16;
  o.kv_cache_bytes = size_t{256} << 20;
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, ModelRunner::Create(weights, o));
  engine::ThreadPool fill_pool(1);
  for (int r = 0; r < runner->num_ranks(); ++r) FillKv(runner->rank_region(r), fill_pool);
  return runner;
}

// BenchDecode, also giving the process CPU ms per token of the measured steps.
Result<Row> BenchDecodeCpu(ModelRunner& runner, const std::string& name, int batch, int context,
                           double seconds, double* cpu_ms_per_token) {
  const double cpu0 = CpuNow(), t0 = Now();
  ASSIGN_OR_RETURN(Row r, BenchDecode(runner, name, /*fp8=*/false, batch, context, seconds));
  const double tokens = r.tokens_per_s * (Now() - t0);  // includes the warm-up step: close enough
  *cpu_ms_per_token = (CpuNow() - cpu0) * 1e3 / tokens;
  return r;
}

// Decode at TP 2 (one thread per rank) against TP 1 (one thread), both runners alive and measured
// alternately, so the machine's drift hits both columns alike.
Status BenchTp(const std::string& dir, const std::string& preset, const BenchEngineFlags& f,
               std::vector<TpRow>* rows) {
  ASSIGN_OR_RETURN(model::ModelWeights weights, model::LoadModelWeights(dir));
  const std::string name = weights.fp8 ? preset + "-fp8" : preset;  // --dtype both: two rows
  std::fprintf(stderr, "bench-engine: %s: laying out weights for TP 1 and TP 2 ...\n",
               name.c_str());
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> tp1, MakeTpRunner(weights, 1));
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> tp2, MakeTpRunner(weights, 2));
  for (int batch : {1, 8}) {
    TpRow row{name, batch, 128};
    for (int round = 0; round < 2; ++round) {  // keep the best of two alternating rounds
      double cpu1 = 0, cpu2 = 0;
      ASSIGN_OR_RETURN(Row a, BenchDecodeCpu(*tp1, name, batch, 128, f.seconds / 2, &cpu1));
      ASSIGN_OR_RETURN(Row b, BenchDecodeCpu(*tp2, name, batch, 128, f.seconds / 2, &cpu2));
      if (a.tokens_per_s > row.tp1_tokens_per_s) {
        row.tp1_tokens_per_s = a.tokens_per_s;
        row.tp1_cpu_ms_per_token = cpu1;
      }
      if (b.tokens_per_s > row.tp2_tokens_per_s) {
        row.tp2_tokens_per_s = b.tokens_per_s;
        row.tp2_cpu_ms_per_token = cpu2;
      }
    }
    std::fprintf(stderr, "bench-engine: %s: decode batch %d: TP1x1 %.1f, TP2x1 %.1f tokens/s\n",
                 name.c_str(), batch, row.tp1_tokens_per_s, row.tp2_tokens_per_s);
    rows->push_back(row);
  }
  return OkStatus();
}

void PrintTp(const std::vector<TpRow>& rows, bool json) {
  if (json) {
    nlohmann::json j = {{"tp_rows", nlohmann::json::array()}};
    for (const TpRow& r : rows)
      j["tp_rows"].push_back({{"model", r.model},
                              {"batch", r.batch},
                              {"context", r.context},
                              {"tp1_1core_tokens_per_s", r.tp1_tokens_per_s},
                              {"tp2_2cores_tokens_per_s", r.tp2_tokens_per_s},
                              {"speedup", r.tp2_tokens_per_s / r.tp1_tokens_per_s},
                              {"tp1_cpu_ms_per_token", r.tp1_cpu_ms_per_token},
                              {"tp2_cpu_ms_per_token", r.tp2_cpu_ms_per_token}});
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%-12s %-10s %5s %7s %12s %12s %8s %12s %12s\n", "model", "phase", "batch", "context",
              "TP1x1 tok/s", "TP2x1 tok/s", "speedup", "TP1 cpu ms/t", "TP2 cpu ms/t");
  for (const TpRow& r : rows)
    std::printf("%-12s %-10s %5d %7d %12.1f %12.1f %8.2f %12.1f %12.1f\n", r.model.c_str(),
                "decode-tp", r.batch, r.context, r.tp1_tokens_per_s, r.tp2_tokens_per_s,
                r.tp2_tokens_per_s / r.tp1_tokens_per_s, r.tp1_cpu_ms_per_token,
                r.tp2_cpu_ms_per_token);
}

// bw: the best read probe of the run; each row's bw_fraction is against the probe measured just
// before it (the host's memory bandwidth is shared and drifts within a run).
// The peak a row's flops fraction is against: a prefill row's own probe, else the run's best FMA
// peak (bf16 rows: the bf16 dot product's).
double RowPeak(const Row& r, double run_peak, double run_bf16dot) {
  if (r.peak_gflops > 0) return r.peak_gflops;
  return r.matmul == "bf16" ? run_bf16dot : run_peak;
}

// bf16dot: the vdpbf16ps peak, 0 when the CPU has none (the JSON field is then absent).
void Print(const std::vector<Row>& rows, double bw, double peak, double bf16dot,
           const BenchEngineFlags& f) {
  const engine::KernelVariant kv = engine::DescribeKernels();
  if (f.json) {
    nlohmann::json j = {{"cpu_model", kv.cpu_model},
                        {"kernels",
                         {{"vendor", kv.vendor},
                          {"isa", kv.isa},
                          {"matmul", kv.matmul},
                          {"bf16_dot", kv.bf16_dot},
                          {"amx", kv.amx},
                          {"decode_stream", kv.decode_stream}}},
                        {"read_gbytes_per_s", bw},
                        {"peak_gflops", peak},
                        {"decode_pairs", f.pairs},
                        {"threads", f.threads},
                        {"tensor_parallel_size", f.tensor_parallel_size}};
    if (bf16dot > 0) j["peak_bf16dot_gflops"] = bf16dot;
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows) {
      j["rows"].push_back({{"model", r.model},
                           {"phase", r.phase},
                           {"matmul", r.matmul},
                           {"dtype", r.dtype},
                           {"path", r.path},
                           {"batch", r.batch},
                           {"context", r.context},
                           {"tokens_per_s", r.tokens_per_s},
                           {"bw_fraction", r.bytes_per_s / 1e9 / r.read_gbytes_per_s},
                           {"flops_fraction", r.flops_per_s / 1e9 / RowPeak(r, peak, bf16dot)},
                           {"read_gbytes_per_s", r.read_gbytes_per_s}});
      if (r.peak_gflops > 0) j["rows"].back()["peak_gflops"] = r.peak_gflops;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("host: %s (%s)\n", kv.cpu_model.c_str(), kv.vendor.c_str());
  std::printf("kernels: isa %s, matmul %s, bf16 dot %s, amx %s, decode stream %s\n", kv.isa.c_str(),
              kv.matmul.c_str(), kv.bf16_dot.c_str(), kv.amx.c_str(), kv.decode_stream.c_str());
  std::printf("machine: memory read %.1f GB/s (best probe), peak FMA %.1f GFLOP/s (%d threads)\n",
              bw, peak, f.threads);
  if (bf16dot > 0)
    std::printf(
        "machine: peak bf16 dot (vdpbf16ps) %.1f GFLOP/s = %.2f of the FMA peak "
        "(the bf16 rows' peak)\n",
        bf16dot, bf16dot / peak);
  else
    std::printf("machine: peak bf16 dot (vdpbf16ps) n/a (no avx512_bf16)\n");
  std::printf(
      "decode rows: the median-ratio pair of %d (read probe, decode) pairs; fl_frac "
      "against the run's peak\n",
      f.pairs);
  std::printf(
      "prefill rows: the median-ratio pair of %d (FMA probe, prefill) pairs; fl_frac "
      "against that pair's probe (column peak)\n",
      f.pairs);
  std::printf("%-20s %-8s %-6s %-15s %-5s %5s %7s %10s %8s %8s %8s %8s %8s %8s\n", "model", "phase",
              "matmul", "path", "dtype", "batch", "context", "tokens/s", "GB/s", "read", "bw_frac",
              "GFLOP/s", "peak", "fl_frac");
  for (const Row& r : rows) {
    const double row_peak = RowPeak(r, peak, bf16dot);
    std::printf("%-20s %-8s %-6s %-15s %-5s %5d %7d %10.1f %8.1f %8.1f %8.3f %8.1f %8.1f %8.3f\n",
                r.model.c_str(), r.phase.c_str(), r.matmul.c_str(), r.path.c_str(), r.dtype.c_str(),
                r.batch, r.context, r.tokens_per_s, r.bytes_per_s / 1e9, r.read_gbytes_per_s,
                r.bytes_per_s / 1e9 / r.read_gbytes_per_s, r.flops_per_s / 1e9, row_peak,
                r.flops_per_s / 1e9 / row_peak);
  }
}

// --phase spec (bench_engine_spec.h): verification of K drafts against a decode step, and TPOT
// with n-gram drafts, at the first of --contexts.
int RunSpecPhase(const std::vector<std::pair<std::string, std::string>>& models,
                 const BenchEngineFlags& f) {
  SpecBenchOptions o;
  o.threads = f.threads;
  o.seconds = f.seconds;
  o.context = f.contexts.empty() ? 128 : f.contexts.front();
  o.json = f.json;
  o.draft_model_dir = f.draft_model;
  o.draft_layers = f.draft_layers;
  for (const auto& [name, dir] : models) {
    Result<model::ModelWeights> weights = model::LoadModelWeights(dir);
    Status s = weights.ok() ? RunSpecBench(name, *weights, o) : weights.status();
    if (!s.ok()) {
      std::fprintf(stderr, "bench-engine: %s: %s\n", name.c_str(), s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

int RunBenchEngine(const BenchEngineFlags& f) {
  if (Status s = engine::SetDecodeStream(f.decode_stream); !s.ok()) {
    std::fprintf(stderr, "bench-engine: %s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<std::pair<std::string, std::string>> models;  // (name, dir)
  if (!f.model_dir.empty()) {
    models.emplace_back(std::filesystem::path(f.model_dir).filename().string(), f.model_dir);
  } else {
    std::vector<std::string> presets = {"llama-1b", "qwen3-0.6b"};
    if (!f.preset.empty()) presets = {f.preset};
    std::vector<std::string> dtypes = {f.dtype};
    if (f.dtype == "both") dtypes = {"bf16", "fp8"};
    for (const std::string& p : presets)
      for (const std::string& dtype : dtypes) {
        Result<std::string> dir = EnsureModel(f.models_root, p, dtype);
        if (!dir.ok()) {
          std::fprintf(stderr, "bench-engine: %s\n", dir.status().ToString().c_str());
          return 1;
        }
        models.emplace_back(p, *dir);
      }
  }
  if (f.phase == "spec") return RunSpecPhase(models, f);
  if (f.phase == "tp") {
    std::vector<TpRow> rows;
    for (const auto& [name, dir] : models) {
      Status s = BenchTp(dir, name, f, &rows);
      if (!s.ok()) {
        std::fprintf(stderr, "bench-engine: %s: %s\n", name.c_str(), s.ToString().c_str());
        return 1;
      }
    }
    PrintTp(rows, f.json);
    return 0;
  }
  engine::ThreadPool pool(f.threads);
  auto probe = engine::ReadBandwidthProbe::Create(pool, {0, 1});  // one round per pair
  if (!probe.ok()) {
    std::fprintf(stderr, "bench-engine: %s\n", probe.status().ToString().c_str());
    return 1;
  }
  std::vector<Variant> variants;
  if (f.matmul != "bf16") variants.push_back({engine::MatmulPrecision::kF32, f.amx != "off"});
  if (f.matmul != "f32") {
    if (engine::MatmulBf16DotUsed(engine::KernelKind::kFast, engine::MatmulPrecision::kBf16)) {
      if (f.amx != "on") variants.push_back({engine::MatmulPrecision::kBf16, false});
      if (f.amx != "off") variants.push_back({engine::MatmulPrecision::kBf16, true});
    } else {
      std::fprintf(stderr, "bench-engine: no AVX512_BF16: matmul bf16 would run f32; left out\n");
      if (variants.empty()) return 1;
    }
  }
  double peak = engine::MeasurePeakGflops(pool);
  std::vector<Row> rows;
  for (const auto& [name, dir] : models) {
    Result<model::ModelWeights> weights = model::LoadModelWeights(dir);
    Status s = weights.status();
    for (size_t i = 0; s.ok() && i < variants.size(); ++i) {
      // FP8 weights take the fp8 kernel (x in f32) at either precision, but AMX tiles for bf16
      // prefill: a bf16 variant without AMX would repeat the f32 rows.
      const Variant& v = variants[i];
      if (weights->fp8 && i > 0 && v.precision == engine::MatmulPrecision::kBf16 && !v.amx)
        continue;
      s = BenchModel(*weights, name, variants[i], f, pool, **probe, &rows);
    }
    if (s.ok() && weights->config.is_moe())
      s = BenchDenseTwin(*weights, name, variants, f, pool, **probe, &rows);
    if (!s.ok()) {
      std::fprintf(stderr, "bench-engine: %s: %s\n", name.c_str(), s.ToString().c_str());
      return 1;
    }
  }
  peak = std::max(peak, engine::MeasurePeakGflops(pool));  // the best of the run's two
  // The bf16 dot-product peak, beside the FMA peak: 0 when the CPU lacks avx512_bf16.
  const Result<double> bf16dot = engine::MeasurePeakBf16DotGflops(pool);
  double bw = (*probe)->Measure();
  for (const Row& r : rows) bw = std::max(bw, r.read_gbytes_per_s);
  Print(rows, bw, peak, bf16dot.ok() ? *bf16dot : 0.0, f);
  return 0;
}

CommandRunner SetUpCommand(CLI::App* app) {
  auto f = std::make_shared<BenchEngineFlags>();
  auto* model = app->add_option("--model", f->model_dir, "model directory");
  app->add_option("--preset", f->preset,
                  "llama-1b, qwen3-0.6b, qwen3-moe-1g or deepseek-v3-1g (written into models/ if "
                  "missing; a MoE preset's rows are followed by its dense twin's)")
      ->excludes(model);
  app->add_flag("--json", f->json, "print JSON");
  app->add_option("--threads", f->threads, "threads")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app->add_option("--seconds", f->seconds, "least seconds measured per decode row")
      ->check(CLI::Range(0.0, 600.0))
      ->capture_default_str();
  app->add_option("--pairs", f->pairs,
                  "(read probe, decode) pairs per decode row and (FMA probe, prefill) pairs per "
                  "prefill row; the median-ratio pair is reported")
      ->check(CLI::Range(1, 99))
      ->capture_default_str();
  app->add_option("--prefill-tokens", f->prefill_tokens, "prompt length")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app->add_option("--kv-gib", f->kv_gib, "cap on the KV region in GiB")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app->add_option("--models-root", f->models_root, "where presets are written")
      ->capture_default_str();
  app->add_option("--phase", f->phase, "rows to measure")
      ->check(CLI::IsMember({"all", "decode", "prefill", "tp", "spec"}))
      ->capture_default_str();
  app->add_option("--draft-model", f->draft_model,
                  "--phase spec: also a draft_model row with this draft checkpoint");
  app->add_option("--draft-layers", f->draft_layers,
                  "--phase spec: also a draft_model row whose draft is the target's first N "
                  "layers (a view: no checkpoint written)")
      ->check(CLI::Range(1, 1 << 10));
  app->add_option("--batches", f->batches, "decode batch sizes (e.g. --batches 1 32)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app->add_option("--contexts", f->contexts, "decode contexts (e.g. --contexts 128)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app->add_option("--matmul", f->matmul,
                  "engine matmul precision: f32 (x kept f32), bf16 (x rounded to bf16, vdpbf16ps) "
                  "or both, side by side")
      ->check(CLI::IsMember({"f32", "bf16", "both"}))
      ->capture_default_str();
  app->add_option("--dtype", f->dtype,
                  "preset checkpoints measured: bf16, fp8 (HF's block-scaled e4m3: weights "
                  "streamed as 1 byte each) or both, side by side in one run (models/PRESET-DTYPE)")
      ->check(CLI::IsMember({"bf16", "fp8", "both"}))
      ->capture_default_str();
  app->add_option("--amx", f->amx,
                  "bf16 rows: AMX tiles for matmuls of 16+ rows (prefill) where the CPU and Linux "
                  "allow them (on), the AVX-512 bf16 dot path only (off), or each in turn (both)")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  app->add_option("--decode-stream", f->decode_stream,
                  "how the AVX-512 panel matmul streams decode batches: auto (per CPU: single on "
                  "AMD, multi elsewhere), single (one hardware-prefetched stream per thread) or "
                  "multi (four software-prefetched groups at a time)")
      ->check(CLI::IsMember({"auto", "single", "multi"}))
      ->capture_default_str();
  app->add_option("--tensor-parallel-size", f->tensor_parallel_size,
                  "ranks of the measured runner (--threads each); --phase tp compares 2 with 1")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  return [f] { return RunBenchEngine(*f); };
}

// The name has a dash, so register directly rather than through PD_REGISTER_COMMAND.
const bool kRegistered = RegisterCommand(
    {"bench-engine", "Engine decode/prefill speed against this machine's bandwidth and FMA peak",
     SetUpCommand});

}  // namespace

}  // namespace pd::apps
