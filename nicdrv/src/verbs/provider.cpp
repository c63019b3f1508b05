#include "providers.hpp"
#include "vrdma/nicdrv/verbs.hpp"

namespace vrdma::nicdrv::detail {

Provider make_verbs_provider() {
  Provider p;
  p.prefix = "verbs";
  p.description = "rdma-core (libibverbs): hardware RDMA NICs, SR-IOV VFs, rxe and siw";
  p.open = [](std::string_view spec, const DeviceOptions& o) { return verbs::open(spec, o); };
  p.list = [] { return verbs::list(); };
  return p;
}

}  // namespace vrdma::nicdrv::detail
