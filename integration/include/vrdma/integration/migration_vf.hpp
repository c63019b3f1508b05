// This host's migration VF: the VF of the SR-IOV pool that carries QEMU's RDMA migration stream
// (`rdma://`) to and from this host, with the host's migration address on its netdev
// (docs/integration.md "The migration VF"). Configured per host in /etc/default/vrdma:
//
//   VRDMA_MIGRATION_POOL=ens1f0             the PF (netdev name or PCI address) whose VFs may carry it
//   VRDMA_MIGRATION_ADDRESS=10.77.0.11/24   this host's address on it (each host its own)
//
// `vrdmactl migrate --migrateuri rdma://…` takes it on the source before its pre-flight checks,
// the libvirt hook on the destination at `migrate begin`, `vrdmactl migration-vf up|show|release`
// by hand. It is one VF per host, shared by every migration, held in the VF ledger (purpose
// migration, owner "migration@<host>") until released, so the guests' VFs never take it.
#pragma once

#include <optional>
#include <string>

#include "vrdma/common/result.hpp"
#include "vrdma/integration/guest_vf.hpp"

namespace vrdma::integration {

// A host setting: $NAME when set, else NAME=value in $VRDMA_DEFAULTS (default /etc/default/vrdma,
// the file the hook sources; shell quoting of the value is taken off). "" when neither has it.
std::string host_setting(const std::string& name);

struct MigrationNet {
  std::string pool;     // VRDMA_MIGRATION_POOL
  std::string address;  // VRDMA_MIGRATION_ADDRESS, CIDR
  // nullopt: this host has no migration VF configured (neither setting). Error (a sentence) when
  // only one of the two is set or the address is not an address with a prefix length.
  static Result<std::optional<MigrationNet>> from_host_settings();
};

struct MigrationVf {
  std::string vf, pf;   // PCI addresses
  std::string ibdev;    // the VF's RDMA device
  std::string netdev;   // the VF's netdev, which carries the address
  std::string address;  // CIDR
  std::string owner;    // "migration@<host>"
  bool reused = false;  // the VF this host already had (not a new one from the pool)
  bool address_added = false;
  bool mac_set = false; // the VF had no MAC; one derived from the address was set through the PF
};

std::string migration_vf_owner(const std::string& host);

// The locally administered MAC a migration VF without one gets: 02:76:6d and the last three
// bytes of the address ("10.77.0.11/24" -> 02:76:6d:4d:00:0b), so hosts' VFs differ.
std::string migration_vf_mac(const std::string& cidr);

// Takes this host's migration VF (the one the ledger records for the host when it is still a
// usable VF of the pool, else a free VF of the pool with an RDMA function), gives it a MAC when
// it has none, brings its netdev up and puts the address on it. Idempotent. Errors as
// sentences: the pool does not exist or has no free VF (who holds its VFs); the VF has no
// netdev; the address is already on another netdev; the kernel refused a step.
Result<MigrationVf> ensure_migration_vf(const VfPaths& paths, const MigrationNet& net, const std::string& host);

// The migration VF the ledger records for this host, as it is now (nullopt: none).
Result<std::optional<MigrationVf>> find_migration_vf(const VfPaths& paths, const std::string& host);

// Takes the address off the VF's netdev (when net is given), brings the netdev down and gives
// the VF back to the pool. Returns the VF's PCI address, nullopt when the host held none.
Result<std::optional<std::string>> release_migration_vf(const VfPaths& paths, const MigrationNet* net,
                                                        const std::string& host);

}  // namespace vrdma::integration
