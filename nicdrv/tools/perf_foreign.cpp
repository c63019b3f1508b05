// The records of perftest and ibv_rc_pingpong, the out-of-band I/O they share, and the run of a
// test against either tool.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <iostream>

#include "perf_foreign.hpp"
#include "vrdma/common/fd.hpp"
#include "vrdma/nicdrv/soft.hpp"

namespace vrdma::perf {

namespace {

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

}  // namespace

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
bool wait_readable(int fd, int ms, const std::function<void()>& idle) {
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
std::string read_record(int fd, const std::function<void()>& idle, const std::function<std::uint64_t()>& progress) {
  // A test runs between two records (perftest -D for as long as it was asked): silence on the
  // out-of-band connection is the peer gone only when the wire is silent too.
  for (;;) {
    const std::uint64_t before = progress ? progress() : 0;
    if (wait_readable(fd, kForeignTimeoutMs, idle)) break;
    if (!progress || progress() == before)
      die("the peer sent nothing on the out-of-band connection, and our engine no packet, for 120 s");
  }
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

int run_foreign(Config& c) {
  bool server = c.connect.empty();
  Ctx x;
  x.c = c;
  create_resources(x, server);
  UniqueFd oob = server ? oob_accept(c) : oob_connect(c);
  ForeignOutcome r;
  if (c.peer_format == "pingpong" && c.srq) {
    r = run_srq_pingpong(x, oob.get(), server);
  } else if (c.peer_format == "pingpong") {
    r = run_pingpong(x, oob.get(), server);
  } else if (server) {
    r = serve_perftest(x, oob.get());
  } else {
    r = client_perftest(x, oob.get());
  }
  // A peer whose QP is UC or UD (perftest -c UC / -c UD) sends packets our RC QP cannot take: they
  // are dropped as malformed and nothing is answered. Say so rather than report an empty run.
  if (const auto st = soft::stats(*x.dev); st && st->rx_dropped_malformed > 0 && st->tx_packets == 0 && r.o.ops == 0)
    die("the peer sent " + std::to_string(st->rx_dropped_malformed) +
        " packets our RC QP cannot take and nothing was answered: is it running UC or UD (perftest -c UC / -c UD)? "
        "vrdma-perf runs RC only");
  json out = {{"test", c.peer_format == "pingpong" ? (c.srq ? "srq_pingpong" : c.connection == "UD" ? "ud_pingpong" : "pingpong") : c.test}, {"peer_format", c.peer_format},
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

}  // namespace vrdma::perf
