#include "server/auth.h"

#include <cstddef>
#include <cstdint>

namespace pd::server {

bool ConstantTimeEquals(std::string_view provided, std::string_view expected) {
  // volatile: the compiler may not turn the loop into an early-exit comparison.
  volatile uint8_t diff = provided.size() == expected.size() ? 0 : 1;
  if (expected.empty()) return provided.empty();  // depends on the (public) emptiness only
  const size_t n = expected.size();
  for (size_t i = 0, j = 0; i < provided.size(); ++i) {
    diff = diff | static_cast<uint8_t>(static_cast<uint8_t>(provided[i]) ^
                                       static_cast<uint8_t>(expected[j]));
    j = j + 1 == n ? 0 : j + 1;
  }
  return diff == 0;
}

bool BearerMatches(std::string_view authorization, std::string_view api_key) {
  constexpr std::string_view kScheme = "Bearer ";
  if (authorization.substr(0, kScheme.size()) != kScheme) return false;  // public text
  return ConstantTimeEquals(authorization.substr(kScheme.size()), api_key);
}

}  // namespace pd::server
