// `pdserve trace-summary FILE`: reads a prefill instance's --trace file and prints, per request,
// runner step and layer, when layer L's compute ended, when its page writes were posted and when
// layer L+1's compute ended, then how many layers had their writes posted before the next
// layer's compute ended (common/trace_summary.h). Exit code 1 when the file has no writes.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "apps/command.h"
#include "common/file_util.h"
#include "common/trace_summary.h"

namespace pd::apps {
namespace {

int RunTraceSummary(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    std::fprintf(stderr, "trace-summary: %s\n", text.status().ToString().c_str());
    return 1;
  }
  auto summary = SummarizePrefillTrace(*text);
  if (!summary.ok()) {
    std::fprintf(stderr, "trace-summary: %s: %s\n", path.c_str(),
                 summary.status().ToString().c_str());
    return 1;
  }
  std::fputs(FormatTraceSummary(*summary).c_str(), stdout);
  if (summary->rows.empty()) {
    std::fprintf(stderr,
                 "trace-summary: %s has no 'post writes' events (not a prefill instance's trace, "
                 "or no request reached it)\n",
                 path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

PD_REGISTER_COMMAND(
    trace_summary, "Per-layer compute end vs KV writes posted, from a --trace file",
    [](CLI::App* app) {
      auto path = std::make_shared<std::string>();
      app->name("trace-summary");
      app->add_option("file", *path, "a prefill instance's --trace JSON")->required();
      return [path] { return RunTraceSummary(*path); };
    });

}  // namespace pd::apps
