// The nicdrv `pv` provider: a guest's view over the virtio RDMA device. nicdrv links no guest
// code (docs/architecture.md), so this file adds it to the registry of every binary that links
// vrdma_pv_provider, whole (CMake's WHOLE_ARCHIVE: nothing here is referenced, so a plain static
// link would drop it).
#include "vrdma/guest/pv.hpp"
#include "vrdma/nicdrv/registry.hpp"

namespace vrdma::pv {
namespace {

nicdrv::Provider make_provider() {
  nicdrv::Provider p;
  p.prefix = "pv";
  p.description = "paravirtual verbs over the virtio RDMA device (libpvverbs as a vhost-user frontend)";
  p.open = [](std::string_view spec, const nicdrv::DeviceOptions& o) { return pv::open(spec, o); };
  return p;
}

[[maybe_unused]] const bool registered = nicdrv::add_provider(make_provider());

}  // namespace
}  // namespace vrdma::pv
