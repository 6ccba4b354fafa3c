// The pdserve CLI: one binary, one subcommand per apps/cmd_*.cc.
#include <sys/resource.h>

#include <cstdio>
#include <map>

#include "apps/command.h"
#include "common/log.h"

namespace pd::apps {

std::vector<Command>& Commands() {
  static std::vector<Command> commands;
  return commands;
}

bool RegisterCommand(Command command) {
  Commands().push_back(std::move(command));
  return true;
}

namespace {

// Every open stream holds a descriptor (the router two: client and decode instance), and a
// serving process may hold thousands: lift the soft limit on descriptors to the hard one.
void RaiseDescriptorLimit() {
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0 || nofile.rlim_cur >= nofile.rlim_max) return;
  nofile.rlim_cur = nofile.rlim_max;
  (void)::setrlimit(RLIMIT_NOFILE, &nofile);
}

}  // namespace

}  // namespace pd::apps

int main(int argc, char** argv) {
  CLI::App app{"pdserve: LLM serving with disaggregated prefill and decode"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")
      ->capture_default_str();
  std::map<CLI::App*, pd::apps::CommandRunner> runners;
  for (auto& command : pd::apps::Commands()) {
    CLI::App* sub = app.add_subcommand(command.name, command.help);
    runners[sub] = command.setup(sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every malformed command line exits 2, whatever CLI11's code.
    return app.exit(e) == 0 ? 0 : 2;
  }
  pd::SetLogLevel(log_level);
  pd::apps::RaiseDescriptorLimit();
  for (auto& [sub, runner] : runners) {
    if (sub->parsed()) return runner();
  }
  return 2;
}
