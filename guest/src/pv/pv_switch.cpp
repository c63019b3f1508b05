// The pv provider moving its device to another backend (docs/virtio-rdma.md): suspend and
// resume_on (the caller carries the state), and migrate (a live switch; the device runs on
// here when the new backend does not take it).
#include <unistd.h>

#include <chrono>
#include <string>

#include "pv_internal.hpp"

namespace vrdma::pv::detail {

Result<std::vector<std::uint8_t>> PvDevice::suspend() {
  std::lock_guard lk(cmd_mu_);
  return t_->suspend();
}

Status PvDevice::resume_on(const std::string& socket, std::span<const std::uint8_t> state) {
  std::lock_guard lk(cmd_mu_);
  stop_events();
  std::lock_guard dk(db_mu_);
  auto s = t_->resume_on(socket, state);
  start_events();
  return s;
}

Status PvDevice::migrate(const std::string& socket, std::chrono::milliseconds probe, bool logged) {
  {
    std::lock_guard lk(cmd_mu_);
    // Connected and given the memory while the guest still runs here: the switch itself only
    // stops the rings here and starts them there.
    if (auto s = t_->prepare_on(socket); !s.ok())
      return make_error(Errc::io_error, "the new backend at " + socket + " could not take the device (nothing was "
                                        "stopped; it runs on here): " + s.error().message);
    stop_events();
    std::lock_guard dk(db_mu_);  // posting waits meanwhile, like a stopped vCPU
    if (auto s = t_->stop_rings(logged); !s.ok()) {
      start_events();
      return s;
    }
    if (auto s = t_->start_on(socket); !s.ok()) {
      auto back = t_->restart_here();
      start_events();
      if (!back.ok()) return make_error(Errc::io_error, s.error().message + "; and restarting here failed too: " + back.error().message);
      return make_error(Errc::io_error, "the new backend at " + socket + " could not take the device (it runs on here): " + s.error().message);
    }
    start_events();
  }
  // The new backend answers commands only once it holds the device state.
  auto q = command(vd::Cmd::query_config, nullptr, 0, sizeof(vd::Config), static_cast<int>(probe.count()));
  // A new backend that came up without the objects says so (DEVICE_FATAL) as it starts, which
  // may reach the event thread before the probe is sent: it runs the device all the same.
  if (q || fatal()) {
    std::lock_guard lk(cmd_mu_);
    t_->commit_switch();
    return {};
  }
  std::lock_guard lk(cmd_mu_);
  stop_events();
  std::lock_guard dk(db_mu_);
  auto back = t_->restart_here();
  if (back.ok()) {
    // The unanswered probe now runs here: take its answer off the ring before anything else.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!t_->get_used(vd::kControlQueue) && std::chrono::steady_clock::now() < until) ::usleep(1000);
  }
  start_events();
  if (!back.ok()) return make_error(Errc::io_error, q.error().message + "; and restarting here failed too: " + back.error().message);
  return make_error(Errc::timeout, "the new backend at " + socket + " did not run the device within " +
                                       std::to_string(probe.count()) + " ms (see its log); it runs on here: " +
                                       q.error().message);
}

}  // namespace vrdma::pv::detail
