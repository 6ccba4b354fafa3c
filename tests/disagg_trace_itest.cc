// --trace with real processes: `pdserve up --trace FILE` gives each instance its own file
// (FILE with the instance name before the extension), written when it stops on SIGTERM; the
// prefill's file holds one "post writes" event per layer per prefill chunk, each after its
// layer's compute began (causal order, never timing), and `pdserve trace-summary` reads it. A
// colocated instance's trace has steps and layers but no writes; a --trace path that cannot be
// written stops `serve` at start with the reason.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/file_util.h"
#include "common/trace.h"
#include "common/trace_reader.h"
#include "common/trace_summary.h"
#include "tests/disagg_process.h"

namespace pd {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using testing::Process;
using testing::StartAndWaitFor;
using namespace std::chrono_literals;

const std::string kBinary = PDSERVE_BINARY;

std::string TempPath(const std::string& name) {
  return testing::TempPathFor("pdserve_trace_", name);
}

const std::string& ModelDir() {
  static const std::string dir = testing::MakeModel(kBinary, "tiny", 7, TempPath("model"));
  return dir;
}

int NumLayers() {
  auto text = ReadFileToString(ModelDir() + "/config.json");
  return text.ok() ? json::parse(*text).value("num_hidden_layers", -1) : -1;
}

int PickPort() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) * 7919u);
  return testing::PickPortBlock(rng, 20000);
}

// A greedy completion of 3 tokens for a prompt of `prompt_len` tokens; the HTTP status.
int Complete(int port, int prompt_len) {
  return testing::CompleteAt("127.0.0.1", port, testing::PromptOf(prompt_len, 0), 3).first;
}

// How many events of each name the trace file holds (none when it cannot be read).
std::map<std::string, int> CountNames(const std::string& path) {
  std::map<std::string, int> n;
  Result<std::vector<TraceEvent>> events = ReadTraceEvents(path);
  EXPECT_TRUE(events.ok()) << events.status().ToString();
  if (!events.ok()) return n;
  for (const TraceEvent& e : *events) n[e.name]++;
  return n;
}

// `pdserve up` (1 prefill + 1 decode, chunks of 16 tokens) on `port` with `--trace trace` and
// `extra` flags, started and serving (a failure carries its output).
::testing::AssertionResult StartTracedUp(Process& up, int port, const std::string& trace,
                                         std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {
      "--page-size",     "4",   "--max-num-batched-tokens", "16", "--max-num-seqs", "8",
      "--max-model-len", "256", "--served-model-name",      "m",  "--trace",        trace};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return StartAndWaitFor(up, testing::UpArgv(kBinary, ModelDir(), 1, 1, port, flags),
                         "router (OpenAI API)", 240s);
}

TEST(TraceUpTest, EachInstanceWritesItsOwnCausalTrace) {
  const int port = PickPort();
  const std::string trace = TempPath("t.json");
  Process up;
  ASSERT_TRUE(StartTracedUp(up, port, trace));
  const std::string prefill_file = TempPath("t.prefill0.json");
  const std::string decode_file = TempPath("t.decode0.json");
  EXPECT_THAT(up.output(), HasSubstr("traces to " + prefill_file));
  EXPECT_THAT(up.output(), HasSubstr("traces to " + decode_file));
  ASSERT_EQ(Complete(port, 40), 200);  // 39 prefilled tokens in chunks of 16, 16, 7
  ASSERT_EQ(up.Stop(SIGTERM, 60s), 0) << up.output();

  const int layers = NumLayers();
  ASSERT_GT(layers, 1);
  auto names = CountNames(prefill_file);
  EXPECT_EQ(names["prefill request"], 1);
  EXPECT_EQ(names["post writes"], 3 * layers);  // one per layer per chunk
  EXPECT_EQ(names["write layer"], 3 * layers);
  EXPECT_EQ(names["post metadata"], 1);
  EXPECT_EQ(names["transfer"], 1);
  EXPECT_GE(names["layer"], 3 * layers);
  EXPECT_GE(names["step"], 3);
  auto prefill_text = ReadFileToString(prefill_file);
  ASSERT_TRUE(prefill_text.ok()) << prefill_text.status().ToString();
  EXPECT_EQ(TraceDroppedEvents(*prefill_text), 0u);

  auto summary = SummarizePrefillTrace(*prefill_text);
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->num_layers, layers);
  EXPECT_EQ(summary->rows.size(), static_cast<size_t>(3 * layers));
  EXPECT_EQ(summary->num_posts_without_compute, 0);
  EXPECT_EQ(summary->num_posts_before_compute_began, 0);  // posted only once the layer ran

  auto dnames = CountNames(decode_file);
  EXPECT_EQ(dnames["prefill request sent"], 1);
  EXPECT_EQ(dnames["kv ready"], 1);
  EXPECT_EQ(dnames["transfer failed"], 0);
  EXPECT_GE(dnames["step"], 3);  // the first decode step and two more tokens

  Process check;
  ASSERT_TRUE(check.Start({kBinary, "trace-summary", prefill_file}));
  EXPECT_EQ(check.Wait(60s), 0) << check.output();
  EXPECT_THAT(check.output(), HasSubstr("posted before the next layer's compute ended: "));
  EXPECT_THAT(check.output(), HasSubstr(" of " + std::to_string(3 * (layers - 1))));
}

