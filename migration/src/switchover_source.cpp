// The switchover's source role (switchover_impl.hpp, docs/migration.md): HELLO and the
// destination's answer, the object layout ahead (PRESTATE), the state when every ring has
// stopped (over RDMA when both sides have a migration engine, else TCP; or into the guest's
// memory when no destination was armed), and letting go once the guest runs there.
#include <poll.h>
#include <sys/socket.h>

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

Status MigratingDevice::Impl::migrate_to(const std::string& addr, std::chrono::milliseconds timeout, bool send_layout) {
  if (st.phase == Phase::incoming || st.phase == Phase::holding || st.phase == Phase::loaded)
    return make_error(Errc::bad_state, "this vrdmad is waiting for an incoming guest; it cannot send one");
  if (st.phase == Phase::armed || st.phase == Phase::state_sent || st.phase == Phase::handed_over)
    return make_error(Errc::busy, fmt::format("a migration to {} is already in progress ({})", st.peer, to_string(st.phase)));
  if (st.phase == Phase::migrated) return make_error(Errc::bad_state, "the guest already left this vrdmad");
  auto a = parse_tcp_address(addr);
  if (!a) return std::move(a).error();
  const auto deadline = Clock::now() + timeout;
  auto fd = tcp_connect(*a, timeout);
  if (!fd) return std::move(fd).error();
  Hello me = identity();
  std::unique_ptr<RdmaLink> link_rdma;
  if (opts.migration_engine) {
    auto l = RdmaLink::create(opts.migration_engine, 0);
    if (l) {
      link_rdma = std::move(*l);
      me.rdma = link_rdma->local();
      me.state_hint = state.state_bound_bytes();
    } else {
      log::warn("migration: the state goes over TCP: cannot make a QP on {}: {}", opts.migration_engine->name(),
                l.error().message);
    }
  }
  const auto hello = encode(FrameType::hello, encode_hello(me));
  if (::send(fd->get(), hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size()))
    return errno_error(errno, "sending HELLO to " + addr);
  FrameReader r;
  bool prestate = false;  // the destination builds the objects ahead when told their layout
  for (;;) {
    auto f = r.next();
    if (!f) return make_error(Errc::protocol_error, addr + " answered with a broken frame: " + f.error().message);
    if (f->has_value()) {
      if ((*f)->type == FrameType::hello_ok) {
        auto ok = decode_hello_ok((*f)->payload);
        if (!ok) return make_error(Errc::protocol_error, addr + " answered HELLO with a broken HELLO_OK: " + ok.error().message);
        prestate = ok->prestate;
        log::info("migration: {} (vrdma {}) takes the guest", addr, release_name(ok->release));
        if (link_rdma && ok->rdma && ok->rdma->bytes > 0) {
          if (auto c = link_rdma->connect(*ok->rdma); c.ok()) {
            log::info("migration: the state goes over RDMA ({} -> {}, room for {} bytes)", link_rdma->local().gid,
                      ok->rdma->gid, ok->rdma->bytes);
          } else {
            log::warn("migration: the state goes over TCP: connecting to {} failed: {}", ok->rdma->gid, c.error().message);
            link_rdma.reset();
          }
        } else if (link_rdma) {
          log::info("migration: the state goes over TCP ({} has no migration engine)", addr);
          link_rdma.reset();
        }
        break;
      }
      if ((*f)->type == FrameType::refuse)
        return make_error(Errc::access_denied, "the destination at " + addr + " refused the guest: " + (*f)->text());
      return make_error(Errc::protocol_error, fmt::format("{} answered HELLO with {}", addr, to_string((*f)->type)));
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd->get(), POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0)
      return make_error(Errc::timeout, fmt::format("the destination at {} did not answer HELLO within {} ms", addr,
                                                   timeout.count()));
    std::uint8_t buf[4096];
    const ssize_t n = ::recv(fd->get(), buf, sizeof buf, 0);
    if (n <= 0) return make_error(Errc::connection_lost, "the destination at " + addr + " closed the connection");
    r.feed(std::span(buf, static_cast<std::size_t>(n)));
  }
  link = std::move(*fd);
  in = std::move(r);
  rdma = std::move(link_rdma);
  VRDMA_TRY(watch_link());
  st = MigrationStatus{};
  st.phase = Phase::armed;
  st.peer = addr;
  st.message = "destination ready; the state goes when every ring stops (GET_VRING_BASE)";
  log::info("migration: {} accepted the guest; the state goes when the frontend stops the rings", addr);
  if (all_stopped() && inner.stats().paused) {
    t_stop = Clock::now();
    send_state();
    return {};
  }
  if (const auto s = inner.stats(); send_layout && prestate && s.pds + s.cqs + s.qps > 0) {
    const auto t0 = Clock::now();
    const auto layout = state.save_layout();
    send(FrameType::prestate, layout);
    log::info("migration: sent the object layout ({} bytes, {:.1f} ms) for {} to build during pre-copy",
              layout.size(), ms_since(t0), addr);
  }
  return {};
}

Status MigratingDevice::migrate_to(const std::string& addr, std::chrono::milliseconds timeout, bool prestate) {
  return impl_->migrate_to(addr, timeout, prestate);
}

Status MigratingDevice::cancel(const std::string& why) {
  auto& m = *impl_;
  if (m.st.phase != Phase::armed) return make_error(Errc::bad_state, fmt::format("no armed migration to cancel ({})",
                                                                               to_string(m.st.phase)));
  m.send(FrameType::abort, why);
  m.drop_link();
  m.fail("cancelled: " + why);
  return {};
}

}  // namespace vrdma::migration
