// --kv-cache-dtype of `serve` and `up` (vLLM's flag name): the KV cache's element type. Prefill
// and decode instances must agree (their handshake refuses a mismatch naming kv_dtype, or for
// fp8_e4m3 different checkpoint scales, naming kv_scales); bfloat16 halves the KV bytes a transfer
// moves, fp8_e4m3 (alias fp8, as in vLLM) halves them again.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/kv_cache.h"

namespace pd::apps {

inline constexpr const char* kKvCacheDTypeFlagHelp =
    "auto | float32 | bfloat16 | fp8_e4m3 | fp8 (auto: float32, the precision activations are "
    "computed in; fp8 = fp8_e4m3 with the checkpoint's k_scale/v_scale, else 1.0); prefill and "
    "decode instances must agree; bfloat16 halves the KV bytes transferred, fp8_e4m3 quarters them";

// Adds --kv-cache-dtype to app, its value checked (a bad one exits 2 naming the flag).
inline CLI::Option* AddKvCacheDTypeFlag(CLI::App* app, std::string* value,
                                        const std::string& help) {
  return app->add_option("--kv-cache-dtype", *value, help)
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "fp8_e4m3", "fp8"}))
      ->capture_default_str();
}

// The dtype of a value AddKvCacheDTypeFlag has checked.
inline engine::KvDType CheckedKvCacheDType(const std::string& value) {
  if (value == "bfloat16") return engine::KvDType::kBF16;
  if (value == "fp8_e4m3" || value == "fp8") return engine::KvDType::kFP8E4M3;
  return engine::KvDType::kF32;
}

}  // namespace pd::apps
