// The switchover's source role (switchover_impl.hpp, docs/migration.md): HELLO and the
// destination's answer, the object layout ahead (PRESTATE), the state when every ring has
// stopped (over RDMA when both sides have a migration engine, else TCP; or into the guest's
// memory when no destination was armed), and letting go once the guest runs there.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "switchover_impl.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::migration {

void MigratingDevice::Impl::on_source_frame(Frame f) {
  switch (f.type) {
    case FrameType::loaded: {
      if (st.phase != Phase::state_sent) break;
      st.phase = Phase::handed_over;
      auto j = nlohmann::json::parse(f.payload.begin(), f.payload.end(), nullptr, false);
      if (j.is_object() && j.contains("load_ms") && j["load_ms"].is_number()) st.load_ms = j["load_ms"].get<double>();
      st.message = "the destination loaded the state; waiting for the guest to run there";
      log::info("migration: {} loaded the device state ({} bytes) in {:.1f} ms", st.peer, st.state_bytes, st.load_ms);
      return;
    }
    case FrameType::reject:
      drop_link();
      return fail(st.peer + " rejected the device state: " + f.text() +
                  "; the guest keeps running here once its rings start again");
    case FrameType::refuse:
      drop_link();
      return fail(st.peer + " refused the guest: " + f.text());
    case FrameType::active:
      return let_go();
    default:
      break;
  }
  drop_link();
  return fail(fmt::format("{} sent an unexpected {} frame", st.peer, to_string(f.type)));
}

void MigratingDevice::Impl::send_state() {
  const auto t0 = Clock::now();
  auto blob = state.save_state();
  if (!blob) {
    send(FrameType::abort, blob.error().message);
    drop_link();
    return fail("capturing the device state failed: " + blob.error().message);
  }
  st.save_ms = ms_since(t0);
  st.state_bytes = blob->size();
  if (blob->size() > kMaxStateBytes) {
    send(FrameType::abort, std::string("device state too large"));
    drop_link();
    return fail(fmt::format("the device state is {} bytes, more than the {} a migration carries", blob->size(),
                            kMaxStateBytes));
  }
  st.phase = Phase::state_sent;
  st.message = "state sent; waiting for the destination to load it";
  log::info("migration: every ring stopped; device state captured in {:.1f} ms ({} bytes), sending it to {}", st.save_ms,
            st.state_bytes, st.peer);
  if (rdma) {
    const auto tw = Clock::now();
    auto s = rdma->write(*blob, std::chrono::milliseconds(2000));
    rdma.reset();  // one state per link
    if (s.ok()) {
      st.state_via = "rdma";
      send(FrameType::state_written, encode_state_written({blob->size(), crc32_of(*blob)}));
      log::info("migration: wrote the device state into {}'s buffer over RDMA in {:.1f} ms", st.peer, ms_since(tw));
      return;
    }
    log::warn("migration: the state goes over TCP after all: {}", s.error().message);
  }
  st.state_via = "tcp";
  send(FrameType::state, *blob);
}

void MigratingDevice::Impl::let_go() {
  st.stop_to_active_ms = ms_since(t_stop);
  st.phase = Phase::migrated;
  st.message = "the guest runs at " + (st.peer.empty() ? std::string("the destination") : st.peer) +
               "; this device is done (stop this vrdmad)";
  drop_link();
  inner.reset();  // engine objects go without a packet: the destination owns the QPs now
  announcer.stop();  // it may have come here in a migration less than half a second ago
  if (!opts.announce_if.empty())
    if (auto s = set_noarp(opts.announce_if, true); !s.ok()) log::error("migration: {}", s.error().message);
  log::info("migration: the guest runs at {} {:.1f} ms after its rings stopped here; let go of it", st.peer,
            st.stop_to_active_ms);
}

void MigratingDevice::Impl::save_to_guest() {
  t_stop = Clock::now();
  auto s = state.save_state_to_guest();
  st.save_ms = ms_since(t_stop);
  if (!s.ok()) {
    st.message = "the rings stopped during a migration but the device state could not go into guest memory: " +
                 s.error().message + "; if the guest moves, it arrives without its RDMA objects (its driver is told)";
    log::error("migration: {}", st.message);
    return;
  }
  st.phase = Phase::in_guest;
  st.state_bytes = state.state_area_state_bytes();
  st.message = "every ring stopped while the frontend logs dirty memory: the device state is in the guest's state "
               "area, for the frontend's last memory pass";
  // The guest's address goes quiet here now (the engine is quiesced anyway): the source VMM may
  // linger paused after the switchover, and this host must not answer for the guest meanwhile.
  announcer.stop();
  if (!opts.announce_if.empty())
    if (auto n = set_noarp(opts.announce_if, true); !n.ok()) log::error("migration: {}", n.error().message);
  log::info("migration: every ring stopped during a live migration; device state ({} bytes) written into guest memory "
            "in {:.1f} ms", st.state_bytes, st.save_ms);
}

