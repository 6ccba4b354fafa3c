// Subcommand registry of the pdserve CLI. Each apps/cmd_*.cc registers itself:
//
//   PD_REGISTER_COMMAND(generate, "Generate a completion offline", [](CLI::App* app) {
//     auto opts = std::make_shared<Options>();
//     app->add_option("--model", opts->model)->required();
//     return [opts] { return RunGenerate(*opts); };  // returns the process exit code
//   });
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace pd::apps {

using CommandRunner = std::function<int()>;
using CommandSetup = std::function<CommandRunner(CLI::App*)>;

struct Command {
  std::string name;
  std::string help;
  CommandSetup setup;
};

std::vector<Command>& Commands();
bool RegisterCommand(Command command);

}  // namespace pd::apps

#define PD_REGISTER_COMMAND(name, help, setup) \
  static const bool pd_command_registered_##name = ::pd::apps::RegisterCommand({#name, help, setup})
