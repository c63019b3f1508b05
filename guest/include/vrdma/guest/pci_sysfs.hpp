// A PCI function seen from user space through sysfs (/sys/bus/pci/devices/<address>/): its
// config space (the `config` file), its memory BARs (`resourceN`, mmap), its driver binding and
// its uio node; plus the virtio 1.x PCI capabilities (virtio spec §4.1.4), each checked to lie
// inside its BAR. Shared by the pci transport of libpvverbs and by pvverbs-bind, and fuzzed
// (pci_caps_fuzzer): public to those, not part of the API applications use.
//
// The device is untrusted from the driver's side as well: every capability, offset and length
// read from it is bounds-checked (overflow-free) before anything is mapped or dereferenced.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"

namespace vrdma::pv::pci {

inline constexpr std::uint16_t kVirtioVendor = 0x1af4;
inline constexpr std::uint16_t kCommandMemory = 1u << 1;
inline constexpr std::uint16_t kCommandBusMaster = 1u << 2;
inline constexpr std::uint16_t kCommandIntxDisable = 1u << 10;

// virtio §4.1.4 cfg_type values.
enum class VirtioCap : std::uint8_t { common = 1, notify = 2, isr = 3, device = 4, pci_cfg = 5 };

struct CapLocation {
  std::uint8_t bar = 0;
  std::uint32_t offset = 0, length = 0;
  std::uint8_t cap_offset = 0;  // where the capability sits in config space
};

struct VirtioCaps {
  std::optional<CapLocation> common, notify, isr, device, pci_cfg;
  std::uint32_t notify_off_multiplier = 0;
};

// Parses the capability list of a 256-byte config space image. Refuses loops, capabilities
// outside config space and virtio capabilities too short for their type.
Result<VirtioCaps> parse_virtio_caps(const std::array<std::uint8_t, 256>& cfg);

// The kernel's name for a function: "0000:00:04.0". Refuses anything else (the name becomes
// a sysfs path).
bool valid_address(const std::string& addr);

class Function {
 public:
  static Result<Function> open(const std::string& address);

  [[nodiscard]] const std::string& address() const { return addr_; }
  [[nodiscard]] std::string sysfs() const { return "/sys/bus/pci/devices/" + addr_; }
  [[nodiscard]] std::uint16_t vendor() const { return vendor_; }
  [[nodiscard]] std::uint16_t device() const { return device_; }
  // The bound driver's name, empty when none.
  [[nodiscard]] std::string driver() const;

  Result<std::array<std::uint8_t, 256>> read_config() const;
  Result<std::uint16_t> read_config16(std::uint32_t off) const;
  Status write_config16(std::uint32_t off, std::uint16_t v) const;
  Status write_config32(std::uint32_t off, std::uint32_t v) const;
  Result<std::uint32_t> read_config32(std::uint32_t off) const;
  Status write_config8(std::uint32_t off, std::uint8_t v) const;

  // Size of memory BAR n (0 when absent or an I/O BAR), from the `resource` file.
  [[nodiscard]] std::uint64_t bar_size(std::uint8_t n) const;
  // Maps memory BAR n read/write (resourceN).
  Result<MmapArea> map_bar(std::uint8_t n) const;

  // /dev/uioN of a function bound to uio_pci_generic.
  Result<std::string> uio_device() const;

  // Reads `len` (1, 2 or 4) bytes at `offset` of BAR `bar` through the VIRTIO_PCI_CAP_PCI_CFG
  // window in config space (virtio §4.1.4.9): works while another driver owns the BARs.
  Result<std::uint32_t> read_through_pci_cfg(const CapLocation& window, std::uint8_t bar, std::uint32_t offset,
                                             std::uint8_t len) const;

 private:
  std::string addr_;
  UniqueFd config_;
  std::uint16_t vendor_ = 0, device_ = 0;
};

// Every PCI function's address, sorted.
std::vector<std::string> list_functions();

}  // namespace vrdma::pv::pci
