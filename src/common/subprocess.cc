#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;

namespace pd {
namespace {

// Everything the child needs, built before fork: between fork and exec the child of a threaded
// process may only make async-signal-safe calls (no allocation).
struct ChildPlan {
  const char* path = nullptr;
  std::vector<char*> argv;
  std::vector<std::string> env_storage;
  std::vector<char*> envp;
  int stdout_fd = -1;
  int stderr_fd = -1;
  const std::vector<int>* inherit_fds = nullptr;
  bool pin = false;
  cpu_set_t cpus;
  bool die_with_parent = false;
  pid_t parent = 0;
};

// What the child reports through the pipe when a step before exec (or exec itself) fails.
enum class ChildStep : int { kDup2, kInheritFd, kSetAffinity, kDeathSignal, kExec };
struct ChildError {
  ChildStep step = ChildStep::kExec;
  int err = 0;
};

const char* StepName(ChildStep step) {
  switch (step) {
    case ChildStep::kDup2:
      return "dup2";
    case ChildStep::kInheritFd:
      return "fcntl(F_SETFD)";
    case ChildStep::kSetAffinity:
      return "sched_setaffinity";
    case ChildStep::kDeathSignal:
      return "prctl(PR_SET_PDEATHSIG)";
    case ChildStep::kExec:
      return "execve";
  }
  return "?";
}

Status ErrnoStatus(const std::string& call, int err) {
  const std::string message = call + ": " + std::strerror(err);
  return err == ENOENT ? NotFound(message) : Internal(message);
}

std::vector<std::string> MergedEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view key = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [k, v] : overrides) replaced = replaced || k == key;
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [k, v] : overrides) env.push_back(k + "=" + v);
  return env;
}

[[noreturn]] void Fail(int err_fd, ChildStep step) {
  const ChildError e{step, errno};
  ssize_t n = ::write(err_fd, &e, sizeof(e));
  (void)n;
  ::_exit(127);
}

// Makes `fd` the child's descriptor `target` (kept across exec).
void Redirect(int fd, int target, int err_fd) {
  if (fd < 0) return;
  if (fd == target) {
    if (::fcntl(fd, F_SETFD, 0) != 0) Fail(err_fd, ChildStep::kInheritFd);
  } else if (::dup2(fd, target) < 0) {
    Fail(err_fd, ChildStep::kDup2);
  }
}

// The child between fork and exec: async-signal-safe calls only.
[[noreturn]] void RunChild(const ChildPlan& plan, int err_fd) {
  if (plan.die_with_parent) {
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) Fail(err_fd, ChildStep::kDeathSignal);
    if (::getppid() != plan.parent) ::_exit(127);  // the parent died before prctl
  }
  Redirect(plan.stdout_fd, STDOUT_FILENO, err_fd);
  Redirect(plan.stderr_fd, STDERR_FILENO, err_fd);
  for (int fd : *plan.inherit_fds) {
    if (::fcntl(fd, F_SETFD, 0) != 0) Fail(err_fd, ChildStep::kInheritFd);
  }
  if (plan.pin && ::sched_setaffinity(0, sizeof(plan.cpus), &plan.cpus) != 0) {
    Fail(err_fd, ChildStep::kSetAffinity);
  }
  // Default handlers for the signals the parent handles, then every signal unblocked (the parent
  // blocked them all across fork).
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction sa;
    if (::sigaction(sig, nullptr, &sa) != 0) continue;
    if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN) continue;
    sa.sa_handler = SIG_DFL;
    sa.sa_flags = 0;
    ::sigaction(sig, &sa, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(plan.path, plan.argv.data(), plan.envp.data());
  Fail(err_fd, ChildStep::kExec);
}

// Fills `plan` in place: its argv and envp point into the options and into its own strings.
void MakePlan(const SubprocessOptions& o, ChildPlan* plan) {
  plan->path = o.path.empty() ? o.argv[0].c_str() : o.path.c_str();
  for (const std::string& a : o.argv) plan->argv.push_back(const_cast<char*>(a.c_str()));
  plan->argv.push_back(nullptr);
  plan->env_storage = MergedEnvironment(o.env);
  for (std::string& e : plan->env_storage) plan->envp.push_back(e.data());
  plan->envp.push_back(nullptr);
  plan->stdout_fd = o.stdout_fd;
  plan->stderr_fd = o.stderr_fd;
  plan->inherit_fds = &o.inherit_fds;
  plan->pin = !o.cpus.empty();
  CPU_ZERO(&plan->cpus);
  for (int cpu : o.cpus) CPU_SET(cpu, &plan->cpus);
  plan->die_with_parent = o.die_with_parent;
  plan->parent = ::getpid();
}

// Reads the child's report: nullopt when the pipe closed empty (exec succeeded).
std::optional<ChildError> ReadChildError(int fd) {
  ChildError e;
  size_t got = 0;
  while (got < sizeof(e)) {
    ssize_t n = ::read(fd, reinterpret_cast<char*>(&e) + got, sizeof(e) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got < sizeof(e)) return std::nullopt;
  return e;
}

int PidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

}  // namespace

std::string ExitStatus::ToString() const {
  if (signal != 0) {
    const char* name = ::sigabbrev_np(signal);  // "KILL"
    return "was killed by signal " + std::to_string(signal) +
           (name != nullptr ? std::string(" (SIG") + name + ")" : std::string());
  }
  return "exited with status " + std::to_string(code);
}

