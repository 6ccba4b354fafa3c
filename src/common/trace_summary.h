// Turns a prefill instance's trace (common/trace.h) into the streaming claim: for every request,
// runner step and layer L, when layer L's compute ended, when its page writes were posted and
// when layer L+1's compute ended; and how many layers had their writes posted before the next
// layer's compute ended.
//
// Events read: "layer" (cat "compute", ph X, args layer and step) from the model runner and
// "post writes" (cat "kv", ph X, args request, layer, step) from the prefill messenger.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pd {

struct TraceLayerRow {
  std::string request;
  int64_t pid = 0;
  int64_t step = 0;
  int layer = 0;
  double compute_begin_us = 0;     // layer L of the step began
  double compute_end_us = 0;       // ... and ended
  double posted_us = 0;            // its writes for this request were posted (submit began)
  bool has_next = false;           // layer L+1 exists in the step
  double next_compute_end_us = 0;  // layer L+1's compute ended (has_next only)
  bool posted_before_next_end() const { return has_next && posted_us < next_compute_end_us; }
};

struct TraceSummary {
  std::vector<TraceLayerRow> rows;  // by request, step, layer
  int num_layers = 0;               // layers per step seen in compute events
  int num_with_next = 0;            // rows with a next layer
  int num_posted_before_next_end = 0;
  // Causality: posts whose step/layer has no compute event, and posts that began before that
  // layer's compute began (both 0 in a sound trace).
  int num_posts_without_compute = 0;
  int num_posts_before_compute_began = 0;
  int64_t dropped_events = 0;  // from the file's otherData
};

// InvalidArgument if the text is not a trace-event JSON object.
Result<TraceSummary> SummarizePrefillTrace(std::string_view json_text);

// The per-layer table and the count, as `pdserve trace-summary` prints them.
std::string FormatTraceSummary(const TraceSummary& summary);

}  // namespace pd
