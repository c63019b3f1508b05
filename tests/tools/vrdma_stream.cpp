// vrdma-stream: one side of the checked RC stream (tests/lib/rdma_stream.hpp) against a peer in
// another process or machine, over any nicdrv provider: what a VM runs while it migrates.
//
//   vrdma-stream -d DEVICE [-c SERVER_IP] [-p PORT] [-n MESSAGES] [--limit SECONDS] [--progress]
//                [--end-file PATH [--end-after N]]
//
// The server (no -c) is side 1, the client side 0 (it also writes). The sides exchange QPN,
// GID, PSN and buffer over one TCP connection (one JSON line each way), then stream; at the end
// each side prints one JSON line (messages, the longest pause between completions, ok) and
// exits 0 only when every message went and came exactly once, in order, with the right bytes.
// With --progress it prints a line every 100 messages received (what a test watches to know the
// stream runs). Every wait is bounded (--limit). With --end-file the server ends the stream early
// (what a test does once it has seen what it waited for): when the file appears, both sides stop
// at the same count, --end-after messages past the further side, and report that count.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "rdma_stream.hpp"
#include "vrdma/common/cli.hpp"
#include "vrdma/common/fd.hpp"
#include "vrdma/nicdrv/registry.hpp"

using namespace vrdma;
using namespace vrdma::test;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "vrdma-stream: %s\n", why.c_str());
  std::exit(1);
}

UniqueFd oob(const std::string& connect, std::uint16_t port, int limit_s) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (!connect.empty()) {
    if (::inet_pton(AF_INET, connect.c_str(), &a.sin_addr) != 1) die("-c needs an IPv4 address");
    const auto deadline = Clock::now() + std::chrono::seconds(limit_s);
    while (Clock::now() < deadline) {
      UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    die("cannot reach the server at " + connect + ":" + std::to_string(port) + " (is it running?)");
  }
  UniqueFd l(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int one = 1;
  ::setsockopt(l.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l.get(), 1) != 0)
    die("cannot listen on TCP port " + std::to_string(port));
  UniqueFd s(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!s) die("accept failed");
  return s;
}

