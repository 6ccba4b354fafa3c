#include "common/trace_reader.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace pd {
namespace {

using nlohmann::json;

// Microseconds (the file's unit) to nanoseconds.
int64_t Nanos(const json& us) { return std::llround(us.get<double>() * 1000.0); }

TraceValue ToValue(const json& v) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) {
      return static_cast<double>(v.get<uint64_t>());
    }
    return v.get<int64_t>();
  }
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

std::string Describe(size_t index, const json& e) {
  return "trace: event " + std::to_string(index) + " (" + e.dump().substr(0, 200) + ")";
}

Result<TraceEvent> ToEvent(size_t index, const json& e) {
  if (!e.is_object()) return InvalidArgument(Describe(index, e) + " is not an object");
  TraceEvent out;
  const auto ph = e.find("ph");
  if (ph == e.end() || !ph->is_string() || ph->get_ref<const std::string&>().size() != 1) {
    return InvalidArgument(Describe(index, e) + " has no one-letter \"ph\"");
  }
  out.ph = ph->get_ref<const std::string&>()[0];
  const auto ts = e.find("ts");
  if (ts != e.end() && ts->is_number()) {
    out.ts_ns = Nanos(*ts);
  } else if (out.ph != 'M') {
    return InvalidArgument(Describe(index, e) + " has no numeric \"ts\"");
  }
  if (const auto dur = e.find("dur"); dur != e.end() && dur->is_number()) out.dur_ns = Nanos(*dur);
  if (const auto name = e.find("name"); name != e.end() && name->is_string()) {
    out.name = name->get<std::string>();
  }
  if (const auto cat = e.find("cat"); cat != e.end() && cat->is_string()) {
    out.cat = cat->get<std::string>();
  }
  if (const auto pid = e.find("pid"); pid != e.end() && pid->is_number_integer()) {
    out.pid = pid->get<int64_t>();
  }
  if (const auto tid = e.find("tid"); tid != e.end() && tid->is_number_integer()) {
    out.tid = tid->get<int64_t>();
  }
  if (const auto args = e.find("args"); args != e.end()) {
    if (!args->is_object()) return InvalidArgument(Describe(index, e) + ": \"args\" not an object");
    for (const auto& [key, value] : args->items()) out.args.push_back({key, ToValue(value)});
  }
  return out;
}

}  // namespace

Result<std::vector<TraceEvent>> ParseTraceEvents(std::string_view json_text) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("trace: not JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc.at("traceEvents").is_array()) {
    return InvalidArgument("trace: expected an object with a \"traceEvents\" array");
  }
  json& events = doc.at("traceEvents");
  std::vector<TraceEvent> out;
  out.reserve(events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    ASSIGN_OR_RETURN(TraceEvent e, ToEvent(i, events[i]));
    out.push_back(std::move(e));
    events[i] = nullptr;  // frees the parsed event: a trace runs to hundreds of MB
  }
  return out;
}

Result<std::vector<TraceEvent>> ReadTraceEvents(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  Result<std::vector<TraceEvent>> events = ParseTraceEvents(text);
  if (!events.ok()) return events.status().WithContext(path);
  return events;
}

const TraceValue* FindTraceArg(const TraceEvent& e, std::string_view key) {
  for (const TraceArg& a : e.args) {
    if (a.key == key) return &a.value;
  }
  return nullptr;
}

std::optional<int64_t> TraceArgInt(const TraceEvent& e, std::string_view key) {
  const TraceValue* v = FindTraceArg(e, key);
  if (v == nullptr || !std::holds_alternative<int64_t>(*v)) return std::nullopt;
  return std::get<int64_t>(*v);
}

std::optional<double> TraceArgNumber(const TraceEvent& e, std::string_view key) {
  const TraceValue* v = FindTraceArg(e, key);
  if (v == nullptr) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(v)) return *d;
  return std::nullopt;
}

std::string TraceArgText(const TraceEvent& e, std::string_view key) {
  const TraceValue* v = FindTraceArg(e, key);
  if (v == nullptr) return "";
  if (const auto* s = std::get_if<std::string>(v)) return *s;
  if (const auto* i = std::get_if<int64_t>(v)) return std::to_string(*i);
  return json(std::get<double>(*v)).dump();
}

}  // namespace pd
