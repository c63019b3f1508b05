// PCI function -> RDMA device through sysfs (Documentation/ABI/testing/sysfs-class-infiniband:
// an RDMA device sits under its PCI function as .../<bdf>/infiniband/<ibdev>). This is how a
// VF from the SR-IOV pool (sriov/) becomes a verbs device name.
#include <cctype>
#include <cstdlib>
#include <system_error>

#include <fmt/format.h>

#include "vrdma/nicdrv/verbs.hpp"

namespace vrdma::nicdrv::verbs {

bool is_pci_address(std::string_view s) noexcept {
  // DDDD:BB:DD.F, hex digits, as the kernel names PCI functions.
  static constexpr std::string_view kShape = "xxxx:xx:xx.x";
  if (s.size() != kShape.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const bool hex = std::isxdigit(static_cast<unsigned char>(s[i])) != 0;
    if (kShape[i] == 'x' ? !hex : s[i] != kShape[i]) return false;
  }
  return true;
}

std::filesystem::path default_sysfs_root() {
  const char* env = std::getenv("VRDMA_SYSFS_ROOT");
  return env != nullptr && *env != '\0' ? std::filesystem::path(env) : std::filesystem::path("/sys");
}

Result<std::string> ibdev_for_pci(const std::filesystem::path& sysfs_root, std::string_view bdf) {
  namespace fs = std::filesystem;
  if (!is_pci_address(bdf))
    // fmt, not "'" + std::string(bdf): GCC 12 at -O3 (Release) warns about that concatenation
    // (-Wrestrict, a known false positive, GCC bug 105329), and warnings are errors.
    return make_error(Errc::invalid_argument,
                      fmt::format("'{}' is not a PCI address; write it as DDDD:BB:DD.F, e.g. 0000:3b:02.1", bdf));
  std::string lower(bdf);
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const fs::path fn = sysfs_root / "bus/pci/devices" / lower;
  std::error_code ec;
  if (!fs::exists(fn, ec))
    return make_error(Errc::not_found, "PCI function " + lower + " does not exist (no " + fn.string() +
                                           "); check the address with lspci, or that its VFs are enabled");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fn / "infiniband", ec)) names.push_back(e.path().filename().string());
  if (names.empty())
    return make_error(Errc::not_found, "PCI function " + lower + " has no RDMA device (nothing under " +
                                           (fn / "infiniband").string() +
                                           "): its driver may not be bound or may not offer RDMA on this function");
  if (names.size() > 1) {
    std::string all;
    for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
    return make_error(Errc::invalid_argument,
                      "PCI function " + lower + " has several RDMA devices (" + all + "); name one as verbs:<ibdev>");
  }
  return names.front();
}

}  // namespace vrdma::nicdrv::verbs
