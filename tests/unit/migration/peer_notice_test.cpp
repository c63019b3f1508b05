// Peer notices between backends (vrdma/migration/peer_notice.hpp): the bytes as documented (network
// byte order), every malformed message refused with a reason, and one exchange over loopback
// TCP, including a backend that is not there and one that never answers.
#define BOOST_TEST_MODULE migration_peer_notice
#include <boost/test/unit_test.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "vrdma/common/fd.hpp"
#include "vrdma/vhost/event_loop.hpp"
#include "vrdma/migration/peer_notice.hpp"

using namespace vrdma;
using namespace vrdma::migration::notice;
using namespace std::chrono_literals;

namespace {

Message sample() {
  Message m;
  m.kind = Kind::repoint;
  m.peer_qpn = 0x11;
  m.mover_qpn = 0x1a2b3c;
  m.mover_gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 2};
  m.token = 0x0102030405060708ull;
  m.sq_psn = 0xabcdef;
  m.rq_psn = 0x123456;
  m.rkeys = {{0x100, 0x200}, {0x101, 0x201}};
  return m;
}

std::uint32_t be32_at(const std::vector<std::uint8_t>& b, std::size_t off) {
  std::uint32_t v = 0;
  std::memcpy(&v, b.data() + off, 4);
  return ntohl(v);
}

std::uint32_t loopback() { return htonl(INADDR_LOOPBACK); }
Address lo() { return ipv4_address(loopback()); }

// A listening socket on 127.0.0.1 at a port of the kernel's choosing.
UniqueFd listener(std::uint16_t& port, int backlog = 4) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  BOOST_REQUIRE(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = loopback();
  BOOST_REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  BOOST_REQUIRE(::listen(fd.get(), backlog) == 0);
  socklen_t len = sizeof a;
  BOOST_REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
  port = ntohs(a.sin_port);
  return fd;
}

// A server's handler that records who sent the notice and answers `kind` for its QP, with `token`.
Server::Handler answering(Kind kind, Address& seen_from, std::uint64_t token = 0) {
  return [kind, &seen_from, token](const Message& m, const Address& from) {
    seen_from = from;
    Message a;
    a.kind = kind;
    a.peer_qpn = m.peer_qpn;
    a.token = token;
    return a;
  };
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_bytes_are_the_documented_ones_and_come_back_the_same) {
  auto m = sample();
  m.reason = "why";
  const auto b = encode(m);
  BOOST_TEST(be32_at(b, 0) == 0x5652504eu);  // "VRPN"
  BOOST_TEST(b[4] == 1);                     // version
  BOOST_TEST(b[5] == 3);                     // REPOINT
  BOOST_TEST(be32_at(b, 6) == b.size() - kHeaderLen);
  BOOST_TEST(be32_at(b, 10) == 0x11u);
  BOOST_TEST(be32_at(b, 14) == 0x1a2b3cu);
  BOOST_TEST(b[30 + 3] == 2);                // the GID's last byte
  BOOST_TEST(be32_at(b, 34) == 0x01020304u);  // the token's high half
  BOOST_TEST(be32_at(b, 50) == 2u);           // rkey pairs
  BOOST_TEST(be32_at(b, 54) == 0x100u);
  auto back = decode(b);
  BOOST_REQUIRE(back.ok());
  BOOST_TEST((*back == m));
  for (auto k : {Kind::pause, Kind::paused, Kind::repointed, Kind::release, Kind::released, Kind::refused}) {
    Message o;
    o.kind = k;
    auto r = decode(encode(o));
    BOOST_REQUIRE(r.ok());
    BOOST_TEST((r->kind == k));
  }
}

BOOST_AUTO_TEST_CASE(malformed_messages_are_refused_with_a_reason) {
  const auto good = encode(sample());
  auto refused = [](std::vector<std::uint8_t> b, const std::string& what) {
    auto r = decode(b);
    BOOST_TEST(!r.ok(), what << " was accepted");
    if (!r.ok()) BOOST_TEST_MESSAGE(what << ": " << r.error().message);
    if (!r.ok()) BOOST_TEST(r.error().message.rfind("peer notice: ", 0) == 0u);
  };
  auto b = good;
  b[0] ^= 1;
  refused(b, "bad magic");
  b = good;
  b[4] = 2;
  refused(b, "version 2");
  for (int k : {0, 8, 255}) {
    b = good;
    b[5] = static_cast<std::uint8_t>(k);
    refused(b, "kind " + std::to_string(k));
  }
  b = good;
  b.pop_back();
  refused(b, "one byte short");
  b = good;
  b.push_back(0);
  refused(b, "one byte more");
  b = good;
  b[10] = 1;  // peer QPN 0x01000011
  refused(b, "a 25-bit QPN");
  b = good;
  b[38 + 4] = 0xff;  // sq_psn's high byte
  refused(b, "a 25-bit PSN");
  b = good;
  b[50] = 0xff;  // rkey count far beyond the bytes there
  refused(b, "more rkeys than bytes");
  auto m = sample();
  m.reason = std::string("line\nbreak");
  refused(encode(m), "a reason with a control character");
  refused({}, "nothing");
  refused(std::vector<std::uint8_t>(good.begin(), good.begin() + kHeaderLen), "a header alone");
  // The header says how long the body is, within a bound.
  auto h = std::vector<std::uint8_t>(good.begin(), good.begin() + kHeaderLen);
  h[6] = 0x7f;
  BOOST_TEST(!body_length(h).ok());
  BOOST_TEST(body_length(std::vector<std::uint8_t>(good.begin(), good.begin() + kHeaderLen)).ok());
}

