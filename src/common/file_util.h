// Small file helpers that return Status instead of throwing.
#pragma once

#include <string>

#include "common/status.h"

namespace pd {

Result<std::string> ReadFileToString(const std::string& path);
Status WriteStringToFile(const std::string& path, const std::string& contents);

}  // namespace pd
