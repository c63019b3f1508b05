// vrdmactl's subcommands on CLI11 (cli.cpp builds the tree, each file adds its own commands).
// A command runs after the whole line parsed; its status is 0 done, 1 failed (a sentence on
// stderr), 2 a usage error the parser could not see.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace vrdma::integration {

struct Command {
  CLI::App* app;            // the (sub)command that runs it
  std::function<int()> run;
};
using Commands = std::vector<Command>;

void add_migrate_command(CLI::App& top, Commands& out);        // migrate.cpp
void add_migration_vf_commands(CLI::App& top, Commands& out);  // migration_vf.cpp
void add_device_commands(CLI::App& top, Commands& out);        // device_cli.cpp
void add_domain_commands(CLI::App& top, Commands& out);        // domain_cli.cpp
void add_list_command(CLI::App& top, Commands& out);           // list_cli.cpp

}  // namespace vrdma::integration
