// The notices' bytes and sockets (peer_notice.hpp). The device's side of them is peer.cpp.
#include "vrdma/migration/peer_notice.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>

#include <fmt/format.h>

#include "vrdma/common/bytes.hpp"
#include "vrdma/common/fd.hpp"

namespace vrdma::migration::notice {

namespace {
constexpr std::uint32_t kMagic = 0x5652504e;  // "VRPN"
constexpr std::uint8_t kVersion = 1;
constexpr std::size_t kFixedBody = 4 + 4 + 16 + 8 + 4 + 4 + 4 + 2;
constexpr std::size_t kMaxBody = kFixedBody + std::size_t{kMaxRkeys} * 8 + kMaxReason;
using Clock = std::chrono::steady_clock;

Error bad(const std::string& what) { return make_error(Errc::protocol_error, "peer notice: " + what); }

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left);
}

// Waits for `events` on fd until the deadline.
Status wait_fd(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return {};
    if (n == 0) return make_error(Errc::timeout, std::string("peer notice: timed out ") + what);
    if (errno != EINTR) return errno_error(errno, std::string("peer notice: poll while ") + what);
  }
}

Status read_exact(int fd, std::uint8_t* p, std::size_t n, Clock::time_point deadline) {
  while (n > 0) {
    if (auto s = wait_fd(fd, POLLIN, deadline, "waiting for the other backend's message"); !s.ok()) return s;
    const auto r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r == 0) return make_error(Errc::connection_lost, "peer notice: the other backend closed the connection");
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return errno_error(errno, "peer notice: reading");
    }
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return {};
}

}  // namespace

const char* to_string(Kind k) {
  switch (k) {
    case Kind::pause: return "PAUSE";
    case Kind::paused: return "PAUSED";
    case Kind::repoint: return "REPOINT";
    case Kind::repointed: return "REPOINTED";
    case Kind::release: return "RELEASE";
    case Kind::released: return "RELEASED";
    case Kind::refused: return "REFUSED";
  }
  return "?";
}

std::vector<std::uint8_t> encode(const Message& m) {
  ByteWriter w;
  w.be(kMagic, kVersion, static_cast<std::uint8_t>(m.kind));
  const std::size_t nkeys = std::min<std::size_t>(m.rkeys.size(), kMaxRkeys);
  const std::size_t nreason = std::min(m.reason.size(), kMaxReason);
  w.be(static_cast<std::uint32_t>(kFixedBody + nkeys * 8 + nreason), m.peer_qpn, m.mover_qpn);
  w.raw(m.mover_gid);
  w.be(m.token, m.sq_psn, m.rq_psn, static_cast<std::uint32_t>(nkeys));
  for (std::size_t i = 0; i < nkeys; ++i) {
    w.be(m.rkeys[i].first, m.rkeys[i].second);
  }
  w.be(static_cast<std::uint16_t>(nreason));
  w.raw(std::span(reinterpret_cast<const std::uint8_t*>(m.reason.data()), nreason));
  return std::move(w.out);
}

Result<std::uint32_t> body_length(std::span<const std::uint8_t> header) {
  ByteReader r{header};
  std::uint32_t magic = 0, len = 0;
  std::uint8_t version = 0, kind = 0;
  if (!r.be(magic) || !r.be(version) || !r.be(kind) || !r.be(len)) return bad("a header is 10 bytes");
  if (magic != kMagic) return bad("not a vrdma peer notice (magic)");
  if (version != kVersion) return bad(fmt::format("version {} (this vrdmad speaks {})", version, kVersion));
  if (kind < 1 || kind > 7) return bad(fmt::format("kind {}", kind));
  if (len < kFixedBody || len > kMaxBody) return bad(fmt::format("a body of {} bytes", len));
  return len;
}

Result<Message> decode(std::span<const std::uint8_t> bytes) {
  if (bytes.size() < kHeaderLen) return bad("shorter than its header");
  auto len = body_length(bytes.first(kHeaderLen));
  if (!len) return std::move(len).error();
  if (bytes.size() != kHeaderLen + *len) return bad("its length is not the header's");
  Message m;
  m.kind = static_cast<Kind>(bytes[5]);
  ByteReader r{bytes.subspan(kHeaderLen)};
  std::uint32_t nkeys = 0;
  std::uint16_t nreason = 0;
  std::span<const std::uint8_t> gid, reason;
  bool ok = r.be(m.peer_qpn, m.mover_qpn) && r.raw(m.mover_gid.size(), gid);
  ok = ok && r.be(m.token, m.sq_psn, m.rq_psn, nkeys);
  if (!ok) return bad("truncated");
  std::memcpy(m.mover_gid.data(), gid.data(), gid.size());
  if (nkeys > kMaxRkeys || std::size_t{nkeys} * 8 > r.remaining()) return bad(fmt::format("{} rkeys", nkeys));
  m.rkeys.resize(nkeys);
  for (auto& [g, n] : m.rkeys) ok = ok && r.be(g, n);
  ok = ok && r.be(nreason);
  if (!ok || nreason > kMaxReason || r.remaining() != nreason || !r.raw(nreason, reason))
    return bad("truncated or trailing bytes");
  m.reason.assign(reinterpret_cast<const char*>(reason.data()), reason.size());
  if ((m.peer_qpn | m.mover_qpn | m.sq_psn | m.rq_psn) >> 24 != 0) return bad("a QPN or PSN wider than 24 bits");
  for (char c : m.reason)
    if (static_cast<unsigned char>(c) < 0x20) return bad("a reason with control characters");
  return m;
}

Address ipv4_address(std::uint32_t ip_be) {
  Address a{};
  a[10] = a[11] = 0xff;
  std::memcpy(a.data() + 12, &ip_be, 4);
  return a;
}

