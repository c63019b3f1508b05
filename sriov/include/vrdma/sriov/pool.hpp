// The VF pool: which VFs may be handed out (from discovery) and the whole assign/release flow
// (ledger row, netlink settings, driver binding) with rollback on failure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/sriov/discovery.hpp"
#include "vrdma/sriov/ledger.hpp"
#include "vrdma/sriov/netlink.hpp"

namespace vrdma::sriov {

struct PoolFilter {
  std::optional<PciAddress> pf;    // only VFs of this PF
  std::optional<PciAddress> vf;    // exactly this VF
  std::optional<int> numa_node;    // only VFs on this NUMA node
  bool need_rdma = true;           // the host-side backend needs the VF's RDMA function
};

// VFs that match `filter` and are usable, in address order. A VF bound to vfio-pci is left out
// (a guest may own it outside vrdma); so is a VF without an RDMA device when need_rdma. Each
// excluded VF adds one sentence to `excluded` when given. The ledger decides who holds what.
std::vector<Candidate> pool_candidates(const Inventory& inv, const PoolFilter& filter,
                                       std::vector<std::string>* excluded = nullptr);

enum class BindMode { keep, vfio, native };

struct AssignOptions {
  PoolFilter filter;
  VfConfig net;                  // applied through the PF netdev when not empty
  BindMode bind = BindMode::keep;
  // Held until released (a guest assigned by the CLI) rather than until req.owner_pid exits
  // (a backend's own allocation). The pid still guards the reservation until activation.
  bool persistent = false;
};

// Applies `cfg` to VF `vf_index` of PF `pf` through the PF's first netdev (rtnetlink). Nothing to
// do when cfg is empty. Errors: bad_state when the PF has no netdev, else as Rtnl::set_vf.
Status configure_vf(const Inventory& inv, const PciAddress& pf, std::uint32_t vf_index, const VfConfig& cfg);

// The settings that undo `applied`: for each field it sets, the value a fresh VF has (MAC
// 00:00:00:00:00:00, no VLAN, no rate limits, trust off, spoof-check on, link state auto).
VfConfig clean_vf_config(const VfConfig& applied);

// Reserve → configure → bind → active; any failure after the reservation releases the row again
// and returns the failure. Errors: as Ledger::allocate, Rtnl::set_vf and bind_driver, plus
// no_memory ("no free VF") with the exclusion reasons in the sentence.
Result<Allocation> assign_vf(const SysfsRoot& sysfs, Ledger& ledger, const AllocateRequest& req,
                             const AssignOptions& opts);

// Marks the row releasing, rebinds the VF to its own driver when it was on vfio-pci and
// `rebind_native`, then removes the row.
Status release_vf(const SysfsRoot& sysfs, Ledger& ledger, const PciAddress& vf,
                  const std::optional<std::string>& owner, bool rebind_native);

}  // namespace vrdma::sriov
