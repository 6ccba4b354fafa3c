// `pdserve validate-sim`'s hold on the deployment it measures: the `pdserve up` child process,
// its prefill and decode instances, and how much waiting for a core stretched their work over a
// window of the run (the kernel's schedstat).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "common/status.h"
#include "planner/cpu_contention.h"

namespace pd::apps::validate_sim {

// Stops `pdserve up` (and so its instances) when it goes out of scope.
struct UpProcess {
  pid_t pid = -1;
  ~UpProcess() { Stop(); }
  void Stop() {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 300; ++i) {  // up stops its children within 10 s
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

// The bench client (this process) and the router (the `up` process; its instances are children
// with their own accounts): CPU seconds so far, the part of the load the simulator does not run.
inline double ClientRouterCpuSeconds(pid_t up_pid) {
  return planner::ProcessCpuSeconds(getpid()) + planner::ProcessCpuSeconds(up_pid);
}

// The same from the kernel's schedstat (nanoseconds, where /proc/PID/stat counts 10 ms ticks):
// for the probes, whose requests are sent from this thread and relayed by the router's
// persistent threads (threads that exited are not counted).
inline double ClientRouterRunSeconds(pid_t up_pid) {
  double s = 0;
  for (pid_t p : {getpid(), up_pid}) {
    auto t = planner::ProcessCpuTimes(p);
    if (t.ok()) s += t->run_s;
  }
  return s;
}

// The processes of the deployment `up` started.
struct Deployment {
  pid_t up = -1, prefill = -1, decode = -1;
};
inline Result<Deployment> FindInstances(pid_t up_pid) {
  Deployment d;
  d.up = up_pid;
  for (const planner::ChildProcess& c : planner::ChildrenOf(up_pid)) {
    auto has = [&c](const std::string& role) {
      return c.cmdline.find(std::string("--role") + '\0' + role + '\0') != std::string::npos;
    };
    if (has("prefill")) d.prefill = c.pid;
    if (has("decode")) d.decode = c.pid;
  }
  if (d.prefill < 0 || d.decode < 0) return NotFound("pdserve up's prefill and decode processes");
  return d;
}

// How much waiting for a core stretched each instance's work over a window (the bench client, the
// router and whatever else runs on this machine compete with the pinned instances).
struct Stretches {
  double prefill = 1.0, decode = 1.0;
};
class ContentionWindow {
 public:
  explicit ContentionWindow(const Deployment& d)
      : d_(d), p0_(Read(d.prefill)), d0_(Read(d.decode)) {}
  // The stretch of each instance's busy (compute) threads since construction.
  Stretches Finish() const {
    return {planner::BusyThreadsStretch(p0_, Read(d_.prefill)),
            planner::BusyThreadsStretch(d0_, Read(d_.decode))};
  }

 private:
  static planner::ThreadCpuTimes Read(pid_t pid) {
    auto t = planner::ProcessThreadCpuTimes(pid);
    return t.ok() ? *t : planner::ThreadCpuTimes{};
  }
  Deployment d_;
  planner::ThreadCpuTimes p0_, d0_;
};

// The threads of process `pid` (empty when unreadable).
inline planner::ThreadCpuTimes ThreadTimes(pid_t pid) {
  auto t = planner::ProcessThreadCpuTimes(pid);
  return t.ok() ? *t : planner::ThreadCpuTimes{};
}

// CPU per request over a window of sequential probe requests: the client's and router's, and
// each instance's threads' other than its compute thread (HTTP, fabric, messenger; pinned with
// it, so on its core).
struct CpuPerRequest {
  double client = 0, prefill_own = 0, decode_own = 0;
};
class CpuWindow {
 public:
  explicit CpuWindow(const Deployment& d)
      : d_(d), client0_(ClientRouterRunSeconds(d.up)), p0_(Read(d.prefill)), d0_(Read(d.decode)) {}
  CpuPerRequest PerRequest(int requests) const {
    const double n = std::max(1, requests);
    return {(ClientRouterRunSeconds(d_.up) - client0_) / n,
            planner::OtherThreadsRunSeconds(p0_, Read(d_.prefill)) / n,
            planner::OtherThreadsRunSeconds(d0_, Read(d_.decode)) / n};
  }

 private:
  static planner::ThreadCpuTimes Read(pid_t pid) {
    auto t = planner::ProcessThreadCpuTimes(pid);
    return t.ok() ? *t : planner::ThreadCpuTimes{};
  }
  Deployment d_;
  double client0_;
  planner::ThreadCpuTimes p0_, d0_;
};

}  // namespace pd::apps::validate_sim
