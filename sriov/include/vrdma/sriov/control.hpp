// Changing SR-IOV state through sysfs: the VF count (sriov_numvfs) and which driver a function is
// bound to (driver_override + drivers_probe, the kernel's documented way to pick a driver for one
// device). Every call waits until the change is visible (settle_timeout) and fails with a sentence
// that names the device and what to do.
#pragma once

#include <cstdint>
#include <string_view>

#include "vrdma/common/result.hpp"
#include "vrdma/sriov/discovery.hpp"

namespace vrdma::sriov {

// Sets the PF's VF count. The kernel only changes a non-zero count through zero, so going from
// 4 to 8 is refused (Errc::busy) rather than silently tearing down 4 VFs; disable first.
// Disabling (n = 0) is refused while a VF is bound to vfio-pci (Errc::busy: likely in a guest).
// Errors: not_found (no such PF), invalid_argument (n > sriov_totalvfs), bad_state (no PF
// driver), busy, timeout (VFs did not appear), io_error.
Status set_num_vfs(const SysfsRoot& sysfs, const PciAddress& pf, std::uint32_t n);

// Binds one function to `driver` ("vfio-pci", "mlx5_core", ...): writes driver_override, unbinds
// the current driver, and triggers drivers_probe. Errors: not_found (no such device or the driver
// is not loaded: modprobe it), bad_state (vfio-pci without an IOMMU group), timeout, io_error.
Status bind_driver(const SysfsRoot& sysfs, const PciAddress& fn, std::string_view driver);

// Clears driver_override and lets the kernel bind the function's own driver again.
Status bind_native_driver(const SysfsRoot& sysfs, const PciAddress& fn);

}  // namespace vrdma::sriov
