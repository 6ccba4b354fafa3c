#include "planner/cpu_contention.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "common/file_util.h"

namespace pd::planner {

Result<CpuTimes> ParseSchedstat(const std::string& text) {
  unsigned long long run = 0, wait = 0, slices = 0;
  char extra = 0;
  if (std::sscanf(text.c_str(), "%llu %llu %llu %c", &run, &wait, &slices, &extra) != 3) {
    return InvalidArgument("schedstat: expected 'RUN_NS WAIT_NS SLICES', got '" + text + "'");
  }
  return CpuTimes{static_cast<double>(run) * 1e-9, static_cast<double>(wait) * 1e-9};
}

Result<ThreadCpuTimes> ProcessThreadCpuTimes(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return NotFound(dir + ": " + ec.message());
  ThreadCpuTimes out;
  for (const auto& task : it) {
    auto text = ReadFileToString(task.path().string() + "/schedstat");
    if (!text.ok()) continue;  // the thread exited meanwhile
    ASSIGN_OR_RETURN(CpuTimes t, ParseSchedstat(*text));
    out[static_cast<pid_t>(std::stol(task.path().filename().string()))] = t;
  }
  if (out.empty()) return NotFound(dir + ": no thread has a readable schedstat");
  return out;
}

Result<CpuTimes> ProcessCpuTimes(pid_t pid) {
  ASSIGN_OR_RETURN(ThreadCpuTimes threads, ProcessThreadCpuTimes(pid));
  CpuTimes sum;
  for (const auto& [tid, t] : threads) {
    sum.run_s += t.run_s;
    sum.wait_s += t.wait_s;
  }
  return sum;
}

CpuTimes BusiestThreadTimes(const ThreadCpuTimes& before, const ThreadCpuTimes& after) {
  CpuTimes best;
  bool any = false;
  for (const auto& [tid, t] : after) {
    auto b = before.find(tid);
    const CpuTimes from = b != before.end() ? b->second : CpuTimes{};
    const CpuTimes d{t.run_s - from.run_s, t.wait_s - from.wait_s};
    if (!any || d.run_s > best.run_s) best = d;
    any = true;
  }
  return best;
}

std::vector<ChildProcess> ChildrenOf(pid_t ppid) {
  std::vector<ChildProcess> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto stat = ReadFileToString(e.path().string() + "/stat");
    if (!stat.ok()) continue;
    const size_t close = stat->rfind(')');  // the command name may hold spaces and parentheses
    int parent = 0;
    char state = 0;
    if (close == std::string::npos ||
        std::sscanf(stat->c_str() + close + 1, " %c %d", &state, &parent) != 2 || parent != ppid) {
      continue;
    }
    auto cmdline = ReadFileToString(e.path().string() + "/cmdline");
    out.push_back({static_cast<pid_t>(std::stol(name)), cmdline.ok() ? *cmdline : ""});
  }
  return out;
}

}  // namespace pd::planner
