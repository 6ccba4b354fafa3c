// The engine-dependent half of the profiler: timing ModelRunner::Forward on synthetic batches.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "engine/model_runner.h"
#include "planner/profiler.h"

namespace pd::planner {
namespace {

using engine::ForwardBatch;
using engine::ForwardOutput;
using engine::SeqStep;

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The ids, page tables and batch of one shape: `batch` sequences with `tokens` ids each,
// starting at `start_pos`, with distinct pages covering start_pos + tokens positions.
struct SyntheticBatch {
  std::vector<std::vector<int32_t>> ids, pages;
  ForwardBatch batch;
};

Result<SyntheticBatch> MakeBatch(engine::ModelRunner& runner, int batch, int start_pos,
                                 int tokens) {
  const model::ModelConfig& c = runner.config();
  const int page_size = runner.region().spec().page_size;
  const int positions = start_pos + tokens;
  if (batch < 1 || tokens < 1)
    return InvalidArgument("profile: a shape needs batch and length >= 1");
  if (c.max_position_embeddings > 0 && positions > c.max_position_embeddings) {
    return InvalidArgument("profile: length " + std::to_string(positions) +
                           " exceeds the model's " + std::to_string(c.max_position_embeddings) +
                           " positions");
  }
  const int per_seq = (positions + page_size - 1) / page_size;
  if (int64_t(batch) * per_seq > runner.region().num_pages()) {
    return InvalidArgument("profile: batch " + std::to_string(batch) + " x " +
                           std::to_string(positions) + " positions needs more KV pages than the " +
                           std::to_string(runner.region().num_pages()) + " in the region");
  }
  SyntheticBatch b;
  b.ids.resize(batch);
  b.pages.resize(batch);
  int next_page = 0;
  for (int i = 0; i < batch; ++i) {
    for (int t = 0; t < tokens; ++t) b.ids[i].push_back((i * 131 + t * 37 + 11) % c.vocab_size);
    for (int p = 0; p < per_seq; ++p) b.pages[i].push_back(next_page++);
  }
  for (int i = 0; i < batch; ++i) {
    b.batch.seqs.push_back(SeqStep{i, start_pos, b.ids[i], b.pages[i], true});
  }
  return b;
}

// Median of `repeats` timed passes after one warm-up pass.
Result<double> TimeMs(engine::ModelRunner& runner, const ForwardBatch& batch, int repeats) {
  ForwardOutput out;
  RETURN_IF_ERROR(runner.Forward(batch, &out));
  std::vector<double> ms;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const double t0 = NowMs();
    RETURN_IF_ERROR(runner.Forward(batch, &out));
    ms.push_back(NowMs() - t0);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void Report(const ProfileOptions& o, const char* phase, const ShapeSpec& s) {
  if (o.progress) {
    o.progress(std::string(phase) + " batch " + std::to_string(s.batch) + " length " +
               std::to_string(s.length));
  }
}

}  // namespace

Result<ProfileResult> ProfileRunner(engine::ModelRunner& runner, const ProfileOptions& options) {
  if (options.prefill_shapes.size() < 3 || options.decode_shapes.size() < 3) {
    return InvalidArgument("profile: need at least 3 prefill and 3 decode shapes");
  }
  std::vector<PrefillSample> prefill;
  for (const ShapeSpec& s : options.prefill_shapes) {
    Report(options, "prefill", s);
    ASSIGN_OR_RETURN(SyntheticBatch b, MakeBatch(runner, s.batch, 0, s.length));
    ASSIGN_OR_RETURN(double ms, TimeMs(runner, b.batch, options.repeats));
    prefill.push_back({int64_t(s.batch) * s.length, double(s.batch) * s.length * s.length, ms});
  }
  std::vector<DecodeSample> decode;
  for (const ShapeSpec& s : options.decode_shapes) {
    Report(options, "decode", s);
    ASSIGN_OR_RETURN(SyntheticBatch b, MakeBatch(runner, s.batch, s.length - 1, 1));
    ASSIGN_OR_RETURN(double ms, TimeMs(runner, b.batch, options.repeats));
    // The engine's decode form counts Σ (context + 1) with context = tokens before this one.
    decode.push_back({s.batch, int64_t(s.batch) * s.length, ms});
  }
  return FitProfile(std::move(prefill), std::move(decode), options.prefill_shapes,
                    options.decode_shapes);
}

}  // namespace pd::planner
