// vrdma-perf: bandwidth and latency tests over any nicdrv provider, in the spirit of perftest.
//
//   server:  vrdma-perf --device soft:10.0.0.1 --test write_bw
//   client:  vrdma-perf --device soft:10.0.0.2 --test write_bw --connect 10.0.0.1 --size 65536
//
// The two sides exchange QPN, PSN, GID, rkey and buffer address as one JSON line over a TCP
// connection (default port 18515), then run the test. --verify checks data end to end.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/times.h>
#include <unistd.h>
#include <zlib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "perf_cm.hpp"
#include "vrdma/common/fd.hpp"
#include "vrdma/nicdrv/registry.hpp"
#include "vrdma/nicdrv/soft.hpp"

using namespace vrdma;
using namespace vrdma::nicdrv;
using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

namespace {

struct Config {
  std::string device, connect, test = "write_bw";
  std::uint16_t port = 18515;
  std::uint32_t size = 65536, depth = 64, mtu = 1024;
  std::uint64_t iters = 1000;
  double duration = 0;
  bool json_out = false, verify = false;
  std::string peer_format = "vrdma";  // vrdma (our JSON lines), perftest, pingpong
  unsigned qp_timeout = 14;            // local ACK timeout exponent: 4.096 us * 2^n (IBA 9.7.6.1.3)
};

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "vrdma-perf: %s\n", msg.c_str());
  std::exit(1);
}

template <class T>
T must(Result<T> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().message);
  return std::move(r).value();
}
void must(Status s, const char* what) {
  if (!s) die(std::string(what) + ": " + s.error().message);
}

// ---- out-of-band exchange -------------------------------------------------------------------
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
    die("cannot listen on TCP port " + std::to_string(c.port) + ": " + std::strerror(errno));
  UniqueFd s(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!s) die("accept failed");
  ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

