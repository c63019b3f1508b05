// vrdma-perf: the resources, the connection, polling and the measured loops every exchange
// format shares.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "perf.hpp"
#include "vrdma/nicdrv/registry.hpp"
#include "vrdma/nicdrv/soft.hpp"

namespace vrdma::perf {

void die(const std::string& msg) {
  std::fprintf(stderr, "vrdma-perf: %s\n", msg.c_str());
  std::exit(1);
}

void must(Status s, const char* what) {
  if (!s) die(std::string(what) + ": " + s.error().message);
}

// ---- out-of-band connection (every exchange format but RDMA-CM's) ---------------------------
UniqueFd oob_connect(const Config& c) {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(c.port);
  if (::inet_pton(AF_INET, c.connect.c_str(), &a.sin_addr) != 1) die("--connect needs an IPv4 address");
  for (int i = 0; i < 100; ++i) {
    if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      int one = 1;
      ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  die("cannot reach the server at " + c.connect + ":" + std::to_string(c.port) + " (is it running?)");
}

UniqueFd oob_accept(const Config& c) {
  UniqueFd l(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int one = 1;
  ::setsockopt(l.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(c.port);
  if (::bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l.get(), 1) != 0)
    die("cannot listen on TCP port " + std::to_string(c.port) + ": " + std::strerror(errno) +
        " (another vrdma-perf still serving? pick another with --port)");
  // The device is open by now (a bad one has already failed): say what we wait for.
  std::fprintf(stderr, "vrdma-perf: %s on %s: waiting for a client on TCP port %u\n",
               c.peer_format == "vrdma" ? c.test.c_str() : c.peer_format.c_str(), c.device.c_str(), c.port);
  UniqueFd s(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!s) die("accept failed");
  ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

void fill(std::span<std::uint8_t> b, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& v : b) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<std::uint8_t>(x >> 24);
  }
}

std::uint32_t crc(const std::uint8_t* p, std::size_t n) {
  return static_cast<std::uint32_t>(::crc32(0, p, static_cast<uInt>(n)));
}

GidEntry local_gid(const Device& d) { return must(preferred_gid(d), "read the GID table"); }

std::shared_ptr<QueuePair> new_qp(Ctx& x) {
  QpInitAttr ia;
  ia.type = x.c.connection == "UD" ? QpType::ud : QpType::rc;
  ia.send_cq = x.cq.get();
  ia.recv_cq = x.cq.get();
  ia.cap.max_send_wr = x.c.depth;
  ia.cap.max_recv_wr = x.c.depth;
  return must(x.pd->create_qp(ia), "create QP");
}

void create_resources(Ctx& x, bool is_server) {
  x.dev = must(open_device(x.c.device), "open device");
  x.pd = must(x.dev->alloc_pd(), "alloc PD");
  x.cq = must(x.dev->create_cq(std::max<std::uint32_t>(4 * x.c.depth, 256)), "create CQ");
  if (x.c.connection == "UD" && x.c.peer_format != "pingpong") x.grh = 40;  // the pingpong peer lays out its own
  x.qp = new_qp(x);
  // Buffer slots depend only on the message size (which both sides check is equal), so the
  // peer's buffer always has room for every slot we address: up to 16, at most 64 MiB in all.
  x.slots = x.c.test == "write_lat" || x.c.test == "send_lat" || x.c.test == "read_lat"
                ? 1
                : std::clamp<std::size_t>((std::size_t{64} << 20) / x.c.size, 1, 16);
  // Latency tests write from the upper half and are written into the lower half.
  std::size_t lat_factor = x.c.test == "write_lat" ? 2 : 1;
  std::size_t min_buf = 64;
  if (x.c.peer_format != "vrdma") {
    // perftest cycles its remote addresses over 2 x max(size, its page size) and more; the
    // ping-pong receives into the first slot and sends from the second.
    x.slots = std::max<std::size_t>(x.slots, 2);
    min_buf = 2 * std::max<std::size_t>(x.c.size, std::size_t{64} << 10);
  }
  const std::size_t bytes = std::max<std::size_t>(lat_factor * x.slots * (x.c.size + x.grh), min_buf);
  x.mem = must(x.dev->alloc_buffer(bytes), "allocate buffer");
  x.buf = x.mem->bytes().first(bytes);
  fill(x.buf, is_server ? 2 : 1);
  x.gid = local_gid(*x.dev);
  if (x.c.test == "write_lat") std::fill(x.buf.begin(), x.buf.end(), 0);
  x.mr = must(x.pd->reg_mr(x.buf.data(), x.buf.size(),
                           Access::local_write | Access::remote_write | Access::remote_read | Access::remote_atomic),
              "register memory");
}

std::uint32_t initial_psn() { return static_cast<std::uint32_t>(::getpid() * 7919u) & 0xffffff; }

// INIT: from here on receives may be posted (IBA 10.8.2), before the peer is known.
void qp_to_init(Ctx& x) { qp_to_init(*x.qp); }

void qp_to_init(QueuePair& qp) {
  using M = QpAttrMask;
  QpAttr a;
  a.qp_state = QpState::init;
  a.qp_access_flags = Access::local_write | Access::remote_write | Access::remote_read | Access::remote_atomic;
  must(qp.modify(a, M::state | M::pkey_index | M::port | M::access_flags), "QP to INIT");
}

void connect_qp(Ctx& x, const Remote& r, std::uint32_t my_psn) { connect_qp(x, *x.qp, r, my_psn); }

void connect_qp(Ctx& x, QueuePair& qp, const Remote& r, std::uint32_t my_psn) {
  auto mtu = mtu_from_bytes(x.c.mtu);
  if (!mtu) die("--mtu must be 256, 512, 1024, 2048 or 4096");
  using M = QpAttrMask;
  if (qp.type() == QpType::ud) {  // ready without its peer; the peer goes into each send
    if (x.c.size > x.c.mtu)
      die("a UD message is one datagram: --size " + std::to_string(x.c.size) + " must fit the path MTU " +
          std::to_string(x.c.mtu));
    QpAttr a;
    a.qp_state = QpState::init;
    a.qkey = Ctx::kUdQkey;
    if (qp.state() == QpState::reset) must(qp.modify(a, M::state | M::pkey_index | M::port | M::qkey), "UD QP to INIT");
    a.qp_state = QpState::rtr;
    must(qp.modify(a, M::state), "UD QP to RTR");
    a.qp_state = QpState::rts;
    a.sq_psn = my_psn;
    must(qp.modify(a, M::state | M::sq_psn), "UD QP to RTS");
    AhAttr h;
    h.dgid = r.gid;
    h.sgid_index = static_cast<std::uint8_t>(x.gid.index);
    h.hop_limit = 1;
    x.ah = must(x.pd->create_ah(h), "create the address handle");
    x.remote_qpn = r.qpn;
    return;
  }
  if (qp.state() == QpState::reset) qp_to_init(qp);
  QpAttr a;
  a.qp_state = QpState::rtr;
  a.path_mtu = *mtu;
  a.dest_qp_num = r.qpn;
  a.rq_psn = r.psn;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = r.min_rnr_timer;
  a.ah_attr.dgid = r.gid;
  a.ah_attr.sgid_index = static_cast<std::uint8_t>(x.gid.index);
  must(qp.modify(a, M::state | M::av | M::path_mtu | M::dest_qpn | M::rq_psn | M::max_dest_rd_atomic | M::min_rnr_timer),
       "QP to RTR");
  a.qp_state = QpState::rts;
  a.sq_psn = my_psn;
  a.timeout = static_cast<std::uint8_t>(x.c.qp_timeout);
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = std::min<std::uint8_t>(16, std::max<std::uint8_t>(r.max_rd_atomic, 1));
  must(qp.modify(a, M::state | M::sq_psn | M::timeout | M::retry_cnt | M::rnr_retry | M::max_qp_rd_atomic), "QP to RTS");
}

std::size_t poll_checked(Ctx& x, WorkCompletion* wc, std::size_t n) {
  auto r = x.cq->poll(std::span<WorkCompletion>(wc, n));
  if (!r) die("poll CQ: " + r.error().message);
  for (std::size_t i = 0; i < *r; ++i)
    if (wc[i].status != WcStatus::success &&
        !(x.peer_may_leave && wc[i].opcode == WcOpcode::send && wc[i].status == WcStatus::retry_exc_err))
      die("work request " + std::to_string(wc[i].wr_id) + " failed: " + std::string(to_string(wc[i].status)));
  return *r;
}

// Busy-polls while completions keep coming (what the tests measure; the soft provider does its
// receive work inside poll(), so no thread switch per message). After 200 us without one it
// yields the core at each empty poll (a yielding task waits behind every runnable one, so not
// sooner), and after 2 ms it sleeps on the CQ's event fd, 1 ms at a time: a slow peer such as a
// TCG guest on the same cores gets them. --busy-poll: polls only (perftest's way).
std::size_t poll_some(Ctx& x, WorkCompletion* wc, std::size_t n) {
  if (x.c.busy_poll) return poll_checked(x, wc, n);
  static thread_local SteadyClock::time_point last = SteadyClock::now();
  std::size_t got = poll_checked(x, wc, n);
  const auto now = SteadyClock::now();
  if (got > 0) {
    last = now;
    return got;
  }
  if (now - last < std::chrono::microseconds(200)) return 0;
  if (now - last < std::chrono::milliseconds(2)) {
    sched_yield();
    return 0;
  }
  must(x.cq->req_notify(false), "arm the CQ");
  got = poll_checked(x, wc, n);  // what arrived before the arm raises no event
  if (got == 0) {
    pollfd p{x.cq->event_fd(), POLLIN, 0};
    ::poll(&p, 1, 1);
    x.cq->ack_events();
    got = poll_checked(x, wc, n);
  }
  if (got > 0) last = SteadyClock::now();
  return got;
}

void check_stall(Watchdog& w, std::uint64_t posted, std::uint64_t completed, const char* what) {
  if (!w.expired()) return;
  die(fmt::format("no {} completed for {} s ({} posted, {} completed): the peer stopped answering or the device lost "
                  "work; see the peer's output and the device's log",
                  what, kStallSeconds, posted, completed));
}

void post_recvs(Ctx& x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    Sge s = x.recv_sge(i % x.slots);
    RecvWr r{i, std::span<const Sge>(&s, 1)};
    must(x.qp->post_recv(std::span<const RecvWr>(&r, 1)), "post receive");
  }
}

bool time_up(const Config& c, SteadyClock::time_point start, std::uint64_t done) {
  if (c.duration > 0) return std::chrono::duration<double>(SteadyClock::now() - start).count() >= c.duration;
  return done >= c.iters;
}

// Streams operations with up to `depth` outstanding (client side of the *_bw tests).
Outcome run_bw(Ctx& x) {
  WrOpcode op = x.c.test == "write_bw"    ? WrOpcode::rdma_write
                : x.c.test == "read_bw"   ? WrOpcode::rdma_read
                : x.c.test == "atomic_bw" ? (x.c.cmp_and_swap ? WrOpcode::atomic_cmp_and_swp : WrOpcode::atomic_fetch_and_add)
                                          : WrOpcode::send;
  const bool atomic = op == WrOpcode::atomic_fetch_and_add || op == WrOpcode::atomic_cmp_and_swp;
  std::uint32_t len = atomic ? 8 : x.c.size;
  // CMP_AND_SWAP: the k-th compares with the value the (k-1)-th left and adds one, so that all
  // succeed when the responder runs them in order and the target ends `ops` above where it
  // started (what --verify checks). x.atomic_base: the target's first value, if known.
  std::uint64_t expect = x.atomic_base;
  Outcome o;
  std::uint64_t posted = 0, completed = 0;
  auto start = SteadyClock::now();
  WorkCompletion wc[64];
  bool stop = false;
  Watchdog progress{std::chrono::seconds(kStallSeconds)};
  while (!stop || completed < posted) {
    while (!stop && posted - completed < x.c.depth) {
      if (time_up(x.c, start, posted)) {
        stop = true;
        break;
      }
      std::size_t slot = posted % x.slots;
      Sge s = x.sge(slot, len);
      SendWr w;
      w.wr_id = posted;
      w.opcode = op;
      w.flags = SendFlags::signaled;
      w.sg_list = std::span<const Sge>(&s, 1);
      w.rdma.remote_addr = x.remote_addr + slot * x.c.size;
      w.rdma.rkey = x.remote_rkey;
      w.atomic.remote_addr = x.remote_addr;
      w.atomic.rkey = x.remote_rkey;
      x.address(w);
      w.atomic.compare_add = op == WrOpcode::atomic_cmp_and_swp ? expect : 1;
      w.atomic.swap = expect + 1;
      ++expect;
      must(x.qp->post_send(std::span<const SendWr>(&w, 1)), "post send");
      ++posted;
    }
    if (const std::size_t n = poll_some(x, wc, 64); n > 0) {
      completed += n;
      progress.moved();
    } else {
      check_stall(progress, posted, completed, "work request");
    }
  }
  o.ops = completed;
  o.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return o;
}

// Ping-pong: the client sends, the server echoes; latency is half the round trip.
Outcome run_lat(Ctx& x, bool waits_first, std::uint64_t iters) {
  Outcome o;
  bool writes = x.c.test == "write_lat";
  WorkCompletion wc[8];
  std::uint64_t sent = 0, send_done = 0;  // our own send/write completions
  auto reap = [&] {
    std::size_t n = poll_some(x, wc, 8);
    for (std::size_t k = 0; k < n; ++k)
      if (wc[k].opcode != WcOpcode::recv) ++send_done;
    return n;
  };
  volatile std::uint8_t* last = x.buf.data() + x.c.size - 1;
  auto send_one = [&](std::uint64_t i) {
    Sge s = x.sge(writes ? 1 : 0, x.c.size);
    SendWr w;
    w.wr_id = i;
    w.opcode = writes ? WrOpcode::rdma_write : WrOpcode::send;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span<const Sge>(&s, 1);
    w.rdma.remote_addr = x.remote_addr;
    w.rdma.rkey = x.remote_rkey;
    x.address(w);
    if (writes) x.buf[2 * x.c.size - 1] = static_cast<std::uint8_t>(i + 1);
    while (sent - send_done >= x.c.depth) reap();  // at most depth sends outstanding (depth 1: one at a time)
    must(x.qp->post_send(std::span<const SendWr>(&w, 1)), "post send");
    ++sent;
  };
  auto wait_in = [&](std::uint64_t i) {
    Watchdog deadline{std::chrono::seconds(30)};
    if (writes) {
      while (*last != static_cast<std::uint8_t>(i + 1)) {
        reap();
        if (deadline.expired()) die("timed out waiting for the peer's write");
      }
      return;
    }
    for (;;) {
      std::size_t n = poll_some(x, wc, 8);
      bool got = false;
      for (std::size_t k = 0; k < n; ++k)
        if (wc[k].opcode != WcOpcode::recv) {
          ++send_done;
        } else {
          got = true;
          Sge s = x.recv_sge(0);
          RecvWr r{0, std::span<const Sge>(&s, 1)};
          must(x.qp->post_recv(std::span<const RecvWr>(&r, 1)), "post receive");
        }
      if (got) return;
      if (deadline.expired()) die("timed out waiting for the peer's message");
    }
  };
  auto start = SteadyClock::now();
  for (std::uint64_t i = 0; i < iters; ++i) {
    auto t0 = SteadyClock::now();
    if (waits_first) {
      wait_in(i);
      send_one(i);
    } else {
      send_one(i);
      wait_in(i);
      o.lat_us.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count() / 2);
    }
  }
  // Drain our send completions.
  auto deadline = SteadyClock::now() + std::chrono::milliseconds(200);
  while (SteadyClock::now() < deadline) reap();
  o.ops = iters;
  o.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return o;
}

