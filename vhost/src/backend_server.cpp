// Backend server: accepts a frontend, reads and validates messages, dispatches, replies.
#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>

#include "backend_conn.hpp"
#include "backend_session.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::vhost {

namespace {
std::int64_t ns_of(BackendConn::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
}  // namespace

BackendServer::BackendServer(Device& dev, EventLoop& loop, BackendOptions opts)
    : dev_(dev), loop_(loop), opts_(opts) {}

BackendServer::~BackendServer() {
  if (conn_) loop_.remove(conn_->fd());
  if (deadline_) loop_.remove(deadline_.get());
  if (faults_) loop_.remove(faults_->fd());
  if (failed_) loop_.remove(failed_.get());
  session_.reset();
  if (listener_) loop_.remove(listener_.get());
}

Result<std::unique_ptr<BackendServer>> BackendServer::listen(const std::string& path, Device& dev, EventLoop& loop,
                                                             BackendOptions opts) {
  std::unique_ptr<BackendServer> s(new BackendServer(dev, loop, opts));
  auto l = listen_unix(path);
  if (!l) return std::move(l).error();
  s->listener_ = std::move(*l);
  BackendServer* self = s.get();
  VRDMA_TRY(loop.add(s->listener_.get(), EPOLLIN, [self](std::uint32_t) { self->on_accept(); }));
  log::info("vhost-user backend listening on {}", path);
  return s;
}

Result<std::unique_ptr<BackendServer>> BackendServer::adopt(UniqueFd conn, Device& dev, EventLoop& loop,
                                                            BackendOptions opts) {
  std::unique_ptr<BackendServer> s(new BackendServer(dev, loop, opts));
  VRDMA_TRY(s->start_session(std::move(conn)));
  return s;
}

void BackendServer::on_accept() {
  UniqueFd c(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!c) {
    log::warn("vhost-user accept failed: {}", std::strerror(errno));
    return;
  }
  if (session_ != nullptr) {
    log::warn("vhost-user: refusing a second frontend while one is connected");
    return;  // closes c
  }
  auto st = start_session(std::move(c));
  if (!st.ok()) log::error("vhost-user: cannot serve the new frontend: {}", st.error().message);
}

Status BackendServer::start_session(UniqueFd conn) {
  auto c = BackendConn::adopt(std::move(conn), opts_.max_reply_backlog);
  if (!c) return std::move(c).error();
  if (!deadline_) {
    deadline_ = UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    if (!deadline_) return errno_error(errno, "timerfd for the vhost-user message deadline");
  }
  if (!faults_) {
    auto f = FaultSink::create();
    if (!f) return std::move(f).error();
    faults_ = std::move(*f);
    VRDMA_TRY(loop_.add(faults_->fd(), EPOLLIN, [this](std::uint32_t) { on_guest_fault(); }));
  }
  if (!failed_) {
    failed_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!failed_) return errno_error(errno, "eventfd for session failures");
    VRDMA_TRY(loop_.add(failed_.get(), EPOLLIN, [this](std::uint32_t) { on_failure(); }));
  }
  failure_.clear();
  conn_ = std::make_unique<BackendConn>(std::move(*c));
  want_out_ = false;
  armed_ns_ = -1;
  session_ = std::make_unique<BackendSession>(dev_, loop_, opts_, stats_, faults_, [this](std::string why) {
    if (failure_.empty()) failure_ = std::move(why);
    const std::uint64_t one = 1;
    [[maybe_unused]] auto w = ::write(failed_.get(), &one, sizeof one);
  });
  ++stats_.connections;
  auto st = loop_.add(conn_->fd(), EPOLLIN, [this](std::uint32_t ev) { on_io(ev); });
  if (st.ok() && !loop_.watching(deadline_.get()))
    st = loop_.add(deadline_.get(), EPOLLIN, [this](std::uint32_t) { on_deadline(); });
  if (!st.ok()) {
    loop_.remove(conn_->fd());
    session_.reset();
    conn_.reset();
    return st;
  }
  log::info("vhost-user frontend connected");
  return {};
}

void BackendServer::drop_session(const std::string& why) {
  log::warn("vhost-user frontend disconnected: {}", why);
  if (conn_) loop_.remove(conn_->fd());
  if (deadline_) {
    loop_.remove(deadline_.get());
    const itimerspec off{};
    ::timerfd_settime(deadline_.get(), 0, &off, nullptr);
  }
  session_.reset();  // stops every ring and resets the device
  conn_.reset();
}

