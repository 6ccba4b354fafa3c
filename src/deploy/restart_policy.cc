#include "deploy/restart_policy.h"

#include <algorithm>
#include <cmath>

namespace pd::deploy {

void RestartTracker::Started(double now) {
  (void)now;
  healthy_since_ = -1.0;
}

void RestartTracker::Healthy(double now) {
  if (healthy_since_ < 0) healthy_since_ = now;
}

RestartDecision RestartTracker::Exited(double now) {
  const bool stable = healthy_since_ >= 0 && now - healthy_since_ >= policy_.stable_after_s;
  healthy_since_ = -1.0;
  failures_in_a_row_ = stable ? 1 : failures_in_a_row_ + 1;
  RestartDecision d;
  d.failures_in_a_row = failures_in_a_row_;
  if (failures_in_a_row_ > policy_.max_failures_in_a_row) {
    d.give_up = true;
    return d;
  }
  const double doubled =
      policy_.initial_backoff_s * std::pow(2.0, std::min(failures_in_a_row_ - 1, 60));
  d.backoff_s = std::min(policy_.max_backoff_s, doubled);
  d.restart_at = now + d.backoff_s;
  ++restarts_;
  return d;
}

}  // namespace pd::deploy