void send_line(int fd, const nlohmann::json& j) {
  const auto s = j.dump() + "\n";
  if (::send(fd, s.data(), s.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(s.size())) die("the peer went away");
}

// The out-of-band connection's lines, read whole or not at all: the client looks for an "end"
// line between steps without blocking, and every other read waits for a whole line.
class Lines {
 public:
  explicit Lines(int fd) : fd_(fd) {}
  // The next line; with `wait` false, nullopt when no whole line has arrived yet.
  std::optional<nlohmann::json> next(bool wait) {
    for (;;) {
      if (const auto nl = buf_.find('\n'); nl != std::string::npos) {
        auto j = nlohmann::json::parse(buf_.substr(0, nl), nullptr, false);
        buf_.erase(0, nl + 1);
        if (j.is_discarded() || !j.is_object()) die("the peer sent something that is not a JSON object");
        return j;
      }
      if (buf_.size() > 4096) die("the peer sent a line of over 4096 bytes");
      char c[512];
      const ssize_t n = ::recv(fd_, c, sizeof c, wait ? 0 : MSG_DONTWAIT);
      if (n < 0 && !wait && (errno == EAGAIN || errno == EWOULDBLOCK)) return std::nullopt;
      if (n <= 0) die("the peer closed the out-of-band connection");
      buf_.append(c, static_cast<std::size_t>(n));
    }
  }
  nlohmann::json wait() { return *next(true); }

 private:
  int fd_;
  std::string buf_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vrdma-stream: a checked RC stream against a peer, over any provider", "vrdma-stream"};
  vrdma::cli::prepare(app);
  std::string device, connect;
  std::uint16_t port = 18700;
  std::size_t msgs = 2000;
  int limit = 300;
  bool progress = false;
  std::string end_file;
  std::size_t end_after = 1000;
  app.add_option("-d,--device", device, "device, e.g. soft:10.0.0.1 or pv:pci:auto")->required();
  app.add_option("-c,--connect", connect, "the server's IPv4 address (client mode); without it, serve");
  app.add_option("-p,--port", port, "TCP port of the out-of-band exchange")->capture_default_str();
  app.add_option("-n,--messages", msgs, "messages each way")->capture_default_str()->check(CLI::Range(1, 100000000));
  app.add_option("--limit", limit, "give up after this many seconds")->capture_default_str()->check(CLI::Range(1, 86400));
  app.add_flag("--progress", progress, "a line every 100 messages received");
  app.add_option("--end-file", end_file,
                 "server: once this file exists, end the stream --end-after messages later (both sides agree on the "
                 "number over the out-of-band connection)");
  app.add_option("--end-after", end_after, "messages each way after --end-file appears")
      ->capture_default_str()
      ->check(CLI::Range(200, 1000000));
  if (auto rc = vrdma::cli::parse(app, argc, argv)) return *rc;
  if (!end_file.empty() && !connect.empty()) {
    std::fprintf(stderr, "vrdma-stream: --end-file is for the server (without -c): the server decides the end\n");
    return 2;
  }

  auto dev = nicdrv::open_device(device);
  if (!dev) die("cannot open " + device + ": " + dev.error().message);
  PairOptions o;
  o.buf_bytes = StreamSide::kBufBytes;
  // ~1.07 s local ACK timeout, 7 retries: the peer waits out a pause of ~8.6 s, as Linux's rdma_cm
  // default (18) does. A TCG guest moved by libvirt on a loaded 2-core machine paused its traffic
  // for 0.5-2.1 s; the VM migration tests then hold the destination paused for another 1-4 s
  // while they compare its memory with the source's (docs/migration.md "Guest memory after a
  // move"), which ran out the ~4.3 s of timeout 17.
  o.timeout = 18;
  auto ep = make_endpoint(*dev, o);
  if (!ep) die("cannot set up the endpoint: " + ep.error().message);
  const bool server = connect.empty();
  const std::uint32_t my_psn = server ? o.psn_b : o.psn_a;
  UniqueFd s = oob(connect, port, limit);
  int one = 1;
  ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  send_line(s.get(), {{"qpn", ep->qp->qp_num()}, {"gid", ep->gid.str()}, {"psn", my_psn}, {"addr", ep->mr->addr()},
                      {"rkey", ep->mr->rkey()}, {"messages", msgs}});
  Lines lines(s.get());
  auto peer = lines.wait();
  nicdrv::Gid gid;
  if (::inet_pton(AF_INET6, peer.value("gid", std::string()).c_str(), gid.raw.data()) != 1)
    die("the peer's GID does not parse");
  if (peer.value("messages", std::size_t{0}) != msgs) die("the peer streams another number of messages");
  PeerInfo pi{peer.value("qpn", 0u), gid, peer.value("psn", 0u)};
  if (auto st = connect_to(*ep, pi, my_psn, o); !st.ok()) die("cannot connect the QP: " + st.error().message);
  StreamSide side(*ep, server ? 1 : 0, msgs, peer.value("addr", std::uint64_t{0}), peer.value("rkey", 0u));
  if (auto st = side.start(); !st.ok()) die(st.error().message);
  send_line(s.get(), {{"ready", true}});  // both have their receives posted before anything is sent
  lines.wait();

  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::seconds(limit);
  std::size_t reported = 0;
  std::string error;
  // The end on demand: the server, once --end-file exists, ends both sides at the same count a
  // little ahead of what either has done (the client is at most its window plus the receives
  // not yet polled ahead of what the server received) and says it over the out-of-band connection.
  auto next_look = t0;
  bool ending = false;
  while (!side.done() && Clock::now() < deadline) {
    if (auto st = side.step(); !st.ok()) {
      error = st.error().message;
      break;
    }
    if (progress && side.received() >= reported + 100) {
      reported = side.received() / 100 * 100;
      std::printf("progress %zu\n", reported);
      std::fflush(stdout);
    }
    if (ending || Clock::now() < next_look) continue;
    next_look = Clock::now() + std::chrono::milliseconds(100);
    if (server && !end_file.empty()) {
      struct stat st{};
      if (::stat(end_file.c_str(), &st) != 0) continue;
      const std::size_t n = std::min(side.msgs(), std::max(side.sent(), side.received()) + end_after);
      if (!side.end_at(n)) die("cannot end the stream at " + std::to_string(n));
      send_line(s.get(), {{"end", n}});
      ending = true;
    } else if (!server) {
      const auto j = lines.next(false);
      if (!j) continue;
      const std::size_t n = j->value("end", std::size_t{0});
      if (!side.end_at(n)) {
        error = "the server ended the stream at " + std::to_string(n) + " messages, but this side had sent " +
                std::to_string(side.sent()) + " and received " + std::to_string(side.received());
        break;
      }
      ending = true;
    }
  }
  if (error.empty() && !side.done())
    error = "the stream did not finish within " + std::to_string(limit) + " s: sent " + std::to_string(side.sent()) +
            ", completed " + std::to_string(side.send_done()) + ", received " + std::to_string(side.received());
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  // Tell the peer we are done, and wait until it is: our QP keeps answering its retransmissions.
  if (error.empty()) {
    send_line(s.get(), {{"done", true}});
    // A client that finished all its messages before the server's "end" came reads it here.
    while (lines.wait().contains("end")) {
    }
  }
  nlohmann::json out{{"device", device}, {"role", server ? "server" : "client"}, {"messages", side.msgs()},
                     {"sent", side.send_done()}, {"received", side.received()}, {"seconds", secs},
                     {"longest_gap_ms", side.longest_gap_ms()}, {"ok", error.empty()}};
  if (!error.empty()) out["error"] = error;
  std::printf("%s\n", out.dump().c_str());
  return error.empty() ? 0 : 1;
}
