// A minimal QMP client for the conformance tests (QEMU's JSON monitor over a UNIX socket).
#pragma once

#include <string>

#include "vrdma/common/fd.hpp"

namespace vrdma::test {

class Qmp {
 public:
  // Connects (retrying up to timeout_ms), reads the greeting, sends qmp_capabilities.
  bool connect(const std::string& path, int timeout_ms = 10000);
  // Sends one command (a JSON object) and returns the first reply line that is not an
  // event ("return" or "error"), or "" on timeout.
  std::string command(const std::string& json, int timeout_ms = 10000);

 private:
  std::string read_line(int timeout_ms);
  UniqueFd fd_;
  std::string buf_;
};

}  // namespace vrdma::test
