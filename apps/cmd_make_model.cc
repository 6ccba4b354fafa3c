// pdserve make-model: writes a random-weight checkpoint in the Hugging Face layout.
//
//   pdserve make-model --arch qwen3 --preset tiny --dtype bf16 --seed 0 --out models/qwen3-tiny
//
// Presets: tiny and small (test models, for every arch), qwen3-0.6b (Qwen3-0.6B's shapes, meant
// for --arch qwen3) and llama-1b (TinyLlama-1.1B's shapes, meant for --arch llama); a named
// preset used with another dense arch keeps its shapes and takes that arch's conventions.
// qwen3_moe and deepseek_v3 take tiny and small, and qwen3-moe-1g / deepseek-v3-1g (Qwen3-30B-A3B's
// and DeepSeek-V3's proportions at about 1 GB of bf16); --q-lora-rank, --no-yarn and --mtp-layers
// override deepseek_v3's MLA query form, yarn rope_scaling and MTP layer count.
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
  std::string q_lora_rank;
  std::string mtp_layers;
  bool no_yarn = false;
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

// The deepseek_v3 overrides; false (after printing why) on a bad value.
bool MoeOptions(const MakeModelFlags& f, model::SyntheticModelOptions* o) {
  const bool deepseek = o->arch == model::Arch::kDeepseekV3;
  if ((!f.q_lora_rank.empty() || !f.mtp_layers.empty() || f.no_yarn) && !deepseek) {
    std::fprintf(stderr,
                 "make-model: --q-lora-rank, --mtp-layers and --no-yarn apply to "
                 "--arch deepseek_v3 only\n");
    return false;
  }
  if (!f.q_lora_rank.empty()) {
    auto r = ParseCount("--q-lora-rank", f.q_lora_rank, /*allow_zero=*/true);
    if (!r || *r > 65536) {
      if (r)
        std::fprintf(stderr, "make-model: --q-lora-rank %s is over 65536\n", f.q_lora_rank.c_str());
      return false;
    }
    o->q_lora_rank = static_cast<int>(*r);
  }
  if (!f.mtp_layers.empty()) {
    auto n = ParseCount("--mtp-layers", f.mtp_layers, /*allow_zero=*/true);
    if (!n || *n > 16) {
      if (n) std::fprintf(stderr, "make-model: --mtp-layers %s is over 16\n", f.mtp_layers.c_str());
      return false;
    }
    o->num_nextn_predict_layers = static_cast<int>(*n);
  }
  if (f.no_yarn) o->yarn = false;
  return true;
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
  return MoeOptions(f, o);
}

void PrintSummary(const model::SyntheticModelOptions& o, double seconds) {
  auto config = model::LoadModelConfig(o.out_dir);
  if (!config.ok()) return;
  const model::ModelConfig& c = *config;
  const model::ParameterCounts params = model::CountParameters(c);
  std::printf("wrote %s (preset %s, %s, seed %llu) to %s in %.1f s\n",
              std::string(model::ArchName(c.arch)).c_str(), o.preset.c_str(),
              std::string(model::DTypeName(o.dtype)).c_str(),
              static_cast<unsigned long long>(o.seed), o.out_dir.c_str(), seconds);
  if (c.is_mla()) {
    std::printf(
        "  %d layers, hidden %d, %d heads, MLA q_lora_rank %d kv_lora_rank %d "
        "qk_nope %d qk_rope %d v %d%s, intermediate %d, vocab %d\n",
        c.num_layers, c.hidden_size, c.num_heads, c.mla.q_lora_rank, c.mla.kv_lora_rank,
        c.mla.qk_nope_head_dim, c.mla.qk_rope_head_dim, c.mla.v_head_dim, c.yarn ? ", yarn" : "",
        c.intermediate_size, c.vocab_size);
  } else {
    std::printf(
        "  %d layers, hidden %d, %d heads (%d KV) x head_dim %d, intermediate %d, vocab %d, "
        "%s embeddings\n",
        c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
        c.vocab_size, c.tie_word_embeddings ? "tied" : "untied");
  }
  if (c.is_moe()) {
    std::printf("  MoE: %d experts (top %d) of width %d, %d shared\n", c.moe.num_experts,
                c.moe.num_experts_per_tok, c.moe.moe_intermediate_size, c.moe.n_shared_experts);
  }
  std::printf("  %.1fM parameters, %.1fM active per token", static_cast<double>(params.total) / 1e6,
              static_cast<double>(params.active) / 1e6);
  if (params.mtp > 0) std::printf(", %.1fM in MTP layers", static_cast<double>(params.mtp) / 1e6);
  std::printf("\n");
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
      app->add_option("--arch", f->arch, "qwen3 | qwen2 | llama | qwen3_moe | deepseek_v3")
          ->capture_default_str();
      app->add_option("--preset", f->preset,
                      "tiny | small (every arch); qwen3-0.6b | llama-1b (dense archs); "
                      "qwen3-moe-1g (qwen3_moe); deepseek-v3-1g (deepseek_v3)")
          ->capture_default_str();
      app->add_option("--dtype", f->dtype,
                      "bf16 | f32 | f16 | fp8 (HF's FP8 format: F8_E4M3 projections with "
                      "128x128 block scales, the rest bf16)")
          ->capture_default_str();
      app->add_option("--seed", f->seed, "weights are a function of the seed")
          ->capture_default_str();
      app->add_option("--out", f->out, "output directory (created)");
      app->add_option("--num-kv-heads", f->num_kv_heads, "override the preset's KV head count");
      app->add_option("--num-layers", f->num_layers, "override the preset's layer count");
      app->add_option("--shard-mb", f->shard_mb,
                      "write shards of at most this many MiB, with an index");
      app->add_option("--q-lora-rank", f->q_lora_rank,
                      "deepseek_v3: override q_lora_rank (0: a plain q_proj)");
      app->add_option("--mtp-layers", f->mtp_layers,
                      "deepseek_v3: override num_nextn_predict_layers (MTP layers written)");
      app->add_flag("--no-yarn", f->no_yarn, "deepseek_v3: rope_scaling null instead of yarn");
      return [f] { return RunMakeModel(*f); };
    });

}  // namespace pd::apps
