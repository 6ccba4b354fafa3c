#include "common/rate_limited_log.h"

namespace pd {

RateLimitedLog::RateLimitedLog(Options options, const Clock& clock)
    : options_(options), clock_(clock) {}

bool RateLimitedLog::ShouldLog(std::string_view key, uint64_t* suppressed) {
  const double now = clock_.NowSeconds();
  MutexLock lock(&mu_);
  auto it = keys_.find(std::string(key));
  if (it == keys_.end()) {
    if (options_.max_keys > 0 && keys_.size() >= options_.max_keys) ForgetOldest();
    keys_.emplace(std::string(key), KeyState{now, 0});
    *suppressed = 0;
    return true;
  }
  KeyState& state = it->second;
  if (now - state.last_logged_s < options_.interval_s) {
    ++state.suppressed;
    ++total_suppressed_;
    return false;
  }
  *suppressed = state.suppressed;
  state = KeyState{now, 0};
  return true;
}

// Linear in the number of keys, and only reached when a new key arrives with the table full.
void RateLimitedLog::ForgetOldest() {
  auto oldest = keys_.begin();
  for (auto it = keys_.begin(); it != keys_.end(); ++it) {
    if (it->second.last_logged_s < oldest->second.last_logged_s) oldest = it;
  }
  if (oldest != keys_.end()) keys_.erase(oldest);
}

uint64_t RateLimitedLog::total_suppressed() const {
  MutexLock lock(&mu_);
  return total_suppressed_;
}

size_t RateLimitedLog::num_keys() const {
  MutexLock lock(&mu_);
  return keys_.size();
}

void LogWarnWithSuppressed(const std::string& message, uint64_t suppressed) {
  if (suppressed == 0) {
    PD_LOG_WARN("{}", message);
  } else {
    PD_LOG_WARN("{} ({} suppressed)", message, suppressed);
  }
}

}  // namespace pd
