// Backend session: config space, inflight area, device status and device-state transfer.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "backend_session.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/vhost/peer_fd.hpp"

namespace vrdma::vhost {

BackendSession::Reply BackendSession::get_config(Message& m) {
  const auto c = m.get<ConfigHeader>();
  auto cfg = dev_.config();
  // A frontend reading less than the whole config from its start is a carrier's (docs/virtio-rdma.md).
  if (c.offset == 0 && c.size < cfg.size() && !info_.compact_config.empty()) cfg = info_.compact_config;
  Message r = make_reply(m);
  r.set(c);
  std::array<std::uint8_t, kMaxConfigSize> window{};
  for (std::uint32_t k = 0; k < c.size; ++k) {
    const std::size_t at = std::size_t{c.offset} + k;  // validate_request bounded offset+size by 256
    window[k] = at < cfg.size() ? cfg[at] : 0;
  }
  r.set_bytes(sizeof(ConfigHeader), window.data(), c.size);
  r.hdr.size = static_cast<std::uint32_t>(sizeof(ConfigHeader) + c.size);
  return std::optional(std::move(r));
}

BackendSession::Reply BackendSession::set_config(Message& m) {
  const auto c = m.get<ConfigHeader>();
  VRDMA_TRY(dev_.write_config(c.offset, std::span<const std::uint8_t>(m.payload.data() + sizeof(ConfigHeader), c.size)));
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::get_inflight_fd(Message& m) {
  const auto info = m.get<InflightInfo>();
  if (info.num_queues != info_.num_queues && info.num_queues > info_.num_queues)
    return make_error(Errc::invalid_argument, fmt::format("GET_INFLIGHT_FD asks for {} queues; the device has {}",
                                                          info.num_queues, info_.num_queues));
  auto area = InflightArea::create(info.num_queues, info.queue_size);
  if (!area) return prefixed("GET_INFLIGHT_FD: ", area.error());
  Message r = make_reply(m);
  InflightInfo out = info;
  out.mmap_size = area->size();
  out.mmap_offset = 0;
  r.set(out);
  const int dup = ::fcntl(area->fd(), F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return errno_error(errno, "dup of the inflight fd");
  r.fds.emplace_back(dup);
  inflight_ = std::move(*area);
  return std::optional(std::move(r));
}

BackendSession::Reply BackendSession::set_inflight_fd(Message& m) {
  for (const auto& v : vrings_)
    if (v.ring) return make_error(Errc::bad_state, "SET_INFLIGHT_FD while a ring is running");
  auto area = InflightArea::attach(m.take_fd(0), m.get<InflightInfo>(), faults_);
  if (!area) return prefixed("SET_INFLIGHT_FD: ", area.error());
  inflight_ = std::move(*area);
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::set_status(Message& m) {
  const auto s = m.get<std::uint64_t>();
  if (s > 0xff) return make_error(Errc::invalid_argument, fmt::format("SET_STATUS {:#x} exceeds 8 bits", s));
  status_ = static_cast<std::uint8_t>(s);
  if (s == 0) {
    // QEMU (7.2 onwards, with PROTOCOL_F_STATUS) sends 0 both when the guest's driver resets the
    // device and whenever it stops the device for a VM stop (`stop`, a migration's switchover),
    // after which the VM may run on here (`cont`, a failed or abandoned migration). The rings
    // stop now; whether the device's objects go too is decided when ring 0 starts again: at the
    // base it stopped at, the same driver carries on; anywhere else (0: a driver that started
    // over), the device is reset then (try_start).
    stop_all();
    reset_pending_ = true;
    stop_base0_ = vrings_.empty() ? 0 : vrings_[0].base;
  }
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::get_status(Message& m) { return std::optional(u64_reply(m, status_)); }

// The device's state travels through a pipe: we write (save) or read (load) it from the
// event loop without blocking, then CHECK_DEVICE_STATE reports the outcome.
BackendSession::Reply BackendSession::set_device_state_fd(Message& m) {
  const auto x = m.get<DeviceStateXfer>();
  if (state_fd_) loop_.remove(state_fd_.get());
  state_fd_ = m.take_fd(0);
  state_dir_ = x.direction;
  state_off_ = 0;
  state_buf_.clear();
  state_ok_ = false;
  // A pipe (vhost-user.rst) or a socket: what polls, never a file that is always "ready".
  struct stat st{};
  if (::fstat(state_fd_.get(), &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
    state_fd_.reset();
    return make_error(Errc::invalid_argument, "SET_DEVICE_STATE_FD fd is not a pipe or a socket; refused");
  }
  const int fl = ::fcntl(state_fd_.get(), F_GETFL);
  if (fl < 0 || ::fcntl(state_fd_.get(), F_SETFL, fl | O_NONBLOCK) != 0) {
    state_fd_.reset();
    return make_error(Errc::invalid_argument, "SET_DEVICE_STATE_FD fd cannot be made non-blocking");
  }
  if (x.direction == 0) {
    auto blob = dev_.save_state();
    if (!blob) {
      state_fd_.reset();
      return prefixed("device state save: ", blob.error());
    }
    state_buf_ = std::move(*blob);
  }
  VRDMA_TRY(loop_.add(state_fd_.get(), x.direction == 0 ? EPOLLOUT : EPOLLIN,
                      [this](std::uint32_t ev) { on_state_fd(ev); }));
  return std::optional(u64_reply(m, 0x100));  // success; bit 8: we use the frontend's fd
}

void BackendSession::on_state_fd(std::uint32_t /*events*/) {
  auto finish = [this](bool ok, const std::string& why) {
    if (!ok) log::error("device state transfer failed: {}", why);
    state_ok_ = ok;
    loop_.remove(state_fd_.get());
    state_fd_.reset();
  };
  // At most 16 reads or writes of up to 64 KiB per wake-up: a frontend that keeps the pipe
  // ready waits its turn behind the loop's other fds.
  constexpr int kPerWake = 16;
  if (state_dir_ == 0) {
    for (int n = 0; n < kPerWake && state_off_ < state_buf_.size(); ++n) {
      const ssize_t w = peer_write(state_fd_.get(), state_buf_.data() + state_off_, state_buf_.size() - state_off_);
      if (w < 0 && errno == EAGAIN) return;
      if (w < 0 && errno == ETIMEDOUT) {
        finish(false, "writing the state pipe blocked (the frontend cleared its O_NONBLOCK)");
        return fail_("writing the device state pipe blocked for 50 ms (the frontend cleared its O_NONBLOCK)");
      }
      if (w <= 0) return finish(false, "the frontend closed the state pipe early");
      state_off_ += static_cast<std::size_t>(w);
    }
    if (state_off_ < state_buf_.size()) return;  // more at the next wake-up
    return finish(true, "");
  }
  constexpr std::size_t kMaxState = 64u << 20;
  std::uint8_t buf[65536];
  for (int n = 0;; ++n) {
    if (n == kPerWake) return;  // more at the next wake-up
    const ssize_t r = peer_read(state_fd_.get(), buf, sizeof buf);
    if (r < 0 && errno == EAGAIN) return;  // more later (EOF ends the transfer)
    if (r < 0 && errno == ETIMEDOUT) {
      finish(false, "reading the state pipe blocked (the frontend cleared its O_NONBLOCK)");
      return fail_("reading the device state pipe blocked for 50 ms (the frontend cleared its O_NONBLOCK)");
    }
    if (r < 0) return finish(false, "reading the state pipe failed");
    if (r == 0) break;
    if (state_buf_.size() + static_cast<std::size_t>(r) > kMaxState) return finish(false, "device state exceeds 64 MiB");
    state_buf_.insert(state_buf_.end(), buf, buf + r);
  }
  auto st = dev_.load_state(state_buf_);
  finish(st.ok(), st.ok() ? "" : st.error().message);
}

BackendSession::Reply BackendSession::check_device_state(Message& m) {
  const bool ok = state_ok_ && !state_fd_;
  return std::optional(u64_reply(m, ok ? 0 : 1));
}

}  // namespace vrdma::vhost