BOOST_AUTO_TEST_CASE(the_fuzzer_seeds_are_messages) {
  const std::filesystem::path dir = std::filesystem::path(VRDMA_SOURCE_DIR) / "tests/fuzz/migration/corpus/peer_notice_fuzzer";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    std::vector<std::uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    BOOST_TEST(decode(b).ok(), e.path().filename().string() << " does not decode");
    ++n;
  }
  BOOST_TEST(n >= 3);
}

BOOST_AUTO_TEST_CASE(an_exchange_over_tcp_carries_the_request_and_the_answer) {
  std::uint16_t port = 0;
  auto l = listener(port);
  Message seen;
  std::uint32_t seen_from = 0;
  std::thread server([&] {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    UniqueFd c(::accept(l.get(), reinterpret_cast<sockaddr*>(&from), &len));
    if (!c) return;
    seen_from = from.sin_addr.s_addr;
    auto m = read_message(c.get(), 2000ms);
    if (!m) return;
    seen = *m;
    Message a;
    a.kind = Kind::repointed;
    a.peer_qpn = 0x22;
    a.token = m->token;
    (void)write_message(c.get(), a, 2000ms);
  });
  auto ans = exchange(lo(), lo(), port, sample(), 3000ms);
  server.join();
  BOOST_REQUIRE_MESSAGE(ans.ok(), (ans.ok() ? std::string() : ans.error().message));
  BOOST_TEST((seen == sample()));
  BOOST_TEST(seen_from == loopback());
  BOOST_TEST((ans->kind == Kind::repointed));
  BOOST_TEST(ans->peer_qpn == 0x22u);
  BOOST_TEST(ans->token == sample().token);
}

BOOST_AUTO_TEST_CASE(no_backend_there_or_one_that_never_answers_is_an_error_in_time) {
  std::uint16_t port = 0;
  {
    auto gone = listener(port);  // closed again: nobody listens on that port
  }
  auto r = exchange(Address{}, lo(), port, sample(), 1000ms);
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST(r.error().message.find("127.0.0.1:" + std::to_string(port)) != std::string::npos, r.error().message);
  // Accepted (by the kernel's backlog) but never answered: the bound holds.
  auto silent = listener(port);
  const auto t0 = std::chrono::steady_clock::now();
  r = exchange(Address{}, lo(), port, sample(), 300ms);
  const auto took = std::chrono::steady_clock::now() - t0;
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST(r.error().is(Errc::timeout), r.error().message);
  BOOST_TEST(took < 2s);
}

