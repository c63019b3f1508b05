// DeviceHost::last_avail_chain: the chain a device kept posted across a migration (device.hpp).
#include <fmt/format.h>

#include "backend_session.hpp"
#include "ring_layout.hpp"

namespace vrdma::vhost {

Result<DescChain> BackendSession::last_avail_chain(std::uint16_t index) const {
  if (index >= vrings_.size()) return make_error(Errc::invalid_argument, fmt::format("there is no vring {}", index));
  const Vring& v = vrings_[index];
  if (!v.addr_set || v.num == 0) return make_error(Errc::bad_state, fmt::format("vring {} is not set up", index));
  if (acked_.has(VirtioFeature::ring_packed))
    return make_error(Errc::not_supported, fmt::format("vring {} is packed: a kept buffer is found on split rings only", index));
  const std::uint16_t last = static_cast<std::uint16_t>(v.base);  // split: last avail idx
  if (last == 0) return make_error(Errc::not_found, fmt::format("vring {} has had no buffer yet", index));
  RingSetup s;
  s.size = v.num;
  auto desc = mem_->uaddr_to_gpa(v.addr.desc_uaddr, desc_area_size(s));
  auto drv = mem_->uaddr_to_gpa(v.addr.avail_uaddr, driver_area_size(s));
  if (!desc) return std::move(desc).error();
  if (!drv) return std::move(drv).error();
  const GuestView g = view();
  const std::uint16_t slot = static_cast<std::uint16_t>((last - 1u) % v.num);
  auto head = g.read_obj<std::uint16_t>(*drv + kAvailRing + std::uint64_t{slot} * 2);
  if (!head) return std::move(head).error();
  if (*head >= v.num)
    return make_error(Errc::protocol_error, fmt::format("vring {}: avail slot {} names descriptor {} of {}", index, slot,
                                                        *head, v.num));
  return walk_split_chain(g, *desc, v.num, *head, acked_.has(VirtioFeature::ring_indirect_desc));
}

}  // namespace vrdma::vhost
