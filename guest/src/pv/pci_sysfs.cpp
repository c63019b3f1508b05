#include "vrdma/guest/pci_sysfs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace vrdma::pv::pci {
namespace {

constexpr std::uint8_t kCapPtr = 0x34;
constexpr std::uint16_t kStatusCapList = 1u << 4;
constexpr std::uint8_t kCapVendor = 0x09;
constexpr std::uint64_t kIoResourceMem = 0x200;  // IORESOURCE_MEM in the `resource` file's flags

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::uint16_t read_hex16(const std::string& path) {
  const std::string s = read_line(path);
  return static_cast<std::uint16_t>(std::strtoul(s.c_str(), nullptr, 16));
}

}  // namespace

bool valid_address(const std::string& a) {
  // dddd:bb:dd.f
  if (a.size() != 12 || a[4] != ':' || a[7] != ':' || a[10] != '.') return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (i == 4 || i == 7 || i == 10) continue;
    if (std::isxdigit(static_cast<unsigned char>(a[i])) == 0) return false;
  }
  return a[11] >= '0' && a[11] <= '7';
}

Result<VirtioCaps> parse_virtio_caps(const std::array<std::uint8_t, 256>& cfg) {
  VirtioCaps caps;
  const std::uint16_t status = static_cast<std::uint16_t>(cfg[6] | (cfg[7] << 8));
  if ((status & kStatusCapList) == 0) return make_error(Errc::not_supported, "the function has no capability list");
  std::uint8_t ptr = cfg[kCapPtr] & 0xfc;
  // At most 48 capabilities fit in the 192 bytes after the header: more means a loop.
  for (int n = 0; ptr != 0; ++n) {
    if (n >= 48) return make_error(Errc::protocol_error, "the capability list loops");
    if (ptr < 0x40 || ptr > 256 - 4)
      return make_error(Errc::protocol_error, fmt::format("a capability at {:#x} lies outside config space", ptr));
    const std::uint8_t id = cfg[ptr], next = cfg[ptr + 1] & 0xfc, len = cfg[ptr + 2];
    if (id == kCapVendor) {
      if (len < 16 || std::size_t{ptr} + len > 256)
        return make_error(Errc::protocol_error, fmt::format("the virtio capability at {:#x} has length {}", ptr, len));
      CapLocation loc;
      loc.cap_offset = ptr;
      loc.bar = cfg[ptr + 4];
      std::memcpy(&loc.offset, &cfg[ptr + 8], 4);
      std::memcpy(&loc.length, &cfg[ptr + 12], 4);
      const auto type = static_cast<VirtioCap>(cfg[ptr + 3]);
      // virtio §4.1.4: the driver uses the first capability of each type it understands.
      switch (type) {
        case VirtioCap::common:
          if (!caps.common) caps.common = loc;
          break;
        case VirtioCap::notify:
          if (!caps.notify) {
            if (len < 20) return make_error(Errc::protocol_error, "the virtio notify capability is shorter than 20 bytes");
            caps.notify = loc;
            std::memcpy(&caps.notify_off_multiplier, &cfg[ptr + 16], 4);
          }
          break;
        case VirtioCap::isr:
          if (!caps.isr) caps.isr = loc;
          break;
        case VirtioCap::device:
          if (!caps.device) caps.device = loc;
          break;
        case VirtioCap::pci_cfg:
          if (!caps.pci_cfg) {
            if (len < 20) return make_error(Errc::protocol_error, "the virtio pci_cfg capability is shorter than 20 bytes");
            caps.pci_cfg = loc;
          }
          break;
        default:
          break;  // types this driver does not know (e.g. shared memory) are skipped
      }
    }
    ptr = next;
  }
  return caps;
}

Result<Function> Function::open(const std::string& address) {
  if (!valid_address(address))
    return make_error(Errc::invalid_argument,
                      fmt::format("'{}' is not a PCI address like 0000:00:04.0 (see lspci -D)", address));
  Function f;
  f.addr_ = address;
  const std::string cfg = f.sysfs() + "/config";
  f.config_ = UniqueFd(::open(cfg.c_str(), O_RDWR | O_CLOEXEC));
  if (!f.config_) return errno_error(errno, fmt::format("cannot open {} (no such function, or not root?)", cfg));
  f.vendor_ = read_hex16(f.sysfs() + "/vendor");
  f.device_ = read_hex16(f.sysfs() + "/device");
  return f;
}

std::string Function::driver() const {
  char buf[512];
  const std::string link = sysfs() + "/driver";
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return {};
  buf[n] = 0;
  const char* slash = std::strrchr(buf, '/');
  return slash != nullptr ? slash + 1 : buf;
}

