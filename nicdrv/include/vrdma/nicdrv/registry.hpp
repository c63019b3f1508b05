// Provider registry: picks a provider by the device name's prefix at run time.
// soft and verbs are compiled into libvrdma_nicdrv; pv (the guest's driver, libpvverbs) is added
// by the binaries that link vrdma_pv_provider (docs/architecture.md: nicdrv links no guest code).
// None needs loading.
//
//   soft:<IPv4>[?opt=val&...]     our userspace RoCEv2 engine bound to that address
//   soft:<ifname>[?...]           ... bound to the interface's first IPv4 address
//   verbs:<ibdev>                 rdma-core (libibverbs)
//   pv:<socket path>              a guest's view over the virtio RDMA device
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/nicdrv/device.hpp"

namespace vrdma::nicdrv {

// Provider-specific options, from the "?k=v&k=v" suffix of a device name or given directly.
struct DeviceOptions {
  std::map<std::string, std::string, std::less<>> params;
  [[nodiscard]] std::string_view get(std::string_view key, std::string_view dflt = {}) const;
  [[nodiscard]] bool flag(std::string_view key) const;  // "1", "true", "yes", "on"
};

struct DeviceInfo {
  std::string name;       // full name to pass to open_device
  std::string provider;
  std::string description;
};

struct Provider {
  std::string prefix;  // "soft", "verbs", "pv"
  std::string description;
  std::function<Result<std::shared_ptr<Device>>(std::string_view spec, const DeviceOptions&)> open;
  std::function<std::vector<DeviceInfo>()> list;  // may be empty
};

// Providers in this binary: the built-in ones, then those added.
const std::vector<Provider>& providers();

// Adds a provider that lives outside nicdrv (at static initialisation, before any other call
// here). False, and nothing added, if its prefix is taken.
bool add_provider(Provider p);

// Opens "prefix:spec[?opts]". Options in `opts` override those in the name.
Result<std::shared_ptr<Device>> open_device(std::string_view name, const DeviceOptions& opts = {});

// Every device every provider can see right now.
std::vector<DeviceInfo> list_devices();

}  // namespace vrdma::nicdrv