bool is_ipv4(const Address& a) {
  static constexpr std::array<std::uint8_t, 12> kPrefix{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(a.data(), kPrefix.data(), kPrefix.size()) == 0;
}

bool is_none(const Address& a) { return a == Address{}; }

std::optional<Address> notice_address(const std::array<std::uint8_t, 16>& gid) {
  if (is_ipv4(gid)) {
    std::uint32_t v = 0;
    std::memcpy(&v, gid.data() + 12, 4);
    if (v == 0) return std::nullopt;
    return gid;
  }
  in6_addr a{};
  std::memcpy(&a, gid.data(), 16);
  if (IN6_IS_ADDR_UNSPECIFIED(&a) || IN6_IS_ADDR_LOOPBACK(&a) || IN6_IS_ADDR_LINKLOCAL(&a) || IN6_IS_ADDR_MULTICAST(&a) ||
      IN6_IS_ADDR_V4COMPAT(&a))
    return std::nullopt;
  return gid;
}

std::optional<Address> parse_address(const std::string& text) {
  in_addr v4{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) return ipv4_address(v4.s_addr);
  in6_addr v6{};
  if (::inet_pton(AF_INET6, text.c_str(), &v6) != 1) return std::nullopt;
  Address a{};
  std::memcpy(a.data(), &v6, 16);
  return a;
}

std::string to_string(const Address& a) {
  char s[INET6_ADDRSTRLEN] = {};
  if (is_ipv4(a)) {
    in_addr v4{};
    std::memcpy(&v4, a.data() + 12, 4);
    ::inet_ntop(AF_INET, &v4, s, sizeof s);
  } else {
    in6_addr v6{};
    std::memcpy(&v6, a.data(), 16);
    ::inet_ntop(AF_INET6, &v6, s, sizeof s);
  }
  return s;
}

unsigned to_sockaddr(const Address& a, std::uint16_t port, sockaddr_storage& out) {
  out = {};
  if (is_ipv4(a)) {
    auto* s = reinterpret_cast<sockaddr_in*>(&out);
    s->sin_family = AF_INET;
    s->sin_port = htons(port);
    std::memcpy(&s->sin_addr, a.data() + 12, 4);
    return sizeof(sockaddr_in);
  }
  auto* s = reinterpret_cast<sockaddr_in6*>(&out);
  s->sin6_family = AF_INET6;
  s->sin6_port = htons(port);
  std::memcpy(&s->sin6_addr, a.data(), 16);
  return sizeof(sockaddr_in6);
}

std::optional<Address> from_sockaddr(const sockaddr_storage& s) {
  if (s.ss_family == AF_INET) return ipv4_address(reinterpret_cast<const sockaddr_in&>(s).sin_addr.s_addr);
  if (s.ss_family != AF_INET6) return std::nullopt;
  Address a{};
  std::memcpy(a.data(), &reinterpret_cast<const sockaddr_in6&>(s).sin6_addr, 16);
  return a;
}

Result<Message> read_message(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<std::uint8_t> b(kHeaderLen);
  if (auto s = read_exact(fd, b.data(), kHeaderLen, deadline); !s.ok()) return std::move(s).error();
  auto len = body_length(b);
  if (!len) return std::move(len).error();
  b.resize(kHeaderLen + *len);
  if (auto s = read_exact(fd, b.data() + kHeaderLen, *len, deadline); !s.ok()) return std::move(s).error();
  return decode(b);
}

Status write_message(int fd, const Message& m, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const auto b = encode(m);
  std::size_t off = 0;
  while (off < b.size()) {
    if (auto s = wait_fd(fd, POLLOUT, deadline, "sending a message"); !s.ok()) return s;
    const auto n = ::send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return errno_error(errno, "peer notice: sending");
    }
    off += static_cast<std::size_t>(n);
  }
  return {};
}

Result<Message> exchange(const Address& from, const Address& to, std::uint16_t port, const Message& m,
                         std::chrono::milliseconds timeout, std::chrono::milliseconds connect_timeout) {
  const auto deadline = Clock::now() + timeout;
  const auto connect_deadline = Clock::now() + std::min(timeout, connect_timeout);
  const bool v6 = !is_ipv4(to);
  const auto where = v6 ? fmt::format("the vrdma backend at [{}]:{}", to_string(to), port)
                        : fmt::format("the vrdma backend at {}:{}", to_string(to), port);
  if (!is_none(from) && is_ipv4(from) != !v6)
    return make_error(Errc::invalid_argument, fmt::format("peer notice: {} cannot reach {} (one is IPv4, the other IPv6)",
                                                          to_string(from), to_string(to)));
  UniqueFd fd(::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return errno_error(errno, "peer notice: socket");
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_storage sa{};
  if (!is_none(from)) {
    const auto src_len = to_sockaddr(from, 0, sa);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&sa), src_len) != 0)
      return errno_error(errno, fmt::format("peer notice: sending from {} (the guest's address; is it on this host?)",
                                            to_string(from)));
  }
  const auto dst_len = to_sockaddr(to, port, sa);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sa), dst_len) != 0) {
    if (errno != EINPROGRESS) return errno_error(errno, "peer notice: connecting to " + where);
    if (auto s = wait_fd(fd.get(), POLLOUT, connect_deadline, ("connecting to " + where).c_str()); !s.ok())
      return std::move(s).error();
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return errno_error(err, "peer notice: connecting to " + where);
  }
  if (auto s = write_message(fd.get(), m, std::chrono::milliseconds(remaining_ms(deadline))); !s.ok())
    return std::move(s).error();
  return read_message(fd.get(), std::chrono::milliseconds(remaining_ms(deadline)));
}

}  // namespace vrdma::migration::notice
