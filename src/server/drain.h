// Graceful drain of one serving process (serve in any role, router), run on SIGTERM: refuse new
// work (503 with Retry-After and the kDrainingHeader, so a router sends the request elsewhere),
// wait for the work in flight to finish, and at the deadline end what is left with an error that
// says why.
//
// Thread safety: Drain blocks its caller; the hooks are called from it alone.
#pragma once

#include <functional>
#include <string>

namespace pd::server {

// On a 503 answered because the instance is draining, or by the HTTP transport to a connection it
// turned away unread (shutting down, too many connections): the request was not started, so a
// router may send it to another instance.
inline constexpr char kDrainingHeader[] = "X-Pdserve-Draining";

struct DrainHooks {
  std::function<void()> begin;     // from now on new work is refused
  std::function<int()> in_flight;  // work still running (requests, streams, transfers)
  // Ends every piece of work still running with an error carrying `why`; may be empty.
  std::function<void(const std::string& why)> end_running;
  // Once nothing is in flight, new work is still refused for this long, and whatever began
  // meanwhile is waited for: work a peer sent before it saw the first refusal reaches a process
  // that refuses it (so the peer retries elsewhere at once) instead of one that is gone.
  double linger_s = 0.0;
};

struct DrainReport {
  int in_flight_at_start = 0;
  int ended_at_deadline = 0;  // still running at the deadline: ended with an error
  double seconds = 0.0;       // from begin until nothing was left (or the deadline)
};

// Runs the drain of `what` ("serve", "router", ...) with a deadline of `timeout_s` (0: none is
// waited for) and logs its outcome.
DrainReport Drain(const DrainHooks& hooks, double timeout_s, const std::string& what);

}  // namespace pd::server
