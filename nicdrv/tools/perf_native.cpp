// vrdma-perf against another vrdma-perf: the two sides exchange QPN, PSN, GID, rkey and buffer
// address as one JSON line over a TCP connection (default port 18515), run the test, and with
// --verify compare CRC-32s of the buffers.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/times.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>

#include "perf.hpp"
#include "vrdma/common/fd.hpp"

namespace vrdma::perf {
namespace {

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

void post_ready_recvs(Ctx& x, bool is_server) {
  // Receives go up before "ready" so the first SEND never meets an empty receive queue.
  if (x.c.test == "send_lat") post_recvs(x, std::min<std::uint64_t>(x.c.depth, 16));
  else if (is_server) post_recvs(x, x.c.depth);
}

// The exchange, on resources already created (create_resources).
void setup(Ctx& x, int oob, bool is_server) {
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

// Server side of send_bw: receive until the client says it is done.
std::uint64_t serve_send_bw(Ctx& x, int oob) {
  // As many receives as the client keeps sends in flight were posted before "ready".
  std::uint64_t got = 0, next_wr = x.c.depth;
  WorkCompletion wc[64];
  std::uint64_t expected = UINT64_MAX;
  ::fcntl(oob, F_SETFL, O_NONBLOCK);
  std::string pending;
  Watchdog progress{std::chrono::seconds(kStallSeconds)};
  while (got < expected) {
    std::size_t n = poll_some(x, wc, 64);
    if (n > 0) progress.moved();
    else check_stall(progress, next_wr, got, "receive");
    for (std::size_t i = 0; i < n; ++i) {
      if (wc[i].opcode != WcOpcode::recv) continue;
      ++got;
      // Receives complete in order: receive k holds message k, which the client sent from
      // slot k % slots; keep the same mapping so the buffers compare equal.
      Sge s = x.recv_sge(next_wr % x.slots);
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

}  // namespace

int run_native(Config c) {
  if (c.test == "atomic_bw") c.size = std::max<std::uint32_t>(c.size, 8);

  bool server = c.connect.empty();
  Ctx x;
  x.c = c;
  create_resources(x, server);  // before waiting: a device that cannot open fails at once
  UniqueFd oob = server ? oob_accept(c) : oob_connect(c);
  setup(x, oob.get(), server);
  c.verify = x.c.verify;
  tms t0{};
  ::times(&t0);
  auto wall0 = SteadyClock::now();
  Outcome o;
  bool lat = c.test == "send_lat" || c.test == "write_lat";  // both sides send
  if (c.test == "atomic_bw") {  // the server's first 8 bytes before the first atomic (its fill pattern)
    std::array<std::uint8_t, 8> head{};
    fill(head, 2);
    std::memcpy(&x.atomic_base, head.data(), head.size());
  }
  if (lat) {
    std::uint64_t iters = c.iters;
    if (!server && c.duration > 0) iters = 1u << 30;
    o = run_lat(x, server, iters);  // our own format: the server answers
  } else if (server) {
    if (c.test == "send_bw") o.ops = serve_send_bw(x, oob.get());
    else o.ops = recv_line(oob.get()).value("ops", 0ull);  // one-sided: wait for "done"
  } else {
    o = c.test == "read_lat" ? run_read_lat(x) : run_bw(x);
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
      } else if (c.test == "read_bw" || c.test == "read_lat") {
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
    if (!lat && c.test != "read_lat" && o.seconds > 0) {
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

}  // namespace vrdma::perf
