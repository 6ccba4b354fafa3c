// `pdserve validate-sim`'s hold on the deployment it measures: the `pdserve up` child process,
// its prefill and decode instances, and how much waiting for a core stretched their work over a
// window of the run (the kernel's schedstat).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "apps/validate_sim_flags.h"
#include "bench/client.h"
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

// The instances' trace cap (`up --trace-max-events`). The decode instance records an event per
// engine step and per layer of it: a run of 600-request rounds traced ~0.93 M events in its
// three rounds, and `up`'s default cap of 1 M cut the decode trace inside the last calibration
// run at the highest rate (2026-12-01), whose round was then simulated with the load run's
// decode figures; five rounds trace ~1.6 M. Memory is taken only by the events recorded (a few
// hundred bytes each); the cap only bounds a runaway.
inline constexpr int64_t kValidateTraceMaxEvents = 8'000'000;

// Starts `pdserve up` (1 prefill + 1 decode) as a child process, its output to f.up_log, and
// waits until its router answers (300 s at most).
inline Status StartUp(const ValidateFlags& f, UpProcess* up) {
  std::vector<std::string> args = {"pdserve",
                                   "up",
                                   "--model",
                                   f.model,
                                   "--prefill",
                                   "1",
                                   "--decode",
                                   "1",
                                   "--threads",
                                   std::to_string(f.threads),
                                   "--port",
                                   std::to_string(f.port),
                                   "--max-num-seqs",
                                   std::to_string(f.max_num_seqs),
                                   "--max-num-batched-tokens",
                                   std::to_string(f.max_num_batched_tokens),
                                   "--matmul",
                                   f.matmul};
  // Whole instances pinned: the simulator models instances that do not disturb each other, and
  // with only two cores the decode instance's streaming threads would otherwise run on the
  // prefill core (measured: attainment 82-84% vs 92-96% at ~18 req/s).
  if (f.pin_cores) args.insert(args.end(), {"--pin-cores", "--pin-whole-instances"});
  if (!f.trace.empty()) {
    args.insert(args.end(), {"--trace", f.trace, "--trace-max-events",
                             std::to_string(kValidateTraceMaxEvents)});
  }
  const int log = open(f.up_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (log < 0) return IoError(f.up_log + ": " + std::strerror(errno));
  up->pid = fork();
  if (up->pid < 0) return Internal(std::string("fork: ") + std::strerror(errno));
  if (up->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    dup2(log, 1);
    dup2(log, 2);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(log);
  bench::Endpoint ep;
  ep.port = f.port;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < end) {
    int status = 0;
    if (waitpid(up->pid, &status, WNOHANG) == up->pid) {
      up->pid = -1;
      return Unavailable("pdserve up exited during start-up; see " + f.up_log);
    }
    if (bench::GetServerInfo(ep).ok()) return OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return DeadlineExceeded("pdserve up did not answer within 300 s; see " + f.up_log);
}

}  // namespace pd::apps::validate_sim
