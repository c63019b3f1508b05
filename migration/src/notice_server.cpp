// The peer notices' listening side (peer_notice.hpp Server): every connection is read without
// blocking the event loop, so a connection that sends nothing, or half a message, costs the
// guest's device nothing but a descriptor until its read timeout.
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/vhost/event_loop.hpp"
#include "vrdma/migration/peer_notice.hpp"

namespace vrdma::migration::notice {

namespace {
using Clock = std::chrono::steady_clock;

struct Conn {
  UniqueFd fd;
  Address from{};
  std::vector<std::uint8_t> buf;
  std::size_t need = kHeaderLen;  // bytes of the whole message once its header is in
  Clock::time_point deadline;
};
}  // namespace

struct Server::Impl {
  vhost::EventLoop& loop;
  Handler handler;
  std::chrono::milliseconds read_timeout;
  UniqueFd listener;
  UniqueFd timer;  // closes connections past their deadline
  std::unordered_map<int, Conn> conns;
  std::uint64_t malformed = 0;

  Impl(vhost::EventLoop& l, Handler h, std::chrono::milliseconds t) : loop(l), handler(std::move(h)), read_timeout(t) {}

  void drop(int fd) {
    loop.remove(fd);
    conns.erase(fd);
    arm_timer();
  }
  void answer(Conn& c, const Message& ans) {
    // A short answer into a fresh socket's empty send buffer: it does not block.
    (void)write_message(c.fd.get(), ans, std::chrono::milliseconds(100));
  }
  void refuse(Conn& c, const std::string& why) {
    if (++malformed <= 100 || malformed % 1000 == 0)
      log::warn("vrdmad: a peer notice from {} is refused: {}", to_string(c.from), why);
    Message ans;
    ans.kind = Kind::refused;
    ans.reason = why;
    answer(c, ans);
  }
  void readable(int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    Conn& c = it->second;
    while (c.buf.size() < c.need) {
      std::uint8_t tmp[4096];
      const auto want = std::min(sizeof tmp, c.need - c.buf.size());
      const auto n = ::recv(fd, tmp, want, MSG_DONTWAIT);
      if (n == 0) return drop(fd);  // gone before a whole message
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;  // more later
        return drop(fd);
      }
      c.buf.insert(c.buf.end(), tmp, tmp + n);
      if (c.need == kHeaderLen && c.buf.size() == kHeaderLen) {
        auto len = body_length(c.buf);
        if (!len) {
          refuse(c, len.error().message);
          return drop(fd);
        }
        c.need = kHeaderLen + *len;
      }
    }
    auto m = decode(c.buf);
    if (!m) {
      refuse(c, m.error().message);
      return drop(fd);
    }
    answer(c, handler(*m, c.from));
    drop(fd);
  }
  void accept_one() {
    sockaddr_storage from{};
    socklen_t len = sizeof from;
    UniqueFd c(::accept4(listener.get(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC | SOCK_NONBLOCK));
    const auto addr = c ? from_sockaddr(from) : std::nullopt;
    if (!addr) return;
    if (conns.size() >= kMaxConnections) {
      log::warn("vrdmad: {} peer notice connections are open already; one from {} is closed", conns.size(),
                to_string(*addr));
      return;
    }
    const int fd = c.get();
    Conn conn;
    conn.fd = std::move(c);
    conn.from = *addr;
    conn.deadline = Clock::now() + read_timeout;
    conns.emplace(fd, std::move(conn));
    if (auto s = loop.add(fd, EPOLLIN, [this, fd](std::uint32_t) { readable(fd); }); !s.ok()) {
      conns.erase(fd);
      return;
    }
    arm_timer();
    readable(fd);  // what came with the connection
  }
  void expire() {
    const auto now = Clock::now();
    std::vector<int> late;
    for (const auto& [fd, c] : conns)
      if (c.deadline <= now) late.push_back(fd);
    for (int fd : late) {
      if (++malformed <= 100 || malformed % 1000 == 0)
        log::warn("vrdmad: a peer notice connection from {} sent no whole message within {} ms; closed",
                  to_string(conns[fd].from), read_timeout.count());
      drop(fd);
    }
    arm_timer();
  }
  void arm_timer() {
    if (!timer) return;
    itimerspec its{};
    if (!conns.empty()) {
      auto first = Clock::time_point::max();
      for (const auto& [fd, c] : conns) first = std::min(first, c.deadline);
      const auto ns =
          std::max<std::int64_t>(1000, std::chrono::duration_cast<std::chrono::nanoseconds>(first - Clock::now()).count());
      its.it_value.tv_sec = ns / 1000000000;
      its.it_value.tv_nsec = ns % 1000000000;
    }
    ::timerfd_settime(timer.get(), 0, &its, nullptr);
  }
  void close() {
    for (auto& [fd, c] : conns) loop.remove(fd);
    conns.clear();
    if (listener) loop.remove(listener.get());
    listener.reset();
    arm_timer();
  }
};

Server::Server(vhost::EventLoop& loop, Handler handler, std::chrono::milliseconds read_timeout)
    : impl_(std::make_unique<Impl>(loop, std::move(handler), read_timeout)) {
  impl_->timer = UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (impl_->timer) {
    auto* im = impl_.get();
    auto s = loop.add(im->timer.get(), EPOLLIN, [im](std::uint32_t) {
      std::uint64_t n;
      [[maybe_unused]] auto r = ::read(im->timer.get(), &n, sizeof n);
      im->expire();
    });
    if (!s.ok()) impl_->timer.reset();
  }
}

Server::~Server() {
  impl_->close();
  if (impl_->timer) impl_->loop.remove(impl_->timer.get());
}

Result<bool> Server::listen(const Address& ip, std::uint16_t port) {
  if (impl_->listener) return true;
  const bool v6 = !is_ipv4(ip);
  const auto where = v6 ? fmt::format("[{}]:{}", to_string(ip), port) : fmt::format("{}:{}", to_string(ip), port);
  sockaddr_storage a{};
  const auto alen = to_sockaddr(ip, port, a);
  UniqueFd fd(::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return errno_error(errno, "creating the peer notice socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // Before the guest's address arrives on this host (a destination starts early); the IPv4 option
  // covers IPv6 sockets too.
  ::setsockopt(fd.get(), IPPROTO_IP, IP_FREEBIND, &one, sizeof one);
  if (v6) ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), alen) != 0) {
    if (errno == EADDRINUSE) return false;
    return errno_error(errno, "binding the peer notice listener to " + where);
  }
  if (::listen(fd.get(), 16) != 0) return errno_error(errno, "listening for peer notices on " + where);
  auto* im = impl_.get();
  VRDMA_TRY(impl_->loop.add(fd.get(), EPOLLIN, [im](std::uint32_t) { im->accept_one(); }));
  impl_->listener = std::move(fd);
  return true;
}

void Server::close() { impl_->close(); }
bool Server::listening() const { return static_cast<bool>(impl_->listener); }
std::uint64_t Server::malformed() const { return impl_->malformed; }

}  // namespace vrdma::migration::notice