// The listening side keeps the event loop free: a connection that sends nothing does not hold
// up the next one, is closed after the read timeout, and junk is refused with the reason; a
// second listener on a taken port is told so.
BOOST_AUTO_TEST_CASE(the_server_answers_without_blocking_on_a_silent_connection) {
  auto loop = vrdma::vhost::EventLoop::create();
  BOOST_REQUIRE(loop.ok());
  Address seen_from{};
  Server srv(*loop, answering(Kind::repointed, seen_from), 2000ms);
  std::uint16_t port = 0;
  {
    auto probe = listener(port);  // a free port: taken and given back
  }
  auto l = srv.listen(lo(), port);
  BOOST_REQUIRE(l.ok());
  BOOST_TEST(*l);
  BOOST_TEST(srv.listening());
  Server other(*loop, [](const Message&, const Address&) { return Message{}; });
  auto busy = other.listen(lo(), port);
  BOOST_REQUIRE(busy.ok());
  BOOST_TEST(!*busy, "a second listener on a taken port");
  std::thread t([&] { (void)loop->run(); });
  auto connect_raw = [&] {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = loopback();
    BOOST_REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    return fd;
  };
  auto silent = connect_raw();
  const auto t0 = std::chrono::steady_clock::now();
  auto ans = exchange(lo(), lo(), port, sample(), 2000ms);
  const auto took = std::chrono::steady_clock::now() - t0;
  BOOST_REQUIRE_MESSAGE(ans.ok(), (ans.ok() ? std::string() : ans.error().message));
  BOOST_TEST((ans->kind == Kind::repointed));
  BOOST_TEST(ans->peer_qpn == sample().peer_qpn);
  // A server that read one connection at a time would answer only after the silent one's 2 s.
  BOOST_TEST((took < 1500ms), "the answer waited for the silent connection");
  auto junk = connect_raw();
  const char bytes[] = "GET / HTTP/1.0\r\n\r\n";
  BOOST_REQUIRE(::send(junk.get(), bytes, sizeof bytes - 1, MSG_NOSIGNAL) > 0);
  auto refused = read_message(junk.get(), 2000ms);
  BOOST_REQUIRE_MESSAGE(refused.ok(), (refused.ok() ? std::string() : refused.error().message));
  BOOST_TEST((refused->kind == Kind::refused));
  BOOST_TEST(refused->reason.find("magic") != std::string::npos, refused->reason);
  // The silent one is closed by the server after its read timeout.
  timeval tv{5, 0};
  ::setsockopt(silent.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c;
  BOOST_TEST(::recv(silent.get(), &c, 1, 0) == 0, "the silent connection was not closed");
  BOOST_TEST((std::chrono::steady_clock::now() - t0 < 4500ms));
  loop->stop();
  t.join();
  BOOST_TEST((seen_from == lo()));
  BOOST_TEST(srv.malformed() == 2u);  // the junk and the silent one
  srv.close();
  BOOST_TEST(!srv.listening());
}

// A host that drops the connection attempt (here: a listener whose accept queue is full, so the
// kernel drops further SYNs) costs no more than the connect bound, not the whole exchange's.
BOOST_AUTO_TEST_CASE(a_dropped_connection_attempt_costs_only_the_connect_bound) {
  std::uint16_t port = 0;
  auto full = listener(port, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = loopback();
  // Fill the accept queue (never accepted): connects that complete at once, then one that hangs.
  std::vector<UniqueFd> fillers;
  for (int i = 0; i < 4; ++i) {
    UniqueFd f(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    (void)::connect(f.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
    fillers.push_back(std::move(f));
  }
  std::this_thread::sleep_for(100ms);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = exchange(Address{}, lo(), port, sample(), 10000ms, 200ms);
  const auto took = std::chrono::steady_clock::now() - t0;
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST_MESSAGE(r.error().message);
  BOOST_TEST(r.error().is(Errc::timeout), r.error().message);
  BOOST_TEST((took < 5000ms), "the dropped connection attempt took the whole exchange's bound");
}

// Addresses as GIDs hold them: IPv4 as ::ffff:a.b.c.d, IPv6 as it is; notices go only to
// addresses a socket can reach without naming an interface.
BOOST_AUTO_TEST_CASE(addresses_are_ipv4_or_global_ipv6) {
  const auto v4 = parse_address("10.0.0.5");
  BOOST_REQUIRE(v4.has_value());
  BOOST_TEST(is_ipv4(*v4));
  BOOST_TEST(to_string(*v4) == "10.0.0.5");
  BOOST_TEST((*v4 == ipv4_address(htonl(0x0a000005))));
  const auto v6 = parse_address("fd92::2");
  BOOST_REQUIRE(v6.has_value());
  BOOST_TEST(!is_ipv4(*v6));
  BOOST_TEST(to_string(*v6) == "fd92::2");
  BOOST_TEST(notice_address(*v4).has_value());
  BOOST_TEST(notice_address(*v6).has_value());
  for (const char* no : {"fe80::1", "::1", "::", "ff02::1", "0.0.0.0"})
    BOOST_TEST(!notice_address(*parse_address(no)).has_value(), no << " takes notices");
  for (const char* junk : {"", "10.0.0", "fd92::2::1", "host.example", "10.0.0.5,10.0.0.6"})
    BOOST_TEST(!parse_address(junk).has_value(), "'" << junk << "' parsed");
  // An IPv4 source cannot reach an IPv6 backend: said, nothing sent.
  auto r = exchange(*v4, *v6, 4792, sample(), 500ms);
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST(r.error().message.find("IPv4") != std::string::npos, r.error().message);
}

// The same exchange and server over IPv6 (the loopback ::1 stands in for a guest's global
// address): the server sees the sender's IPv6 address.
BOOST_AUTO_TEST_CASE(notices_travel_over_ipv6_too) {
  auto loop = vrdma::vhost::EventLoop::create();
  BOOST_REQUIRE(loop.ok());
  Address seen_from{};
  Server srv(*loop, answering(Kind::paused, seen_from, 7));
  const auto v6lo = *parse_address("::1");
  std::uint16_t port = 0;
  {
    auto probe = listener(port);  // a port free on 127.0.0.1; most likely on ::1 too
  }
  auto l = srv.listen(v6lo, port);
  BOOST_REQUIRE_MESSAGE(l.ok(), (l.ok() ? std::string() : l.error().message));
  BOOST_REQUIRE(*l);
  std::thread t([&] { (void)loop->run(); });
  auto ans = exchange(v6lo, v6lo, port, sample(), 2000ms);
  loop->stop();
  t.join();
  BOOST_REQUIRE_MESSAGE(ans.ok(), (ans.ok() ? std::string() : ans.error().message));
  BOOST_TEST((ans->kind == Kind::paused));
  BOOST_TEST(ans->token == 7u);
  BOOST_TEST((seen_from == v6lo), to_string(seen_from));
  // Nobody on the IPv6 port now: the error names the address as [addr]:port.
  srv.close();
  auto gone = exchange(Address{}, v6lo, port, sample(), 500ms);
  BOOST_REQUIRE(!gone.ok());
  BOOST_TEST(gone.error().message.find("[::1]:" + std::to_string(port)) != std::string::npos, gone.error().message);
}