void send_line(int fd, const json& j) {
  std::string s = j.dump() + "\n";
  if (::send(fd, s.data(), s.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(s.size())) die("out-of-band send failed");
}

json recv_line(int fd) {
  std::string s;
  char ch;
  while (s.size() < 65536) {
    ssize_t r = ::recv(fd, &ch, 1, 0);
    if (r <= 0) die("the peer closed the out-of-band connection");
    if (ch == '\n') break;
    s += ch;
  }
  auto j = json::parse(s, nullptr, false);
  if (j.is_discarded()) die("the peer sent a malformed exchange line");
  return j;
}

// ---- the test ---------------------------------------------------------------------------------
struct Ctx {
  Config c;
  std::shared_ptr<Device> dev;
  std::shared_ptr<ProtectionDomain> pd;
  std::shared_ptr<CompletionQueue> cq;
  std::shared_ptr<QueuePair> qp;
  std::shared_ptr<Buffer> mem;  // from Device::alloc_buffer: memory every provider can register
  std::span<std::uint8_t> buf;  // the part of `mem` the test uses
  std::shared_ptr<MemoryRegion> mr;
  std::uint64_t remote_addr = 0;
  std::uint32_t remote_rkey = 0;
  std::size_t slots = 1;
  GidEntry gid;  // ours, as peers address us (local_gid)

  Sge sge(std::size_t slot, std::uint32_t len) const {
    return Sge{reinterpret_cast<std::uint64_t>(buf.data()) + slot * c.size, len, mr->lkey()};
  }
};

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

void post_recvs(Ctx& x, std::size_t n);

void post_ready_recvs(Ctx& x, bool is_server) {
  // Receives go up before "ready" so the first SEND never meets an empty receive queue.
  if (x.c.test == "send_lat") post_recvs(x, std::min<std::uint64_t>(x.c.depth, 16));
  else if (is_server) post_recvs(x, x.c.depth);
}

// What a QP needs to know of its peer to connect (every exchange format carries these).
struct Remote {
  std::uint32_t qpn = 0, psn = 0;
  Gid gid;
  std::uint8_t max_rd_atomic = 16;  // how many READs/atomics the peer's responder takes
  std::uint8_t min_rnr_timer = 1;
};

GidEntry local_gid(const Device& d) { return must(preferred_gid(d), "read the GID table"); }

void create_resources(Ctx& x, bool is_server) {
  x.dev = must(open_device(x.c.device), "open device");
  x.pd = must(x.dev->alloc_pd(), "alloc PD");
  x.cq = must(x.dev->create_cq(std::max<std::uint32_t>(4 * x.c.depth, 256)), "create CQ");
  QpInitAttr ia;
  ia.send_cq = x.cq.get();
  ia.recv_cq = x.cq.get();
  ia.cap.max_send_wr = x.c.depth;
  ia.cap.max_recv_wr = x.c.depth;
  x.qp = must(x.pd->create_qp(ia), "create QP");
  // Buffer slots depend only on the message size (which both sides check is equal), so the
  // peer's buffer always has room for every slot we address: up to 16, at most 64 MiB in all.
  x.slots = x.c.test == "write_lat" || x.c.test == "send_lat"
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
  const std::size_t bytes = std::max<std::size_t>(lat_factor * x.slots * x.c.size, min_buf);
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
void qp_to_init(Ctx& x) {
  using M = QpAttrMask;
  QpAttr a;
  a.qp_state = QpState::init;
  a.qp_access_flags = Access::local_write | Access::remote_write | Access::remote_read | Access::remote_atomic;
  must(x.qp->modify(a, M::state | M::pkey_index | M::port | M::access_flags), "QP to INIT");
}

void connect_qp(Ctx& x, const Remote& r, std::uint32_t my_psn) {
  auto mtu = mtu_from_bytes(x.c.mtu);
  if (!mtu) die("--mtu must be 256, 512, 1024, 2048 or 4096");
  using M = QpAttrMask;
  if (x.qp->state() == QpState::reset) qp_to_init(x);
  QpAttr a;
  a.qp_state = QpState::rtr;
  a.path_mtu = *mtu;
  a.dest_qp_num = r.qpn;
  a.rq_psn = r.psn;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = r.min_rnr_timer;
  a.ah_attr.dgid = r.gid;
  a.ah_attr.sgid_index = static_cast<std::uint8_t>(x.gid.index);
  must(x.qp->modify(a, M::state | M::av | M::path_mtu | M::dest_qpn | M::rq_psn | M::max_dest_rd_atomic | M::min_rnr_timer),
       "QP to RTR");
  a.qp_state = QpState::rts;
  a.sq_psn = my_psn;
  a.timeout = static_cast<std::uint8_t>(x.c.qp_timeout);
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = std::min<std::uint8_t>(16, std::max<std::uint8_t>(r.max_rd_atomic, 1));
  must(x.qp->modify(a, M::state | M::sq_psn | M::timeout | M::retry_cnt | M::rnr_retry | M::max_qp_rd_atomic), "QP to RTS");
}

void setup(Ctx& x, int oob, bool is_server) {
  create_resources(x, is_server);
  const GidEntry& gid = x.gid;
  std::uint32_t psn = initial_psn();
  json me = {{"qpn", x.qp->qp_num()}, {"psn", psn}, {"gid", gid.gid.str()}, {"rkey", x.mr->rkey()},
             {"addr", x.mr->addr()}, {"test", x.c.test}, {"size", x.c.size}, {"verify", x.c.verify}};
  json peer;
  if (is_server) {
    peer = recv_line(oob);
    send_line(oob, me);
  } else {
    send_line(oob, me);
    peer = recv_line(oob);
  }
  if (peer.value("test", "") != x.c.test || peer.value("size", 0u) != x.c.size)
    die("client and server disagree on --test or --size");
  if (is_server) x.c.verify = peer.value("verify", false);  // the client decides
  x.remote_addr = peer["addr"];
  x.remote_rkey = peer["rkey"];
  Remote r;
  r.qpn = peer["qpn"];
  r.psn = peer["psn"];
  if (::inet_pton(AF_INET6, peer["gid"].get<std::string>().c_str(), r.gid.raw.data()) != 1) die("peer GID is malformed");
  connect_qp(x, r, psn);
  // Both QPs must be ready before the first packet flies (else it meets a QP still in INIT).
  if (x.c.test == "send_lat" || x.c.test == "send_bw") post_ready_recvs(x, is_server);
  send_line(oob, {{"ready", true}});
  recv_line(oob);
}

std::size_t poll_checked(Ctx& x, WorkCompletion* wc, std::size_t n) {
  auto r = x.cq->poll(std::span<WorkCompletion>(wc, n));
  if (!r) die("poll CQ: " + r.error().message);
  for (std::size_t i = 0; i < *r; ++i)
    if (wc[i].status != WcStatus::success)
      die("work request " + std::to_string(wc[i].wr_id) + " failed: " + std::string(to_string(wc[i].status)));
  return *r;
}

// Busy-polls while completions keep coming (what the tests measure; the soft provider does its
// receive work inside poll(), so no thread switch per message). After 200 us without one it
// yields the core at each empty poll (a yielding task waits behind every runnable one, so not
// sooner), and after 2 ms it sleeps on the CQ's event fd, 1 ms at a time: a slow peer such as a
// TCG guest on the same cores gets them.
std::size_t poll_some(Ctx& x, WorkCompletion* wc, std::size_t n) {
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

void post_recvs(Ctx& x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    Sge s = x.sge(i % x.slots, x.c.size);
    RecvWr r{i, std::span<const Sge>(&s, 1)};
    must(x.qp->post_recv(std::span<const RecvWr>(&r, 1)), "post receive");
  }
}

bool time_up(const Config& c, SteadyClock::time_point start, std::uint64_t done) {
  if (c.duration > 0) return std::chrono::duration<double>(SteadyClock::now() - start).count() >= c.duration;
  return done >= c.iters;
}

struct Outcome {
  std::uint64_t ops = 0;
  double seconds = 0;
  std::vector<double> lat_us;
};

// Streams operations with up to `depth` outstanding (client side of the *_bw tests).
Outcome run_bw(Ctx& x) {
  WrOpcode op = x.c.test == "write_bw"    ? WrOpcode::rdma_write
                : x.c.test == "read_bw"   ? WrOpcode::rdma_read
                : x.c.test == "atomic_bw" ? WrOpcode::atomic_fetch_and_add
                                          : WrOpcode::send;
  std::uint32_t len = op == WrOpcode::atomic_fetch_and_add ? 8 : x.c.size;
  Outcome o;
  std::uint64_t posted = 0, completed = 0;
  auto start = SteadyClock::now();
  WorkCompletion wc[64];
  bool stop = false;
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
      w.atomic.compare_add = 1;
      must(x.qp->post_send(std::span<const SendWr>(&w, 1)), "post send");
      ++posted;
    }
    completed += poll_some(x, wc, 64);
  }
  o.ops = completed;
  o.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return o;
}