Outcome run_read_lat(Ctx& x) {
  Outcome o;
  WorkCompletion wc[8];
  const auto start = SteadyClock::now();
  for (std::uint64_t i = 0; !time_up(x.c, start, i); ++i) {
    Sge s = x.sge(0, x.c.size);
    SendWr w;
    w.wr_id = i;
    w.opcode = WrOpcode::rdma_read;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span<const Sge>(&s, 1);
    w.rdma.remote_addr = x.remote_addr;
    w.rdma.rkey = x.remote_rkey;
    const auto t0 = SteadyClock::now();
    must(x.qp->post_send(std::span<const SendWr>(&w, 1)), "post READ");
    const auto deadline = t0 + std::chrono::seconds(30);
    while (poll_some(x, wc, 8) == 0)
      if (SteadyClock::now() > deadline) die("READ " + std::to_string(i) + " did not complete in 30 s");
    o.lat_us.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
    ++o.ops;
  }
  o.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return o;
}

// A soft engine's packet counters in the JSON ("engine"): what a case checks moved (and was lost).
// Our own resends (retransmits, read_rereads, tail_probes) and what says the peer resent: the
// sequence NAKs we sent for its gaps and the duplicates we received (IBA 9.7.5.1.1, 9.9.2).
void add_engine_stats(json& out, const nicdrv::Device& dev) {
  auto st = soft::stats(dev);
  if (!st) return;
  out["engine"] = {{"rx_dropped_icrc", st->rx_dropped_icrc}, {"rx_dropped_malformed", st->rx_dropped_malformed},
                   {"rx_longer_than_mtu", st->rx_longer_than_mtu}, {"rx_dropped_no_recv", st->rx_dropped_no_recv},
                   {"retransmits", st->retransmits},
                   {"read_rereads", st->read_rereads}, {"tail_probes", st->tail_probes}, {"tx_packets", st->tx_packets}, {"rx_packets", st->rx_packets},
                   {"seq_naks_sent", st->seq_naks_sent}, {"duplicates_received", st->duplicates_received}};
}

}  // namespace vrdma::perf
