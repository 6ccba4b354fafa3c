// pdserve generate: one offline completion on the CPU engine.
//
//   pdserve generate --model models/qwen3-tiny --prompt "Hello" --max-tokens 16
//   pdserve generate --model DIR --prompt-ids 1,2,3 --json
//
// Prints the completion text; with --json one object {"token_ids", "logprobs", "text",
// "finish_reason"} where logprobs[i] is the log-probability (log-softmax of the model's logits)
// of generated token i. Exit codes: 0 done, 1 bad model or request, 2 bad flags.
#include <charconv>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/command.h"
#include "apps/matmul_flag.h"
#include "engine/engine.h"
#include "engine/kv_cache.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace pd::apps {
namespace {

constexpr int kUsageError = 2;
constexpr int kRunError = 1;

// Numbers are kept as text and parsed here so that a bad value exits 2 with our message.
struct GenerateFlags {
  std::string model;
  std::optional<std::string> prompt;
  std::optional<std::string> prompt_ids;
  std::string max_tokens = "16";
  std::string temperature = "0";
  std::string top_p = "1";
  std::string top_k = "0";
  std::optional<std::string> seed;
  bool ignore_eos = false;
  bool json = false;
  std::string threads = "0";
  std::string tensor_parallel_size = "1";
  std::string page_size = "16";
  std::string kv_layout = "hnd";
  std::string kv_dtype = "f32";
  std::string matmul = "f32";
};

bool Fail(const char* flag, const std::string& value, const char* want) {
  std::fprintf(stderr, "generate: %s: expected %s, got \"%s\"\n", flag, want, value.c_str());
  return false;
}

template <typename T>
bool ParseInt(const char* flag, const std::string& text, T min, T* out) {
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min) {
    const std::string want = "an integer >= " + std::to_string(min);
    return Fail(flag, text, want.c_str());
  }
  *out = value;
  return true;
}

bool ParseFloat(const char* flag, const std::string& text, float* out) {
  try {
    size_t used = 0;
    float v = std::stof(text, &used);
    if (used != text.size()) return Fail(flag, text, "a number");
    *out = v;
    return true;
  } catch (const std::exception&) {
    return Fail(flag, text, "a number");
  }
}

bool ParseIdList(const std::string& text, std::vector<int32_t>* ids) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int32_t id = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      return Fail("--prompt-ids", text, "comma-separated token ids such as 1,2,3");
    }
    ids->push_back(id);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return true;
}

// Flags -> engine options and sampling; false after printing why.
bool ToOptions(const GenerateFlags& f, engine::EngineOptions* eo, engine::SamplingParams* sp) {
  if (f.model.empty()) {
    std::fprintf(stderr, "generate: --model DIR is required\n");
    return false;
  }
  if (f.prompt.has_value() == f.prompt_ids.has_value()) {
    std::fprintf(stderr, "generate: give exactly one of --prompt TEXT and --prompt-ids 1,2,3\n");
    return false;
  }
  if (!ParseInt("--max-tokens", f.max_tokens, 1, &sp->max_tokens) ||
      !ParseFloat("--temperature", f.temperature, &sp->temperature) ||
      !ParseFloat("--top-p", f.top_p, &sp->top_p) ||
      !ParseInt("--top-k", f.top_k, -1, &sp->top_k) ||
      !ParseInt("--threads", f.threads, 0, &eo->runner.num_threads) ||
      !ParseInt("--tensor-parallel-size", f.tensor_parallel_size, 1,
                &eo->runner.tensor_parallel_size) ||
      !ParseInt("--page-size", f.page_size, 1, &eo->runner.kv.page_size)) {
    return false;
  }
  if (f.seed) {
    uint64_t seed = 0;
    if (!ParseInt("--seed", *f.seed, uint64_t{0}, &seed)) return false;
    sp->seed = seed;
  }
  auto layout = engine::ParseKvLayout(f.kv_layout);
  if (!layout.ok()) return Fail("--kv-layout", f.kv_layout, "hnd or nhd");
  auto dtype = engine::ParseKvDType(f.kv_dtype);
  if (!dtype.ok()) return Fail("--kv-dtype", f.kv_dtype, "f32, bf16 or fp8_e4m3");
  eo->runner.kv.layout = *layout;
  eo->runner.kv.dtype = *dtype;
  auto matmul = engine::ParseMatmulPrecision(f.matmul);
  if (!matmul.ok()) return Fail("--matmul", f.matmul, "f32 or bf16");
  eo->runner.matmul = *matmul;
  WarnIfMatmulFallsBack("generate", *matmul);
  sp->ignore_eos = f.ignore_eos;
  sp->logprobs = 0;  // the chosen token's logprob, for --json
  return true;
}

struct Completion {
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
  engine::FinishReason finish = engine::FinishReason::kNone;
  Status error;
};

