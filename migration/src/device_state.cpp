// DeviceState's public face (device_state.hpp) and the device's hooks: what a stop, a start
// and a reset of the device mean to the state that moves it.

#include "device_state_impl.hpp"
#include "vrdma/vhost/write_journal.hpp"

namespace vrdma::migration {

DeviceState::DeviceState(device::RdmaDevice& device, DeviceStateOptions opts)
    : impl_(std::make_unique<Impl>(device, opts)) {}
DeviceState::~DeviceState() = default;

Result<std::vector<std::uint8_t>> DeviceState::save_state() { return impl_->save_state(); }
Status DeviceState::load_state(std::span<const std::uint8_t> blob) { return impl_->load_state(blob); }
std::vector<std::uint8_t> DeviceState::save_layout() const { return impl_->save_layout(); }
Status DeviceState::precreate(std::span<const std::uint8_t> layout) { return impl_->precreate(layout); }
void DeviceState::drop_precreated() { impl_->pre.clear(); }
Status DeviceState::save_state_to_guest() { return impl_->save_state_to_guest(); }
Result<bool> DeviceState::load_state_from_guest() { return impl_->load_state_from_guest(); }
std::string DeviceState::state_lost() const { return impl_->state_lost; }
bool DeviceState::has_state_area() const { return impl_->state_area.has_value(); }
std::uint64_t DeviceState::state_bound_bytes() const { return vd::state_area_bound(impl_->census()); }
std::uint64_t DeviceState::state_area_bytes() const { return impl_->state_area ? impl_->state_area->writable : 0; }
std::uint64_t DeviceState::state_area_state_bytes() const { return impl_->state_saved_bytes; }
notice::Message DeviceState::peer_notice(const notice::Message& m, const notice::Address& from) {
  return impl_->answer_notice(m, from);
}
DeviceStateStats DeviceState::stats() const {
  auto s = impl_->st;
  s.precreated = impl_->pre.count();
  s.adopted = impl_->adopted;
  return s;
}

DeviceState::Impl::Impl(device::RdmaDevice& dev, DeviceStateOptions o) : device(dev), d(dev.model()), opts(o) {
  device.set_hooks(this);
}

DeviceState::Impl::~Impl() {
  device.set_hooks(nullptr);
  pre.clear();
  if (hold_timer) d.loop.remove(hold_timer.get());
}

void DeviceState::Impl::rings_stopped() {
  if (!state_area || !vhost::journal::enabled()) return;
  for (const auto& b : state_area->bufs)
    if (b.writable) vhost::journal::object(vhost::journal::Object::state_area, 0, b.gpa, b.len);
}

void DeviceState::Impl::rings_running() {
  if (!stopped_for_rebuild.empty()) rebuild_here();
  withdraw_state_from_guest();
}

void DeviceState::Impl::device_reset() {
  rebuilds.clear();
  stopped_for_rebuild.clear();
  held_for_peer.clear();
  state_area.reset();
  state_area_asked = 0;
}

}  // namespace vrdma::migration
