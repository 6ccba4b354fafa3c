// Logging through spdlog. Call sites use PD_LOG_INFO("loaded {} tensors", n).
#pragma once

#include <spdlog/spdlog.h>

namespace pd {
// Sets the global level from a name: trace, debug, info, warn, error, off. Unknown names keep info.
void SetLogLevel(const std::string& level);
}  // namespace pd

#define PD_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define PD_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define PD_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define PD_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
