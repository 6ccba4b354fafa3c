// `pdserve plot WHAT ...`: bench/plot.py (matplotlib, run by /usr/bin/python3) with the same
// arguments: attainment against rate, latency CDFs, the simulator against DistServe's A100 runs,
// one request's timeline (docs/observability.md). The script is the source tree's, whose path is
// built in (as the planner's DistServe data is).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "apps/command.h"

namespace pd::apps {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

int RunPlot(const std::vector<std::string>& args) {
  if (::access(PD_PLOT_SCRIPT, R_OK) != 0) {
    std::fprintf(stderr, "pdserve plot: %s: %s (the script comes with pdserve's source tree)\n",
                 PD_PLOT_SCRIPT, std::strerror(errno));
    return 1;
  }
  std::vector<std::string> argv = {kPython, PD_PLOT_SCRIPT};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execv(kPython, c_argv.data());  // returns only on failure
  std::fprintf(stderr, "pdserve plot: cannot run %s: %s (scripts/install-deps.sh installs it)\n",
               kPython, std::strerror(errno));
  return 1;
}

}  // namespace

PD_REGISTER_COMMAND(plot,
                    "Draw PNG/SVG pictures from bench, simulate and trace JSON (bench/plot.py)",
                    [](CLI::App* app) {
                      app->prefix_command();  // every argument, --help included, is the script's
                      app->set_help_flag();
                      return [app] { return RunPlot(app->remaining()); };
                    });

}  // namespace pd::apps
