#include "vrdma/vhost/channel.hpp"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "passed_fds.hpp"

namespace vrdma::vhost {
namespace {

Result<sockaddr_un> unix_addr(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof(a.sun_path))
    return make_error(Errc::invalid_argument, fmt::format("socket path {} is longer than {} bytes", path,
                                                          sizeof(a.sun_path) - 1));
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

// Reads exactly len bytes (no fds). EOF or a short read after the header is a protocol error.
Status read_exact(int fd, std::uint8_t* p, std::size_t len) {
  std::size_t got = 0;
  while (got < len) {
    const ssize_t r = ::recv(fd, p + got, len - got, 0);
    if (r == 0) return make_error(Errc::connection_lost, "vhost-user peer closed the connection mid-message");
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return make_error(Errc::timeout, "vhost-user peer stalled in the middle of a message");
      return errno_error(errno, "vhost-user recv");
    }
    got += static_cast<std::size_t>(r);
  }
  return {};
}

}  // namespace

Result<Channel> Channel::connect(const std::string& path) {
  auto addr = unix_addr(path);
  if (!addr) return std::move(addr).error();
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) return errno_error(errno, "socket(AF_UNIX)");
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(sockaddr_un)) != 0)
    return errno_error(errno, fmt::format("connect to vhost-user socket {}", path));
  return Channel(std::move(s));
}

Status Channel::set_recv_timeout_ms(int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  if (::setsockopt(sock_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
    return errno_error(errno, "setsockopt(SO_RCVTIMEO)");
  return {};
}

Result<Message> Channel::recv() {
  Message m;
  // Room for more fds than any message may carry, so an excess is seen (and closed), not truncated.
  constexpr std::size_t kCmsgFds = kMaxFds * 4;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * kCmsgFds)];
  iovec iov{&m.hdr, sizeof(Header)};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf;
  mh.msg_controllen = sizeof cbuf;
  ssize_t r;
  do {
    r = ::recvmsg(sock_.get(), &mh, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return make_error(Errc::connection_lost, "vhost-user peer closed the connection");
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return make_error(Errc::timeout, "vhost-user recv timed out");
    return errno_error(errno, "vhost-user recvmsg");
  }
  std::vector<UniqueFd> fds;
  take_passed_fds(mh, fds);
  if ((mh.msg_flags & MSG_CTRUNC) != 0)
    return make_error(Errc::protocol_error, "vhost-user message carried more file descriptors than any request may");
  if (fds.size() > kMaxFds)
    return make_error(Errc::protocol_error,
                      fmt::format("vhost-user message carried {} file descriptors; at most {} are allowed", fds.size(),
                                  kMaxFds));
  if (static_cast<std::size_t>(r) < sizeof(Header))
    VRDMA_TRY(read_exact(sock_.get(), reinterpret_cast<std::uint8_t*>(&m.hdr) + r, sizeof(Header) - static_cast<std::size_t>(r)));
  if (m.hdr.size > kMaxPayload)
    return make_error(Errc::protocol_error,
                      fmt::format("vhost-user {} payload of {} bytes exceeds the largest message ({} bytes)",
                                  request_name(m.hdr.request), m.hdr.size, kMaxPayload));
  VRDMA_TRY(read_exact(sock_.get(), m.payload.data(), m.hdr.size));
  m.fds = std::move(fds);
  return m;
}

Status Channel::send_raw(const void* data, std::size_t len, const int* fds, std::size_t nfds) {
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * kMaxFds * 4)];
  iovec iov{const_cast<void*>(data), len};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (nfds > kMaxFds * 4) return make_error(Errc::invalid_argument, "too many fds for one message");
  if (nfds > 0) {
    mh.msg_control = cbuf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  std::size_t off = 0;
  while (off < len) {
    const ssize_t r = ::sendmsg(sock_.get(), &mh, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_error(errno, "vhost-user sendmsg");
    }
    off += static_cast<std::size_t>(r);
    iov.iov_base = static_cast<std::uint8_t*>(iov.iov_base) + r;
    iov.iov_len = len - off;
    mh.msg_control = nullptr;  // fds travel with the first byte only
    mh.msg_controllen = 0;
  }
  return {};
}

Status Channel::send(const Message& m) {
  std::array<std::uint8_t, sizeof(Header) + kMaxPayload> buf;
  const std::uint32_t size = m.hdr.size > kMaxPayload ? kMaxPayload : m.hdr.size;
  std::memcpy(buf.data(), &m.hdr, sizeof(Header));
  std::memcpy(buf.data() + sizeof(Header), m.payload.data(), size);
  int fds[kMaxFds];
  std::size_t n = 0;
  for (const auto& f : m.fds)
    if (n < kMaxFds) fds[n++] = f.get();
  return send_raw(buf.data(), sizeof(Header) + size, fds, n);
}

namespace {

// True when /proc/net/unix (this network namespace's UNIX sockets) lists a listening socket
// bound to `path`. Lines: "Num RefCount Protocol Flags Type St Inode Path"; Flags has
// __SO_ACCEPTCON (0x10000) on a listener. Reading it touches nothing of the listener.
bool someone_listens(const std::string& path) {
  std::ifstream in("/proc/net/unix");
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string num, refs, proto, flags, type, state, inode, bound;
    if (!(f >> num >> refs >> proto >> flags >> type >> state >> inode >> bound)) continue;
    if (bound != path) continue;
    if ((std::strtoul(flags.c_str(), nullptr, 16) & 0x10000UL) != 0) return true;
  }
  return false;
}

}  // namespace

Status claim_socket_path(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return errno_error(errno, "looking at " + path);
  }
  if (!S_ISSOCK(st.st_mode))
    return make_error(Errc::invalid_argument,
                      path + " exists and is not a socket; remove it or choose another path for the socket");
  if (someone_listens(path))
    return make_error(Errc::busy, "another process listens on " + path +
                                      " (a second backend for the same device?); stop it first, or give this one "
                                      "another socket path");
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return errno_error(errno, "removing the stale socket " + path);
  return {};
}

Result<UniqueFd> listen_unix(const std::string& path, int backlog) {
  auto addr = unix_addr(path);
  if (!addr) return std::move(addr).error();
  VRDMA_TRY(claim_socket_path(path));
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) return errno_error(errno, "socket(AF_UNIX)");
  if (::bind(s.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(sockaddr_un)) != 0)
    return errno_error(errno, fmt::format("bind vhost-user socket {}", path));
  if (::listen(s.get(), backlog) != 0) return errno_error(errno, "listen");
  return s;
}

}  // namespace vrdma::vhost
