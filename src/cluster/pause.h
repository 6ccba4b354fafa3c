// The wait between the retries of a cluster background thread (MemberWatch, Registration): a
// pause that Stop cuts short.
#pragma once

#include <chrono>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace pd::cluster {

// Waits on `cv` for `seconds`, or until `*stop` (guarded by `mu`) turns true; true when not
// stopped. `mu` must be held; `cv` is the one Stop signals after setting `*stop`.
inline bool PauseUnlessStopped(Mutex* mu, CondVar* cv, const bool* stop, double seconds)
    REQUIRES(mu) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(seconds));
  while (!*stop && cv->WaitUntil(mu, until)) {
  }
  return !*stop;
}

}  // namespace pd::cluster
