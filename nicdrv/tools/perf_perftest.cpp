// vrdma-perf as perftest's peer (ib_write_bw, ib_read_bw, ib_send_bw, ib_send_lat ... over its TCP
// exchange), in both roles.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <iostream>

#include "perf_foreign.hpp"
#include "vrdma/nicdrv/soft.hpp"

namespace vrdma::perf {
namespace {

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

}  // namespace

// perftest client (ib_write_bw, ib_read_bw, ib_send_bw, ib_send_lat ... <our address>) against
// us as the server: keys on every 108-byte record, the client's own record back for the rest,
// our path MTU for its MTU record (the smaller one is taken).
ForeignOutcome serve_perftest(Ctx& x, int fd) {
  ForeignOutcome r;
  int keys = 0;  // rounds of key records (a round names each of the client's QPs once)
  bool receiving = false;
  std::uint64_t next_wr = 0;
  WorkCompletion wc[64];
  // perftest -q N: the client's QPs in the order its records name them, and ours answering them
  // (qps[0] is x.qp). Each gets its own QP here, connected when the client first names it.
  std::vector<std::uint64_t> peer_qpns;
  std::vector<std::shared_ptr<QueuePair>> qps;
  std::vector<std::uint32_t> psns;
  auto qp_of = [&](std::uint32_t qpn) -> QueuePair& {
    for (auto& q : qps)
      if (q->qp_num() == qpn) return *q;
    die("a completion for QP " + std::to_string(qpn) + ", which is none of ours");
  };
  auto post_recv = [&](QueuePair& q, std::size_t slot) {
    Sge s = x.recv_sge(slot);
    RecvWr w{next_wr++, std::span<const Sge>(&s, 1)};
    must(q.post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
  };
  // While the client runs: keep receives posted (send_bw) and answer each message (send_lat,
  // whose client may still exchange records after its QP is ready, so the echo runs here).
  const bool echo = x.c.test == "send_lat";
  auto service = [&] {
    if (!receiving) return;
    std::size_t n = poll_some(x, wc, 64);
    for (std::size_t i = 0; i < n; ++i) {
      if (wc[i].opcode != WcOpcode::recv) continue;
      ++r.o.ops;
      post_recv(qp_of(wc[i].qp_num), echo ? 0 : next_wr % x.slots);
      if (!echo) continue;
      Sge out = x.sge(1, x.c.size);
      SendWr sw;
      sw.wr_id = r.o.ops;
      sw.opcode = WrOpcode::send;
      sw.flags = SendFlags::signaled;
      sw.sg_list = std::span<const Sge>(&out, 1);
      x.address(sw);
      must(x.qp->post_send(std::span<const SendWr>(&sw, 1)), "post send");
    }
  };
  // The packets our engine moved (soft): a WRITE or READ test moves them with no completion here.
  auto wire_packets = [&]() -> std::uint64_t {
    auto st = soft::stats(*x.dev);
    return st ? st->rx_packets + st->tx_packets : 0;
  };
  auto start = SteadyClock::now();
  for (int rounds = 0; rounds < 64 * 16; ++rounds) {
    std::string m = read_record(fd, service, wire_packets);
    if (m.empty()) break;
    r.records.push_back(m.size());
    if (m == std::string_view("done", 5)) break;
    ForeignDest peer;
    if (keys == 0 && peer_qpns.empty() && is_perftest_mtu_record(m)) {  // each side takes the smaller (check_mtu)
      write_all(fd, perftest_mtu_record(x));
      take_smaller_mtu(x, m);
      continue;
    }
    if (!parse_perftest_record(m, peer)) {
      write_all(fd, m);
      continue;
    }
    std::size_t q = std::find(peer_qpns.begin(), peer_qpns.end(), peer.qpn) - peer_qpns.begin();
    if (q == peer_qpns.size()) {  // a QP of the client's not seen before: ours for it
      const bool one_qp_only = x.c.bidirectional || x.c.connection == "UD" || x.c.test == "send_lat" ||
                               x.c.test == "write_lat" || x.c.test == "read_lat" || x.c.test == "atomic_bw";
      if (q > 0 && one_qp_only)
        die("the perftest client runs more than one QP (-q N: its records name QPN " + std::to_string(peer_qpns[0]) +
            " and " + std::to_string(peer.qpn) + "); vrdma-perf serves -q N for write_bw, read_bw and send_bw over "
            "RC: run this test with -q 1");
      if (q >= 64) die("the perftest client names more than 64 QPs: vrdma-perf serves at most 64 (-q 64)");
      peer_qpns.push_back(peer.qpn);
      qps.push_back(q == 0 ? x.qp : new_qp(x));
      psns.push_back((initial_psn() + 7919u * static_cast<std::uint32_t>(q)) & 0xffffff);
      Remote rem;
      rem.qpn = static_cast<std::uint32_t>(peer.qpn);
      rem.psn = static_cast<std::uint32_t>(peer.psn);
      rem.gid = peer.gid;
      rem.max_rd_atomic = static_cast<std::uint8_t>(std::min<std::uint64_t>(peer.out_reads, 16));
      if (q == 0) {
        x.remote_addr = peer.vaddr;
        x.remote_rkey = static_cast<std::uint32_t>(peer.rkey);
      }
      connect_qp(x, *qps[q], rem, psns[q]);
      if (x.c.test == "send_bw" || x.c.test == "send_lat") {
        const std::size_t n = x.c.test == "send_bw" ? x.c.depth : 16;
        for (std::size_t k = 0; k < n; ++k) post_recv(*qps[q], x.c.test == "send_bw" ? next_wr % x.slots : 0);
        receiving = true;
      }
    }
    if (q == 0) ++keys;  // a round starts with the record of the client's first QP
    ForeignDest me = my_dest(x, psns[q]);
    me.qpn = qps[q]->qp_num();
    write_all(fd, perftest_record(me));
    if (q != 0) continue;
    // The client's test runs between its third and fourth key record (WRITE/READ) or its fourth
    // and fifth (SEND, whose server posts its receives in between): see client_perftest.
    // write_lat and read_lat run theirs after the fourth, with no record after write_lat's:
    // perftest's write_lat server writes first (run_iter_lat_write), so as its server we do.
    const bool lat4 = x.c.test == "write_lat" || x.c.test == "read_lat";
    const int test_key = x.c.test == "send_bw" || x.c.test == "send_lat" || lat4 ? 4 : 3;
    if (keys == test_key) start = SteadyClock::now();
    if (keys == test_key && x.c.bidirectional) {  // perftest -b: its server writes (reads) as its client does
      x.slots = 1;  // the client's buffer past the address it gave holds one message
      r.o = run_bw(x);
      continue;
    }
    if (keys == test_key && x.c.test == "write_lat") {
      r.o = run_lat(x, /*waits_first=*/false, x.c.iters);
      continue;
    }
    if (keys == test_key + 1) r.o.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  }
  if (keys < 3) die("the perftest client stopped after " + std::to_string(keys) + " key exchanges (want at least 3)");
  // Messages that completed after the client's last record: count them too (until 200 ms pass
  // without one).
  for (auto quiet = SteadyClock::now() + std::chrono::milliseconds(200); receiving && SteadyClock::now() < quiet;) {
    const auto before = r.o.ops;
    service();
    if (r.o.ops != before) quiet = SteadyClock::now() + std::chrono::milliseconds(200);
  }
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
  const bool lat4 = x.c.test == "write_lat" || x.c.test == "read_lat";
  auto keys = [&] {  // every later key record must name the QP the first named (one QP: -q 1)
    ForeignDest again;
    if (!parse_perftest_record(xchg(perftest_record(me)), again)) die("the perftest server's keys are malformed");
    if (again.qpn != peer.qpn)
      die("the perftest server runs more than one QP (-q N: its key records name QPN " + std::to_string(peer.qpn) +
          " and " + std::to_string(again.qpn) + "); vrdma-perf runs one QP per test: start it with -q 1");
  };
  keys();
  keys();
  if (sends || lat4) keys();  // SEND: the server has posted its receives; lat: perftest's extra round
  if (x.c.test == "send_lat") {
    r.o = run_lat(x, false, x.c.iters);
  } else if (x.c.test == "write_lat") {
    r.o = run_lat(x, /*waits_first=*/true, x.c.iters);  // perftest's server writes first
    return r;  // write_lat exchanges nothing after its test
  } else if (x.c.test == "read_lat") {
    r.o = run_read_lat(x);
  } else if (x.c.all_sizes) {  // perftest -a: each size 2^1 .. 2^23 in turn, --iters each, no record between
    for (std::uint32_t shift = 1; shift <= 23; ++shift) {
      x.c.size = 1u << shift;
      const Outcome one = run_bw(x);
      r.o.ops += one.ops;
      r.o.seconds += one.seconds;
    }
  } else {
    r.o = run_bw(x);
  }
  if (!sends && !lat4) keys();
  if (!sends && !lat4) {
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
  keys();
  write_all(fd, std::string_view("done", 5));
  return r;
}

}  // namespace vrdma::perf