Result<std::array<std::uint8_t, 256>> Function::read_config() const {
  std::array<std::uint8_t, 256> c{};
  const ssize_t n = ::pread(config_.get(), c.data(), c.size(), 0);
  if (n < 0) return errno_error(errno, "reading " + addr_ + "'s config space");
  if (n < 64) return make_error(Errc::access_denied, fmt::format("only {} bytes of {}'s config space are readable (root "
                                                                 "reads 256)", n, addr_));
  return c;
}

Result<std::uint16_t> Function::read_config16(std::uint32_t off) const {
  std::uint16_t v = 0;
  if (::pread(config_.get(), &v, 2, off) != 2) return errno_error(errno, "reading " + addr_ + "'s config space");
  return v;
}
Result<std::uint32_t> Function::read_config32(std::uint32_t off) const {
  std::uint32_t v = 0;
  if (::pread(config_.get(), &v, 4, off) != 4) return errno_error(errno, "reading " + addr_ + "'s config space");
  return v;
}
Status Function::write_config8(std::uint32_t off, std::uint8_t v) const {
  if (::pwrite(config_.get(), &v, 1, off) != 1) return errno_error(errno, "writing " + addr_ + "'s config space");
  return {};
}
Status Function::write_config16(std::uint32_t off, std::uint16_t v) const {
  if (::pwrite(config_.get(), &v, 2, off) != 2) return errno_error(errno, "writing " + addr_ + "'s config space");
  return {};
}
Status Function::write_config32(std::uint32_t off, std::uint32_t v) const {
  if (::pwrite(config_.get(), &v, 4, off) != 4) return errno_error(errno, "writing " + addr_ + "'s config space");
  return {};
}

std::uint64_t Function::bar_size(std::uint8_t n) const {
  if (n > 5) return 0;
  std::ifstream f(sysfs() + "/resource");
  std::string line;
  for (int i = 0; i <= n; ++i)
    if (!std::getline(f, line)) return 0;
  std::istringstream is(line);
  std::uint64_t start = 0, end = 0, flags = 0;
  is >> std::hex >> start >> end >> flags;
  if (!is || (flags & kIoResourceMem) == 0 || end < start) return 0;
  return end - start + 1;
}

Result<MmapArea> Function::map_bar(std::uint8_t n) const {
  const std::uint64_t size = bar_size(n);
  if (size == 0) return make_error(Errc::not_supported, fmt::format("{} has no memory BAR {}", addr_, n));
  const std::string path = fmt::format("{}/resource{}", sysfs(), n);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_SYNC));
  if (!fd) return errno_error(errno, "cannot open " + path);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return errno_error(errno, "cannot map " + path);
  return MmapArea(p, size);
}

Result<std::string> Function::uio_device() const {
  const std::string dir = sysfs() + "/uio";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr)
    return make_error(Errc::no_device, fmt::format("{} is not bound to uio_pci_generic (driver: '{}'); run pvverbs-bind",
                                                   addr_, driver()));
  std::string name;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, "uio", 3) == 0) name = e->d_name;
  }
  ::closedir(d);
  if (name.empty()) return make_error(Errc::no_device, addr_ + " has no uio node");
  return "/dev/" + name;
}

Result<std::uint32_t> Function::read_through_pci_cfg(const CapLocation& w, std::uint8_t bar, std::uint32_t offset,
                                                     std::uint8_t len) const {
  if (len != 1 && len != 2 && len != 4) return make_error(Errc::invalid_argument, "pci_cfg reads 1, 2 or 4 bytes");
  // virtio_pci_cfg_cap: cap.bar at +4, cap.offset at +8, cap.length at +12, pci_cfg_data at +16.
  // The window's three fields are put back as they were found: the function is left as it was
  // (its driver may use the window too, and a function that is not ours must not notice us).
  auto was_bar = read_config32(w.cap_offset + 4u);
  auto was_offset = read_config32(w.cap_offset + 8u);
  auto was_length = read_config32(w.cap_offset + 12u);
  if (!was_bar) return std::move(was_bar).error();
  if (!was_offset) return std::move(was_offset).error();
  if (!was_length) return std::move(was_length).error();
  VRDMA_TRY(write_config8(w.cap_offset + 4u, bar));
  VRDMA_TRY(write_config32(w.cap_offset + 8u, offset));
  VRDMA_TRY(write_config32(w.cap_offset + 12u, len));
  auto v = read_config32(w.cap_offset + 16u);
  VRDMA_TRY(write_config8(w.cap_offset + 4u, static_cast<std::uint8_t>(*was_bar & 0xffu)));
  VRDMA_TRY(write_config32(w.cap_offset + 8u, *was_offset));
  VRDMA_TRY(write_config32(w.cap_offset + 12u, *was_length));
  if (!v) return std::move(v).error();
  return len == 4 ? *v : (*v & ((1u << (8 * len)) - 1));
}

std::vector<std::string> list_functions() {
  std::vector<std::string> out;
  DIR* d = ::opendir("/sys/bus/pci/devices");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d))
    if (valid_address(e->d_name)) out.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace vrdma::pv::pci
