// The provider-neutral connection entry points (cm.hpp): soft devices use our own CM on QP1,
// verbs devices librdmacm bound to the device's address, pv has none yet.
#include "vrdma/nicdrv/cm.hpp"

#include <arpa/inet.h>

#include "vrdma/nicdrv/soft.hpp"
#include "vrdma/nicdrv/verbs.hpp"

namespace vrdma::nicdrv {
namespace {

bool starts_with(const std::string& s, std::string_view p) { return s.compare(0, p.size(), p) == 0; }

// The device's first IPv4 address (its RoCEv2 IPv4-mapped GID), or "".
std::string device_ipv4(Device& dev) {
  auto t = dev.gid_table();
  if (!t) return {};
  for (const auto& g : *t) {
    if (!g.gid.is_ipv4_mapped()) continue;
    std::uint32_t ip = g.gid.ipv4();
    char b[INET_ADDRSTRLEN];
    if (::inet_ntop(AF_INET, &ip, b, sizeof b) != nullptr) return b;
  }
  return {};
}

Error unsupported(const std::shared_ptr<Device>& dev) {
  return make_error(Errc::not_supported, (dev ? dev->name() : std::string("(no device)")) +
                                             " has no connection manager (RDMA-CM works on soft: and verbs: devices)");
}

}  // namespace

Result<std::unique_ptr<CmConnection>> cm_resolve(const std::shared_ptr<Device>& dev, std::string_view dst_ip,
                                                 std::uint16_t port, const CmParams& params) {
  if (!dev) return unsupported(dev);
  if (starts_with(dev->name(), "soft:")) return soft::cm_resolve(dev, dst_ip, port, params);
  if (starts_with(dev->name(), "verbs:")) {
    auto c = verbs::cm_resolve(dst_ip, port, device_ipv4(*dev), params);
    if (!c) return c;
    const std::string& via = (*c)->device_name();
    if (dev->name().compare(0, via.size(), via) != 0)
      return make_error(Errc::invalid_argument, "the route to " + std::string(dst_ip) + " uses " + via + ", not " +
                                                    dev->name() + ": open that device instead");
    return c;
  }
  return unsupported(dev);
}

Result<std::unique_ptr<CmListener>> cm_listen(const std::shared_ptr<Device>& dev, std::uint16_t port, int backlog) {
  if (!dev) return unsupported(dev);
  if (starts_with(dev->name(), "soft:")) return soft::cm_listen(dev, port, backlog);
  if (starts_with(dev->name(), "verbs:")) return verbs::cm_listen(device_ipv4(*dev), port, backlog);
  return unsupported(dev);
}

}  // namespace vrdma::nicdrv
