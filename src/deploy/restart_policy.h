// When a supervised child that died is started again: exponential backoff with a cap, reset once
// the child has run healthily for a while, and giving up after too many fast failures in a row.
// A pure step function over times in seconds (no clock of its own), so tests drive it directly:
//
//   RestartTracker t(RestartPolicy{});
//   t.Started(0.0);
//   RestartDecision d = t.Exited(0.3);  // d.give_up == false, d.restart_at == 0.8 (0.3 + 0.5)
//
// Thread safety: none; one supervisor thread owns each tracker.
#pragma once

namespace pd::deploy {

struct RestartPolicy {
  double initial_backoff_s = 0.5;  // after the first failure
  double max_backoff_s = 30.0;     // doubled per failure in a row, never beyond this
  // A child that was healthy and then ran this long counts as stable: its next failure starts
  // the backoff (and the count of failures in a row) over.
  double stable_after_s = 30.0;
  // This many failures in a row, none after a stable run: the supervisor gives up.
  int max_failures_in_a_row = 5;
};

struct RestartDecision {
  bool give_up = false;
  double restart_at = 0.0;  // when to start the child again (seconds, the callers' clock)
  double backoff_s = 0.0;   // restart_at - the exit time
  int failures_in_a_row = 0;
};

class RestartTracker {
 public:
  explicit RestartTracker(const RestartPolicy& policy) : policy_(policy) {}

  // The child was (re)started at `now`.
  void Started(double now);
  // It answered its health check at `now` (once per start is enough; later calls are ignored).
  void Healthy(double now);
  // It died at `now`: when to restart it, or give up.
  RestartDecision Exited(double now);

  int failures_in_a_row() const { return failures_in_a_row_; }
  int restarts() const { return restarts_; }

 private:
  const RestartPolicy policy_;
  double healthy_since_ = -1.0;  // < 0: not healthy since the last start
  int failures_in_a_row_ = 0;
  int restarts_ = 0;
};

}  // namespace pd::deploy
