// pvverbs-bind: inside a VM, finds the virtio RDMA device's PCI function by the signature in
// its config space (native, or the carrier window of a vhost-user-blk-pci: docs/virtio-rdma.md),
// keeps virtio_blk off it (driver_override) and binds it to uio_pci_generic, so that libpvverbs
// ("pv:pci:<address>" or "pv:pci:auto") can drive it from user space. Prints each address.
//
//   pvverbs-bind [--list] [--pci ADDRESS]
//
// The config space is read through the function's VIRTIO_PCI_CAP_PCI_CFG window in PCI
// config space (virtio §4.1.4.9), which works while virtio_blk still owns the BARs; the window is
// put back as it was, and a virtio_blk disk with sectors (a real disk) is skipped unread.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "vrdma/common/cli.hpp"
#include "vrdma/guest/pci_sysfs.hpp"
#include "vrdma/virtio_rdma.hpp"

using namespace vrdma;
namespace pci = vrdma::pv::pci;
namespace vd = vrdma::vrdma_dev;

namespace {

// virtio PCI device ids: 0x1000 + n transitional (0x1001 blk), 0x1040 + id modern.
bool virtio_rdma_candidate(std::uint16_t device) {
  return device == 0x1001 || device == 0x1040 + 2 || device == 0x1040 + vd::kVirtioId;
}

enum class Kind { none, native, carrier };

Result<Kind> identify(const pci::Function& f) {
  auto cfg = f.read_config();
  if (!cfg) return std::move(cfg).error();
  auto caps = pci::parse_virtio_caps(*cfg);
  if (!caps) return std::move(caps).error();
  if (!caps->device || !caps->pci_cfg || caps->device->length < sizeof(vd::CarrierConfig)) return Kind::none;
  const auto& d = *caps->device;
  auto rd = [&](std::uint32_t off) { return f.read_through_pci_cfg(*caps->pci_cfg, d.bar, d.offset + off, 4); };
  auto w0 = rd(0);
  if (!w0) return std::move(w0).error();
  if (*w0 == vd::kSignature) return Kind::native;
  auto w1 = rd(4), w2 = rd(vd::kCarrierSignatureOffset);
  if (!w1) return std::move(w1).error();
  if (!w2) return std::move(w2).error();
  if (*w0 == 0 && *w1 == 0 && *w2 == vd::kSignature) return Kind::carrier;
  return Kind::none;
}

// A virtio_blk disk with sectors is somebody's disk, not the carrier (whose capacity is 0): its
// config space is not touched (reading it means writing the function's pci_cfg window). Returns
// the disk's name and size, or nothing when the function is not such a disk.
std::optional<std::string> real_disk(const pci::Function& f) {
  std::error_code ec;
  for (const auto& v : std::filesystem::directory_iterator(f.sysfs(), ec)) {
    if (!v.path().filename().string().starts_with("virtio")) continue;
    std::error_code ec2;
    for (const auto& b : std::filesystem::directory_iterator(v.path() / "block", ec2)) {
      std::ifstream in(b.path() / "size");
      unsigned long long sectors = 0;
      if (in >> sectors && sectors > 0)
        return fmt::format("the virtio_blk disk {} ({} sectors)", b.path().filename().string(), sectors);
    }
  }
  return std::nullopt;
}

// The driver on the function's virtio device (virtio_pci creates /sys/.../virtioN; virtio_blk
// binds there, not to the PCI function), empty when none.
std::string virtio_driver(const pci::Function& f) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(f.sysfs(), ec)) {
    const auto name = e.path().filename().string();
    if (!name.starts_with("virtio")) continue;
    const auto drv = std::filesystem::read_symlink(e.path() / "driver", ec);
    if (!ec) return drv.filename().string();
  }
  return {};
}

bool write_file(const std::string& path, const std::string& v) {
  std::ofstream f(path);
  f << v;
  f.flush();
  return static_cast<bool>(f);
}

int bind(const pci::Function& f) {
  const std::string drv = f.driver();
  if (drv == "uio_pci_generic") return 0;
  if (::access("/sys/bus/pci/drivers/uio_pci_generic", F_OK) != 0) {
    std::fprintf(stderr, "pvverbs-bind: uio_pci_generic is not loaded (modprobe uio_pci_generic)\n");
    return 1;
  }
  // driver_override first, so that nothing but uio_pci_generic can take it after the unbind.
  if (!write_file(f.sysfs() + "/driver_override", "uio_pci_generic")) {
    std::fprintf(stderr, "pvverbs-bind: cannot set %s/driver_override (not root?)\n", f.sysfs().c_str());
    return 1;
  }
  if (!drv.empty() && !write_file(f.sysfs() + "/driver/unbind", f.address())) {
    std::fprintf(stderr, "pvverbs-bind: cannot unbind %s from %s\n", f.address().c_str(), drv.c_str());
    return 1;
  }
  if (!write_file("/sys/bus/pci/drivers_probe", f.address()) || f.driver() != "uio_pci_generic") {
    std::fprintf(stderr, "pvverbs-bind: %s did not bind to uio_pci_generic (driver now: '%s')\n", f.address().c_str(),
                 f.driver().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pvverbs-bind: bind the virtio RDMA device's PCI function to uio_pci_generic for libpvverbs", "pvverbs-bind"};
  vrdma::cli::prepare(app);
  bool list = false;
  std::string only;
  app.add_flag("--list", list, "only list the functions found, bind nothing");
  app.add_option("--pci", only, "only this function (0000:00:04.0)");
  if (auto rc = vrdma::cli::parse(app, argc, argv)) return *rc;

  int found = 0, failed = 0;
  for (const auto& a : pci::list_functions()) {
    if (!only.empty() && a != only) continue;
    auto f = pci::Function::open(a);
    if (!f || f->vendor() != pci::kVirtioVendor || !virtio_rdma_candidate(f->device())) continue;
    if (auto disk = real_disk(*f)) {
      if (list) std::printf("%s skipped: %s, not the carrier\n", a.c_str(), disk->c_str());
      continue;
    }
    auto k = identify(*f);
    if (!k) {
      std::fprintf(stderr, "pvverbs-bind: %s: %s\n", a.c_str(), k.error().message.c_str());
      continue;
    }
    if (*k == Kind::none) continue;
    ++found;
    if (list) {
      const std::string vdrv = virtio_driver(*f);
      std::printf("%s %s driver=%s virtio=%s\n", a.c_str(), *k == Kind::native ? "native" : "carrier",
                  f->driver().empty() ? "none" : f->driver().c_str(), vdrv.empty() ? "none" : vdrv.c_str());
      continue;
    }
    if (bind(*f) != 0) {
      ++failed;
      continue;
    }
    std::printf("%s\n", a.c_str());
  }
  if (found == 0) {
    std::fprintf(stderr, "pvverbs-bind: no virtio RDMA device found (no virtio function carries the \"VRDM\" signature)\n");
    return 1;
  }
  return failed == 0 ? 0 : 1;
}
