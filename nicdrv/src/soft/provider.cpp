#include "providers.hpp"
#include "vrdma/nicdrv/soft.hpp"

namespace vrdma::nicdrv::detail {

Provider make_soft_provider() {
  Provider p;
  p.prefix = "soft";
  p.description = "userspace RoCEv2 engine over UDP port 4791";
  p.open = [](std::string_view spec, const DeviceOptions& o) { return soft::open(spec, o); };
  return p;
}

}  // namespace vrdma::nicdrv::detail
