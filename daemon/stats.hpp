// vrdmad's statistics and status as JSON: what the control socket answers to "stats" and
// "status", and what vrdmad logs when it exits (docs/operations.md reads the keys).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "vrdma/migration/switchover.hpp"
#include "vrdma/nicdrv/device.hpp"
#include "vrdma/vhost/backend.hpp"
#include "vrdma/device/rdma_device.hpp"

namespace vrdma::vrdmad {

// The migration's phase, peer, figures and last sentence.
nlohmann::json migration_json(const migration::MigratingDevice& mig);
// What the engine put on and took off the wire: the soft engine's own counters; a NIC's port
// counters from sysfs; {} when neither.
nlohmann::json wire_json(const nicdrv::Device& engine, const std::string& name);
// Everything: the device's objects and counters, the device state's (pre-created objects,
// notices), the vhost-user server's, the wire's and the migration's.
nlohmann::json stats_json(const device::RdmaDevice& dev, const migration::MigratingDevice& mig,
                          const vhost::BackendServer& srv, const std::string& engine, const nicdrv::Device& wire,
                          const std::string& domain, const std::string& socket);

}  // namespace vrdma::vrdmad
