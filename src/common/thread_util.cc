#include "common/thread_util.h"

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string>

namespace pd {
namespace {

constexpr int kMaxCpu = 1024;  // CPU_SETSIZE

Result<int> ParseCpu(std::string_view text, std::string_view list) {
  int v = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < 0 ||
      v >= kMaxCpu) {
    return InvalidArgument("CPU list '" + std::string(list) + "': '" + std::string(text) +
                           "' is not a CPU number in [0, " + std::to_string(kMaxCpu) + ")");
  }
  return v;
}

}  // namespace

void SetCurrentThreadName(std::string_view name) {
  const std::string cut(name.substr(0, 15));
  pthread_setname_np(pthread_self(), cut.c_str());  // only fails for names over 15 bytes
}

Result<std::vector<int>> ParseCpuList(std::string_view list) {
  if (list.empty()) return InvalidArgument("CPU list is empty");
  std::vector<int> cpus;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string_view item = list.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    ASSIGN_OR_RETURN(int first, ParseCpu(item.substr(0, dash), list));
    int last = first;
    if (dash != std::string_view::npos) {
      ASSIGN_OR_RETURN(last, ParseCpu(item.substr(dash + 1), list));
      if (last < first) {
        return InvalidArgument("CPU list '" + std::string(list) + "': range '" + std::string(item) +
                               "' runs backwards");
      }
    }
    for (int c = first; c <= last; ++c) cpus.push_back(c);
    pos = comma + 1;
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

Status PinCurrentThread(const std::vector<int>& cpus) {
  if (cpus.empty()) return InvalidArgument("no CPU to pin the thread to");
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c < 0 || c >= kMaxCpu) return InvalidArgument("CPU " + std::to_string(c) + " out of range");
    CPU_SET(c, &set);
  }
  if (int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); rc != 0) {
    return InvalidArgument("cannot pin the thread to CPUs " + std::to_string(cpus.front()) +
                           "..: " + std::strerror(rc));
  }
  return OkStatus();
}

std::vector<int> CurrentThreadCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (pthread_getaffinity_np(pthread_self(), sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < kMaxCpu; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

namespace {

// struct sched_attr of sched_setattr(2) (glibc has no wrapper before 2.41).
struct SchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime;
  uint64_t sched_deadline;
  uint64_t sched_period;
};

}  // namespace

Status SetCurrentThreadLatencySensitive(int64_t slice_ns) {
  if (slice_ns <= 0) return InvalidArgument("slice must be positive");
  SchedAttr a{};
  if (syscall(SYS_sched_getattr, 0, &a, sizeof(a), 0) != 0)
    return Internal(std::string("sched_getattr: ") + std::strerror(errno));
  if (a.sched_policy != SCHED_OTHER) return OkStatus();  // real-time or batch: leave it
  a.size = sizeof(a);
  a.sched_flags = 0;
  a.sched_runtime = static_cast<uint64_t>(slice_ns);
  if (syscall(SYS_sched_setattr, 0, &a, 0) != 0)
    return Internal(std::string("sched_setattr: ") + std::strerror(errno));
  return OkStatus();
}

int64_t CurrentThreadSliceNs() {
  SchedAttr a{};
  if (syscall(SYS_sched_getattr, 0, &a, sizeof(a), 0) != 0) return -1;
  return static_cast<int64_t>(a.sched_runtime);
}

}  // namespace pd