// --trace-max-events reaches every file `up` writes: each keeps that many events, counts the
// rest, and says both in its otherData (which TraceDroppedEvents reads off the tail).
TEST(TraceUpTest, TheEventCapReachesEveryInstanceAndTheRouter) {
  const int port = PickPort();
  const std::string trace = TempPath("capped.json");
  Process up;
  ASSERT_TRUE(StartTracedUp(up, port, trace, {"--trace-max-events", "4"}));
  ASSERT_EQ(Complete(port, 40), 200);
  ASSERT_EQ(up.Stop(SIGTERM, 60s), 0) << up.output();
  for (const char* tag : {"prefill0", "decode0", "router"}) {
    const std::string path = TempPath(std::string("capped.") + tag + ".json");
    auto text = ReadFileToString(path);
    ASSERT_TRUE(text.ok()) << path;
    auto events = ParseTraceEvents(*text);
    ASSERT_TRUE(events.ok()) << events.status().ToString();
    EXPECT_THAT(*text, HasSubstr("\"max_events\":4,")) << tag;
    int kept = 0;
    int64_t noted = 0;  // the dropped count of the closing "trace_events_dropped" event
    for (const TraceEvent& e : *events) {
      kept += e.ph != 'M' && e.name != "trace_events_dropped";
      if (e.name == "trace_events_dropped") noted = TraceArgInt(e, "dropped").value_or(-1);
    }
    EXPECT_LE(kept, 4) << tag;
    const std::optional<uint64_t> dropped = TraceDroppedEvents(*text);
    ASSERT_TRUE(dropped.has_value()) << tag;
    EXPECT_EQ(noted, static_cast<int64_t>(*dropped)) << tag;
    // One request of 39 prompt tokens in three chunks: far more than four events on either side.
    if (std::string(tag) != "router") {
      EXPECT_GT(*dropped, 0u) << tag;
    }
  }
}

TEST(TraceServeTest, ANonPositiveEventCapIsRefusedByName) {
  Process serve;
  ASSERT_TRUE(serve.Start({kBinary, "serve", "--model", ModelDir(), "--port",
                           std::to_string(PickPort()), "--threads", "1", "--trace",
                           TempPath("never.json"), "--trace-max-events", "0"}));
  EXPECT_NE(serve.Wait(120s), 0) << serve.output();
  EXPECT_THAT(serve.output(), HasSubstr("--trace-max-events"));
}

TEST(TraceServeTest, AColocatedTraceHasComputeButNoWrites) {
  const int port = PickPort() + 5;
  const std::string trace = TempPath("colocated.json");
  Process serve;
  ASSERT_TRUE(
      StartAndWaitFor(serve, testing::ServeArgv(kBinary, ModelDir(), port, 256, {"--trace", trace}),
                      "pdserve: serving", 240s));
  ASSERT_EQ(Complete(port, 9), 200);
  ASSERT_EQ(serve.Stop(SIGTERM, 60s), 0) << serve.output();
  EXPECT_THAT(serve.output(), HasSubstr("written to " + trace));
  auto names = CountNames(trace);
  EXPECT_GE(names["step"], 3);
  EXPECT_EQ(names["layer"] % NumLayers(), 0);
  EXPECT_GE(names["layer"], 3 * NumLayers());
  EXPECT_EQ(names["post writes"], 0);

  Process check;
  ASSERT_TRUE(check.Start({kBinary, "trace-summary", trace}));
  EXPECT_EQ(check.Wait(60s), 1);
  EXPECT_THAT(check.output(), HasSubstr("no 'post writes' events"));
}

TEST(TraceServeTest, AnUnwritableTracePathStopsServeAtStart) {
  Process serve;
  ASSERT_TRUE(serve.Start({kBinary, "serve", "--model", ModelDir(), "--port",
                           std::to_string(PickPort() + 7), "--threads", "1", "--trace",
                           "/nonexistent-pdserve-dir/t.json"}));
  EXPECT_EQ(serve.Wait(120s), 1) << serve.output();
  EXPECT_THAT(serve.output(), HasSubstr("--trace"));
  EXPECT_THAT(serve.output(), HasSubstr("/nonexistent-pdserve-dir/t.json"));
  EXPECT_THAT(serve.output(), HasSubstr("No such file or directory"));
}

TEST(TraceSummaryCommandTest, ABrokenFileIsAClearError) {
  const std::string path = TempPath("broken.json");
  ASSERT_TRUE(WriteStringToFile(path, "{\"traceEvents\": [").ok());
  Process check;
  ASSERT_TRUE(check.Start({kBinary, "trace-summary", path}));
  EXPECT_EQ(check.Wait(60s), 1);
  EXPECT_THAT(check.output(), HasSubstr("not JSON"));
  Process missing;
  ASSERT_TRUE(missing.Start({kBinary, "trace-summary", TempPath("missing.json")}));
  EXPECT_EQ(missing.Wait(60s), 1);
  EXPECT_THAT(missing.output(), HasSubstr("missing.json"));
}

}  // namespace
}  // namespace pd
