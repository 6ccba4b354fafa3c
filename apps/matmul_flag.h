// --matmul of `generate`, `serve`, `up`, `profile` and `validate-sim` (engine::MatmulPrecision):
// whether the matmuls over bf16 weights keep x in f32 (exact products, the default) or round it to
// bf16 for the CPU's bf16 dot products.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "engine/model_runner.h"

namespace pd::apps {

inline constexpr const char* kMatmulFlagHelp =
    "f32: x kept f32, exact products (outputs as without this flag) | bf16: x rounded to bf16, "
    "AVX-512 BF16 dot products (up to 2x prefill and large decode batches where the CPU runs "
    "vdpbf16ps at full rate; see bench-engine)";

// Adds --matmul to app, its value checked to be f32 or bf16 (a bad one exits 2 naming the flag).
inline CLI::Option* AddMatmulFlag(CLI::App* app, std::string* value, const std::string& help) {
  return app->add_option("--matmul", *value, help)
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
}

// The precision of a value AddMatmulFlag has checked.
inline engine::MatmulPrecision CheckedMatmul(const std::string& value) {
  return engine::ParseMatmulPrecision(value).value();
}

// Says on stderr when bf16 was asked for but the CPU has no AVX512_BF16 (the engine keeps f32).
inline void WarnIfMatmulFallsBack(const char* command, engine::MatmulPrecision p) {
  if (p == engine::MatmulPrecision::kBf16 &&
      !engine::MatmulBf16DotUsed(engine::KernelKind::kFast, p)) {
    std::fprintf(stderr, "%s: --matmul bf16: this CPU has no AVX512_BF16; matmuls stay f32\n",
                 command);
  }
}

}  // namespace pd::apps