void BackendServer::on_io(std::uint32_t events) {
  if ((events & EPOLLOUT) != 0) {
    if (auto st = conn_->flush(); !st.ok()) return drop_session(st.error().message);
    watch_output();
  }
  if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) == 0) return;
  // A bounded number of messages per wake-up: a frontend that floods the socket waits its turn
  // behind the loop's other fds (epoll is level-triggered: what is left wakes us again).
  for (unsigned n = 0; n < opts_.messages_per_wake; ++n) {
    auto msg = conn_->read();
    if (!msg) return drop_session(msg.error().message);
    if (!msg->has_value()) break;
    if (!handle(**msg)) return;
  }
  if (conn_->mid_message()) {
    const auto started = conn_->message_started();
    const auto limit = std::chrono::milliseconds(opts_.message_deadline_ms);
    if (BackendConn::Clock::now() - started >= limit) return on_deadline();
    if (armed_ns_ != ns_of(started)) {
      // Armed once per message, at its first byte plus the deadline (steady_clock is
      // CLOCK_MONOTONIC): later bytes do not move it.
      const std::int64_t at = ns_of(started + limit);
      const itimerspec when{{0, 0}, {at / 1'000'000'000, at % 1'000'000'000}};
      if (::timerfd_settime(deadline_.get(), TFD_TIMER_ABSTIME, &when, nullptr) == 0) armed_ns_ = ns_of(started);
    }
  }
}

void BackendServer::on_deadline() {
  std::uint64_t n;
  [[maybe_unused]] auto r = ::read(deadline_.get(), &n, sizeof n);
  if (!conn_ || !conn_->mid_message()) return;
  const auto started = conn_->message_started();
  const auto took = BackendConn::Clock::now() - started;
  const auto limit = std::chrono::milliseconds(opts_.message_deadline_ms);
  if (took < limit) return;  // a newer message; on_io armed the timer for it
  ++stats_.dropped_slow;
  const auto expected = conn_->message_bytes_expected();
  drop_session(fmt::format(
      "it sent {} of a message's {} bytes in {} ms; a message must arrive whole within {} ms of its first byte",
      conn_->message_bytes_read(), expected == 0 ? std::string("12 or more") : std::to_string(expected),
      std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), opts_.message_deadline_ms));
}

void BackendServer::on_guest_fault() {
  const auto f = faults_->take();
  if (f.faults == 0) return;
  stats_.guest_faults += f.faults;
  const auto what = f.what != nullptr ? f.what : "guest memory";
  if (!session_) {
    log::error("vhost-user: {} at host address {:#x} went away after its frontend left ({} SIGBUS absorbed)", what,
               f.addr, f.faults);
    return;
  }
  drop_session(fmt::format("{} at host address {:#x} went away under the backend (SIGBUS, {} absorbed): its file was "
                           "shrunk after it was mapped, or could not supply the page; this frontend's device fails",
                           what, f.addr, f.faults));
}

void BackendServer::on_failure() {
  std::uint64_t n;
  [[maybe_unused]] auto r = ::read(failed_.get(), &n, sizeof n);
  if (session_ && !failure_.empty()) drop_session(std::exchange(failure_, std::string()));
}

bool BackendServer::send(Message m) {
  if (auto st = conn_->send(std::move(m)); !st.ok()) {
    if (st.error().is(Errc::limit_exceeded)) ++stats_.dropped_backlog;
    drop_session(st.error().message);
    return false;
  }
  watch_output();
  return true;
}

void BackendServer::watch_output() {
  const bool want = conn_->has_queued();
  if (want == want_out_) return;
  if (loop_.modify(conn_->fd(), want ? EPOLLIN | EPOLLOUT : EPOLLIN).ok()) want_out_ = want;
}

bool BackendServer::handle(Message& m) {
  ++stats_.messages;
  const MessageSpec* spec = find_spec(m.hdr.request);
  const bool ack = session_->acked_protocol().has(ProtocolFeature::reply_ack) && m.need_reply();
  auto fail = [&](const Error& e) {
    ++stats_.rejected;
    log::error("{}", e.message);
    if (spec != nullptr && spec->reply == ReplyRule::always) {
      // The frontend waits for an answer we cannot give; closing is the only clear signal.
      drop_session(fmt::format("could not answer {}", spec->name));
      return false;
    }
    if (ack) {
      Message r = make_reply(m);
      r.set(std::uint64_t{1});
      return send(std::move(r));
    }
    return true;
  };
  if (auto st = validate_request(m, session_->acked_protocol()); !st.ok()) return fail(st.error());
  log::debug("vhost-user {} ({} bytes, {} fds)", spec->name, m.hdr.size, m.fds.size());
  auto reply = session_->handle(m);
  if (!reply) return fail(reply.error());
  if (reply->has_value()) return send(std::move(**reply));
  if (ack) {
    Message r = make_reply(m);
    r.set(std::uint64_t{0});
    return send(std::move(r));
  }
  return true;
}

}  // namespace vrdma::vhost
