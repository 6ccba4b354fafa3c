// Chrome trace events (the JSON that chrome://tracing and Perfetto open): complete "X" events
// with a begin and a duration, instant "i" events and thread names ("M" metadata), kept in memory
// up to a cap and written to a file at shutdown.
//
// Tracing is off when the Tracer* is null: callers test the pointer (or use TraceSpan, which
// does) before building any argument, so a disabled trace costs one branch.
//
// Timestamps are steady-clock (CLOCK_MONOTONIC) nanoseconds, the same clock in every process of
// the machine, so the files of a prefill and a decode instance can be laid side by side. The file
// gives them in microseconds ("ts", "dur"), as the format wants.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"

namespace pd {

using TraceValue = std::variant<int64_t, double, std::string>;

struct TraceArg {
  std::string key;
  TraceValue value;
};
using TraceArgs = std::vector<TraceArg>;

struct TraceEvent {
  std::string name;
  std::string cat;
  char ph = 'X';       // 'X' complete, 'i' instant
  int64_t ts_ns = 0;   // begin
  int64_t dur_ns = 0;  // 'X' only
  int64_t tid = 0;     // the recording thread's id
  int64_t pid = 0;     // the recording process's id
  TraceArgs args;
};

struct TracerOptions {
  // Events past this are dropped and counted (the first ones are kept); an event takes a few
  // hundred bytes, so the default bounds a trace to ~300 MB. (200,000 cut the decode instance's
  // trace of one `pdserve validate-sim` run at ~40% of its ~470,000 events: one per layer and
  // step; its outside-latency calibration needs the load run and prints the rounds' figures.)
  size_t max_events = 1'000'000;
  std::string process_name;  // shown for the process; empty: none
};

// Thread safety: every method may be called from any thread.
class Tracer {
 public:
  explicit Tracer(TracerOptions options = {});
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Steady-clock nanoseconds: the clock every event is on.
  static int64_t NowNs();
  // The calling thread's id as the file gives it ("tid").
  static int64_t CurrentThreadId();

  // A complete event from begin_ns to end_ns on the calling thread.
  void Complete(std::string_view name, std::string_view cat, int64_t begin_ns, int64_t end_ns,
                TraceArgs args = {}) EXCLUDES(mu_);
  // An instant event now on the calling thread.
  void Instant(std::string_view name, std::string_view cat, TraceArgs args = {}) EXCLUDES(mu_);
  // Names the calling thread in the viewer (not counted against the cap).
  void SetThreadName(std::string_view name) EXCLUDES(mu_);

  size_t num_events() const EXCLUDES(mu_);
  uint64_t dropped() const EXCLUDES(mu_);
  std::vector<TraceEvent> Events() const EXCLUDES(mu_);  // a copy, in recording order

  // {"traceEvents":[...],"otherData":{"dropped_events":N,...}}.
  std::string ToJson() const EXCLUDES(mu_);
  // Writes ToJson() to path (through path.tmp and a rename); IoError names the path and errno.
  Status WriteToFile(const std::string& path) const EXCLUDES(mu_);

 private:
  bool Admit() REQUIRES(mu_);  // room for one more event, else counts a drop

  const TracerOptions options_;
  const int64_t pid_;
  mutable Mutex mu_;
  std::vector<TraceEvent> events_ GUARDED_BY(mu_);
  std::map<int64_t, std::string> names_ GUARDED_BY(mu_);  // tid -> thread name
  uint64_t dropped_ GUARDED_BY(mu_) = 0;
};

// Records one complete event from construction to destruction; does nothing when tracer is null.
// tracer->Instant(name, cat) when there is a tracer; for code whose tracer is optional.
inline void TraceInstant(Tracer* tracer, std::string_view name, std::string_view cat) {
  if (tracer != nullptr) tracer->Instant(name, cat);
}

class TraceSpan {
 public:
  TraceSpan(Tracer* tracer, std::string_view name, std::string_view cat)
      : tracer_(tracer), name_(name), cat_(cat), begin_ns_(tracer ? Tracer::NowNs() : 0) {}
  ~TraceSpan() {
    if (tracer_ != nullptr) tracer_->Complete(name_, cat_, begin_ns_, Tracer::NowNs(), args_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

  bool enabled() const { return tracer_ != nullptr; }
  // Adds an argument (call only when enabled() to skip building it otherwise).
  void Arg(std::string key, TraceValue value) {
    if (tracer_ != nullptr) args_.push_back({std::move(key), std::move(value)});
  }

 private:
  Tracer* tracer_;
  std::string_view name_;
  std::string_view cat_;
  int64_t begin_ns_;
  TraceArgs args_;
};

// FILE with `tag` inserted before its extension: ("t.json", "prefill0") -> "t.prefill0.json";
// a name without an extension gets ".tag" appended.
std::string TracePathFor(const std::string& path, std::string_view tag);

// The events a trace file (Tracer::ToJson) says it dropped (its otherData.dropped_events), read
// off the file's tail without parsing the whole of it (a trace runs to hundreds of MB); nullopt
// when the tail holds no such count (not a Tracer's file, or cut short).
std::optional<uint64_t> TraceDroppedEvents(std::string_view trace_json);

}  // namespace pd
