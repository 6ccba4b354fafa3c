#include "common/trace_summary.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

namespace pd {
namespace {

using nlohmann::json;

struct Compute {
  double begin_us = 0;
  double end_us = 0;
};

// (pid, step, layer)
using LayerKey = std::tuple<int64_t, int64_t, int>;

Status ReadEvents(const std::vector<TraceRecord>& events, std::map<LayerKey, Compute>* compute,
                  std::vector<TraceLayerRow>* posts, int* num_layers) {
  for (const TraceRecord& e : events) {
    if (e.ph != "X") continue;
    const bool is_layer = e.name == "layer" && e.cat == "compute";
    const bool is_post = e.name == "post writes" && e.cat == "kv";
    if (!is_layer && !is_post) continue;
    const std::optional<int64_t> layer = e.IntArg("layer"), step = e.IntArg("step");
    if (!layer || !step) {
      return InvalidArgument("trace: a '" + e.name +
                             "' event lacks integer args.layer or args.step at ts " +
                             std::to_string(e.ts_us));
    }
    if (is_layer) {
      (*compute)[{e.pid, *step, static_cast<int>(*layer)}] = {e.ts_us, e.ts_us + e.dur_us};
      *num_layers = std::max(*num_layers, static_cast<int>(*layer) + 1);
    } else {
      TraceLayerRow row;
      row.request = e.Arg("request");
      row.pid = e.pid;
      row.step = *step;
      row.layer = static_cast<int>(*layer);
      row.posted_us = e.ts_us;
      posts->push_back(row);
    }
  }
  return OkStatus();
}

}  // namespace

std::string TraceRecord::Arg(const std::string& key) const {
  const auto it = args.find(key);
  return it == args.end() ? "" : it->second;
}

std::optional<double> TraceRecord::NumArg(const std::string& key) const {
  const auto it = args.find(key);
  if (it == args.end()) return std::nullopt;
  double v = 0;
  const char* end = it->second.data() + it->second.size();
  const auto [p, ec] = std::from_chars(it->second.data(), end, v);
  if (ec != std::errc() || p != end) return std::nullopt;
  return v;
}

std::optional<int64_t> TraceRecord::IntArg(const std::string& key) const {
  const auto it = args.find(key);
  if (it == args.end()) return std::nullopt;
  int64_t v = 0;
  const char* end = it->second.data() + it->second.size();
  const auto [p, ec] = std::from_chars(it->second.data(), end, v);
  if (ec != std::errc() || p != end) return std::nullopt;
  return v;
}

Result<TraceRecords> ReadTraceEvents(std::string_view json_text) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("trace: not JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc.at("traceEvents").is_array()) {
    return InvalidArgument("trace: expected an object with a \"traceEvents\" array");
  }
  TraceRecords out;
  json& events = doc.at("traceEvents");
  out.events.reserve(events.size());
  for (const json& e : events) {
    if (!e.is_object() || e.value("ph", "") == "M") continue;  // metadata: names, no time
    if (!e.contains("ts") || !e.at("ts").is_number()) {
      return InvalidArgument("trace: an event lacks a numeric ts: " + e.dump().substr(0, 200));
    }
    TraceRecord t;
    t.name = e.value("name", "");
    t.cat = e.value("cat", "");
    t.ph = e.value("ph", "");
    t.pid = e.contains("pid") && e.at("pid").is_number_integer() ? e.at("pid").get<int64_t>() : 0;
    t.ts_us = e.at("ts").get<double>();
    t.dur_us = e.contains("dur") && e.at("dur").is_number() ? e.at("dur").get<double>() : 0;
    if (e.contains("args") && e.at("args").is_object()) {
      for (const auto& [key, v] : e.at("args").items()) {
        t.args[key] = v.is_string() ? v.get<std::string>() : v.dump();
      }
    }
    out.events.push_back(std::move(t));
  }
  if (doc.contains("otherData") && doc.at("otherData").is_object()) {
    out.dropped_events = doc.at("otherData").value("dropped_events", int64_t{0});
  }
  return out;
}

Result<TraceSummary> SummarizePrefillTrace(std::string_view json_text) {
  ASSIGN_OR_RETURN(const TraceRecords events, ReadTraceEvents(json_text));
  TraceSummary s;
  s.dropped_events = events.dropped_events;
  std::map<LayerKey, Compute> compute;
  std::vector<TraceLayerRow> posts;
  RETURN_IF_ERROR(ReadEvents(events.events, &compute, &posts, &s.num_layers));
  for (TraceLayerRow& row : posts) {
    auto it = compute.find({row.pid, row.step, row.layer});
    if (it == compute.end()) {
      ++s.num_posts_without_compute;
      continue;
    }
    row.compute_begin_us = it->second.begin_us;
    row.compute_end_us = it->second.end_us;
    if (row.posted_us < row.compute_begin_us) ++s.num_posts_before_compute_began;
    auto next = compute.find({row.pid, row.step, row.layer + 1});
    if (next != compute.end()) {
      row.has_next = true;
      row.next_compute_end_us = next->second.end_us;
      ++s.num_with_next;
      if (row.posted_before_next_end()) ++s.num_posted_before_next_end;
    }
    s.rows.push_back(row);
  }
  std::sort(s.rows.begin(), s.rows.end(), [](const TraceLayerRow& a, const TraceLayerRow& b) {
    return std::tie(a.request, a.pid, a.step, a.layer, a.posted_us) <
           std::tie(b.request, b.pid, b.step, b.layer, b.posted_us);
  });
  return s;
}

std::string FormatTraceSummary(const TraceSummary& s) {
  std::string out;
  char line[256];
  const TraceLayerRow* group = nullptr;
  double t0 = 0;
  for (const TraceLayerRow& r : s.rows) {
    if (group == nullptr || r.request != group->request || r.pid != group->pid ||
        r.step != group->step) {
      group = &r;
      t0 = r.compute_begin_us;  // times below: microseconds from this layer's compute begin
      std::snprintf(line, sizeof line,
                    "request %s, runner step %lld (us from layer %d's compute begin)\n"
                    "  layer  compute_end(L)  writes_posted(L)  compute_end(L+1)  posted_first\n",
                    r.request.c_str(), static_cast<long long>(r.step), r.layer);
      out += line;
    }
    if (r.has_next) {
      std::snprintf(line, sizeof line, "  %5d  %14.1f  %16.1f  %16.1f  %s\n", r.layer,
                    r.compute_end_us - t0, r.posted_us - t0, r.next_compute_end_us - t0,
                    r.posted_before_next_end() ? "yes" : "NO");
    } else {
      std::snprintf(line, sizeof line, "  %5d  %14.1f  %16.1f  %16s  %s\n", r.layer,
                    r.compute_end_us - t0, r.posted_us - t0, "-", "(last layer)");
    }
    out += line;
  }
  std::snprintf(line, sizeof line,
                "layers whose writes were posted before the next layer's compute ended: %d of %d"
                " (last layers excluded)\n",
                s.num_posted_before_next_end, s.num_with_next);
  out += line;
  if (s.num_posts_without_compute > 0 || s.num_posts_before_compute_began > 0) {
    std::snprintf(line, sizeof line,
                  "warning: %d post(s) without a compute event, %d posted before their layer's "
                  "compute began\n",
                  s.num_posts_without_compute, s.num_posts_before_compute_began);
    out += line;
  }
  if (s.dropped_events > 0) {
    std::snprintf(line, sizeof line, "warning: the trace dropped %lld events (cap reached)\n",
                  static_cast<long long>(s.dropped_events));
    out += line;
  }
  return out;
}

}  // namespace pd
