// A child process for end-to-end tests: fork/exec with stdout+stderr captured through a pipe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace pd::server::testing {

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();  // SIGKILLs a child that is still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool Start(const std::vector<std::string>& argv);
  // Reads output until a line contains `needle`; returns that line ("" on timeout or exit).
  std::string WaitForLine(const std::string& needle, std::chrono::milliseconds timeout);
  // Sends a signal and waits for exit; the exit code, or -1 on timeout / abnormal exit.
  int Stop(int signal, std::chrono::milliseconds timeout);
  // Waits for exit; the exit code, or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout);
  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }
  // Resident memory in KiB from /proc/PID/status (VmRSS), or -1.
  long VmRssKib() const;

 private:
  void Drain(int wait_ms);
  bool Running();  // reaps the child when it has exited
  pid_t pid_ = -1;
  int exit_code_ = -1;
  int out_fd_ = -1;
  std::string output_;
  size_t scanned_ = 0;
};

// Runs a command to completion; returns its exit code (output appended to *output).
int RunCommand(const std::vector<std::string>& argv, std::string* output,
               std::chrono::milliseconds timeout);

}  // namespace pd::server::testing
