#include "vrdma/sriov/control.hpp"

#include <fmt/format.h>

#include <cerrno>

#include "sysfs_io.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::sriov {
namespace fs = std::filesystem;
using detail::link_basename;
using detail::read_attr;
using detail::wait_until;
using detail::write_attr;

namespace {

std::string current_driver(const SysfsRoot& sysfs, const PciAddress& a) {
  return link_basename(sysfs.pci_device(a) / "driver").value_or("");
}

std::uint32_t count_present_vfs(const SysfsRoot& sysfs, const PciAddress& pf) {
  std::uint32_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(sysfs.pci_device(pf), ec)) {
    if (e.path().filename().string().rfind("virtfn", 0) != 0) continue;
    if (fs::exists(e.path(), ec)) ++n;  // follows the link: the VF device must exist too
  }
  return n;
}

Status unbind(const SysfsRoot& sysfs, const PciAddress& fn, const std::string& drv) {
  auto st = write_attr(sysfs.pci_driver(drv) / "unbind", fn.str());
  if (!st.ok())
    return make_error(st.error().is(Errc::not_found) ? Errc::not_found : Errc::io_error,
                      fmt::format("cannot unbind {} from {}: {}", fn.str(), drv, st.error().message));
  if (!wait_until([&] { return current_driver(sysfs, fn).empty(); }, sysfs.settle_timeout))
    return make_error(Errc::timeout, fmt::format("{} is still bound to {} {} ms after unbinding; check dmesg for "
                                                 "a driver that refuses to let go",
                                                 fn.str(), drv, sysfs.settle_timeout.count()));
  return {};
}

Status probe(const SysfsRoot& sysfs, const PciAddress& fn) {
  auto st = write_attr(sysfs.root / "bus/pci/drivers_probe", fn.str());
  if (!st.ok()) return make_error(Errc::io_error, fmt::format("cannot re-probe {}: {}", fn.str(), st.error().message));
  return {};
}

}  // namespace

Status set_num_vfs(const SysfsRoot& sysfs, const PciAddress& pf, std::uint32_t n) {
  const fs::path dir = sysfs.pci_device(pf);
  std::error_code ec;
  if (!fs::exists(dir, ec))
    return make_error(Errc::not_found, fmt::format("there is no PCI device {} (looked in {})", pf.str(), dir.string()));
  if (!fs::exists(dir / "sriov_totalvfs", ec))
    return make_error(Errc::invalid_argument,
                      fmt::format("{} is not an SR-IOV physical function (it has no sriov_totalvfs)", pf.str()));
  auto total_s = read_attr(dir / "sriov_totalvfs");
  auto cur_s = read_attr(dir / "sriov_numvfs");
  if (!total_s) return std::move(total_s).error();
  if (!cur_s) return std::move(cur_s).error();
  auto total = parse_sysfs_int(*total_s, 0, 65535);
  auto cur = parse_sysfs_int(*cur_s, 0, 65535);
  if (!total || !cur)
    return make_error(Errc::io_error, fmt::format("PF {} shows an unreadable VF count (sriov_totalvfs '{}', "
                                                  "sriov_numvfs '{}')",
                                                  pf.str(), total_s->substr(0, 16), cur_s->substr(0, 16)));
  if (n > *total)
    return make_error(Errc::invalid_argument, fmt::format("PF {} supports at most {} VFs (sriov_totalvfs); {} were "
                                                          "asked for",
                                                          pf.str(), *total, n));
  if (static_cast<std::int64_t>(n) == *cur) {
    log::info("PF {} already has {} VFs; nothing to change", pf.str(), n);
    return {};
  }
  if (*cur != 0 && n != 0)
    return make_error(Errc::busy, fmt::format("PF {} already has {} VFs enabled and the kernel changes the count only "
                                              "from 0; disable them first ('vrdmactl vf disable --pf {}'), which "
                                              "removes every VF of this PF",
                                              pf.str(), *cur, pf.str()));
  const std::string pf_driver = current_driver(sysfs, pf);
  if (pf_driver.empty())
    return make_error(Errc::bad_state, fmt::format("PF {} has no driver bound, so the kernel cannot create or remove "
                                                   "its VFs; load the PF's driver (for example 'modprobe qede', "
                                                   "'modprobe ice' or 'modprobe mlx5_core') and retry",
                                                   pf.str()));
  if (n == 0) {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().filename().string().rfind("virtfn", 0) != 0) continue;
      auto vf = link_basename(e.path());
      if (!vf) continue;
      if (link_basename(e.path() / "driver").value_or("") == "vfio-pci")
        return make_error(Errc::busy, fmt::format("VF {} of PF {} is bound to vfio-pci, so a guest probably uses it; "
                                                  "detach it from the guest and release it ('vrdmactl vf release "
                                                  "--vf {}') before disabling the VFs",
                                                  *vf, pf.str(), *vf));
    }
  }
  auto st = write_attr(dir / "sriov_numvfs", std::to_string(n));
  if (!st.ok()) {
    const auto& e = st.error();
    if (e.is(Errc::busy))
      return make_error(Errc::busy, fmt::format("the kernel refused to change the VF count of PF {} because it is "
                                                "busy (VFs still in use, or another change in progress): {}; stop "
                                                "what uses the VFs and retry",
                                                pf.str(), e.message));
    if (e.is(Errc::not_found))
      return make_error(Errc::not_supported, fmt::format("driver {} of PF {} does not support SR-IOV configuration "
                                                         "through sysfs: {}",
                                                         pf_driver, pf.str(), e.message));
    return make_error(e.is(Errc::no_memory) || e.is(Errc::limit_exceeded) ? Errc::no_memory : Errc::io_error,
                      fmt::format("the kernel could not set {} VFs on PF {}: {}; check dmesg (SR-IOV disabled in "
                                  "firmware/BIOS, or not enough PCI bus numbers)",
                                  n, pf.str(), e.message));
  }
  if (!wait_until([&] { return count_present_vfs(sysfs, pf) == n; }, sysfs.settle_timeout))
    return make_error(Errc::timeout, fmt::format("PF {} accepted sriov_numvfs={} but shows {} VFs after {} ms; check "
                                                 "dmesg",
                                                 pf.str(), n, count_present_vfs(sysfs, pf),
                                                 sysfs.settle_timeout.count()));
  log::info("PF {} now has {} VFs", pf.str(), n);
  return {};
}

