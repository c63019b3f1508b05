// What the guest VFs (guest_vf.cpp) and the migration VF (migration_vf.cpp) share.
#pragma once

#include <cstddef>
#include <string>

#include "vrdma/common/result.hpp"
#include "vrdma/integration/guest_vf.hpp"
#include "vrdma/sriov/discovery.hpp"
#include "vrdma/sriov/ledger.hpp"
#include "vrdma/sriov/pool.hpp"

namespace vrdma::integration {

sriov::SysfsRoot sysfs_of(const VfPaths& p);

// This host's name up to the first dot (the "@host" of ledger owners and the hook's XML).
std::string short_hostname();

// Owner names are printable ASCII without spaces (the ledger's rule); anything else becomes '_'.
std::string ledger_safe(const std::string& s, std::size_t max);

// The operator's sentence when `pool` ("" = the whole host) has nothing to give: who holds its
// VFs, or why each VF cannot `use` ("serve a backend"), and the vrdmactl command that frees or
// adds one.
Error no_free_vf(const sriov::Inventory& inv, sriov::Ledger& ledger, const sriov::PoolFilter& filter,
                 const std::string& pool, const std::string& use);

}  // namespace vrdma::integration
