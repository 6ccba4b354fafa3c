#include "common/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace pd {
namespace {

void AppendEscaped(std::string* out, std::string_view s) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out->append(buf);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// Nanoseconds as microseconds with three decimals, e.g. 1234567 -> "1234.567".
void AppendMicros(std::string* out, int64_t ns) {
  char buf[40];
  const char* sign = ns < 0 ? "-" : "";
  const uint64_t a = ns < 0 ? static_cast<uint64_t>(-(ns + 1)) + 1 : static_cast<uint64_t>(ns);
  std::snprintf(buf, sizeof buf, "%s%" PRIu64 ".%03" PRIu64, sign, a / 1000, a % 1000);
  out->append(buf);
}

void AppendValue(std::string* out, const TraceValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) {
    out->append(std::to_string(*i));
  } else if (const auto* d = std::get_if<double>(&v)) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", *d);
    // JSON has no nan/inf: write them as strings.
    if (std::strpbrk(buf, "ni") != nullptr) {
      AppendEscaped(out, buf);
    } else {
      out->append(buf);
    }
  } else {
    AppendEscaped(out, std::get<std::string>(v));
  }
}

void AppendEvent(std::string* out, const TraceEvent& e) {
  out->append("{\"name\":");
  AppendEscaped(out, e.name);
  out->append(",\"cat\":");
  AppendEscaped(out, e.cat);
  out->append(",\"ph\":\"");
  out->push_back(e.ph);
  out->append("\",\"ts\":");
  AppendMicros(out, e.ts_ns);
  if (e.ph == 'X') {
    out->append(",\"dur\":");
    AppendMicros(out, e.dur_ns);
  }
  if (e.ph == 'i') out->append(",\"s\":\"t\"");
  out->append(",\"pid\":" + std::to_string(e.pid) + ",\"tid\":" + std::to_string(e.tid));
  out->append(",\"args\":{");
  for (size_t i = 0; i < e.args.size(); ++i) {
    if (i > 0) out->push_back(',');
    AppendEscaped(out, e.args[i].key);
    out->push_back(':');
    AppendValue(out, e.args[i].value);
  }
  out->append("}}");
}

void AppendMetadata(std::string* out, std::string_view name, int64_t pid, int64_t tid,
                    std::string_view value) {
  out->append("{\"name\":");
  AppendEscaped(out, name);
  out->append(",\"cat\":\"__metadata\",\"ph\":\"M\",\"ts\":0,\"pid\":" + std::to_string(pid) +
              ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"name\":");
  AppendEscaped(out, value);
  out->append("}}");
}

}  // namespace

Tracer::Tracer(TracerOptions options)
    : options_(std::move(options)), pid_(static_cast<int64_t>(getpid())) {}

int64_t Tracer::NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t Tracer::CurrentThreadId() {
  thread_local const int64_t tid = static_cast<int64_t>(syscall(SYS_gettid));
  return tid;
}

bool Tracer::Admit() {
  if (events_.size() < options_.max_events) return true;
  ++dropped_;
  return false;
}

void Tracer::Complete(std::string_view name, std::string_view cat, int64_t begin_ns, int64_t end_ns,
                      TraceArgs args) {
  TraceEvent e{std::string(name),
               std::string(cat),
               'X',
               begin_ns,
               end_ns > begin_ns ? end_ns - begin_ns : 0,
               CurrentThreadId(),
               pid_,
               std::move(args)};
  MutexLock lock(&mu_);
  if (Admit()) events_.push_back(std::move(e));
}

void Tracer::Instant(std::string_view name, std::string_view cat, TraceArgs args) {
  TraceEvent e{std::string(name), std::string(cat), 'i', NowNs(), 0, CurrentThreadId(), pid_,
               std::move(args)};
  MutexLock lock(&mu_);
  if (Admit()) events_.push_back(std::move(e));
}

void Tracer::SetThreadName(std::string_view name) {
  const int64_t tid = CurrentThreadId();
  MutexLock lock(&mu_);
  names_[tid] = std::string(name);
}

size_t Tracer::num_events() const {
  MutexLock lock(&mu_);
  return events_.size();
}

uint64_t Tracer::dropped() const {
  MutexLock lock(&mu_);
  return dropped_;
}

std::vector<TraceEvent> Tracer::Events() const {
  MutexLock lock(&mu_);
  return events_;
}

std::string Tracer::ToJson() const {
  MutexLock lock(&mu_);
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) out.append(",\n");
    first = false;
  };
  if (!options_.process_name.empty()) {
    sep();
    AppendMetadata(&out, "process_name", pid_, 0, options_.process_name);
  }
  for (const auto& [tid, name] : names_) {
    sep();
    AppendMetadata(&out, "thread_name", pid_, tid, name);
  }
  for (const TraceEvent& e : events_) {
    sep();
    AppendEvent(&out, e);
  }
  if (dropped_ > 0) {  // visible in the viewer too, at the last kept event's time
    sep();
    TraceEvent note{"trace_events_dropped",
                    "trace",
                    'i',
                    events_.empty() ? 0 : events_.back().ts_ns,
                    0,
                    0,
                    pid_,
                    TraceArgs{{"dropped", static_cast<int64_t>(dropped_)}}};
    AppendEvent(&out, note);
  }
  out.append("\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_events\":" +
             std::to_string(dropped_) + ",\"max_events\":" + std::to_string(options_.max_events) +
             ",\"clock\":\"steady_clock\"}}\n");
  return out;
}

Status Tracer::WriteToFile(const std::string& path) const {
  const std::string json = ToJson();
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return IoError("trace: cannot open " + tmp + ": " + std::strerror(errno));
  }
  const size_t written = std::fwrite(json.data(), 1, json.size(), f);
  const int write_errno = errno;
  if (written != json.size()) {
    std::fclose(f);
    std::remove(tmp.c_str());
    return IoError("trace: writing " + tmp + " failed after " + std::to_string(written) + " of " +
                   std::to_string(json.size()) + " bytes: " + std::strerror(write_errno));
  }
  if (std::fclose(f) != 0) {
    const int close_errno = errno;
    std::remove(tmp.c_str());
    return IoError("trace: closing " + tmp + " failed: " + std::strerror(close_errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(tmp.c_str());
    return IoError("trace: cannot rename " + tmp + " to " + path + ": " +
                   std::strerror(rename_errno));
  }
  return OkStatus();
}

std::string TracePathFor(const std::string& path, std::string_view tag) {
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  const bool has_ext =
      dot != std::string::npos && dot > 0 && (slash == std::string::npos || dot > slash + 1);
  if (!has_ext) return path + "." + std::string(tag);
  return path.substr(0, dot) + "." + std::string(tag) + path.substr(dot);
}

std::optional<uint64_t> TraceDroppedEvents(std::string_view trace_json) {
  // ToJson's last line: "],...,"otherData":{"dropped_events":N,"max_events":M,...}}".
  constexpr std::string_view kKey = "\"otherData\":{\"dropped_events\":";
  constexpr size_t kTail = 512;
  const std::string_view tail =
      trace_json.substr(trace_json.size() > kTail ? trace_json.size() - kTail : 0);
  const size_t at = tail.rfind(kKey);
  if (at == std::string_view::npos) return std::nullopt;
  const char* end = tail.data() + tail.size();
  uint64_t n = 0;
  const auto [next, ec] = std::from_chars(tail.data() + at + kKey.size(), end, n);
  if (ec != std::errc() || next == end || (*next != ',' && *next != '}')) return std::nullopt;
  return n;
}

}  // namespace pd
