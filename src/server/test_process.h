// A child process for end-to-end tests (a Subprocess, common/subprocess.h) with its stdout and
// stderr captured in an unlinked temporary file, never a pipe: a chatty child never blocks on it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/subprocess.h"

namespace pd::server::testing {

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();  // the Subprocess SIGKILLs a child that is still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts argv (argv[0] a path); false when it cannot, with the reason in output().
  bool Start(const std::vector<std::string>& argv);
  // Reads output until a line contains `needle`; returns that line ("" on timeout or exit).
  std::string WaitForLine(const std::string& needle, std::chrono::milliseconds timeout);
  // Sends a signal and waits for exit; the exit code, or -1 on timeout / abnormal exit.
  int Stop(int signal, std::chrono::milliseconds timeout);
  // Waits for exit; the exit code, or -1 on timeout / abnormal exit.
  int Wait(std::chrono::milliseconds timeout);
  pid_t pid() const { return process_.pid(); }
  const std::string& output() const { return output_; }
  // Resident memory in KiB from /proc/PID/status (VmRSS), or -1.
  long VmRssKib() const;

 private:
  void Drain();  // appends what the child wrote since the last call
  Subprocess process_;
  int out_fd_ = -1;
  std::string output_;
  size_t scanned_ = 0;
};

// Runs a command to completion; returns its exit code (output appended to *output).
int RunCommand(const std::vector<std::string>& argv, std::string* output,
               std::chrono::milliseconds timeout);

}  // namespace pd::server::testing
