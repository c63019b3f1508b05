#include "backend_conn.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "passed_fds.hpp"

namespace vrdma::vhost {

Result<BackendConn> BackendConn::adopt(UniqueFd sock, std::size_t max_queued_bytes) {
  // Our own end of the connection: its file description is not shared with the frontend.
  const int fl = ::fcntl(sock.get(), F_GETFL);
  if (fl < 0 || ::fcntl(sock.get(), F_SETFL, fl | O_NONBLOCK) != 0)
    return errno_error(errno, "making the vhost-user connection non-blocking");
  BackendConn c;
  c.sock_ = std::move(sock);
  c.max_queued_ = max_queued_bytes;
  return c;
}

Result<std::optional<Message>> BackendConn::read() {
  constexpr std::size_t kHdr = sizeof(Header);
  // Room for more fds than any message may carry, so an excess is seen (and closed), not truncated.
  constexpr std::size_t kCmsgFds = kMaxFds * 4;
  for (;;) {
    // Never more than this message's bytes: the next message's fds travel with its own bytes.
    std::uint8_t* dst;
    std::size_t want;
    if (have_ < kHdr) {
      dst = reinterpret_cast<std::uint8_t*>(&msg_.hdr) + have_;
      want = kHdr - have_;
    } else {
      dst = msg_.payload.data() + (have_ - kHdr);
      want = kHdr + msg_.hdr.size - have_;
    }
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * kCmsgFds)];
    iovec iov{dst, want};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    const ssize_t r = ::recvmsg(sock_.get(), &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return std::optional<Message>{};
      return errno_error(errno, "vhost-user recvmsg");
    }
    // Fds first: whatever came is owned (and closed on the error paths below).
    take_passed_fds(mh, msg_.fds);
    if (r == 0) {
      return make_error(Errc::connection_lost, have_ == 0 ? "vhost-user peer closed the connection"
                                                          : "vhost-user peer closed the connection mid-message");
    }
    if ((mh.msg_flags & MSG_CTRUNC) != 0)
      return make_error(Errc::protocol_error, "vhost-user message carried more file descriptors than any request may");
    if (msg_.fds.size() > kMaxFds)
      return make_error(Errc::protocol_error,
                        fmt::format("vhost-user message carried {} file descriptors; at most {} are allowed",
                                    msg_.fds.size(), kMaxFds));
    if (have_ == 0) started_ = Clock::now();
    have_ += static_cast<std::size_t>(r);
    if (have_ == kHdr && msg_.hdr.size > kMaxPayload)
      return make_error(Errc::protocol_error,
                        fmt::format("vhost-user {} payload of {} bytes exceeds the largest message ({} bytes)",
                                    request_name(msg_.hdr.request), msg_.hdr.size, kMaxPayload));
    if (have_ >= kHdr && have_ == kHdr + msg_.hdr.size) {
      Message done = std::move(msg_);
      msg_ = Message{};
      have_ = 0;
      return std::optional<Message>(std::move(done));
    }
  }
}

Result<std::size_t> BackendConn::send_some(Out& o) {
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * kMaxFds)];
  iovec iov{o.bytes.data() + o.off, o.bytes.size() - o.off};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (!o.fds.empty()) {
    mh.msg_control = cbuf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * o.fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    if (c == nullptr) return make_error(Errc::invalid_argument, "no room for the fds of a vhost-user reply");
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * o.fds.size());
    for (std::size_t i = 0; i < o.fds.size(); ++i) {
      const int fd = o.fds[i].get();
      std::memcpy(CMSG_DATA(c) + i * sizeof(int), &fd, sizeof fd);
    }
  }
  for (;;) {
    const ssize_t r = ::sendmsg(sock_.get(), &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) {
      o.off += static_cast<std::size_t>(r);
      if (r > 0) o.fds.clear();  // the kernel holds its own references now
      return static_cast<std::size_t>(r);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return std::size_t{0};
    return errno_error(errno, "vhost-user sendmsg");
  }
}

Status BackendConn::send(Message m) {
  Out o;
  const std::uint32_t size = m.hdr.size > kMaxPayload ? kMaxPayload : m.hdr.size;
  o.bytes.resize(sizeof(Header) + size);
  std::memcpy(o.bytes.data(), &m.hdr, sizeof(Header));
  std::memcpy(o.bytes.data() + sizeof(Header), m.payload.data(), size);
  if (m.fds.size() > kMaxFds) return make_error(Errc::invalid_argument, "too many fds for one vhost-user reply");
  o.fds = std::move(m.fds);
  if (out_.empty()) {
    auto n = send_some(o);
    if (!n) return std::move(n).error();
    if (o.off == o.bytes.size()) return {};
  }
  const std::size_t rest = o.bytes.size() - o.off;
  if (queued_ + rest > max_queued_)
    return make_error(Errc::limit_exceeded,
                      fmt::format("the frontend does not read its replies: {} bytes of them wait and the next would pass "
                                  "the bound of {} bytes",
                                  queued_, max_queued_));
  queued_ += rest;
  out_.push_back(std::move(o));
  return {};
}

Status BackendConn::flush() {
  while (!out_.empty()) {
    Out& o = out_.front();
    auto n = send_some(o);
    if (!n) return std::move(n).error();
    if (*n == 0) return {};  // full again; the next EPOLLOUT goes on
    queued_ -= *n;
    if (o.off == o.bytes.size()) out_.pop_front();
  }
  return {};
}

}  // namespace vrdma::vhost