bool MigratingDevice::Impl::others_stopped(std::uint16_t index) const {
  if (host == nullptr) return true;
  for (std::uint16_t i = 0; i < inner.info().num_queues; ++i)
    if (i != index && host->queue_running(i)) return false;
  return true;
}

bool MigratingDevice::Impl::all_stopped() const {
  if (host == nullptr) return true;
  for (std::uint16_t i = 0; i < inner.info().num_queues; ++i)
    if (host->queue_running(i)) return false;
  return true;
}

Status MigratingDevice::Impl::migrate_to(const std::string& addr, MigratingDevice::Done done,
                                         std::chrono::milliseconds timeout, bool send_layout) {
  if (st.phase == Phase::incoming || st.phase == Phase::holding || st.phase == Phase::loaded)
    return make_error(Errc::bad_state, "this vrdmad is waiting for an incoming guest; it cannot send one");
  if (st.phase == Phase::connecting || st.phase == Phase::armed || st.phase == Phase::state_sent ||
      st.phase == Phase::handed_over)
    return make_error(Errc::busy, fmt::format("a migration to {} is already in progress ({})", st.peer, to_string(st.phase)));
  if (st.phase == Phase::migrated) return make_error(Errc::bad_state, "the guest already left this vrdmad");
  auto a = parse_tcp_address(addr);
  if (!a) return std::move(a).error();
  auto fd = tcp_connect_start(*a);
  if (!fd) return std::move(fd).error();
  auto d = std::make_unique<Dial>();
  d->fd = std::move(*fd);
  d->to = *a;
  d->addr = addr;
  d->timeout = timeout;
  d->send_layout = send_layout;
  d->before = st;
  d->done = std::move(done);
  Hello me = identity();
  if (opts.migration_engine) {
    auto l = RdmaLink::create(opts.migration_engine, 0);
    if (l) {
      d->rdma = std::move(*l);
      me.rdma = d->rdma->local();
      me.state_hint = state.state_bound_bytes();
    } else {
      log::warn("migration: the state goes over TCP: cannot make a QP on {}: {}", opts.migration_engine->name(),
                l.error().message);
    }
  }
  d->hello = encode(FrameType::hello, encode_hello(me));
  d->timer = UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!d->timer) return errno_error(errno, "a timer for the connection to " + addr);
  const auto ms = std::max<std::int64_t>(timeout.count(), 1);
  const itimerspec t{{0, 0}, {static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1'000'000}};
  if (::timerfd_settime(d->timer.get(), 0, &t, nullptr) != 0) return errno_error(errno, "arming the timer for " + addr);
  const int dfd = d->fd.get(), tfd = d->timer.get();
  VRDMA_TRY(loop.add(dfd, EPOLLOUT, [this](std::uint32_t ev) { on_dial(ev); }));
  if (auto s = loop.add(tfd, EPOLLIN, [this](std::uint32_t) {
        const auto what = dial->hello_sent ? "did not answer HELLO" : "did not accept a connection";
        dial_failed(make_error(Errc::timeout, fmt::format("the destination vrdmad at {} {} within {} ms", dial->addr, what,
                                                          dial->timeout.count())));
      });
      !s.ok()) {
    loop.remove(dfd);
    return s;
  }
  dial = std::move(d);
  st.phase = Phase::connecting;
  st.peer = addr;
  st.message = "connecting to the destination vrdmad and waiting for it to accept the guest (HELLO)";
  log::info("migration: connecting to {} (at most {} ms)", addr, timeout.count());
  return {};
}