// Runs the engine until the one request is done.
Result<Completion> RunToCompletion(engine::Engine& engine, engine::Request request) {
  RETURN_IF_ERROR(engine.AddRequest(std::move(request)));
  Completion c;
  while (engine.HasWork()) {
    ASSIGN_OR_RETURN(std::vector<engine::RequestOutput> outputs, engine.Step());
    for (const engine::RequestOutput& out : outputs) {
      c.token_ids.insert(c.token_ids.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      for (const engine::TokenLogprob& lp : out.logprobs) c.logprobs.push_back(lp.logprob);
      if (out.finished()) {
        c.finish = out.finish_reason;
        c.error = out.error;
      }
    }
  }
  if (c.finish == engine::FinishReason::kError) return c.error;
  return c;
}

int RunGenerate(const GenerateFlags& flags) {
  engine::EngineOptions options;
  engine::Request request;
  if (!ToOptions(flags, &options, &request.sampling)) return kUsageError;
  if (flags.prompt_ids && !ParseIdList(*flags.prompt_ids, &request.prompt_ids)) return kUsageError;

  auto weights = model::LoadModelWeights(flags.model);
  if (!weights.ok()) {
    std::fprintf(stderr, "generate: %s\n", weights.status().ToString().c_str());
    return kRunError;
  }
  auto tokenizer = model::Tokenizer::Load(flags.model);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "generate: %s\n", tokenizer.status().ToString().c_str());
    return kRunError;
  }
  const model::Tokenizer& tok = **tokenizer;
  if (flags.prompt) {
    request.prompt_ids = tok.Encode(*flags.prompt);
    // BOS as HF's tokenizer adds it: Llama 3's post-processor and DeepSeek-V3's add_bos_token do,
    // Qwen's tokenizers do not (the server's EncodePrompt follows the same rule).
    auto bos = tok.bos_token_id();
    if (tok.adds_bos_token() && bos &&
        (request.prompt_ids.empty() || request.prompt_ids.front() != *bos)) {
      request.prompt_ids.insert(request.prompt_ids.begin(), *bos);
    }
  }
  // A chat model's end-of-turn token (tokenizer_config's eos) also ends the completion.
  auto eos = tok.eos_token_id();
  if (eos && *eos != weights->config.eos_token_id && !request.sampling.ignore_eos) {
    request.sampling.stop_token_ids.push_back(*eos);
  }

  auto engine = engine::Engine::Create(*weights, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "generate: %s\n", engine.status().ToString().c_str());
    return kRunError;
  }
  auto completion = RunToCompletion(**engine, std::move(request));
  if (!completion.ok()) {
    std::fprintf(stderr, "generate: %s\n", completion.status().ToString().c_str());
    return kRunError;
  }
  auto text = tok.Decode(completion->token_ids, /*skip_special=*/true);
  if (!text.ok()) {
    std::fprintf(stderr, "generate: %s\n", text.status().ToString().c_str());
    return kRunError;
  }
  if (flags.json) {
    nlohmann::json j;
    j["token_ids"] = completion->token_ids;
    j["logprobs"] = completion->logprobs;
    j["text"] = *text;
    j["finish_reason"] = std::string(engine::FinishReasonName(completion->finish));
    // Invalid UTF-8 (a completion cut inside a character) is replaced, never thrown.
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s\n", text->c_str());
  }
  return 0;
}

}  // namespace

PD_REGISTER_COMMAND(generate, "Generate a completion offline", [](CLI::App* app) {
  auto f = std::make_shared<GenerateFlags>();
  app->add_option("--model", f->model, "model directory (config.json, safetensors, tokenizer)");
  app->add_option("--prompt", f->prompt, "prompt text");
  app->add_option("--prompt-ids", f->prompt_ids, "prompt token ids, e.g. 1,2,3");
  app->add_option("--max-tokens", f->max_tokens, "tokens to generate")->capture_default_str();
  app->add_option("--temperature", f->temperature, "0: greedy")->capture_default_str();
  app->add_option("--top-p", f->top_p, "nucleus sampling mass, (0, 1]")->capture_default_str();
  app->add_option("--top-k", f->top_k, "0 or -1: off")->capture_default_str();
  app->add_option("--seed", f->seed, "sampling seed");
  app->add_flag("--ignore-eos", f->ignore_eos, "keep generating after EOS");
  app->add_flag("--json", f->json, "print one JSON object");
  app->add_option("--threads", f->threads, "threads per rank (0: all cores / ranks)")
      ->capture_default_str();
  app->add_option("--tensor-parallel-size", f->tensor_parallel_size,
                  "ranks (threads) splitting heads, KV heads and MLP columns")
      ->capture_default_str();
  app->add_option("--page-size", f->page_size, "KV page size in tokens")->capture_default_str();
  app->add_option("--kv-layout", f->kv_layout, "hnd | nhd")->capture_default_str();
  app->add_option("--kv-dtype", f->kv_dtype, "f32 | bf16 | fp8_e4m3 (alias fp8)")
      ->capture_default_str();
  app->add_option("--matmul", f->matmul, kMatmulFlagHelp)->capture_default_str();
  return [f] { return RunGenerate(*f); };
});

}  // namespace pd::apps
