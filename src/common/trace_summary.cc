#include "common/trace_summary.h"

#include <algorithm>
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

// The argument as text: requests are written as strings, but a hand-written trace may use numbers.
std::string ArgText(const json& args, const char* key) {
  if (!args.contains(key)) return "";
  const json& v = args.at(key);
  return v.is_string() ? v.get<std::string>() : v.dump();
}

Status ReadEvents(const json& events, std::map<LayerKey, Compute>* compute,
                  std::vector<TraceLayerRow>* posts, int* num_layers) {
  for (const json& e : events) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const std::string name = e.value("name", "");
    const bool is_layer = name == "layer" && e.value("cat", "") == "compute";
    const bool is_post = name == "post writes" && e.value("cat", "") == "kv";
    if (!is_layer && !is_post) continue;
    if (!e.contains("ts") || !e.at("ts").is_number() || !e.contains("args") ||
        !e.at("args").contains("layer") || !e.at("args").contains("step")) {
      return InvalidArgument("trace: a '" + name + "' event lacks ts, args.layer or args.step: " +
                             e.dump().substr(0, 200));
    }
    const json& args = e.at("args");
    if (!args.at("layer").is_number_integer() || !args.at("step").is_number_integer()) {
      return InvalidArgument("trace: args.layer and args.step must be integers: " +
                             e.dump().substr(0, 200));
    }
    const int64_t pid = e.value("pid", int64_t{0});
    const int64_t step = args.at("step").get<int64_t>();
    const int layer = args.at("layer").get<int>();
    const double ts = e.at("ts").get<double>();
    if (is_layer) {
      const double dur =
          e.contains("dur") && e.at("dur").is_number() ? e.at("dur").get<double>() : 0;
      (*compute)[{pid, step, layer}] = {ts, ts + dur};
      *num_layers = std::max(*num_layers, layer + 1);
    } else {
      TraceLayerRow row;
      row.request = ArgText(args, "request");
      row.pid = pid;
      row.step = step;
      row.layer = layer;
      row.posted_us = ts;
      posts->push_back(row);
    }
  }
  return OkStatus();
}

}  // namespace

Result<TraceSummary> SummarizePrefillTrace(std::string_view json_text) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("trace: not JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc.at("traceEvents").is_array()) {
    return InvalidArgument("trace: expected an object with a \"traceEvents\" array");
  }
  TraceSummary s;
  std::map<LayerKey, Compute> compute;
  std::vector<TraceLayerRow> posts;
  RETURN_IF_ERROR(ReadEvents(doc.at("traceEvents"), &compute, &posts, &s.num_layers));
  if (doc.contains("otherData") && doc.at("otherData").is_object()) {
    s.dropped_events = doc.at("otherData").value("dropped_events", int64_t{0});
  }
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