// Ping-pong: the client sends, the server echoes; latency is half the round trip.
Outcome run_lat(Ctx& x, bool is_server, std::uint64_t iters) {
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
    if (writes) x.buf[2 * x.c.size - 1] = static_cast<std::uint8_t>(i + 1);
    while (sent - send_done >= x.c.depth) reap();  // at most depth sends outstanding (depth 1: one at a time)
    must(x.qp->post_send(std::span<const SendWr>(&w, 1)), "post send");
    ++sent;
  };
  auto wait_in = [&](std::uint64_t i) {
    auto deadline = SteadyClock::now() + std::chrono::seconds(30);
    if (writes) {
      while (*last != static_cast<std::uint8_t>(i + 1)) {
        reap();
        if (SteadyClock::now() > deadline) die("timed out waiting for the peer's write");
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
          Sge s = x.sge(0, x.c.size);
          RecvWr r{0, std::span<const Sge>(&s, 1)};
          must(x.qp->post_recv(std::span<const RecvWr>(&r, 1)), "post receive");
        }
      if (got) return;
      if (SteadyClock::now() > deadline) die("timed out waiting for the peer's message");
    }
  };
  auto start = SteadyClock::now();
  for (std::uint64_t i = 0; i < iters; ++i) {
    auto t0 = SteadyClock::now();
    if (is_server) {
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

// Server side of send_bw: receive until the client says it is done.
std::uint64_t serve_send_bw(Ctx& x, int oob) {
  // As many receives as the client keeps sends in flight were posted before "ready".
  std::uint64_t got = 0, next_wr = x.c.depth;
  WorkCompletion wc[64];
  std::uint64_t expected = UINT64_MAX;
  ::fcntl(oob, F_SETFL, O_NONBLOCK);
  std::string pending;
  while (got < expected) {
    std::size_t n = poll_some(x, wc, 64);
    for (std::size_t i = 0; i < n; ++i) {
      if (wc[i].opcode != WcOpcode::recv) continue;
      ++got;
      // Receives complete in order: receive k holds message k, which the client sent from
      // slot k % slots; keep the same mapping so the buffers compare equal.
      Sge s = x.sge(next_wr % x.slots, x.c.size);
      RecvWr r{next_wr++, std::span<const Sge>(&s, 1)};
      must(x.qp->post_recv(std::span<const RecvWr>(&r, 1)), "post receive");
    }
    char ch;
    while (expected == UINT64_MAX && ::recv(oob, &ch, 1, 0) == 1) {
      if (ch == '\n') expected = json::parse(pending, nullptr, false).value("ops", 0ull);
      else pending += ch;
    }
  }
  ::fcntl(oob, F_SETFL, 0);
  return got;
}


// ---- foreign peers: the out-of-band formats of perftest and ibv_rc_pingpong -------------------
// Both tools swap fixed-size, NUL-terminated text records over TCP, the client writing first.
// perftest (KEY_PRINT_FMT_GID in perftest_communication.h) sends
//   lid:out_reads:qpn:psn:rkey:vaddr:<16 GID bytes, each "xx:">srqn:   (108 bytes with the NUL)
// and, before and after the keys, other records (versions, page and cache-line size, MTU, the
// bandwidth report) that the server answers with a record of the same size. As a server we
// answer those with the client's own record: we agree to its version and sizes.
// ibv_rc_pingpong sends lid:qpn:psn:<GID as 32 hex digits> (52 bytes), then the client "done".
constexpr std::size_t kPerftestKeyLen = 108, kPingpongLen = 52;
constexpr int kForeignTimeoutMs = 120000;

struct ForeignDest {
  std::uint64_t lid = 0, out_reads = 0, qpn = 0, psn = 0, rkey = 0, vaddr = 0, srqn = 0;
  Gid gid;
};

std::string hex(std::uint64_t v, int width) {
  char b[24];
  std::snprintf(b, sizeof b, "%0*llx", width, static_cast<unsigned long long>(v));
  return b;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (std::size_t pos = 0;;) {
    std::size_t e = s.find(sep, pos);
    out.push_back(s.substr(pos, e == std::string_view::npos ? std::string_view::npos : e - pos));
    if (e == std::string_view::npos) return out;
    pos = e + 1;
  }
}

bool parse_hex(std::string_view f, std::size_t width, std::uint64_t& v) {
  if (f.size() != width) return false;
  auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), v, 16);
  return ec == std::errc{} && p == f.data() + f.size();
}

std::string perftest_record(const ForeignDest& d) {
  std::string s = hex(d.lid, 4) + ":" + hex(d.out_reads, 4) + ":" + hex(d.qpn, 6) + ":" + hex(d.psn, 6) + ":" +
                  hex(d.rkey, 8) + ":" + hex(d.vaddr, 16) + ":";
  for (auto b : d.gid.raw) s += hex(b, 2) + ":";
  s += hex(d.srqn, 8) + ":";
  s.push_back('\0');
  return s;
}

bool parse_perftest_record(std::string_view m, ForeignDest& d) {
  if (m.size() != kPerftestKeyLen || m.back() != '\0') return false;
  auto f = split(m.substr(0, m.size() - 1), ':');
  if (f.size() != 24 || !f[23].empty()) return false;  // 6 fields, 16 GID bytes, srqn, trailing ':'
  static constexpr std::size_t w[] = {4, 4, 6, 6, 8, 16};
  std::uint64_t* dst[] = {&d.lid, &d.out_reads, &d.qpn, &d.psn, &d.rkey, &d.vaddr};
  for (std::size_t i = 0; i < 6; ++i)
    if (!parse_hex(f[i], w[i], *dst[i])) return false;
  for (std::size_t i = 0; i < 16; ++i) {
    std::uint64_t b = 0;
    if (!parse_hex(f[6 + i], 2, b)) return false;
    d.gid.raw[i] = static_cast<std::uint8_t>(b);
  }
  return parse_hex(f[22], 8, d.srqn);
}

