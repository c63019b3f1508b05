// The switchover protocol (switchover.hpp, docs/migration.md): MigratingDevice's vhost::Device
// face. It forwards to the device model and moves the migration's phase when the frontend
// starts and stops the rings; the roles are in switchover_source.cpp and
// switchover_destination.cpp, their link in switchover_link.cpp.
#include "vrdma/migration/switchover.hpp"

#include <fmt/format.h>

#include "switchover_impl.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::migration {

using Clock = std::chrono::steady_clock;

const char* to_string(Phase p) noexcept {
  switch (p) {
    case Phase::idle: return "idle";
    case Phase::connecting: return "connecting";
    case Phase::incoming: return "incoming";
    case Phase::holding: return "holding";
    case Phase::loaded: return "loaded";
    case Phase::armed: return "armed";
    case Phase::state_sent: return "state-sent";
    case Phase::handed_over: return "handed-over";
    case Phase::migrated: return "migrated";
    case Phase::failed: return "failed";
    case Phase::running: return "running";
    case Phase::in_guest: return "in-guest";
  }
  return "unknown";
}


MigratingDevice::MigratingDevice(device::RdmaDevice& inner, vhost::EventLoop& loop, MigrationOptions opts)
    : impl_(std::make_unique<Impl>(inner, loop, std::move(opts))) {}
MigratingDevice::~MigratingDevice() = default;

MigrationStatus MigratingDevice::status() const {
  MigrationStatus s = impl_->st;
  s.garps = impl_->announcer.sent();
  return s;
}

vhost::DeviceInfo MigratingDevice::info() const { return impl_->inner.info(); }
std::vector<std::uint8_t> MigratingDevice::config() const { return impl_->inner.config(); }
Status MigratingDevice::write_config(std::uint32_t offset, std::span<const std::uint8_t> data) {
  return impl_->inner.write_config(offset, data);
}
void MigratingDevice::features_acked(vhost::VirtioFeatures acked) { impl_->inner.features_acked(acked); }

void MigratingDevice::attach(vhost::DeviceHost* host) {
  auto& m = *impl_;
  if (host == nullptr && m.st.phase == Phase::in_guest) {
    // The frontend went away after a migration stop: the VMM quits once the guest runs at the
    // destination. (A migration that fails restarts the rings here instead.)
    m.st.peer.clear();
    m.let_go();
  }
  m.host = host;
  m.inner.attach(host);
}

void MigratingDevice::memory_changed() {
  impl_->inner.memory_changed();
  impl_->try_load();
}

void MigratingDevice::queue_ready(vhost::Queue& q) {
  auto& m = *impl_;
  switch (m.st.phase) {
    case Phase::incoming:
    case Phase::holding:
      if (m.st.phase == Phase::incoming) {
        m.st.phase = Phase::holding;
        m.st.message = "the guest's rings started before its device state arrived; holding them until it does";
        if (!m.guest_only)
          log::warn("migration: ring {} started before the device state arrived from the source; holding every ring "
                    "until it does (is the source vrdmad migrating to us?), or until it is found in guest memory",
                    q.index());
      }
      if (m.try_guest_state()) m.activate();  // runs every ring, this one included
      return;
    case Phase::in_guest:
      m.st.phase = Phase::idle;
      m.st.message = "the frontend runs the guest here again after a migration stop; the device carries on";
      log::info("migration: {}", m.st.message);
      if (!m.opts.announce_if.empty())
        if (auto n = set_noarp(m.opts.announce_if, false); !n.ok()) log::error("migration: {}", n.error().message);
      break;
    case Phase::loaded:
      m.activate();  // runs every ring, this one included
      return;
    case Phase::migrated:
      if (!m.told_dropping) {
        m.told_dropping = true;
        log::error("migration: the guest's rings started again here after it moved to {}; ignoring them", m.st.peer);
      }
      return;
    case Phase::state_sent:
    case Phase::handed_over:
      // The frontend runs the guest here again: the migration failed on its side.
      m.send(FrameType::abort, std::string("the guest runs on at the source"));
      m.drop_link();
      m.fail("the frontend restarted the guest here after the state went; told the destination to discard it");
      break;
    default:
      break;
  }
  m.inner.queue_ready(q);
}

void MigratingDevice::queue_stopped(std::uint16_t index) {
  auto& m = *impl_;
  m.inner.queue_stopped(index);
  if (!m.others_stopped(index)) return;
  if (m.st.phase == Phase::armed) {
    m.t_stop = Clock::now();
    m.send_state();
  } else if ((m.st.phase == Phase::idle || m.st.phase == Phase::running || m.st.phase == Phase::failed) &&
             m.host != nullptr && m.host->memory().logging() && m.state.has_state_area()) {
    m.save_to_guest();
  }
}

void MigratingDevice::reset() {
  auto& m = *impl_;
  if (m.st.phase == Phase::loaded || m.st.phase == Phase::holding) {
    // The destination's frontend went away before the guest ran here: nothing to keep.
    log::warn("migration: the frontend reset the device before the guest ran here; discarding the incoming state");
    m.st.phase = Phase::incoming;
    m.have_state = false;
    m.pending_state.clear();
  }
  m.inner.reset();
}

Result<std::vector<std::uint8_t>> MigratingDevice::save_state() { return impl_->state.save_state(); }
DeviceState& MigratingDevice::device_state() { return impl_->state; }
const DeviceState& MigratingDevice::device_state() const { return impl_->state; }

Status MigratingDevice::load_state(std::span<const std::uint8_t> blob) {
  auto& m = *impl_;
  VRDMA_TRY(m.state.load_state(blob));
  // QEMU >= 8.2 brought the state through its own stream (DEVICE_STATE): no source link needed.
  if (m.st.phase == Phase::incoming || m.st.phase == Phase::holding) m.st.phase = Phase::loaded;
  return {};
}

}  // namespace vrdma::migration
