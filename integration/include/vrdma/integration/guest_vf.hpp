// A guest's VF for its backend: what the libvirt hook does for a vrdma:device with
// engine="verbs:vf" (domain_xml.hpp, docs/integration.md "VFs for guests"). It uses the SR-IOV
// manager (sriov/), the same code and the same crash-safe ledger as `vrdmactl vf …`:
//
//   assign_guest_vf    the owner's VF again if the ledger still records one that nobody runs,
//                      else a free VF of the requested pool with an RDMA function; set up through
//                      the PF's netdev (MAC = the device's mac, VLAN, rate, trust, spoof-check as
//                      the element asks) and held by this process (the hook) in the ledger
//   backend_for_vf     the vrdmad arguments for it: --engine verbs:<the VF's ibdev>, --mac
//   hand_over_guest_vf once vrdmad serves, the ledger row names vrdmad's pid: reconcile frees
//                      the VF when that process is gone (and at once if the hook dies before)
//   release_guest_vf   settings back to a fresh VF's, ledger row removed (libvirt's release)
//
// Owner names in the ledger are "<domain>@<host>" (purpose guest), so the source and the
// destination of a migration never clash even when both run on one machine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "vrdma/common/result.hpp"
#include "vrdma/integration/domain_xml.hpp"
#include "vrdma/sriov/netlink.hpp"

namespace vrdma::integration {

// Where the SR-IOV manager looks: $VRDMA_SYSFS_ROOT (default /sys; the verbs provider reads the
// same variable) and $VRDMA_VF_LEDGER (default /var/lib/vrdma/vf-ledger.sqlite, the file
// `vrdmactl vf` uses), both settable in /etc/default/vrdma (read when the variable is unset,
// host_setting in migration_vf.hpp). Tests point them at the simulated
// SR-IOV sysfs tree and a ledger of their own.
struct VfPaths {
  std::string sysfs_root = "/sys";
  std::string ledger = "/var/lib/vrdma/vf-ledger.sqlite";
  static VfPaths from_environment();
};

// "<domain>@<host>", with anything the ledger does not take in an owner name turned into '_'.
std::string vf_owner(const std::string& domain, const std::string& host);

// The VF settings for a device: MAC = m.mac (when set), and the element's vf-vlan, vf-max-rate,
// vf-trust, vf-spoofchk. Error (a sentence) when the MAC is not a unicast MAC.
Result<sriov::VfConfig> vf_config_for(const DeviceMeta& m);

struct GuestVf {
  std::string vf;        // PCI address of the VF
  std::string pf;        // its PF
  std::uint32_t index = 0;
  std::string ibdev;     // the VF's RDMA device (from sysfs)
  std::string mac;       // the VF netdev's MAC as sysfs shows it ("" if it has no netdev)
  std::string owner;     // ledger owner
  bool reused = false;   // the owner's VF from an earlier start, not a new one
};

// Takes and configures a VF for m (m.vf must be set), held by this process. Errors as sentences:
// the PF named by vf-pool does not exist; no free VF (who holds the pool's VFs, or why each VF
// was left out, and the vrdmactl command that frees or adds one); the owner's VF is held by a
// live process; the PF's netdev refused a setting (the VF is then given back).
Result<GuestVf> assign_guest_vf(const VfPaths& paths, const DeviceMeta& m, const std::string& owner);

// The device vrdmad is started with: engine verbs:<ibdev>[?OPTIONS of the element's engine], and
// mac = the element's mac, else the VF's own.
DeviceMeta backend_for_vf(const DeviceMeta& m, const GuestVf& vf);

// The VF passes to process pid (the backend). Error when the ledger no longer has vf active
// for vf.owner.
Status hand_over_guest_vf(const VfPaths& paths, const GuestVf& vf, int pid);

struct ReleasedVf {
  std::string vf;
  std::string warning;  // "" or a sentence: the settings could not be cleared (the VF is free all the same)
};

// Gives the owner's VF back: the settings m asked for are reset to a fresh VF's
// (sriov::clean_vf_config), then the ledger row goes. nullopt when the owner holds none.
// Errors: the ledger cannot be opened or changed.
Result<std::optional<ReleasedVf>> release_guest_vf(const VfPaths& paths, const DeviceMeta& m, const std::string& owner);

}  // namespace vrdma::integration
