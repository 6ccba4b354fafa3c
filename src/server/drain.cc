#include "server/drain.h"

#include <chrono>
#include <thread>

#include "common/log.h"

namespace pd::server {
namespace {

using Clock = std::chrono::steady_clock;

// Polls `in_flight` until it reaches 0 or `until`; what is left.
int WaitIdle(const std::function<int()>& in_flight, Clock::time_point until) {
  int left = in_flight();
  while (left > 0 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    left = in_flight();
  }
  return left;
}

}  // namespace

DrainReport Drain(const DrainHooks& hooks, double timeout_s, const std::string& what) {
  DrainReport report;
  const Clock::time_point start = Clock::now();
  if (hooks.begin) hooks.begin();
  report.in_flight_at_start = hooks.in_flight ? hooks.in_flight() : 0;
  PD_LOG_INFO(
      "{}: draining: new work refused, {} in flight, waiting up to {} s (--drain-timeout-s)", what,
      report.in_flight_at_start, timeout_s);
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  int left = hooks.in_flight ? WaitIdle(hooks.in_flight, deadline) : 0;
  if (left == 0 && hooks.linger_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(hooks.linger_s));
    left = hooks.in_flight ? WaitIdle(hooks.in_flight, deadline) : 0;
  }
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (left > 0) {
    report.ended_at_deadline = left;
    PD_LOG_WARN(
        "{}: drain deadline ({} s, --drain-timeout-s) passed with {} still running: "
        "ending them with an error",
        what, timeout_s, left);
    if (hooks.end_running) {
      hooks.end_running(what + " is shutting down: its drain deadline (--drain-timeout-s " +
                        std::to_string(static_cast<int>(timeout_s)) + ") passed");
      // The errors reach their clients before the process goes.
      (void)WaitIdle(hooks.in_flight, Clock::now() + std::chrono::seconds(2));
    }
  } else {
    PD_LOG_INFO("{}: drained: {} in flight at the start, all finished in {:.2f} s", what,
                report.in_flight_at_start, report.seconds);
  }
  return report;
}

}  // namespace pd::server
