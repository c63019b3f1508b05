// Notices between vrdma backends about QPs that move on a NIC (docs/migration.md "Telling vrdma
// peers where a QP went"). A NIC gives a moved QP a new QPN, so a peer QP elsewhere would keep
// sending to the old one. When the guest's backend (the mover) stops its QPs, it asks each peer
// backend to *pause* its side of the connection (hold the guest's send ring, drain what the NIC
// has in flight) and gets a token; once the QP exists again (at the destination, or at the source
// after a failed move) the mover *re-points* the peer with the token, its new QPN and its new
// memory keys, and the peer re-creates its QP toward it. An abandoned stop *releases* the pause.
//
// TCP, one request and one answer per connection, to the peer QP's address (its GID: IPv4 for
// ::ffff:a.b.c.d, else a global IPv6 address) at port 4792 unless configured otherwise; the answer to anything refused says why. Every field is
// in network byte order:
//   "VRPN" (u32), version 1 (u8), kind (u8), body length (u32), then the body:
//   peer_qpn u32, mover_qpn u32, mover_gid [16], token u64, sq_psn u32, rq_psn u32,
//   rkey count u32 + (guest rkey u32, NIC rkey u32) pairs, reason length u16 + UTF-8 bytes.
// decode() checks every field: these are bytes from the network
// (tests/fuzz/migration/peer_notice_fuzzer.cpp).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "vrdma/common/result.hpp"

struct sockaddr_storage;

namespace vrdma::migration::notice {

constexpr std::uint16_t kDefaultPort = 4792;
constexpr std::size_t kHeaderLen = 10;
constexpr std::uint32_t kMaxRkeys = 65536;
constexpr std::size_t kMaxReason = 1024;

enum class Kind : std::uint8_t {
  pause = 1,      // mover -> peer: hold and drain your QP peer_qpn, connected to mover_qpn at mover_gid
  paused = 2,     // peer: drained; token, and the peer's PSNs (sq_psn: next to send, rq_psn: next expected)
  repoint = 3,    // mover -> peer: token; the QP is now mover_qpn at mover_gid, its PSNs, its rkey map
  repointed = 4,  // peer: re-created; peer_qpn is its new QPN
  release = 5,    // mover -> peer: the stop was abandoned; token; let your ring run again
  released = 6,
  refused = 7,    // either way: reason
};
[[nodiscard]] const char* to_string(Kind k);

struct Message {
  Kind kind = Kind::refused;
  std::uint32_t peer_qpn = 0;
  std::uint32_t mover_qpn = 0;
  std::array<std::uint8_t, 16> mover_gid{};
  std::uint64_t token = 0;
  std::uint32_t sq_psn = 0, rq_psn = 0;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> rkeys;  // mover's guest rkey -> its NIC's rkey
  std::string reason;
  bool operator==(const Message&) const = default;
};

std::vector<std::uint8_t> encode(const Message& m);
// The body length a header announces, after checking magic, version, kind and bound.
Result<std::uint32_t> body_length(std::span<const std::uint8_t> header);
// A whole message (header and body).
Result<Message> decode(std::span<const std::uint8_t> bytes);

// Where notices go and come from: an address as a RoCE v2 GID holds it, 16 bytes, an IPv4
// address as ::ffff:a.b.c.d. All zeros: none (any, as a source).
using Address = std::array<std::uint8_t, 16>;
[[nodiscard]] Address ipv4_address(std::uint32_t ip_be);
[[nodiscard]] bool is_ipv4(const Address& a);
[[nodiscard]] bool is_none(const Address& a);
// A GID that can carry notices: IPv4, or an IPv6 address that is not link-local (a socket to one
// would need its interface), multicast, loopback or unspecified.
[[nodiscard]] std::optional<Address> notice_address(const std::array<std::uint8_t, 16>& gid);
// "10.0.0.5" or "fd00::5" (inet_pton); nullopt for anything else.
[[nodiscard]] std::optional<Address> parse_address(const std::string& text);
[[nodiscard]] std::string to_string(const Address& a);
// For the sockets: `a`:`port` as a sockaddr_in or sockaddr_in6 (its length returned), and back.
unsigned to_sockaddr(const Address& a, std::uint16_t port, ::sockaddr_storage& out);
std::optional<Address> from_sockaddr(const ::sockaddr_storage& s);

// One message from a connected socket, within `timeout`.
Result<Message> read_message(int fd, std::chrono::milliseconds timeout);
Status write_message(int fd, const Message& m, std::chrono::milliseconds timeout);
// A client's exchange: connects from `from` (none: any) to `to`:`port` (both IPv4 or both
// IPv6) within `connect_timeout` (a host that drops the connection attempt costs no more), sends
// `m` and reads the answer, all within `timeout`.
Result<Message> exchange(const Address& from, const Address& to, std::uint16_t port, const Message& m,
                         std::chrono::milliseconds timeout, std::chrono::milliseconds connect_timeout);
inline Result<Message> exchange(const Address& from, const Address& to, std::uint16_t port, const Message& m,
                                std::chrono::milliseconds timeout) {
  return exchange(from, to, port, m, timeout, timeout);
}

}  // namespace vrdma::migration::notice

namespace vrdma::vhost {
class EventLoop;
}

namespace vrdma::migration::notice {

// The listening side, on an event loop: accepts connections, reads each request without
// blocking the loop (a connection that has not sent a whole message within `read_timeout` is
// closed, at most kMaxConnections are open at once), passes it with the sender's address to
// `handler`, writes the answer and closes. Bytes that are no notice get a REFUSED with the
// reason. The answering itself runs on the loop (a pause drains a QP: up to the drain bound).
class Server {
 public:
  using Handler = std::function<Message(const Message& m, const Address& from)>;
  static constexpr std::size_t kMaxConnections = 16;

  Server(vhost::EventLoop& loop, Handler handler, std::chrono::milliseconds read_timeout = std::chrono::milliseconds(1000));
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Listens on ip:port (IPv4 or IPv6; IP_FREEBIND). false: another socket holds the port
  // (nothing changed); an error for anything else.
  Result<bool> listen(const Address& ip, std::uint16_t port);
  // Stops listening and drops the connections still reading.
  void close();
  [[nodiscard]] bool listening() const;
  [[nodiscard]] std::uint64_t malformed() const;  // requests that were no notice (refused)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vrdma::migration::notice
