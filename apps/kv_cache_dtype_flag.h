// --kv-cache-dtype of `serve` and `up` (vLLM's flag name): the KV cache's element type. Prefill
// and decode instances must agree (their handshake refuses a mismatch naming kv_dtype); bfloat16
// halves the KV bytes a transfer moves.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/kv_cache.h"

namespace pd::apps {

inline constexpr const char* kKvCacheDTypeFlagHelp =
    "auto | float32 | bfloat16 (auto: float32, the precision activations are computed in); "
    "prefill and decode instances must agree; bfloat16 halves the KV bytes transferred";

// Adds --kv-cache-dtype to app, its value checked (a bad one exits 2 naming the flag).
inline CLI::Option* AddKvCacheDTypeFlag(CLI::App* app, std::string* value,
                                        const std::string& help) {
  return app->add_option("--kv-cache-dtype", *value, help)
      ->check(CLI::IsMember({"auto", "float32", "bfloat16"}))
      ->capture_default_str();
}

// The dtype of a value AddKvCacheDTypeFlag has checked.
inline engine::KvDType CheckedKvCacheDType(const std::string& value) {
  return value == "bfloat16" ? engine::KvDType::kBF16 : engine::KvDType::kF32;
}

}  // namespace pd::apps
