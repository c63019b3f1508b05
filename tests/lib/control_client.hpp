// One request to a vrdmad control socket (a JSON line each way), for tests: the vhost and
// migration tests on the host, and nic_migration_test inside the reference guest.
#pragma once

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

namespace vrdma::test {

// Sends `req` to the control socket at `path` and returns the parsed reply; a discarded JSON
// value when vrdmad cannot be reached or says nothing within `timeout_ms`.
nlohmann::json control_request(const std::string& path, const nlohmann::json& req, int timeout_ms = 30000);

// Asks the vrdmad at control socket `path` for its status every 10 ms until its migration phase
// is `phase` or `limit` has passed; returns the last status (the caller checks phase_of()).
nlohmann::json wait_for_phase(const std::string& path, const std::string& phase, std::chrono::milliseconds limit);

// A status's migration phase ("" when it has none).
std::string phase_of(const nlohmann::json& status);

}  // namespace vrdma::test