std::string pingpong_record(const ForeignDest& d) {
  std::string s = hex(d.lid, 4) + ":" + hex(d.qpn, 6) + ":" + hex(d.psn, 6) + ":";
  for (auto b : d.gid.raw) s += hex(b, 2);
  s.push_back('\0');
  return s;
}

bool parse_pingpong_record(std::string_view m, ForeignDest& d) {
  if (m.size() != kPingpongLen || m.back() != '\0') return false;
  auto f = split(m.substr(0, m.size() - 1), ':');
  if (f.size() != 4 || !parse_hex(f[0], 4, d.lid) || !parse_hex(f[1], 6, d.qpn) || !parse_hex(f[2], 6, d.psn) ||
      f[3].size() != 32)
    return false;
  for (std::size_t i = 0; i < 16; ++i) {
    std::uint64_t b = 0;
    if (!parse_hex(f[3].substr(2 * i, 2), 2, b)) return false;
    d.gid.raw[i] = static_cast<std::uint8_t>(b);
  }
  return true;
}

void write_all(int fd, std::string_view m) {
  if (::send(fd, m.data(), m.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(m.size()))
    die("the peer closed the out-of-band connection while we were writing");
}

// Waits up to `ms` for bytes; false on timeout. Runs `idle` between short waits.
template <class F>
bool wait_readable(int fd, int ms, F&& idle) {
  auto deadline = SteadyClock::now() + std::chrono::milliseconds(ms);
  while (SteadyClock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1) > 0) return true;
    idle();
  }
  return false;
}

std::string read_exact(int fd, std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t got = 0; got < n;) {
    if (!wait_readable(fd, kForeignTimeoutMs, [] {})) die("the peer sent nothing on the out-of-band connection for 120 s");
    ssize_t r = ::recv(fd, s.data() + got, n - got, 0);
    if (r <= 0) die("the peer closed the out-of-band connection after " + std::to_string(got) + " of " + std::to_string(n) + " bytes");
    got += static_cast<std::size_t>(r);
  }
  return s;
}

// One record of unknown size: everything that arrives until the line is quiet for 50 ms (the
// writer then waits for our answer). Empty on end of stream.
template <class F>
std::string read_record(int fd, F&& idle) {
  if (!wait_readable(fd, kForeignTimeoutMs, idle)) die("the peer sent nothing on the out-of-band connection for 120 s");
  std::string s;
  char b[512];
  for (;;) {
    ssize_t r = ::recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (r == 0) return s;
    if (r > 0) {
      s.append(b, static_cast<std::size_t>(r));
      if (s.size() > 4096) die("the peer sent an out-of-band record over 4 KiB: not perftest");
      continue;
    }
    if (!wait_readable(fd, 50, [] {})) return s;
  }
}

ForeignDest my_dest(Ctx& x, std::uint32_t psn) {
  ForeignDest d;
  d.out_reads = 16;
  d.qpn = x.qp->qp_num();
  d.psn = psn;
  d.rkey = x.mr->rkey();
  d.vaddr = x.mr->addr();
  d.gid = x.gid.gid;
  return d;
}

struct ForeignOutcome {
  Outcome o;
  std::vector<std::size_t> records;  // sizes of the records the peer sent, in order
  bool verified = true;
  bool last_ack_lost = false;  // pingpong: see run_pingpong
};

// perftest's path MTU record: the ibv_mtu enum as one digit and a NUL (check_mtu, "%d" in a
// 2-byte exchange).
bool is_perftest_mtu_record(std::string_view m) { return m.size() == 2 && m[0] >= '1' && m[0] <= '5' && m[1] == '\0'; }

// Our side of that exchange: --mtu as perftest writes it.
std::string perftest_mtu_record(const Ctx& x) {
  auto ours = mtu_from_bytes(x.c.mtu);
  if (!ours) die("--mtu must be 256, 512, 1024, 2048 or 4096");
  std::string r(2, '\0');
  r[0] = static_cast<char>('0' + static_cast<int>(*ours));
  return r;
}

// Both sides of perftest's MTU exchange run the smaller of the two path MTUs (its check_mtu);
// ours becomes that.
void take_smaller_mtu(Ctx& x, std::string_view theirs) {
  const std::uint32_t their = mtu_bytes(static_cast<Mtu>(theirs[0] - '0'));
  if (their >= x.c.mtu) return;
  std::cerr << "vrdma-perf: the perftest peer runs path MTU " << their << ", we were given " << x.c.mtu << ": both use "
            << their << " (as perftest does)\n";
  x.c.mtu = their;
}

