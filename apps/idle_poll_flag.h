// --idle-poll-us of `serve` and `up` (engine/idle_poll.h): how long an engine loop with a core to
// itself polls for work before it sleeps.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace pd::apps {

// The default: off. In bench/disagg/run.sh --scenario low-load (3 alternating --quick pairs, 60
// requests each side), `up --idle-poll-us 20000` (the prefill's core then spins through the ~10 ms
// between one request's prefill and the next) cut PrefillRequest received -> prefill step begins
// from 0.050 to 0.013 ms (p50) and the client's read of the first token on that core from 0.071
// to 0.053 ms, but TTFT minus the prefill step moved within its noise (3.09 vs 3.03 ms): too
// little for a core spinning whenever it idles.
inline constexpr int64_t kDefaultIdlePollUs = 0;

inline Status CheckIdlePollUs(int64_t us) {
  if (us < 0 || us > 60'000'000) {
    return InvalidArgument("--idle-poll-us must be in [0, 60000000] (0: off), got " +
                           std::to_string(us));
  }
  return OkStatus();
}

}  // namespace pd::apps
