// Backend server: accepts a frontend, reads and validates messages, dispatches, replies.
#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>

#include "backend_session.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::vhost {

BackendServer::BackendServer(Device& dev, EventLoop& loop, BackendOptions opts)
    : dev_(dev), loop_(loop), opts_(opts) {}

BackendServer::~BackendServer() {
  if (chan_.valid()) loop_.remove(chan_.fd());
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
  UniqueFd c(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
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
  chan_ = Channel(std::move(conn));
  VRDMA_TRY(chan_.set_recv_timeout_ms(opts_.recv_timeout_ms));
  session_ = std::make_unique<BackendSession>(dev_, loop_, opts_, stats_);
  ++stats_.connections;
  auto st = loop_.add(chan_.fd(), EPOLLIN, [this](std::uint32_t) { on_message(); });
  if (!st.ok()) {
    session_.reset();
    chan_.close();
    return st;
  }
  log::info("vhost-user frontend connected");
  return {};
}

void BackendServer::drop_session(const std::string& why) {
  log::warn("vhost-user frontend disconnected: {}", why);
  if (chan_.valid()) loop_.remove(chan_.fd());
  session_.reset();  // stops every ring and resets the device
  chan_.close();
}

void BackendServer::on_message() {
  auto msg = chan_.recv();
  if (!msg) return drop_session(msg.error().message);
  ++stats_.messages;
  Message& m = *msg;
  const MessageSpec* spec = find_spec(m.hdr.request);
  const bool ack = session_->acked_protocol().has(ProtocolFeature::reply_ack) && m.need_reply();
  auto fail = [&](const Error& e) {
    ++stats_.rejected;
    log::error("{}", e.message);
    if (spec != nullptr && spec->reply == ReplyRule::always) {
      // The frontend waits for an answer we cannot give; closing is the only clear signal.
      return drop_session(fmt::format("could not answer {}", spec->name));
    }
    if (ack) {
      Message r = make_reply(m);
      r.set(std::uint64_t{1});
      if (auto st = chan_.send(r); !st.ok()) drop_session(st.error().message);
    }
  };
  if (auto st = validate_request(m, session_->acked_protocol()); !st.ok()) return fail(st.error());
  log::debug("vhost-user {} ({} bytes, {} fds)", spec->name, m.hdr.size, m.fds.size());
  auto reply = session_->handle(m);
  if (!reply) return fail(reply.error());
  if (reply->has_value()) {
    if (auto st = chan_.send(**reply); !st.ok()) return drop_session(st.error().message);
  } else if (ack) {
    Message r = make_reply(m);
    r.set(std::uint64_t{0});
    if (auto st = chan_.send(r); !st.ok()) return drop_session(st.error().message);
  }
}

}  // namespace vrdma::vhost