void MigratingDevice::Impl::on_dial(std::uint32_t ev) {
  if (!dial) return;
  Dial& d = *dial;
  if (!d.hello_sent) {
    if (auto c = connect_outcome(d.fd.get(), d.to); !c.ok()) return dial_failed(c.error());
    // HELLO is a few hundred bytes: it goes whole into the new socket's empty buffer.
    const ssize_t n = ::send(d.fd.get(), d.hello.data(), d.hello.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n != static_cast<ssize_t>(d.hello.size()))
      return dial_failed(n < 0 ? errno_error(errno, "sending HELLO to " + d.addr)
                               : make_error(Errc::io_error, "sending HELLO to " + d.addr + ": short write"));
    d.hello_sent = true;
    if (auto m = loop.modify(d.fd.get(), EPOLLIN); !m.ok()) return dial_failed(m.error());
    return;
  }
  bool closed = false;
  for (;;) {
    std::uint8_t buf[4096];
    const ssize_t n = ::recv(d.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    if (n <= 0) {
      closed = true;
      break;
    }
    d.in.feed(std::span(buf, static_cast<std::size_t>(n)));
    if (d.in.buffered() > 65536)
      return dial_failed(make_error(Errc::protocol_error, d.addr + " answered HELLO with more than a HELLO_OK"));
  }
  auto f = d.in.next();
  if (!f)
    return dial_failed(make_error(Errc::protocol_error, d.addr + " answered with a broken frame: " + f.error().message));
  if (f->has_value()) {
    if ((*f)->type == FrameType::hello_ok) {
      auto ok = decode_hello_ok((*f)->payload);
      if (!ok)
        return dial_failed(make_error(Errc::protocol_error, d.addr + " answered HELLO with a broken HELLO_OK: " + ok.error().message));
      return dialled(*ok);
    }
    if ((*f)->type == FrameType::refuse)
      return dial_failed(make_error(Errc::access_denied, "the destination at " + d.addr + " refused the guest: " + (*f)->text()));
    return dial_failed(make_error(Errc::protocol_error, fmt::format("{} answered HELLO with {}", d.addr, to_string((*f)->type))));
  }
  if (closed || (ev & (EPOLLHUP | EPOLLERR)) != 0)
    dial_failed(make_error(Errc::connection_lost, "the destination at " + d.addr + " closed the connection"));
}

void MigratingDevice::Impl::drop_dial() {
  if (!dial) return;
  loop.remove(dial->fd.get());
  loop.remove(dial->timer.get());
  dial.reset();
}

void MigratingDevice::Impl::dial_failed(Error why) {
  if (!dial) return;
  auto done = std::move(dial->done);
  st = dial->before;
  drop_dial();
  log::warn("migration: {}; the guest keeps running here", why.message);
  if (done) done(Status(std::move(why)));
}

void MigratingDevice::Impl::dialled(const HelloOk& ok) {
  Dial& d = *dial;
  const std::string addr = d.addr;
  log::info("migration: {} (vrdma {}) takes the guest", addr, release_name(ok.release));
  std::unique_ptr<RdmaLink> link_rdma = std::move(d.rdma);
  if (link_rdma && ok.rdma && ok.rdma->bytes > 0) {
    if (auto c = link_rdma->connect(*ok.rdma); c.ok()) {
      log::info("migration: the state goes over RDMA ({} -> {}, room for {} bytes)", link_rdma->local().gid,
                ok.rdma->gid, ok.rdma->bytes);
    } else {
      log::warn("migration: the state goes over TCP: connecting to {} failed: {}", ok.rdma->gid, c.error().message);
      link_rdma.reset();
    }
  } else if (link_rdma) {
    log::info("migration: the state goes over TCP ({} has no migration engine)", addr);
    link_rdma.reset();
  }
  loop.remove(d.fd.get());
  loop.remove(d.timer.get());
  link = std::move(d.fd);
  in = std::move(d.in);
  rdma = std::move(link_rdma);
  const bool send_layout = d.send_layout;
  auto done = std::move(d.done);
  dial.reset();
  if (auto w = watch_link(); !w.ok()) {
    st = MigrationStatus{};
    drop_link();
    fail("watching the link to " + addr + ": " + w.error().message);
    if (done) done(std::move(w));
    return;
  }
  st = MigrationStatus{};
  st.phase = Phase::armed;
  st.peer = addr;
  st.message = "destination ready; the state goes when every ring stops (GET_VRING_BASE)";
  log::info("migration: {} accepted the guest; the state goes when the frontend stops the rings", addr);
  if (all_stopped() && inner.stats().paused) {
    t_stop = Clock::now();
    send_state();
  } else if (const auto s = inner.stats(); send_layout && ok.prestate && s.pds + s.cqs + s.qps > 0) {
    const auto t0 = Clock::now();
    const auto layout = state.save_layout();
    send(FrameType::prestate, layout);
    log::info("migration: sent the object layout ({} bytes, {:.1f} ms) for {} to build during pre-copy",
              layout.size(), ms_since(t0), addr);
  }
  if (done) done({});
}

Status MigratingDevice::migrate_to(const std::string& addr, Done done, std::chrono::milliseconds timeout, bool prestate) {
  return impl_->migrate_to(addr, std::move(done), timeout, prestate);
}

Status MigratingDevice::cancel(const std::string& why) {
  auto& m = *impl_;
  if (m.st.phase == Phase::connecting) {
    m.dial_failed(make_error(Errc::bad_state, "cancelled before the destination accepted the guest: " + why));
    return {};
  }
  if (m.st.phase != Phase::armed) return make_error(Errc::bad_state, fmt::format("no armed migration to cancel ({})",
                                                                               to_string(m.st.phase)));
  m.send(FrameType::abort, why);
  m.drop_link();
  m.fail("cancelled: " + why);
  return {};
}

}  // namespace vrdma::migration
