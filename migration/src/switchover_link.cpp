// The switchover's link to its peer (switchover_impl.hpp): frames out through a buffer that
// drains as the socket takes it, frames in as they complete, and what losing the link means in
// each phase.
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "switchover_impl.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/common/version.hpp"

namespace vrdma::migration {

MigratingDevice::Impl::Impl(device::RdmaDevice& d, vhost::EventLoop& l, MigrationOptions o) : inner(d), loop(l), opts(std::move(o)), state(d, opts.device) {
  if (opts.announce_if.empty()) return;
  auto v6 = turn_off_ipv6(opts.announce_if);
  if (!v6)
    log::warn("migration: {}; another host carrying the guest's MAC may steer its traffic away after a migration",
              v6.error().message);
  else if (*v6)
    log::info("migration: turned IPv6 off on {}: the guest's MAC lives on every host that may run it, and IPv6 "
              "would keep sending from it where the guest is not",
              opts.announce_if);
}

MigratingDevice::Impl::~Impl() {
  drop_dial();
  drop_link();
  if (listener) loop.remove(listener.get());
  if (no_area_timer) loop.remove(no_area_timer.get());
}

Hello MigratingDevice::Impl::identity() const {
  Hello h;
  auto g = inner.engine().query_gid(0);
  h.gid = g ? g->gid.str() : std::string("?");
  h.mac = opts.mac;
  h.engine = opts.engine_name.substr(0, opts.engine_name.find(':'));
  h.state_version = DeviceState::kStateVersion;
  h.source = opts.self;
  h.release = std::string(vrdma::version());
  return h;
}

void MigratingDevice::Impl::drop_link() {
  if (!link) return;
  loop.remove(link.get());
  link.reset();
  out.clear();
  out_off = 0;
  in = FrameReader{};
  link_out_armed = false;
  rdma.reset();
}

void MigratingDevice::Impl::send(FrameType t, std::span<const std::uint8_t> payload) {
  if (!link) return;
  auto f = encode(t, payload);
  out.insert(out.end(), f.begin(), f.end());
  flush();
}

void MigratingDevice::Impl::send(FrameType t, const std::string& text) {
  send(t, std::span(reinterpret_cast<const std::uint8_t*>(text.data()), std::min<std::size_t>(text.size(), kMaxTextBytes)));
}

void MigratingDevice::Impl::flush() {
  while (link && out_off < out.size()) {
    const ssize_t n = ::send(link.get(), out.data() + out_off, out.size() - out_off, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    if (n <= 0) return link_lost(fmt::format("writing to {} failed: {}", st.peer, std::strerror(errno)));
    out_off += static_cast<std::size_t>(n);
  }
  if (!link) return;
  if (out_off == out.size()) {
    out.clear();
    out_off = 0;
  }
  const bool want = out_off < out.size();
  if (want != link_out_armed) {
    link_out_armed = want;
    (void)loop.modify(link.get(), EPOLLIN | (want ? EPOLLOUT : 0u));
  }
}

Status MigratingDevice::Impl::watch_link() {
  return loop.add(link.get(), EPOLLIN, [this](std::uint32_t ev) { on_link(ev); });
}

void MigratingDevice::Impl::on_link(std::uint32_t ev) {
  if (ev & EPOLLOUT) flush();
  if (!link) return;
  if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    std::uint8_t buf[65536];
    std::string closed;  // the peer's last frames count even when its close arrives with them
    for (;;) {
      const ssize_t n = ::recv(link.get(), buf, sizeof buf, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      if (n <= 0) {
        closed = n == 0 ? st.peer + " closed the migration connection"
                        : fmt::format("reading from {} failed: {}", st.peer, std::strerror(errno));
        break;
      }
      in.feed(std::span(buf, static_cast<std::size_t>(n)));
      if (in.buffered() > kMaxStateBytes + kHeaderSize) return link_lost("the peer sent more than a device state");
    }
    for (;;) {
      auto f = in.next();
      if (!f) return link_lost(fmt::format("{} broke the migration protocol: {}", st.peer, f.error().message));
      if (!f->has_value()) break;
      on_frame(std::move(**f));
      if (!link) return;
    }
    if (!closed.empty()) return link_lost(closed);
  }
}

void MigratingDevice::Impl::link_lost(const std::string& why) {
  drop_link();
  switch (st.phase) {
    case Phase::armed:
    case Phase::state_sent:
      fail(why + "; the guest keeps running here with its RDMA state intact");
      break;
    case Phase::handed_over:
      st.message = why + "; the destination has the state: the guest runs wherever the frontend starts it";
      log::warn("migration: {}", st.message);
      break;
    case Phase::incoming:
    case Phase::holding:
      if (!have_state) {
        state.drop_precreated();
        st.message = why + " before the device state arrived; waiting for another source";
        log::warn("migration: {}", st.message);
      }
      break;
    default:
      break;
  }
}

void MigratingDevice::Impl::fail(const std::string& why) {
  st.phase = Phase::failed;
  st.message = why;
  log::error("migration to {} failed: {}", st.peer, why);
}

void MigratingDevice::Impl::on_frame(Frame f) {
  const bool source = st.phase == Phase::armed || st.phase == Phase::state_sent || st.phase == Phase::handed_over;
  if (source) return on_source_frame(std::move(f));
  on_destination_frame(std::move(f));
}

}  // namespace vrdma::migration
