// Names the calling thread for `top -H`, `ps -L`, perf and debuggers ("pd-engine", "pd-fabric",
// ...). Linux keeps 15 bytes of a name; longer names are cut there.
#pragma once

#include <string_view>

namespace pd {

void SetCurrentThreadName(std::string_view name);

}  // namespace pd