Status bind_driver(const SysfsRoot& sysfs, const PciAddress& fn, std::string_view driver_sv) {
  const std::string driver(driver_sv);
  const fs::path dir = sysfs.pci_device(fn);
  std::error_code ec;
  if (!fs::exists(dir, ec))
    return make_error(Errc::not_found, fmt::format("there is no PCI device {} (looked in {})", fn.str(), dir.string()));
  if (!fs::exists(sysfs.pci_driver(driver), ec))
    return make_error(Errc::not_found, fmt::format("driver {} is not loaded (no {}); run 'modprobe {}' and retry",
                                                   driver, sysfs.pci_driver(driver).string(), driver));
  if (driver == "vfio-pci" && !fs::exists(dir / "iommu_group", ec))
    return make_error(Errc::bad_state, fmt::format("{} has no IOMMU group, so vfio-pci cannot give it to a guest; "
                                                   "enable the IOMMU (intel_iommu=on or amd_iommu=on on the kernel "
                                                   "command line, VT-d/AMD-Vi in firmware)",
                                                   fn.str()));
  const std::string cur = current_driver(sysfs, fn);
  if (cur == driver) return {};
  VRDMA_TRY(write_attr(dir / "driver_override", driver));
  if (!cur.empty()) VRDMA_TRY(unbind(sysfs, fn, cur));
  VRDMA_TRY(probe(sysfs, fn));
  if (!wait_until([&] { return current_driver(sysfs, fn) == driver; }, sysfs.settle_timeout)) {
    std::string now = current_driver(sysfs, fn);
    return make_error(Errc::timeout, fmt::format("{} did not bind to {} within {} ms (now bound to {}); check dmesg",
                                                 fn.str(), driver, sysfs.settle_timeout.count(),
                                                 now.empty() ? "no driver" : now));
  }
  log::info("{} is now bound to {}", fn.str(), driver);
  return {};
}

Status bind_native_driver(const SysfsRoot& sysfs, const PciAddress& fn) {
  auto inv = discover(sysfs);
  if (!inv) return std::move(inv).error();
  const PciFunction* f = inv->find(fn);
  if (f == nullptr)
    return make_error(Errc::not_found, fmt::format("there is no SR-IOV function {} under {}", fn.str(),
                                                   sysfs.root.string()));
  const std::string native = f->native_driver();
  std::error_code ec;
  if (!native.empty() && !fs::exists(sysfs.pci_driver(native), ec))
    return make_error(Errc::not_found, fmt::format("driver {} for {} ({}) is not loaded; run 'modprobe {}' and retry",
                                                   native, fn.str(), f->model(), native));
  if (!native.empty() && f->driver == native && f->driver_override.empty()) return {};
  VRDMA_TRY(write_attr(sysfs.pci_device(fn) / "driver_override", ""));
  if (!f->driver.empty()) VRDMA_TRY(unbind(sysfs, fn, f->driver));
  VRDMA_TRY(probe(sysfs, fn));
  auto bound = [&] {
    std::string d = current_driver(sysfs, fn);
    return native.empty() ? (!d.empty() && d != "vfio-pci") : d == native;
  };
  if (!wait_until(bound, sysfs.settle_timeout))
    return make_error(Errc::timeout, fmt::format("no driver claimed {} within {} ms after clearing driver_override; "
                                                 "load its driver ({}) and check dmesg",
                                                 fn.str(), sysfs.settle_timeout.count(),
                                                 native.empty() ? "unknown for this device id" : native));
  log::info("{} is back on its own driver {}", fn.str(), current_driver(sysfs, fn));
  return {};
}

}  // namespace vrdma::sriov
