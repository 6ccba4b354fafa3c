// A child process: fork + exec of an argv, its pid, signals, a wait with a deadline, and a SIGKILL
// (then a reap) when the handle goes away with the child still running.
//
//   SubprocessOptions o;
//   o.argv = {"/bin/sh", "-c", "exit 3"};
//   ASSIGN_OR_RETURN(Subprocess child, Subprocess::Spawn(o));
//   ASSIGN_OR_RETURN(ExitStatus s, child.Wait(std::chrono::seconds(5)));  // s.code == 3
//
// Errors name the call that failed: "execve /no/such: No such file or directory" (Spawn reports a
// failed exec itself: the child writes its errno to a close-on-exec pipe), "waitpid 1234: still
// running after 50 ms". Waits sleep on a pidfd (poll), never in fixed naps, on kernels that have
// one (Linux 5.3+).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace pd {

struct SubprocessOptions {
  std::vector<std::string> argv;  // argv[0] is the program's path unless `path` is set
  std::string path;               // the file to execute ("": argv[0]); no PATH search
  // Set in the child's environment, over the parent's.
  std::vector<std::pair<std::string, std::string>> env;
  int stdout_fd = -1;  // >= 0: becomes the child's stdout (the caller still owns and closes it)
  int stderr_fd = -1;  // >= 0: becomes the child's stderr
  // Descriptors the child keeps, under the same numbers, across exec (their close-on-exec flag
  // is cleared in the child only): pass the numbers to it in argv or env.
  std::vector<int> inherit_fds;
  std::vector<int> cpus;         // non-empty: the child (and every thread it starts) runs on these
  bool die_with_parent = false;  // SIGTERM to the child when the thread that spawned it exits
};

// How a child ended: an exit code, or the signal that killed it.
struct ExitStatus {
  int code = 0;    // when signal == 0
  int signal = 0;  // the terminating signal, or 0
  bool ok() const { return signal == 0 && code == 0; }
  std::string ToString() const;  // "exited with status 3" | "was killed by signal 9 (SIGKILL)"
  bool operator==(const ExitStatus&) const = default;
};

// The child starts with every signal unblocked and default handlers for the signals the parent
// handles (ignored ones stay ignored, as exec leaves them).
//
// Thread safety: a handle belongs to one thread at a time. A child reaped through its handle is
// never signalled again (its pid may belong to another process by then).
class Subprocess {
 public:
  static Result<Subprocess> Spawn(const SubprocessOptions& options);

  Subprocess() = default;  // no process
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();  // SIGKILLs and reaps a child that is still running

  // The child's pid (kept after it is reaped, for messages); -1 for no process.
  pid_t pid() const { return pid_; }
  // Set once the child has been reaped.
  const std::optional<ExitStatus>& exit_status() const { return exit_; }
  bool running() const { return pid_ > 0 && !exit_.has_value(); }

  // kill(2). FailedPrecondition once the child has been reaped.
  Status Signal(int signal);
  // Reaps the child if it has exited: its status, or nullopt while it runs.
  Result<std::optional<ExitStatus>> Poll();
  // Waits until the child exits and reaps it; DeadlineExceeded (the child keeps running) when
  // `timeout` passes first.
  Result<ExitStatus> Wait(std::chrono::milliseconds timeout);
  // SIGKILL, then reaps.
  Result<ExitStatus> Kill();
  // SIGTERM, up to `grace` for the child to exit, then SIGKILL.
  Result<ExitStatus> Terminate(std::chrono::milliseconds grace);
  // SIGSTOP, returning once the kernel reports the child stopped; Resume sends SIGCONT.
  Status Suspend();
  Status Resume();

 private:
  Subprocess(pid_t pid, int pidfd) : pid_(pid), pidfd_(pidfd) {}
  void Reaped(int wait_status);
  Status SleepUntilExit(std::chrono::milliseconds timeout);  // returns early on exit
  void Release();  // kills and reaps a running child; closes the pidfd

  pid_t pid_ = -1;
  int pidfd_ = -1;  // -1 without pidfd support: Wait then naps between polls
  std::optional<ExitStatus> exit_;
};

}  // namespace pd
