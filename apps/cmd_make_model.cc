// pdserve make-model: writes a random-weight checkpoint in the Hugging Face layout.
//
//   pdserve make-model --arch qwen3 --preset tiny --dtype bf16 --seed 0 --out models/qwen3-tiny
//
// Presets: tiny and small (test models, for every arch), qwen3-0.6b (Qwen3-0.6B's shapes, meant
// for --arch qwen3) and llama-1b (TinyLlama-1.1B's shapes, meant for --arch llama); a named
// preset used with another arch keeps its shapes and takes that arch's conventions.
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "apps/command.h"
#include "model/config.h"
#include "model/model_writer.h"
#include "model/weights.h"

namespace pd::apps {
namespace {

struct MakeModelFlags {
  std::string arch = "qwen3";
  std::string preset = "tiny";
  std::string dtype = "bf16";
  std::string seed = "0";
  std::string out;
  std::string num_kv_heads;  // numbers are parsed here so that bad values exit 2 with our message
  std::string num_layers;
  std::string shard_mb;
};

constexpr int kUsageError = 2;

// Parses a non-negative integer flag value; nullopt (after printing why) when it is not one.
std::optional<uint64_t> ParseCount(const char* flag, const std::string& text, bool allow_zero) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || (!allow_zero && value == 0)) {
    std::fprintf(stderr, "make-model: %s: expected a %s integer, got \"%s\"\n", flag,
                 allow_zero ? "non-negative" : "positive", text.c_str());
    return std::nullopt;
  }
  return value;
}

// Fills options from flags; false (after printing the error) on a bad flag.
bool ToOptions(const MakeModelFlags& f, model::SyntheticModelOptions* o) {
  auto arch = model::ParseArch(f.arch);
  if (!arch.ok()) {
    std::fprintf(stderr, "make-model: --arch: %s\n", arch.status().message().c_str());
    return false;
  }
  auto dtype = model::ParseDTypeFlag(f.dtype);
  if (!dtype.ok()) {
    std::fprintf(stderr, "make-model: --dtype: %s\n", dtype.status().message().c_str());
    return false;
  }
  auto preset = model::PresetConfig(*arch, f.preset);
  if (!preset.ok()) {
    std::fprintf(stderr, "make-model: --preset: %s\n", preset.status().message().c_str());
    return false;
  }
  if (f.out.empty()) {
    std::fprintf(stderr, "make-model: --out DIR is required\n");
    return false;
  }
  o->arch = *arch;
  o->dtype = *dtype;
  o->preset = f.preset;
  o->out_dir = f.out;
  auto seed = ParseCount("--seed", f.seed, /*allow_zero=*/true);
  if (!seed) return false;
  o->seed = *seed;
  if (!f.num_kv_heads.empty()) {
    auto k = ParseCount("--num-kv-heads", f.num_kv_heads, false);
    if (!k) return false;
    if (*k > static_cast<uint64_t>(preset->num_heads) || preset->num_heads % *k != 0) {
      std::fprintf(stderr, "make-model: --num-kv-heads %s must divide the preset's %d heads\n",
                   f.num_kv_heads.c_str(), preset->num_heads);
      return false;
    }
    o->num_kv_heads = static_cast<int>(*k);
  }
  if (!f.num_layers.empty()) {
    auto l = ParseCount("--num-layers", f.num_layers, false);
    if (!l || *l > 1024) {
      if (l)
        std::fprintf(stderr, "make-model: --num-layers %s is over 1024\n", f.num_layers.c_str());
      return false;
    }
    o->num_layers = static_cast<int>(*l);
  }
  if (!f.shard_mb.empty()) {
    auto mb = ParseCount("--shard-mb", f.shard_mb, false);
    if (!mb) return false;
    if (*mb > (1u << 20)) {
      std::fprintf(stderr, "make-model: --shard-mb %s is over 1 TiB\n", f.shard_mb.c_str());
      return false;
    }
    o->max_shard_bytes = static_cast<size_t>(*mb) << 20;
  }
  return true;
}

void PrintSummary(const model::SyntheticModelOptions& o, double seconds) {
  auto config = model::LoadModelConfig(o.out_dir);
  if (!config.ok()) return;
  const model::ModelConfig& c = *config;
  int64_t params = 0;
  for (const auto& spec : model::RequiredTensors(c)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    params += n;
  }
  std::printf("wrote %s (preset %s, %s, seed %llu) to %s in %.1f s\n",
              std::string(model::ArchName(c.arch)).c_str(), o.preset.c_str(),
              std::string(model::DTypeName(o.dtype)).c_str(),
              static_cast<unsigned long long>(o.seed), o.out_dir.c_str(), seconds);
  std::printf(
      "  %d layers, hidden %d, %d heads (%d KV) x head_dim %d, intermediate %d, vocab %d, "
      "%s embeddings: %.1fM parameters\n",
      c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
      c.vocab_size, c.tie_word_embeddings ? "tied" : "untied", static_cast<double>(params) / 1e6);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(o.out_dir, ec)) {
    if (!entry.is_regular_file()) continue;
    std::printf("  %-40s %12ju bytes\n", entry.path().filename().c_str(),
                static_cast<uintmax_t>(entry.file_size()));
  }
}

int RunMakeModel(const MakeModelFlags& flags) {
  model::SyntheticModelOptions options;
  if (!ToOptions(flags, &options)) return kUsageError;
  auto start = std::chrono::steady_clock::now();
  Status s = model::WriteSyntheticModel(options);
  if (!s.ok()) {
    std::fprintf(stderr, "make-model: %s\n", s.ToString().c_str());
    return 1;
  }
  std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  PrintSummary(options, elapsed.count());
  return 0;
}

}  // namespace

PD_REGISTER_COMMAND(
    make_model, "Write a random-weight checkpoint in the Hugging Face layout", [](CLI::App* app) {
      auto f = std::make_shared<MakeModelFlags>();
      app->name("make-model");
      app->add_option("--arch", f->arch, "qwen3 | qwen2 | llama")->capture_default_str();
      app->add_option("--preset", f->preset, "tiny | small | qwen3-0.6b | llama-1b")
          ->capture_default_str();
      app->add_option("--dtype", f->dtype, "bf16 | f32 | f16")->capture_default_str();
      app->add_option("--seed", f->seed, "weights are a function of the seed")
          ->capture_default_str();
      app->add_option("--out", f->out, "output directory (created)");
      app->add_option("--num-kv-heads", f->num_kv_heads, "override the preset's KV head count");
      app->add_option("--num-layers", f->num_layers, "override the preset's layer count");
      app->add_option("--shard-mb", f->shard_mb,
                      "write shards of at most this many MiB, with an index");
      return [f] { return RunMakeModel(*f); };
    });

}  // namespace pd::apps
