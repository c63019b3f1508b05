#include "providers.hpp"
#include "vrdma/vhost/pv.hpp"

namespace vrdma::nicdrv::detail {

Provider make_pv_provider() {
  Provider p;
  p.prefix = "pv";
  p.description = "paravirtual verbs over the virtio RDMA device (libpvverbs as a vhost-user frontend)";
  p.open = [](std::string_view spec, const DeviceOptions& o) { return pv::open(spec, o); };
  return p;
}

}  // namespace vrdma::nicdrv::detail