// perftest client (ib_write_bw, ib_read_bw, ib_send_bw, ib_send_lat ... <our address>) against
// us as the server: keys on every 108-byte record, the client's own record back for the rest,
// our path MTU for its MTU record (the smaller one is taken).
ForeignOutcome serve_perftest(Ctx& x, int fd) {
  ForeignOutcome r;
  const std::uint32_t psn = initial_psn();
  const ForeignDest me = my_dest(x, psn);
  int keys = 0;
  bool receiving = false;
  std::uint64_t next_wr = 0;
  WorkCompletion wc[64];
  // While the client runs: keep receives posted (send_bw) and answer each message (send_lat,
  // whose client may still exchange records after its QP is ready, so the echo runs here).
  const bool echo = x.c.test == "send_lat";
  auto service = [&] {
    if (!receiving) return;
    std::size_t n = poll_some(x, wc, 64);
    for (std::size_t i = 0; i < n; ++i) {
      if (wc[i].opcode != WcOpcode::recv) continue;
      ++r.o.ops;
      Sge s = x.sge(echo ? 0 : next_wr % x.slots, x.c.size);
      RecvWr w{next_wr++, std::span<const Sge>(&s, 1)};
      must(x.qp->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
      if (!echo) continue;
      Sge out = x.sge(1, x.c.size);
      SendWr sw;
      sw.wr_id = r.o.ops;
      sw.opcode = WrOpcode::send;
      sw.flags = SendFlags::signaled;
      sw.sg_list = std::span<const Sge>(&out, 1);
      must(x.qp->post_send(std::span<const SendWr>(&sw, 1)), "post send");
    }
  };
  auto start = SteadyClock::now();
  for (int rounds = 0; rounds < 64; ++rounds) {
    std::string m = read_record(fd, service);
    if (m.empty()) break;
    r.records.push_back(m.size());
    if (m == std::string_view("done", 5)) break;
    ForeignDest peer;
    if (keys == 0 && is_perftest_mtu_record(m)) {  // each side takes the smaller (perftest's check_mtu)
      write_all(fd, perftest_mtu_record(x));
      take_smaller_mtu(x, m);
      continue;
    }
    if (!parse_perftest_record(m, peer)) {
      write_all(fd, m);
      continue;
    }
    if (++keys == 1) {
      Remote rem;
      rem.qpn = static_cast<std::uint32_t>(peer.qpn);
      rem.psn = static_cast<std::uint32_t>(peer.psn);
      rem.gid = peer.gid;
      rem.max_rd_atomic = static_cast<std::uint8_t>(std::min<std::uint64_t>(peer.out_reads, 16));
      x.remote_addr = peer.vaddr;
      x.remote_rkey = static_cast<std::uint32_t>(peer.rkey);
      connect_qp(x, rem, psn);
      if (x.c.test == "send_bw" || x.c.test == "send_lat") {
        std::size_t n = x.c.test == "send_bw" ? x.c.depth : 16;
        for (; next_wr < n; ++next_wr) {
          Sge s = x.sge(x.c.test == "send_bw" ? next_wr % x.slots : 0, x.c.size);
          RecvWr w{next_wr, std::span<const Sge>(&s, 1)};
          must(x.qp->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
        }
        receiving = true;
      }
    }
    write_all(fd, perftest_record(me));
    // The client's test runs between its third and fourth key record (WRITE/READ) or its fourth
    // and fifth (SEND, whose server posts its receives in between): see client_perftest.
    const int test_key = x.c.test == "send_bw" || x.c.test == "send_lat" ? 4 : 3;
    if (keys == test_key) start = SteadyClock::now();
    if (keys == test_key + 1) r.o.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  }
  if (keys < 3) die("the perftest client stopped after " + std::to_string(keys) + " key exchanges (want at least 3)");
  return r;
}

// Us as the client of a perftest server (ib_write_bw ... without an address). The records, in
// the order perftest 6.06 expects them (a server answers each with one of the same size):
// version (16 bytes), page size and cache-line size (4 each, network order), path MTU as the
// decimal enum value ("3" + NUL), then for WRITE/READ keys three times, the test, keys, the
// bandwidth report (size, iterations, peak, average, message rate: 8 bytes each, network
// order); for SEND keys four times (after the fourth the server's receives are up), the test;
// then keys and "done".
ForeignOutcome client_perftest(Ctx& x, int fd) {
  ForeignOutcome r;
  const std::uint32_t psn = initial_psn();
  const ForeignDest me = my_dest(x, psn);
  auto xchg = [&](std::string_view mine) {
    write_all(fd, mine);
    std::string got = read_exact(fd, mine.size());
    r.records.push_back(got.size());
    return got;
  };
  auto be32 = [](std::uint32_t v) {
    v = htonl(v);
    return std::string(reinterpret_cast<const char*>(&v), 4);
  };
  auto be64 = [](std::uint64_t v) {
    std::string b(8, '\0');
    for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = static_cast<char>(v >> (56 - 8 * i));
    return b;
  };
  std::string version(16, '\0');
  version.replace(0, 4, "6.06");  // the revision of the exchange we speak
  xchg(version);
  xchg(be32(4096));
  xchg(be32(64));
  const std::string their_mtu = xchg(perftest_mtu_record(x));
  if (!is_perftest_mtu_record(their_mtu)) die("the perftest server's path MTU record is malformed: not perftest 6.06");
  take_smaller_mtu(x, their_mtu);
  ForeignDest peer;
  if (!parse_perftest_record(xchg(perftest_record(me)), peer)) die("the perftest server's keys are malformed");
  Remote rem;
  rem.qpn = static_cast<std::uint32_t>(peer.qpn);
  rem.psn = static_cast<std::uint32_t>(peer.psn);
  rem.gid = peer.gid;
  rem.max_rd_atomic = static_cast<std::uint8_t>(std::min<std::uint64_t>(peer.out_reads, 16));
  x.remote_addr = peer.vaddr;
  x.remote_rkey = static_cast<std::uint32_t>(peer.rkey);
  x.slots = 1;  // the server's buffer holds two messages; every operation uses the first
  connect_qp(x, rem, psn);
  if (x.c.test == "send_lat") post_recvs(x, 16);
  const bool sends = x.c.test == "send_bw" || x.c.test == "send_lat";
  xchg(perftest_record(me));
  xchg(perftest_record(me));
  if (sends) xchg(perftest_record(me));  // the server has posted its receives
  if (x.c.test == "send_lat") r.o = run_lat(x, false, x.c.iters);
  else r.o = run_bw(x);
  if (!sends) xchg(perftest_record(me));
  if (!sends) {
    const double bytes = static_cast<double>(r.o.ops) * x.c.size;
    const double mbps = r.o.seconds > 0 ? bytes / r.o.seconds / (1 << 20) : 0;
    const double mpps = r.o.seconds > 0 ? static_cast<double>(r.o.ops) / r.o.seconds / 1e6 : 0;
    auto dbl = [&](double d) {
      std::uint64_t u;
      std::memcpy(&u, &d, 8);
      return be64(u);
    };
    xchg(be64(x.c.size));
    xchg(be64(r.o.ops));
    xchg(dbl(mbps));
    xchg(dbl(mbps));
    xchg(dbl(mpps));
  }
  xchg(perftest_record(me));
  write_all(fd, std::string_view("done", 5));
  return r;
}

// ibv_rc_pingpong: SENDs of --size bytes back and forth, --iters each way. The tool sends and
// receives in one buffer, so after its first message it echoes ours: we check every byte.
// With -c it zeroes each page's first byte before its first send and checks them at the end,
// so our pattern keeps those bytes zero.
ForeignOutcome run_pingpong(Ctx& x, int fd, bool is_server) {
  ForeignOutcome r;
  const std::uint32_t psn = initial_psn();
  const ForeignDest me = my_dest(x, psn);
  const std::uint32_t n = x.c.size;
  std::uint8_t* rx = x.buf.data();
  std::uint8_t* tx = x.buf.data() + n;
  for (std::uint32_t i = 0; i < n; i += 4096) tx[i] = 0;
  qp_to_init(x);
  for (std::uint64_t i = 0; i < 16; ++i) {
    Sge s = x.sge(0, n);
    RecvWr w{i, std::span<const Sge>(&s, 1)};
    must(x.qp->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
  }
  ForeignDest peer;
  if (is_server) {
    std::string m = read_exact(fd, kPingpongLen);
    if (!parse_pingpong_record(m, peer)) die("the peer's record is not ibv_rc_pingpong's lid:qpn:psn:gid");
  } else {
    write_all(fd, pingpong_record(me));
    std::string m = read_exact(fd, kPingpongLen);
    if (!parse_pingpong_record(m, peer)) die("the peer's record is not ibv_rc_pingpong's lid:qpn:psn:gid");
  }
  Remote rem;
  rem.qpn = static_cast<std::uint32_t>(peer.qpn);
  rem.psn = static_cast<std::uint32_t>(peer.psn);
  rem.gid = peer.gid;
  rem.max_rd_atomic = 1;
  rem.min_rnr_timer = 12;
  connect_qp(x, rem, psn);
  if (is_server) {
    write_all(fd, pingpong_record(me));
    read_exact(fd, 5);  // "done"
  } else {
    write_all(fd, std::string_view("done", 5));
  }
  r.records = {kPingpongLen};
  auto first_ok = [&] {  // the tool's own first message: 0x7b, page starts 0 with -c
    for (std::uint32_t i = 0; i < n; ++i)
      if (rx[i] != 0x7b && !(i % 4096 == 0 && rx[i] == 0)) return false;
    return true;
  };
  WorkCompletion wc[8];
  std::uint64_t sends_out = 0;
  auto send = [&](std::uint64_t i) {
    Sge s = x.sge(1, n);
    SendWr w;
    w.wr_id = i;
    w.opcode = WrOpcode::send;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span<const Sge>(&s, 1);
    must(x.qp->post_send(std::span<const SendWr>(&w, 1)), "post send");
    ++sends_out;
  };
  auto wait_recv = [&](std::uint64_t i) {
    auto deadline = SteadyClock::now() + std::chrono::seconds(30);
    for (;;) {
      std::size_t k = poll_some(x, wc, 8);
      bool got = false;
      for (std::size_t j = 0; j < k; ++j) {
        if (wc[j].opcode != WcOpcode::recv) {
          --sends_out;
          continue;
        }
        got = true;
        bool ok = wc[j].byte_len == n && ((is_server && i == 0) ? first_ok() : std::memcmp(rx, tx, n) == 0);
        if (!ok && r.verified) std::fprintf(stderr, "vrdma-perf: message %llu from the peer is not what we expect\n",
                                            static_cast<unsigned long long>(i));
        r.verified = r.verified && ok;
        Sge s = x.sge(0, n);
        RecvWr w{i + 16, std::span<const Sge>(&s, 1)};
        must(x.qp->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
      }
      if (got) return;
      if (SteadyClock::now() > deadline) die("timed out waiting for the peer's message " + std::to_string(i));
    }
  };
  auto start = SteadyClock::now();
  for (std::uint64_t i = 0; i < x.c.iters; ++i) {
    auto t0 = SteadyClock::now();
    if (is_server) {
      wait_recv(i);
      send(i);
    } else {
      send(i);
      wait_recv(i);
    }
    r.o.lat_us.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count() / 2);
  }
  // The tool destroys its QP as soon as its last exchange completes. If the ACK of our last SEND
  // is lost on the way back, its retransmissions reach no QP and it runs out of retries. By then
  // the tool has every message (as server: it received our last one; as client: it answered it,
  // which it does only after receiving it), all checked, so that one completion is no failure.
  // As client we also stay a while after the tool's last message: if our ACK of it is lost, the
  // tool's retransmissions (every ~67 ms: its timeout 14, 7 retries) must find our QP alive, or
  // the tool fails its last SEND.
  r.o.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  auto deadline = SteadyClock::now() + std::chrono::seconds(10);
  auto linger_until = SteadyClock::now() + (is_server ? std::chrono::milliseconds(0) : std::chrono::milliseconds(1000));
  while ((sends_out > 0 && SteadyClock::now() < deadline) || SteadyClock::now() < linger_until) {
    auto k = x.cq->poll(std::span<WorkCompletion>(wc, 8));
    if (!k) die("poll CQ: " + k.error().message);
    for (std::size_t j = 0; j < *k; ++j) {
      if (wc[j].opcode == WcOpcode::recv) continue;
      --sends_out;
      if (wc[j].status == WcStatus::success) continue;
      if (wc[j].status == WcStatus::retry_exc_err && wc[j].wr_id + 1 == x.c.iters) {
        r.last_ack_lost = true;
        continue;
      }
      die("work request " + std::to_string(wc[j].wr_id) + " failed: " + std::string(to_string(wc[j].status)));
    }
    if (*k == 0) {
      if (sends_out > 0) sched_yield(); else std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  r.o.ops = x.c.iters;
  return r;
}

// A soft engine's packet counters in the JSON ("engine"): what a case checks moved (and was lost).
void add_engine_stats(json& out, const nicdrv::Device& dev) {
  auto st = soft::stats(dev);
  if (!st) return;
  out["engine"] = {{"rx_dropped_icrc", st->rx_dropped_icrc}, {"rx_dropped_malformed", st->rx_dropped_malformed},
                   {"rx_longer_than_mtu", st->rx_longer_than_mtu}, {"retransmits", st->retransmits},
                   {"read_rereads", st->read_rereads}, {"tail_probes", st->tail_probes}, {"tx_packets", st->tx_packets}, {"rx_packets", st->rx_packets}};
}

int run_foreign(Config& c) {
  bool server = c.connect.empty();
  Ctx x;
  x.c = c;
  create_resources(x, server);
  UniqueFd oob = server ? oob_accept(c) : oob_connect(c);
  ForeignOutcome r;
  if (c.peer_format == "pingpong") {
    r = run_pingpong(x, oob.get(), server);
  } else if (server) {
    r = serve_perftest(x, oob.get());
  } else {
    r = client_perftest(x, oob.get());
  }
  json out = {{"test", c.peer_format == "pingpong" ? "pingpong" : c.test}, {"peer_format", c.peer_format},
              {"device", c.device}, {"role", server ? "server" : "client"}, {"size", c.size}, {"ops", r.o.ops},
              {"seconds", r.o.seconds}, {"records", r.records}};
  if (c.peer_format == "pingpong") out["verified"] = r.verified;
  if (r.last_ack_lost) out["last_ack_lost"] = true;
  if (!r.o.lat_us.empty()) {
    auto v = r.o.lat_us;
    std::sort(v.begin(), v.end());
    out["lat_us"] = {{"min", v.front()}, {"p50", v[v.size() / 2]}, {"max", v.back()}};
  }
  add_engine_stats(out, *x.dev);
  std::cout << out.dump() << std::endl;
  return r.verified ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"vrdma-perf: RDMA bandwidth and latency over any vrdma provider (soft:, verbs:, pv:)"};
  app.add_option("-d,--device", c.device, "device, e.g. soft:10.0.0.1")->required();
  app.add_option("-t,--test", c.test, "write_bw, read_bw, send_bw, atomic_bw, send_lat, write_lat")
      ->check(CLI::IsMember({"write_bw", "read_bw", "send_bw", "atomic_bw", "send_lat", "write_lat"}));
  app.add_option("-c,--connect", c.connect, "server's IPv4 address (client mode); without it, serve");
  app.add_option("-p,--port", c.port, "TCP port for the out-of-band exchange");
  app.add_option("-s,--size", c.size, "message size in bytes")->check(CLI::Range(1u, 1u << 30));
  app.add_option("-q,--depth", c.depth, "outstanding work requests")->check(CLI::Range(1u, 16384u));
  app.add_option("-n,--iters", c.iters, "iterations")->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  app.add_option("-D,--duration", c.duration, "run for this many seconds instead of --iters");
  app.add_option("-m,--mtu", c.mtu, "path MTU");
  app.add_flag("--json", c.json_out, "print one JSON object");
  app.add_flag("--verify", c.verify, "check data end to end (CRC-32 of the buffers)");
  app.add_option("--peer-format", c.peer_format,
                 "out-of-band format of the peer: vrdma (another vrdma-perf), perftest (ib_*_bw/lat), "
                 "pingpong (ibv_rc_pingpong), rping (rping -s/-c; connects through RDMA-CM, default port 7174)")
      ->check(CLI::IsMember({"vrdma", "perftest", "pingpong", "rping"}));
  app.add_option("--qp-timeout", c.qp_timeout,
                 "local ACK timeout exponent, 4.096 us x 2^n (default 14 = 67 ms; a slow peer such as a TCG guest needs more)")
      ->check(CLI::Range(1, 31));
  bool cm = false;
  app.add_flag("--cm", cm, "with --peer-format perftest: the peer runs with -R (RDMA-CM; server role only)");
  CLI11_PARSE(app, argc, argv);
  if (cm && c.peer_format == "perftest") {
    if (!c.connect.empty()) die("--cm: vrdma-perf serves perftest's -R (ib_send_bw -R <us>); it cannot be its client yet");
    vrdma::perf::CmRunConfig r;
    r.device = c.device;
    r.port = c.port;
    r.size = c.size;
    r.test = c.test;
    r.qp_timeout = c.qp_timeout;
    return vrdma::perf::run_perftest_cm_server(r);
  }
  if (c.peer_format == "rping") {
    vrdma::perf::CmRunConfig r;
    r.device = c.device;
    r.connect = c.connect;
    r.port = app.count("--port") != 0 ? c.port : std::uint16_t{7174};
    r.size = app.count("--size") != 0 ? c.size : 64u;  // rping's default
    r.iters = c.iters;
    r.qp_timeout = c.qp_timeout;
    return vrdma::perf::run_rping(r);
  }
  if (c.peer_format != "vrdma") return run_foreign(c);
  if (c.test == "atomic_bw") c.size = std::max<std::uint32_t>(c.size, 8);

  bool server = c.connect.empty();
  UniqueFd oob = server ? oob_accept(c) : oob_connect(c);
  Ctx x;
  x.c = c;
  setup(x, oob.get(), server);
  c.verify = x.c.verify;
  tms t0{};
  ::times(&t0);
  auto wall0 = SteadyClock::now();
  Outcome o;
  bool lat = c.test == "send_lat" || c.test == "write_lat";
  if (lat) {
    std::uint64_t iters = c.iters;
    if (!server && c.duration > 0) iters = 1u << 30;
    o = run_lat(x, server, iters);
  } else if (server) {
    if (c.test == "send_bw") o.ops = serve_send_bw(x, oob.get());
    else o.ops = recv_line(oob.get()).value("ops", 0ull);  // one-sided: wait for "done"
  } else {
    o = run_bw(x);
    send_line(oob.get(), {{"ops", o.ops}});
  }
  tms t1{};
  ::times(&t1);
  double cpu = static_cast<double>((t1.tms_utime - t0.tms_utime) + (t1.tms_stime - t0.tms_stime)) /
               static_cast<double>(::sysconf(_SC_CLK_TCK));
  double wall = std::chrono::duration<double>(SteadyClock::now() - wall0).count();

  // Verification: the side that was written to (or read from) reports its CRC.
  bool verified = true;
  if (c.verify && !lat) {
    // The bytes both sides compare: the client's slots that were used (it tells the server).
    std::size_t span = std::min<std::size_t>(x.slots, std::max<std::uint64_t>(o.ops, 1)) * c.size;
    if (c.test == "atomic_bw") span = 8;
    if (server) {
      span = std::min<std::size_t>(recv_line(oob.get()).value("span", std::size_t{0}), x.buf.size());
      send_line(oob.get(), {{"crc", crc(x.buf.data(), std::min(span, x.buf.size()))}});
      recv_line(oob.get());
    } else {
      send_line(oob.get(), {{"span", span}});
      json peer = recv_line(oob.get());
      std::uint32_t want = 0;
      if (c.test == "write_bw" || c.test == "send_bw") {
        want = crc(x.buf.data(), std::min(span, x.buf.size()));
        verified = peer["crc"].get<std::uint32_t>() == want;
      } else if (c.test == "read_bw") {
        std::vector<std::uint8_t> srv(x.buf.size());
        fill(srv, 2);
        verified = crc(srv.data(), std::min(span, srv.size())) == crc(x.buf.data(), std::min(span, x.buf.size()));
      } else {
        // atomic_bw: the server's first 8 bytes advanced by exactly the number of fetch-adds.
        std::vector<std::uint8_t> srv(x.buf.size());
        fill(srv, 2);
        std::uint64_t v0;
        std::memcpy(&v0, srv.data(), 8);
        v0 += o.ops;
        verified = peer["crc"].get<std::uint32_t>() == crc(reinterpret_cast<std::uint8_t*>(&v0), 8);
      }
      send_line(oob.get(), {{"ok", verified}});
    }
  }

  // A server prints its line for SEND and the latency tests (it counts those too), and with --json
  // always (its engine's counters: for READ, the responses it sent).
  if (!server || c.test == "send_bw" || lat || c.json_out) {
    json out = {{"test", c.test}, {"device", c.device}, {"role", server ? "server" : "client"}, {"size", c.size},
                {"depth", c.depth}, {"ops", o.ops}, {"seconds", o.seconds}, {"cpu_seconds", cpu}, {"wall_seconds", wall}};
    if (!lat && o.seconds > 0) {
      double bytes = static_cast<double>(o.ops) * (c.test == "atomic_bw" ? 8.0 : c.size);
      out["gbit_per_s"] = bytes * 8 / o.seconds / 1e9;
      out["mops_per_s"] = static_cast<double>(o.ops) / o.seconds / 1e6;
    }
    if (!o.lat_us.empty()) {
      auto v = o.lat_us;
      std::sort(v.begin(), v.end());
      double sum = 0;
      for (double d : v) sum += d;
      out["lat_us"] = {{"min", v.front()}, {"p50", v[v.size() / 2]}, {"p99", v[v.size() * 99 / 100]},
                       {"max", v.back()}, {"avg", sum / static_cast<double>(v.size())}};
    }
    if (c.verify) out["verified"] = verified;
    add_engine_stats(out, *x.dev);
    if (c.json_out) {
      std::cout << out.dump() << std::endl;
    } else {
      std::printf("%-10s %8u B  %10llu ops  %8.3f s", c.test.c_str(), c.size, static_cast<unsigned long long>(o.ops), o.seconds);
      if (out.contains("gbit_per_s")) std::printf("  %8.3f Gbit/s  %7.3f Mop/s", out["gbit_per_s"].get<double>(), out["mops_per_s"].get<double>());
      if (out.contains("lat_us")) std::printf("  lat avg %.2f us p50 %.2f p99 %.2f", out["lat_us"]["avg"].get<double>(), out["lat_us"]["p50"].get<double>(), out["lat_us"]["p99"].get<double>());
      if (c.verify) std::printf("  data %s", verified ? "verified" : "MISMATCH");
      std::printf("\n");
    }
  }
  return verified ? 0 : 2;
}
