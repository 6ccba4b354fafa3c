#include "server/test_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace pd::server::testing {

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
}

bool ChildProcess::Start(const std::vector<std::string>& argv) {
  // Output goes to an unlinked temporary file, never a pipe: a chatty child can never block on it.
  char path[] = "/tmp/pdserve_child_XXXXXX";
  int write_fd = ::mkstemp(path);
  if (write_fd < 0) return false;
  out_fd_ = ::open(path, O_RDONLY);
  ::unlink(path);
  pid_ = ::fork();
  if (pid_ < 0) return false;
  if (pid_ == 0) {
    ::dup2(write_fd, 1);
    ::dup2(write_fd, 2);
    ::close(write_fd);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(write_fd);
  return out_fd_ >= 0;
}

void ChildProcess::Drain(int wait_ms) {
  if (out_fd_ < 0) return;
  char buf[4096];
  bool got = false;
  for (;;) {
    ssize_t n = ::read(out_fd_, buf, sizeof(buf));
    if (n <= 0) break;
    got = true;
    output_.append(buf, static_cast<size_t>(n));
  }
  // A regular file has no readiness to wait on: back off briefly before the caller polls again.
  if (!got && wait_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
}

std::string ChildProcess::WaitForLine(const std::string& needle,
                                      std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    Drain(0);
    size_t pos = output_.find(needle, scanned_);
    if (pos != std::string::npos) {
      size_t start = output_.rfind('\n', pos);
      start = start == std::string::npos ? 0 : start + 1;
      size_t end = output_.find('\n', pos);
      if (end == std::string::npos) end = output_.size();
      scanned_ = end;
      return output_.substr(start, end - start);
    }
    if (std::chrono::steady_clock::now() > deadline || !Running()) return "";
    Drain(10);
  }
}

bool ChildProcess::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return true;
  pid_ = -1;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return false;
}

int ChildProcess::Wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (Running()) {
    if (std::chrono::steady_clock::now() > deadline) return -1;
    Drain(10);
  }
  Drain(0);
  return exit_code_;
}

int ChildProcess::Stop(int signal, std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, signal);
  return Wait(timeout);
}

long ChildProcess::VmRssKib() const {
  std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

int RunCommand(const std::vector<std::string>& argv, std::string* output,
               std::chrono::milliseconds timeout) {
  ChildProcess p;
  if (!p.Start(argv)) return -1;
  int code = p.Wait(timeout);
  if (output) *output += p.output();
  return code;
}

}  // namespace pd::server::testing
