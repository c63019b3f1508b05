// vrdmad's JSON control socket (control_socket.hpp).
#include "control_socket.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "vrdma/vhost/channel.hpp"

namespace vrdma::vrdmad {

Result<UniqueFd> listen_unix(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return errno_error(errno, "creating the control socket");
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) return make_error(Errc::invalid_argument, "control socket path too long: " + path);
  // Bound under a temporary name and renamed once listening: whoever sees `path` can connect
  // (a client that connected between bind and listen was refused).
  const std::string tmp = path + ".new";
  if (tmp.size() >= sizeof a.sun_path) return make_error(Errc::invalid_argument, "control socket path too long: " + path);
  VRDMA_TRY(vhost::claim_socket_path(path));
  std::memcpy(a.sun_path, tmp.c_str(), tmp.size() + 1);
  ::unlink(tmp.c_str());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return errno_error(errno, "binding " + tmp);
  if (::listen(fd.get(), 8) != 0) return errno_error(errno, "listening on " + tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return errno_error(errno, "renaming " + tmp + " to " + path);
  return fd;
}

ControlConnections::~ControlConnections() {
  for (auto& [fd, c] : conns_) loop_.remove(fd);
  if (timer_) loop_.remove(timer_.get());
  loop_.remove(listener_);
}

Status ControlConnections::start() {
  timer_ = UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!timer_) return errno_error(errno, "timerfd for the control socket");
  VRDMA_TRY(loop_.add(timer_.get(), EPOLLIN, [this](std::uint32_t) { on_timer(); }));
  return loop_.add(listener_, EPOLLIN, [this](std::uint32_t) { on_accept(); });
}

void ControlConnections::on_accept() {
  for (int i = 0; i < 16; ++i) {  // a few per wake-up; the rest wake us again
    UniqueFd c(::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!c) return;
    if (conns_.size() >= kMaxConns) {
      // The oldest still sending its request goes; one waiting for its answer only when all are.
      auto oldest = std::min_element(conns_.begin(), conns_.end(), [](const auto& a, const auto& b) {
        return std::pair(a.second.answering, a.second.order) < std::pair(b.second.answering, b.second.order);
      });
      close(oldest->first);
    }
    const int fd = c.get();
    if (!loop_.add(fd, EPOLLIN, [this, fd](std::uint32_t ev) { on_read(fd, ev); }).ok()) continue;
    conns_[fd] = Conn{std::move(c), {}, std::chrono::steady_clock::now(), ++order_};
    if (conns_.size() == 1) arm(true);
  }
}

void ControlConnections::on_read(int fd, std::uint32_t ev) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  if (c.answering) {  // watched for nothing but hang-ups now: the client left before its answer
    if ((ev & (EPOLLHUP | EPOLLERR)) != 0) close(fd);
    return;
  }
  char buf[1024];
  const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0) c.in.append(buf, static_cast<std::size_t>(n));
  const auto nl = c.in.find('\n');
  // More to come, unless what came is a whole JSON value already (a client that sends no newline).
  if (n > 0 && nl == std::string::npos && c.in.size() < kMaxLine && !nlohmann::json::accept(c.in)) return;
  if (n < 0 || c.in.empty()) return close(fd);
  c.answering = true;
  c.since = std::chrono::steady_clock::now();
  if (!loop_.modify(fd, 0).ok()) return close(fd);
  const std::string line = c.in.substr(0, nl);
  c.in.clear();
  // `c` may be gone once the handler returns: it may answer (and close) at once.
  handler_(line, [alive = std::weak_ptr<int>(alive_), this, fd, order = c.order](const std::string& out) {
    if (!alive.expired()) answer(fd, order, out);
  });
}

void ControlConnections::answer(int fd, std::uint64_t order, const std::string& out) {
  auto it = conns_.find(fd);
  if (it == conns_.end() || it->second.order != order) return;  // that client is gone
  // The reply (a few KiB) fits the empty socket buffer; a client that cannot take it is gone.
  [[maybe_unused]] auto w = ::send(fd, out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  close(fd);
}

void ControlConnections::on_timer() {
  std::uint64_t n;
  [[maybe_unused]] auto r = ::read(timer_.get(), &n, sizeof n);
  const auto now = std::chrono::steady_clock::now();
  std::vector<int> late;
  for (const auto& [fd, c] : conns_)
    if (now - c.since >= (c.answering ? kAnswerDeadline : kDeadline))
      late.push_back(fd);
  for (int fd : late) close(fd);
}

void ControlConnections::close(int fd) {
  loop_.remove(fd);
  conns_.erase(fd);
  if (conns_.empty()) arm(false);
}

void ControlConnections::arm(bool on) {
  const timespec every{0, on ? 250'000'000 : 0};
  const itimerspec t{every, every};
  ::timerfd_settime(timer_.get(), 0, &t, nullptr);
}

}  // namespace vrdma::vrdmad
