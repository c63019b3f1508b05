// A vrdmad process for tests: started (optionally inside a network namespace) with its
// vhost-user socket, control socket and log in a TempDir, stopped on destruction. Used by the
// vhost integration tests and the migration tests. Include from Boost.Test sources only.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "control_client.hpp"
#include "process.hpp"

namespace vrdma::test {

struct Vrdmad {
  std::string sock, ctl, log;
  std::unique_ptr<Child> child;
  // `ns` empty: this host's namespace. `extra`: more vrdmad options (limits, --incoming...).
  Vrdmad(const TempDir& dir, const std::string& name, const std::string& ns, const std::string& engine,
         std::vector<std::string> extra = {}, const std::string& binary = VRDMAD) {
    sock = dir.file(name + ".sock");
    ctl = dir.file(name + ".ctl");
    log = dir.file(name + ".log");
    std::vector<std::string> argv;
    if (!ns.empty()) argv = {"/usr/sbin/ip", "netns", "exec", ns};
    for (const auto& a : {binary, std::string("--socket"), sock, std::string("--engine"), engine, std::string("--control"), ctl})
      argv.push_back(a);
    argv.insert(argv.end(), extra.begin(), extra.end());
    child = std::make_unique<Child>(argv, log);
    BOOST_REQUIRE_MESSAGE(wait_for_path(ctl, 30000), "vrdmad did not start within 30 s; log:\n" + read_file(log));
  }
  ~Vrdmad() {
    if (child) child->stop(SIGTERM);
  }
  Vrdmad(const Vrdmad&) = delete;
  Vrdmad& operator=(const Vrdmad&) = delete;

  [[nodiscard]] std::string device() const { return "pv:" + sock; }
  // One control request; the parsed JSON reply (discarded JSON when vrdmad does not answer).
  [[nodiscard]] nlohmann::json control(const nlohmann::json& req) const { return control_request(ctl, req); }
  [[nodiscard]] nlohmann::json status() const { return control({{"cmd", "status"}}); }
};

}  // namespace vrdma::test
