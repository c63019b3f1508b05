// The switchover protocol (switchover.hpp, docs/migration.md): both roles in one state machine
// around the device model, on the backend's event loop.
#include "vrdma/migration/switchover.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zlib.h>

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "net.hpp"
#include "rdma_link.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/migration/stream.hpp"

namespace vrdma::migration {

using Clock = std::chrono::steady_clock;

const char* to_string(Phase p) noexcept {
  switch (p) {
    case Phase::idle: return "idle";
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

namespace {
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
std::uint32_t crc32_of(std::span<const std::uint8_t> b) {
  return static_cast<std::uint32_t>(::crc32_z(0, b.data(), b.size()));
}
}  // namespace

struct MigratingDevice::Impl {
  vhost::RdmaDevice& inner;
  vhost::EventLoop& loop;
  MigrationOptions opts;
  vhost::DeviceHost* host = nullptr;
  MigrationStatus st;

  UniqueFd listener;
  UniqueFd link;
  FrameReader in;
  std::vector<std::uint8_t> out;
  std::size_t out_off = 0;
  bool link_out_armed = false;

  std::vector<std::uint8_t> pending_state;  // destination: received, not loaded yet
  bool have_state = false;
  bool guest_only = false;      // destination: --incoming guest (no listener)
  bool guest_state_refused = false;
  UniqueFd no_area_timer;       // destination: the frontend may never start the state queue
  Announcer announcer;          // destination: the gratuitous ARPs once the guest runs here
  std::unique_ptr<RdmaLink> rdma;  // the state's RDMA path to the peer, when both have an engine
  Clock::time_point t_stop{}, t_state{};
  bool told_dropping = false;

  Impl(vhost::RdmaDevice& d, vhost::EventLoop& l, MigrationOptions o) : inner(d), loop(l), opts(std::move(o)) {
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
  ~Impl() {
    drop_link();
    if (listener) loop.remove(listener.get());
    if (no_area_timer) loop.remove(no_area_timer.get());
  }

  // ---- identity --------------------------------------------------------------------------------
  Hello identity() const {
    Hello h;
    auto g = inner.engine().query_gid(0);
    h.gid = g ? g->gid.str() : std::string("?");
    h.mac = opts.mac;
    h.engine = opts.engine_name.substr(0, opts.engine_name.find(':'));
    h.state_version = vhost::RdmaDevice::kStateVersion;
    h.source = opts.self;
    return h;
  }
  // The destination's check of a source's HELLO: a sentence when it cannot take the guest.
  std::optional<std::string> refuse_reason(const Hello& h) const {
    const Hello me = identity();
    if (st.phase != Phase::incoming && st.phase != Phase::holding)
      return fmt::format("this vrdmad is not waiting for a guest (it is {})", to_string(st.phase));
    if (!vhost::RdmaDevice::state_version_readable(h.state_version))
      return fmt::format("the source sends device state version {}, this vrdmad reads versions {} to {}: run a vrdma "
                         "release on the destination at least as new as the source's",
                         h.state_version, vhost::RdmaDevice::kOldestStateVersion, me.state_version);
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

  // ---- the link ---------------------------------------------------------------------------------
  void drop_link() {
    if (!link) return;
    loop.remove(link.get());
    link.reset();
    out.clear();
    out_off = 0;
    in = FrameReader{};
    link_out_armed = false;
    rdma.reset();
  }

  void send(FrameType t, std::span<const std::uint8_t> payload) {
    if (!link) return;
    auto f = encode(t, payload);
    out.insert(out.end(), f.begin(), f.end());
    flush();
  }
  void send(FrameType t, const std::string& text) {
    send(t, std::span(reinterpret_cast<const std::uint8_t*>(text.data()), std::min<std::size_t>(text.size(), kMaxTextBytes)));
  }

  void flush() {
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

  Status watch_link() {
    return loop.add(link.get(), EPOLLIN, [this](std::uint32_t ev) { on_link(ev); });
  }

  void on_link(std::uint32_t ev) {
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

  void link_lost(const std::string& why) {
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
          inner.drop_precreated();
          st.message = why + " before the device state arrived; waiting for another source";
          log::warn("migration: {}", st.message);
        }
        break;
      default:
        break;
    }
  }

  void fail(const std::string& why) {
    st.phase = Phase::failed;
    st.message = why;
    log::error("migration to {} failed: {}", st.peer, why);
  }

  void on_frame(Frame f) {
    const bool source = st.phase == Phase::armed || st.phase == Phase::state_sent || st.phase == Phase::handed_over;
    if (source) {
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
    // Destination.
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
        log::info("migration: {} offers the guest {} ({}); accepted, waiting for its state", h->source, h->gid, h->mac);
        // "prestate": this destination takes the object layout ahead of the state (PRESTATE).
        HelloOk ok;
        ok.prestate = true;
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
        if (auto s = inner.precreate(f.payload); !s.ok())
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
        inner.drop_precreated();
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

  // ---- destination -------------------------------------------------------------------------------
  void accept_source() {
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

  // Destination: the source's state is here (over TCP or RDMA); loaded once the memory is.
  void state_arrived(std::vector<std::uint8_t> blob, const char* via) {
    pending_state = std::move(blob);
    have_state = true;
    t_state = Clock::now();
    st.state_bytes = pending_state.size();
    st.state_via = via;
    log::info("migration: received the device state ({} bytes) from {} over {}", st.state_bytes, st.peer,
              st.state_via == "rdma" ? "RDMA" : "TCP");
    try_load();
  }

  bool have_memory() const { return host != nullptr && !host->memory().memory().regions().empty(); }

  void try_load() {
    if (!have_state || !have_memory() || (st.phase != Phase::incoming && st.phase != Phase::holding)) return;
    const auto t0 = Clock::now();
    auto s = inner.load_state(pending_state);
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

  void activate() {
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

  // ---- state in guest memory ---------------------------------------------------------------------
  std::string arrived_without;  // why the guest runs here without (all) its objects, for the status
  // Destination, rings started without a state from a source: look in the guest's state area.
  // Returns true when the rings may run (state loaded, or there is definitely none to wait for).
  bool try_guest_state() {
    if (have_state || guest_state_refused) return false;  // a source's state is being loaded, or refused
    const auto t0 = Clock::now();
    auto r = inner.load_state_from_guest();
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
    if (!*r && !inner.state_lost().empty()) {
      // The source had objects and could not send them: the guest runs here without them, and
      // its driver hears it at once (DEVICE_FATAL) rather than waiting on objects that are gone.
      arrived_without = "the guest's RDMA objects did not come with it (" + inner.state_lost() +
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
    st.state_bytes = inner.state_area_state_bytes();
    log::info("migration: loaded the device state ({} bytes) from guest memory in {:.1f} ms", st.state_bytes, st.load_ms);
    return true;
  }

  // The guest runs here with no device state. After a restart (the backend before this one
  // died) that means its objects, if it had any, died with that backend: its driver hears it at
  // once (DEVICE_FATAL, kFatalBackendRestarted) instead of waiting on completions that cannot come.
  void runs_without_state(const std::string& why, bool serious) {
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

  // A frontend that runs the device with only the required queues never starts the state
  // queue: after a grace period the guest runs here without a state.
  void arm_no_area_timer() {
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

  // Source: every ring stopped while the frontend dirty-logs, and no destination was armed.
  void save_to_guest() {
    t_stop = Clock::now();
    auto s = inner.save_state_to_guest();
    st.save_ms = ms_since(t_stop);
    if (!s.ok()) {
      st.message = "the rings stopped during a migration but the device state could not go into guest memory: " +
                   s.error().message + "; if the guest moves, it arrives without its RDMA objects (its driver is told)";
      log::error("migration: {}", st.message);
      return;
    }
    st.phase = Phase::in_guest;
    st.state_bytes = inner.state_area_state_bytes();
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

  // ---- source --------------------------------------------------------------------------------------
  void send_state() {
    const auto t0 = Clock::now();
    auto blob = inner.save_state();
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

  void let_go() {
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

  bool others_stopped(std::uint16_t index) const {
    if (host == nullptr) return true;
    for (std::uint16_t i = 0; i < inner.info().num_queues; ++i)
      if (i != index && host->queue_running(i)) return false;
    return true;
  }

  bool all_stopped() const {
    if (host == nullptr) return true;
    for (std::uint16_t i = 0; i < inner.info().num_queues; ++i)
      if (host->queue_running(i)) return false;
    return true;
  }

  Status migrate_to(const std::string& addr, std::chrono::milliseconds timeout, bool send_layout) {
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
        me.state_hint = inner.state_bound_bytes();
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
      const auto layout = inner.save_layout();
      send(FrameType::prestate, layout);
      log::info("migration: sent the object layout ({} bytes, {:.1f} ms) for {} to build during pre-copy",
                layout.size(), ms_since(t0), addr);
    }
    return {};
  }
};

MigratingDevice::MigratingDevice(vhost::RdmaDevice& inner, vhost::EventLoop& loop, MigrationOptions opts)
    : impl_(std::make_unique<Impl>(inner, loop, std::move(opts))) {}
MigratingDevice::~MigratingDevice() = default;

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
             m.host != nullptr && m.host->memory().logging() && m.inner.has_state_area()) {
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

Result<std::vector<std::uint8_t>> MigratingDevice::save_state() { return impl_->inner.save_state(); }

Status MigratingDevice::load_state(std::span<const std::uint8_t> blob) {
  auto& m = *impl_;
  VRDMA_TRY(m.inner.load_state(blob));
  // QEMU >= 8.2 brought the state through its own stream (DEVICE_STATE): no source link needed.
  if (m.st.phase == Phase::incoming || m.st.phase == Phase::holding) m.st.phase = Phase::loaded;
  return {};
}

}  // namespace vrdma::migration
