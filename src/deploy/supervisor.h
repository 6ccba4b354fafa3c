// Supervises child processes (the instances of `pdserve up`): starts each, waits for its health
// check, and when one dies logs how (its exit code or the signal's name) and, with
// OnFailure::kRestart, starts it again after a backoff (deploy/restart_policy.h) while the others
// keep running; a restarted child is healthy again once it answers its health check. Gives up,
// with an error saying why, when a child fails too often in a row, or at the first death with
// OnFailure::kStop.
//
//   Supervisor s(options);
//   size_t k = s.Add({"prefill 0", "http://127.0.0.1:8001", process_options});
//   RETURN_IF_ERROR(s.Start(k));
//   RETURN_IF_ERROR(s.WaitHealthy({k}, 300.0));
//   while (!stop_requested) RETURN_IF_ERROR(s.Step());  // every ~100 ms
//   s.StopAll(std::chrono::seconds(10));
//
// A healthy child is not health-checked again: a child that hangs without dying is not restarted.
//
// Thread safety: none; one thread drives a supervisor (its children are its Subprocess handles).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/subprocess.h"
#include "deploy/restart_policy.h"

namespace pd::deploy {

enum class OnFailure { kRestart, kStop };

// "restart" | "stop".
Result<OnFailure> ParseOnFailure(const std::string& text);

struct ChildSpec {
  std::string name;        // "prefill 0", in every message
  std::string health_url;  // GET health_url + "/health" == 200: healthy; "": healthy once running
  SubprocessOptions process;  // run again, as is, on every restart
};

struct SupervisorOptions {
  OnFailure on_failure = OnFailure::kRestart;
  RestartPolicy policy;
  double health_poll_s = 0.1;  // between health checks of a child starting up
  // A restarted child that does not answer its health check this long is killed, and that counts
  // as a failure.
  double start_timeout_s = 300.0;
  // Each event, one line without a newline ("decode 0 (pid 12) was killed by signal 9 (SIGKILL);
  // restarting it in 0.5 s"); empty: written to stderr.
  std::function<void(const std::string&)> log;
};

class Supervisor {
 public:
  explicit Supervisor(SupervisorOptions options);
  ~Supervisor();  // StopAll(10 s)
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  size_t Add(ChildSpec spec);  // its index
  Status Start(size_t child);  // the first start: its error names the child
  // Until each of `children` is healthy (OK), one of all children dies (FailedPrecondition naming
  // it and how it ended: a first start is not retried), timeout_s passes (DeadlineExceeded) or
  // `cancelled` (checked between health checks; may be empty) says so (Cancelled).
  Status WaitHealthy(const std::vector<size_t>& children, double timeout_s,
                     const std::function<bool()>& cancelled = {});
  // One supervision step: reaps the children that died, restarts those whose backoff is over,
  // checks the health of those starting up. An error (saying which child, how it ended and why
  // this is the end) when the supervisor gives up; the children then still run: StopAll them.
  Status Step();
  // SIGTERM to every child, up to `grace` (together) for them to exit, then SIGKILL; Step does
  // nothing afterwards. Idempotent.
  void StopAll(std::chrono::milliseconds grace);

  size_t size() const { return children_.size(); }
  const ChildSpec& spec(size_t child) const { return children_[child].spec; }
  pid_t pid(size_t child) const { return children_[child].process.pid(); }
  bool healthy(size_t child) const;
  int restarts(size_t child) const { return children_[child].tracker.restarts(); }

 private:
  enum class State { kStarting, kHealthy, kWaitingToRestart };
  struct Child {
    explicit Child(ChildSpec s, const RestartPolicy& policy)
        : spec(std::move(s)), tracker(policy) {}
    ChildSpec spec;
    Subprocess process;
    State state = State::kStarting;
    RestartTracker tracker;
    double started_at = 0.0;
    double next_health_check = 0.0;
    double restart_at = 0.0;
  };

  double Now() const;
  void Log(const std::string& line) const;
  Status Spawn(Child& c);
  bool CheckHealth(Child& c);  // true when it answered 200
  // `c` died (its status reaped) or was killed for not starting: schedules its restart, or the
  // error that ends supervision.
  Status Failed(Child& c, const std::string& how);
  Status StepChild(Child& c, double now);

  const SupervisorOptions options_;
  std::vector<Child> children_;
  bool stopped_ = false;  // StopAll ran: Step does nothing
};

}  // namespace pd::deploy
