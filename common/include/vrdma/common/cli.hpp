// The command-line contract of every vrdma tool (docs/integration.md "The command line"): --help prints on stdout
// and exits 0, --version prints "<tool> <version>" and exits 0, and a usage error is one line on
// stderr naming the fix, exit status 2. Operational failures are the tools' own (exit 1).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vrdma/common/version.hpp"

namespace vrdma::cli {

// Gives `app` (a tool's top-level App, its name set) --version and the one-line usage error.
void prepare(CLI::App& app);

// Parses; std::nullopt means "go on", otherwise the status to exit with (0 after --help or
// --version, 2 after a usage error, which has been reported).
std::optional<int> parse(CLI::App& app, int argc, const char* const* argv);
// The same for arguments without the program name (subcommand drivers, tests).
std::optional<int> parse(CLI::App& app, std::vector<std::string> args);

// "vrdmactl domain attach": the name of `app` and of the subcommands parsed under it.
std::string command_path(const CLI::App& app);

}  // namespace vrdma::cli
