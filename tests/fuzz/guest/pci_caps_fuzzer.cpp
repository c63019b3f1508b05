// libpvverbs' pci transport parses a PCI function's config space (its capability list) before
// it maps anything: every capability it returns must lie inside config space, and no input may
// crash or loop.
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "vrdma/guest/pci_sysfs.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::array<std::uint8_t, 256> cfg{};
  std::memcpy(cfg.data(), data, size < cfg.size() ? size : cfg.size());
  auto caps = vrdma::pv::pci::parse_virtio_caps(cfg);
  if (!caps) return 0;
  for (const auto* c : {&caps->common, &caps->notify, &caps->isr, &caps->device, &caps->pci_cfg}) {
    if (!c->has_value()) continue;
    if ((*c)->cap_offset < 0x40 || (*c)->cap_offset > 256 - 16) std::abort();
  }
  return 0;
}
