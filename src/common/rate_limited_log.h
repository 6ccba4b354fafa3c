// Rate-limited warnings: at most one line per key per interval, so that a peer sending garbage or a
// client hammering a limit cannot flood the log. The next line logged for a key says how many were
// suppressed since the last one:
//
//   PD_LOG_WARN_EVERY_N_SEC(10, peer_name, "dropped a frame from {}: {}", peer_name, reason);
//   // -> "dropped a frame from p0: bad MAC (41 suppressed)"
//
// Each expansion of the macro has its own limiter (a function-local static), so two call sites
// never suppress each other. Code that wants one limiter across call sites, or an injected clock,
// holds a RateLimitedLog and uses PD_LOG_WARN_LIMITED.
//
// Thread safety: RateLimitedLog is safe to use from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/clock.h"
#include "common/log.h"
#include "common/mutex.h"

namespace pd {

class RateLimitedLog {
 public:
  struct Options {
    double interval_s = 10.0;
    // Keys remembered at once; past this the oldest-logged key is forgotten (its next event logs).
    size_t max_keys = 1024;
  };
  explicit RateLimitedLog(double interval_s) : RateLimitedLog(Options{interval_s, 1024}) {}
  explicit RateLimitedLog(Options options, const Clock& clock = SystemClock::Get());

  // True when an event for `key` should be logged now; then `*suppressed` is the number of events
  // for `key` that were not logged since the last one that was.
  bool ShouldLog(std::string_view key, uint64_t* suppressed) EXCLUDES(mu_);

  // Events not logged since construction, over all keys.
  uint64_t total_suppressed() const EXCLUDES(mu_);
  size_t num_keys() const EXCLUDES(mu_);

 private:
  struct KeyState {
    double last_logged_s = 0.0;
    uint64_t suppressed = 0;
  };
  void ForgetOldest() REQUIRES(mu_);

  const Options options_;
  const Clock& clock_;
  mutable Mutex mu_;
  std::unordered_map<std::string, KeyState> keys_ GUARDED_BY(mu_);
  uint64_t total_suppressed_ GUARDED_BY(mu_) = 0;
};

// Appends " (N suppressed)" when N > 0 and logs at warn level.
void LogWarnWithSuppressed(const std::string& message, uint64_t suppressed);

}  // namespace pd

// Logs a warning through `limiter` (a RateLimitedLog) under `key`; the message is formatted only
// when it is logged.
#define PD_LOG_WARN_LIMITED(limiter, key, ...)                                   \
  do {                                                                           \
    uint64_t pd_rl_suppressed = 0;                                               \
    if ((limiter).ShouldLog((key), &pd_rl_suppressed)) {                         \
      ::pd::LogWarnWithSuppressed(::fmt::format(__VA_ARGS__), pd_rl_suppressed); \
    }                                                                            \
  } while (0)

// A warning logged at most once per `seconds` per `key` from this call site.
#define PD_LOG_WARN_EVERY_N_SEC(seconds, key, ...)       \
  do {                                                   \
    static ::pd::RateLimitedLog pd_rl_site{(seconds)};   \
    PD_LOG_WARN_LIMITED(pd_rl_site, (key), __VA_ARGS__); \
  } while (0)
