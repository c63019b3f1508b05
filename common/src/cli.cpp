#include "vrdma/common/cli.hpp"

#include <iostream>

namespace vrdma::cli {

std::string command_path(const CLI::App& app) {
  std::string path = app.get_name();
  const CLI::App* at = &app;
  for (;;) {
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : at->get_subcommands())
      if (sub->parsed()) next = sub;
    if (next == nullptr) return path;
    path += " " + next->get_name();
    at = next;
  }
}

void prepare(CLI::App& app) {
  app.set_version_flag("--version", app.get_name() + " " + std::string(version()),
                       "print the version and exit");
  // One line: what was wrong, and where the options are described.
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    const std::string path = command_path(*a);
    std::string what = e.what();
    while (!what.empty() && (what.back() == '\n' || what.back() == '.')) what.pop_back();
    return path + ": " + what + " (run '" + path + " --help' for the options)\n";
  });
}

namespace {
std::optional<int> finish(CLI::App& app, const CLI::ParseError& e) {
  return app.exit(e, std::cout, std::cerr) == 0 ? 0 : 2;
}
}  // namespace

std::optional<int> parse(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return finish(app, e);
  }
  return std::nullopt;
}

std::optional<int> parse(CLI::App& app, std::vector<std::string> args) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return finish(app, e);
  }
  return std::nullopt;
}

}  // namespace vrdma::cli