Result<Subprocess> Subprocess::Spawn(const SubprocessOptions& options) {
  if (options.argv.empty()) return InvalidArgument("Subprocess: argv is empty");
  for (int cpu : options.cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) {
      return InvalidArgument("Subprocess: cpu " + std::to_string(cpu) + " is out of range");
    }
  }
  ChildPlan plan;
  MakePlan(options, &plan);
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) return ErrnoStatus("pipe2", errno);
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);  // no parent handler may run in the child
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(err_pipe[0]);
    RunChild(plan, err_pipe[1]);
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ::close(err_pipe[1]);
  if (pid < 0) {
    ::close(err_pipe[0]);
    return ErrnoStatus("fork", fork_errno);
  }
  const std::optional<ChildError> failed = ReadChildError(err_pipe[0]);
  ::close(err_pipe[0]);
  if (failed.has_value()) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    std::string call = StepName(failed->step);
    if (failed->step == ChildStep::kExec) call += std::string(" ") + plan.path;
    return ErrnoStatus(call, failed->err);
  }
  return Subprocess(pid, PidfdOpen(pid));
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      pidfd_(std::exchange(other.pidfd_, -1)),
      exit_(std::exchange(other.exit_, std::nullopt)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    Release();
    pid_ = std::exchange(other.pid_, -1);
    pidfd_ = std::exchange(other.pidfd_, -1);
    exit_ = std::exchange(other.exit_, std::nullopt);
  }
  return *this;
}

Subprocess::~Subprocess() { Release(); }

void Subprocess::Release() {
  if (running()) (void)Kill();
  if (pidfd_ >= 0) ::close(pidfd_);
  pidfd_ = -1;
}

void Subprocess::Reaped(int wait_status) {
  ExitStatus s;
  if (WIFSIGNALED(wait_status)) {
    s.signal = WTERMSIG(wait_status);
  } else {
    s.code = WEXITSTATUS(wait_status);
  }
  exit_ = s;
  if (pidfd_ >= 0) ::close(pidfd_);
  pidfd_ = -1;
}

Status Subprocess::Signal(int signal) {
  if (pid_ <= 0) return FailedPrecondition("Subprocess: no process to signal");
  if (exit_.has_value()) {
    return FailedPrecondition("kill " + std::to_string(pid_) + ": the process " +
                              exit_->ToString() + " and was reaped");
  }
  if (::kill(pid_, signal) != 0) {
    return ErrnoStatus("kill " + std::to_string(pid_) + " signal " + std::to_string(signal), errno);
  }
  return OkStatus();
}

Result<std::optional<ExitStatus>> Subprocess::Poll() {
  if (exit_.has_value()) return exit_;
  if (pid_ <= 0) return FailedPrecondition("Subprocess: no process to wait for");
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      Reaped(status);
      return exit_;
    }
    if (r == 0) return std::optional<ExitStatus>();
    if (errno != EINTR) return ErrnoStatus("waitpid " + std::to_string(pid_), errno);
  }
}

Status Subprocess::SleepUntilExit(std::chrono::milliseconds timeout) {
  if (pidfd_ < 0) {  // no pidfd: a short nap, then the caller polls again
    std::this_thread::sleep_for(std::min(timeout, std::chrono::milliseconds(2)));
    return OkStatus();
  }
  pollfd p{pidfd_, POLLIN, 0};
  const int ms = static_cast<int>(std::min<int64_t>(timeout.count(), 1 << 30));
  if (::poll(&p, 1, ms) < 0 && errno != EINTR) {
    return ErrnoStatus("poll pidfd of " + std::to_string(pid_), errno);
  }
  return OkStatus();
}

Result<ExitStatus> Subprocess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ASSIGN_OR_RETURN(std::optional<ExitStatus> status, Poll());
    if (status.has_value()) return *status;
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return DeadlineExceeded("waitpid " + std::to_string(pid_) + ": still running after " +
                              std::to_string(timeout.count()) + " ms");
    }
    RETURN_IF_ERROR(SleepUntilExit(left));
  }
}

Result<ExitStatus> Subprocess::Kill() {
  if (exit_.has_value()) return *exit_;
  RETURN_IF_ERROR(Signal(SIGKILL));
  for (;;) {
    int status = 0;
    if (::waitpid(pid_, &status, 0) == pid_) {
      Reaped(status);
      return *exit_;
    }
    if (errno != EINTR) return ErrnoStatus("waitpid " + std::to_string(pid_), errno);
  }
}

Result<ExitStatus> Subprocess::Terminate(std::chrono::milliseconds grace) {
  if (exit_.has_value()) return *exit_;
  RETURN_IF_ERROR(Signal(SIGTERM));
  Result<ExitStatus> status = Wait(grace);
  if (status.ok() || status.status().code() != StatusCode::kDeadlineExceeded) return status;
  return Kill();
}

Status Subprocess::Suspend() {
  RETURN_IF_ERROR(Signal(SIGSTOP));
  for (;;) {
    int status = 0;
    if (::waitpid(pid_, &status, WUNTRACED) == pid_) {
      if (WIFSTOPPED(status)) return OkStatus();
      Reaped(status);
      return FailedPrecondition("waitpid " + std::to_string(pid_) + ": the process " +
                                exit_->ToString() + " instead of stopping");
    }
    if (errno != EINTR) return ErrnoStatus("waitpid " + std::to_string(pid_), errno);
  }
}

Status Subprocess::Resume() { return Signal(SIGCONT); }

}  // namespace pd
