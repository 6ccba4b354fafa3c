#include "server/test_process.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace pd::server::testing {
namespace {

// How long a wait sleeps between reads of the output file (a regular file has no readiness to
// wait on); the child's exit ends the sleep at once.
constexpr std::chrono::milliseconds kReadPeriod(10);

}  // namespace

ChildProcess::~ChildProcess() {
  if (out_fd_ >= 0) ::close(out_fd_);
}

bool ChildProcess::Start(const std::vector<std::string>& argv) {
  char path[] = "/tmp/pdserve_child_XXXXXX";
  const int write_fd = ::mkstemp(path);
  if (write_fd < 0) {
    output_ = "mkstemp failed";
    return false;
  }
  out_fd_ = ::open(path, O_RDONLY | O_CLOEXEC);
  ::unlink(path);
  SubprocessOptions o;
  o.argv = argv;
  o.stdout_fd = write_fd;
  o.stderr_fd = write_fd;
  Result<Subprocess> p = Subprocess::Spawn(o);
  ::close(write_fd);
  if (!p.ok()) {
    output_ = p.status().ToString();
    return false;
  }
  process_ = std::move(p).value();
  return out_fd_ >= 0;
}

void ChildProcess::Drain() {
  if (out_fd_ < 0) return;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(out_fd_, buf, sizeof(buf));
    if (n <= 0) break;
    output_.append(buf, static_cast<size_t>(n));
  }
}

std::string ChildProcess::WaitForLine(const std::string& needle,
                                      std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    Drain();
    size_t pos = output_.find(needle, scanned_);
    if (pos != std::string::npos) {
      size_t start = output_.rfind('\n', pos);
      start = start == std::string::npos ? 0 : start + 1;
      size_t end = output_.find('\n', pos);
      if (end == std::string::npos) end = output_.size();
      scanned_ = end;
      return output_.substr(start, end - start);
    }
    if (std::chrono::steady_clock::now() > deadline || !process_.running()) return "";
    (void)process_.Wait(kReadPeriod);
  }
}

int ChildProcess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    Drain();
    Result<ExitStatus> status = process_.Wait(kReadPeriod);
    if (status.ok()) {
      Drain();
      return status->signal == 0 ? status->code : -1;
    }
    if (status.status().code() != StatusCode::kDeadlineExceeded ||
        std::chrono::steady_clock::now() > deadline) {
      return -1;
    }
  }
}

int ChildProcess::Stop(int signal, std::chrono::milliseconds timeout) {
  if (!process_.Signal(signal).ok()) return -1;
  return Wait(timeout);
}

long ChildProcess::VmRssKib() const {
  std::ifstream f("/proc/" + std::to_string(process_.pid()) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

int RunCommand(const std::vector<std::string>& argv, std::string* output,
               std::chrono::milliseconds timeout) {
  ChildProcess p;
  const bool started = p.Start(argv);
  const int code = started ? p.Wait(timeout) : -1;
  if (output) *output += p.output();
  return code;
}

}  // namespace pd::server::testing
