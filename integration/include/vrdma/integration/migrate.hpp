// `vrdmactl migrate`: a live, peer-to-peer migration of a libvirt domain on the libvirt C API
// (virDomainMigrateToURI3 with VIR_MIGRATE_LIVE | VIR_MIGRATE_PEER2PEER), with progress lines from
// MIGRATION_ITERATION events and virDomainGetJobStats, and the JOB_COMPLETED figures at the end.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace vrdma::integration {

// What the pre-flight checks look at, gathered from this host and the domain (tests fill it in).
struct TransportFacts {
  std::vector<std::string> rdma_devices;  // $VRDMA_SYSFS_ROOT/class/infiniband entries
  bool hard_limit_set = false;            // the domain's <memtune><hard_limit>
  unsigned long long memlock_limit = 0;   // RLIMIT_MEMLOCK of this process (bytes; ~0ULL: unlimited)
  bool cap_sys_resource = false;          // may raise it (libvirt raises QEMU's to hard_limit)
  unsigned long long guest_memory = 0;    // bytes
  // The route from this host to the rdma:// destination: looked up at all (false when the host
  // name does not resolve, and in tests that leave it), the interface it leaves by ("": no
  // route), and the interfaces that carry a GID of an RDMA device (its RoCE/iWARP ports).
  bool route_checked = false;
  std::string route_ifname;
  std::vector<std::string> gid_ifnames;
  // rdma:// on a host with a migration VF configured: why it could not be set up ("": it is, or
  // none is configured).
  std::string migration_vf_error;
};

struct TransportChoice {
  std::string migrate_uri;          // what goes into VIR_MIGRATE_PARAM_URI ("" lets libvirt choose)
  bool rdma = false;                // rdma:// with VIR_MIGRATE_RDMA_PIN_ALL
  int parallel = 0;                 // TCP: multifd connections (VIR_MIGRATE_PARALLEL); 0: one stream
  std::vector<std::string> notes;   // sentences for the operator (why TCP, and so on)
};

// Multifd connections when the memory goes over TCP and --parallel was not given (QEMU's own
// default number of multifd channels).
inline constexpr int kDefaultMultifdChannels = 2;

// requested: the --migrateuri (may be empty); dest_host: the destination's host name from the
// libvirt URI; parallel: --parallel (-1: not given, 1: one TCP stream, N: N multifd connections).
// rdma:// is kept only when every check passes; otherwise the same host and port over tcp://,
// with one sentence per failed check. TCP goes multifd (kDefaultMultifdChannels) unless
// --parallel says otherwise; RDMA is one stream (QEMU's RDMA transport has no multifd).
TransportChoice choose_transport(const std::string& requested, const std::string& dest_host, const TransportFacts& f,
                                 int parallel = -1);

// What a live migration does to the guest's RDMA device with this engine, when the operator must
// hear it before the guest moves ("" when its objects move with it: the soft engine). A NIC's
// (verbs) QPs are re-created under new numbers: peers outside the guest lose their connections
// (docs/migration.md "On a NIC").
std::string device_migration_note(const std::string& domain, const std::string& engine);

// The host part of a libvirt or migration URI: qemu+tcp://h/system -> h, tcp://h:p -> h, tcp:h:p -> h.
std::string uri_host(const std::string& uri);

// One sentence for a vrdmad migration phase ("idle", "armed", ...).
std::string phase_sentence(const std::string& phase);

}  // namespace vrdma::integration
