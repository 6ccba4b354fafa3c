#include "common/trace_summary.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <tuple>

#include "common/trace_reader.h"

namespace pd {
namespace {

struct Compute {
  double begin_us = 0;
  double end_us = 0;
};

// (pid, step, layer)
using LayerKey = std::tuple<int64_t, int64_t, int>;

double Micros(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

Status ReadEvents(const std::vector<TraceEvent>& events, std::map<LayerKey, Compute>* compute,
                  std::vector<TraceLayerRow>* posts, int* num_layers) {
  for (const TraceEvent& e : events) {
    if (e.ph != 'X') continue;
    const bool is_layer = e.name == "layer" && e.cat == "compute";
    const bool is_post = e.name == "post writes" && e.cat == "kv";
    if (!is_layer && !is_post) continue;
    const std::optional<int64_t> layer = TraceArgInt(e, "layer");
    const std::optional<int64_t> step = TraceArgInt(e, "step");
    if (!layer.has_value() || !step.has_value()) {
      return InvalidArgument("trace: a '" + e.name +
                             "' event lacks the integer arguments args.layer and args.step");
    }
    if (is_layer) {
      const double ts = Micros(e.ts_ns);
      (*compute)[{e.pid, *step, static_cast<int>(*layer)}] = {ts, ts + Micros(e.dur_ns)};
      *num_layers = std::max(*num_layers, static_cast<int>(*layer) + 1);
    } else {
      TraceLayerRow row;
      // Requests are written as strings, but a hand-written trace may use numbers.
      row.request = TraceArgText(e, "request");
      row.pid = e.pid;
      row.step = *step;
      row.layer = static_cast<int>(*layer);
      row.posted_us = Micros(e.ts_ns);
      posts->push_back(row);
    }
  }
  return OkStatus();
}

}  // namespace

Result<TraceSummary> SummarizePrefillTrace(std::string_view json_text) {
  ASSIGN_OR_RETURN(const std::vector<TraceEvent> events, ParseTraceEvents(json_text));
  TraceSummary s;
  s.dropped_events = static_cast<int64_t>(TraceDroppedEvents(json_text).value_or(0));
  std::map<LayerKey, Compute> compute;
  std::vector<TraceLayerRow> posts;
  RETURN_IF_ERROR(ReadEvents(events, &compute, &posts, &s.num_layers));
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
