// The switchover's destination role (switchover_impl.hpp, docs/migration.md): a source's HELLO
// checked against this vrdmad's identity, the object layout built ahead, the state taken (over
// TCP, RDMA, or from the guest's state area) and loaded once the guest's memory is here, and the
// guest run here (rings, then the address announced, then ACTIVE).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "switchover_impl.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/common/version.hpp"

namespace vrdma::migration {

std::optional<std::string> MigratingDevice::Impl::refuse_reason(const Hello& h) const {
  const Hello me = identity();
  if (st.phase != Phase::incoming && st.phase != Phase::holding)
    return fmt::format("this vrdmad is not waiting for a guest (it is {})", to_string(st.phase));
  if (!DeviceState::state_version_readable(h.state_version))
    return fmt::format("the source (vrdma {}) sends device state version {}, this vrdmad (vrdma {}) reads versions {} "
                       "to {}: run a vrdma release on the destination at least as new as the source's",
                       release_name(h.release), h.state_version, me.release,
                       DeviceState::kOldestStateVersion, me.state_version);
  if (h.engine != me.engine)
    return fmt::format("the guest uses a {} engine, this vrdmad a {} engine", h.engine, me.engine);
  if (h.gid != me.gid)
    return fmt::format("the guest's GID is {} but this vrdmad's engine has GID {}: start the destination with --engine "
                       "on the guest's own address", h.gid, me.gid);
  if (h.mac != me.mac)
    return fmt::format("the guest's MAC is {} but this vrdmad serves MAC {}: start it with --mac {}", h.mac, me.mac, h.mac);
  const auto s = inner.stats();
  if (s.pds + s.cqs + s.qps + s.mrs != 0) return std::string("this vrdmad already serves a guest with RDMA objects");
  return std::nullopt;
}

void MigratingDevice::Impl::on_destination_frame(Frame f) {
  switch (f.type) {
    case FrameType::hello: {
      auto h = decode_hello(f.payload);
      if (!h) {
        send(FrameType::refuse, h.error().message);
        return drop_link();
      }
      if (auto why = refuse_reason(*h)) {
        log::warn("migration: refusing the guest from {}: {}", h->source, *why);
        send(FrameType::refuse, *why);
        return drop_link();
      }
      st.peer = h->source;
      st.message = "identity accepted; waiting for the device state";
      log::info("migration: {} (vrdma {}, device state version {}) offers the guest {} ({}); accepted, waiting for "
                "its state", h->source, release_name(h->release), h->state_version, h->gid, h->mac);
      // "prestate": this destination takes the object layout ahead of the state (PRESTATE).
      HelloOk ok;
      ok.prestate = true;
      ok.release = std::string(vrdma::version());
      rdma.reset();
      if (h->rdma && opts.migration_engine) {
        // Room for the source's bound on the state of its objects now, a quarter more for
        // objects made meanwhile, and 1 MiB; a larger state goes over TCP.
        const std::uint64_t room =
            std::min<std::uint64_t>(h->state_hint + h->state_hint / 4 + (1u << 20), kMaxStateBytes);
        auto l = RdmaLink::create(opts.migration_engine, room);
        std::string why;
        if (!l) why = l.error().message;
        else if (auto c = (*l)->connect(*h->rdma); !c.ok()) why = c.error().message;
        if (why.empty()) {
          rdma = std::move(*l);
          ok.rdma = rdma->local();
          log::info("migration: the state may come over RDMA ({} -> {}, a {}-byte buffer)", h->rdma->gid,
                    rdma->local().gid, room);
        } else {
          log::warn("migration: the state comes over TCP: no RDMA path to {}: {}", h->rdma->gid, why);
        }
      }
      return send(FrameType::hello_ok, encode_hello_ok(ok));
    }
    case FrameType::state:
      if (have_state || (st.phase != Phase::incoming && st.phase != Phase::holding)) break;
      return state_arrived(std::move(f.payload), "tcp");
    case FrameType::state_written: {
      if (have_state || !rdma || (st.phase != Phase::incoming && st.phase != Phase::holding)) break;
      auto w = decode_state_written(f.payload);
      const auto got = w ? rdma->received(w->bytes) : std::span<const std::uint8_t>{};
      std::string why;
      if (!w) why = w.error().message;
      else if (got.size() != w->bytes)
        why = fmt::format("it says it wrote {} bytes into a {}-byte buffer", w->bytes, rdma->local().bytes);
      else if (crc32_of(got) != w->crc32)
        why = "the bytes in the buffer do not match its CRC-32 (the RDMA WRITE did not place them all)";
      if (!why.empty()) {
        st.message = "rejected the device state written over RDMA: " + why;
        log::error("migration: {}", st.message);
        send(FrameType::reject, why);
        return drop_link();
      }
      return state_arrived(std::vector<std::uint8_t>(got.begin(), got.end()), "rdma");
    }
    case FrameType::prestate: {
      if (have_state || (st.phase != Phase::incoming && st.phase != Phase::holding)) break;
      if (auto s = state.precreate(f.payload); !s.ok())
        log::warn("migration: could not build the guest's objects ahead ({}); they are built when its state arrives",
                  s.error().message);
      return;
    }
    case FrameType::abort:
      if (st.phase == Phase::running) {
        log::error("migration: {} aborted after the guest already runs here ({}); ignoring: the frontend started "
                   "the guest on both hosts?", st.peer, f.text());
        return drop_link();
      }
      log::warn("migration: {} aborted: {}; discarding its state", st.peer, f.text());
      if (st.phase == Phase::loaded) inner.reset();
      state.drop_precreated();
      pending_state.clear();
      have_state = false;
      st.phase = st.phase == Phase::holding ? Phase::holding : Phase::incoming;
      st.message = "the source aborted: " + f.text();
      return drop_link();
    default:
      break;
  }
  log::warn("migration: {} sent an unexpected {} frame; closing", st.peer, to_string(f.type));
  drop_link();
}

void MigratingDevice::Impl::accept_source() {
  UniqueFd c(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (!c) return;
  if (link || (st.phase != Phase::incoming && st.phase != Phase::holding)) {
    const auto f = encode(FrameType::refuse, std::string("this vrdmad is already receiving a guest"));
    [[maybe_unused]] auto n = ::send(c.get(), f.data(), f.size(), MSG_NOSIGNAL);
    return;
  }
  int one = 1;  // LOADED and ACTIVE are small frames back to back: no Nagle delay
  ::setsockopt(c.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  link = std::move(c);
  st.peer = "the source";
  if (auto s = watch_link(); !s.ok()) {
    log::error("migration: {}", s.error().message);
    link.reset();
  }
}

void MigratingDevice::Impl::state_arrived(std::vector<std::uint8_t> blob, const char* via) {
  pending_state = std::move(blob);
  have_state = true;
  t_state = Clock::now();
  st.state_bytes = pending_state.size();
  st.state_via = via;
  log::info("migration: received the device state ({} bytes) from {} over {}", st.state_bytes, st.peer,
            st.state_via == "rdma" ? "RDMA" : "TCP");
  try_load();
}

void MigratingDevice::Impl::try_load() {
  if (!have_state || !have_memory() || (st.phase != Phase::incoming && st.phase != Phase::holding)) return;
  const auto t0 = Clock::now();
  auto s = state.load_state(pending_state);
  pending_state.clear();
  pending_state.shrink_to_fit();
  have_state = false;
  if (!s.ok()) {
    st.message = "rejected the device state: " + s.error().message;
    log::error("migration: {}", st.message);
    inner.reset();
    send(FrameType::reject, s.error().message);
    return drop_link();
  }
  st.load_ms = ms_since(t0);
  send(FrameType::loaded, nlohmann::json{{"load_ms", st.load_ms}}.dump());
  const bool was_holding = st.phase == Phase::holding;
  st.phase = Phase::loaded;
  st.message = "state loaded; the guest runs here when its rings start";
  if (was_holding) activate();
}

void MigratingDevice::Impl::activate() {
  st.phase = Phase::running;
  st.message = arrived_without.empty() ? "the guest runs here" : "the guest runs here; " + arrived_without;
  // The rings first: the guest's work waits on nothing else, and the engine's first frame
  // from here teaches the switch the guest's port as well as the announcement does.
  if (host != nullptr)
    for (std::uint16_t i = 0; i < inner.info().num_queues; ++i) host->run_queue(i);
  if (!opts.announce_if.empty()) {
    if (auto s = set_noarp(opts.announce_if, false); !s.ok()) log::error("migration: {}", s.error().message);
    announcer.start(opts.announce_if);
  }
  send(FrameType::active, std::string("{}"));
  if (listener) {
    loop.remove(listener.get());
    listener.reset();
  }
  if (opts.announce_if.empty())
    log::info("migration: the guest runs here (state {} bytes, loaded in {:.1f} ms)", st.state_bytes, st.load_ms);
  else
    log::info("migration: the guest runs here (state {} bytes, loaded in {:.1f} ms); announcing its address on {}",
              st.state_bytes, st.load_ms, opts.announce_if);
}

bool MigratingDevice::Impl::try_guest_state() {
  if (have_state || guest_state_refused) return false;  // a source's state is being loaded, or refused
  const auto t0 = Clock::now();
  auto r = state.load_state_from_guest();
  if (!r) {
    if (r.error().is(Errc::bad_state)) {  // the state queue is not set up (yet)
      arm_no_area_timer();
      return false;
    }
    // As with a state from a source: hold the rings and answer nothing, so a frontend that can
    // (our own) restarts the guest at the source; the sentence says what to fix.
    guest_state_refused = true;
    st.message = "refused the device state in guest memory: " + r.error().message + "; holding the guest's rings";
    log::error("migration: {}", st.message);
    inner.reset();
    return false;
  }
  if (!*r && !state.state_lost().empty()) {
    // The source had objects and could not send them: the guest runs here without them, and
    // its driver hears it at once (DEVICE_FATAL) rather than waiting on objects that are gone.
    arrived_without = "the guest's RDMA objects did not come with it (" + state.state_lost() +
                      "); it runs here with none, its driver is told (DEVICE_FATAL) and its RDMA peers see their "
                      "connections fail";
    st.message = arrived_without;
    log::error("migration: {}", st.message);
    inner.report_objects_lost();
    return true;
  }
  if (!*r) {
    if (!guest_only) return false;  // wait for a source's state over the stream
    runs_without_state("no device state in the guest's state area: the guest had no RDMA objects, or its driver "
                       "posts no state area; it runs here with none",
                       false);
    return true;
  }
  st.load_ms = ms_since(t0);
  st.state_bytes = state.state_area_state_bytes();
  log::info("migration: loaded the device state ({} bytes) from guest memory in {:.1f} ms", st.state_bytes, st.load_ms);
  return true;
}

void MigratingDevice::Impl::runs_without_state(const std::string& why, bool serious) {
  if (opts.restarted) {
    st.message = "this vrdmad replaces one that died, and " + why +
                 ": any RDMA objects the guest had died with the old one; its driver is told (DEVICE_FATAL: a "
                 "driver that had objects fails them and must open the device again) and its RDMA peers see their "
                 "connections fail";
    log::error("migration: {}", st.message);
    inner.report_backend_restarted();
  } else {
    st.message = why;
    if (serious) log::error("migration: {}", st.message);
    else log::warn("migration: {}", st.message);
  }
  arrived_without = st.message;
}

void MigratingDevice::Impl::arm_no_area_timer() {
  if (no_area_timer || !guest_only) return;
  no_area_timer = UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!no_area_timer) return;
  itimerspec its{};
  its.it_value.tv_sec = 2;
  ::timerfd_settime(no_area_timer.get(), 0, &its, nullptr);
  auto s = loop.add(no_area_timer.get(), EPOLLIN, [this](std::uint32_t) {
    loop.remove(no_area_timer.get());
    no_area_timer.reset();
    if (st.phase != Phase::holding || guest_state_refused || have_state) return;
    if (try_guest_state()) return activate();
    if (guest_state_refused) return;
    runs_without_state("the frontend did not start the state queue within 2 s: the guest runs here without its device "
                       "state",
                       true);
    activate();
  });
  if (!s.ok()) no_area_timer.reset();
}

Status MigratingDevice::listen_incoming(const std::string& addr) {
  auto& m = *impl_;
  if (m.st.phase != Phase::idle) return make_error(Errc::bad_state, "listen_incoming twice");
  if (addr == "guest") {
    if (!m.opts.announce_if.empty()) VRDMA_TRY(set_noarp(m.opts.announce_if, true));
    m.guest_only = true;
    m.st.phase = Phase::incoming;
    m.st.message = "waiting for the guest; its device state comes in its own memory";
    return {};
  }
  auto a = parse_tcp_address(addr);
  if (!a) return std::move(a).error();
  auto l = tcp_listen(*a);
  if (!l) return std::move(l).error();
  m.listener = std::move(*l);
  VRDMA_TRY(m.loop.add(m.listener.get(), EPOLLIN, [&m](std::uint32_t) { m.accept_source(); }));
  if (!m.opts.announce_if.empty()) VRDMA_TRY(set_noarp(m.opts.announce_if, true));
  m.st.phase = Phase::incoming;
  m.st.message = "waiting for a source vrdmad on " + addr;
  return {};
}

}  // namespace vrdma::migration
