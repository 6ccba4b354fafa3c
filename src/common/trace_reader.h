// Reading Chrome trace-event JSON (what Tracer::ToJson writes, common/trace.h) back into
// TraceEvents, for the tools that analyse a --trace file: trace-summary, the planner's
// calibration from traces, the tests that check what an instance traced.
//
//   ASSIGN_OR_RETURN(std::vector<TraceEvent> events, ReadTraceEvents("t.prefill0.json"));
//   for (const TraceEvent& e : events)
//     if (e.name == "layer") layer = TraceArgInt(e, "layer").value_or(-1);
//
// Every event of the file's "traceEvents" array comes back, in file order, metadata ('M') events
// included; "ts"/"dur" (microseconds in the file) become ts_ns/dur_ns; "pid" and "tid" are kept.
// Argument values: JSON integers become int64_t, other numbers double, strings std::string, and
// anything else (true, null, an array or object) its JSON text. The otherData counts are not
// events: TraceDroppedEvents (trace.h) reads the dropped count off the file's tail.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/trace.h"

namespace pd {

// InvalidArgument naming what is wrong: not JSON, no "traceEvents" array, or an event that is
// not an object, lacks a one-letter "ph", lacks a numeric "ts" (metadata may) or has "args" that
// is not an object.
Result<std::vector<TraceEvent>> ParseTraceEvents(std::string_view json_text);
// The file's events; errors name the path.
Result<std::vector<TraceEvent>> ReadTraceEvents(const std::string& path);

// The argument `key` of the event, or null.
const TraceValue* FindTraceArg(const TraceEvent& e, std::string_view key);
// An integer argument; nullopt when missing or of another type.
std::optional<int64_t> TraceArgInt(const TraceEvent& e, std::string_view key);
// A numeric argument (integer or not) as a double; nullopt when missing or not a number.
std::optional<double> TraceArgNumber(const TraceEvent& e, std::string_view key);
// The argument as text: a string as it is, a number as JSON writes it; "" when missing.
std::string TraceArgText(const TraceEvent& e, std::string_view key);

}  // namespace pd
