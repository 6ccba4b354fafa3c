#include "common/log.h"

namespace pd {

void SetLogLevel(const std::string& level) { spdlog::set_level(spdlog::level::from_str(level)); }

}  // namespace pd
