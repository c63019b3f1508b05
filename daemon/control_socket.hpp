// vrdmad's JSON control socket (--control PATH): each connection sends one request line and gets
// one JSON line back (vrdmad.cpp says which requests there are).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"
#include "vrdma/vhost/event_loop.hpp"

namespace vrdma::vrdmad {

// A listening UNIX socket at `path`, non-blocking; bound under a temporary name and renamed once
// listening, so that whoever sees `path` can connect. A live socket at `path` is refused.
Result<UniqueFd> listen_unix(const std::string& path);

// The control socket's connections, served on the event loop without ever blocking it (the
// rule of docs/vhost.md "What a frontend cannot do to the event loop", for whoever can reach this
// socket): each is non-blocking, its request line read as bytes arrive and handed to the handler
// once whole (a newline, the client's shutdown, a whole JSON value, or 4 KiB); at most 64 at once
// (a 65th closes the oldest still sending its request, or the oldest of all); one whose line is
// not whole 1 s after it connected is closed. The handler answers through `Reply`, at once or
// later (a migration answers once the destination accepted the guest): the connection waits for
// it up to 30 s, and a reply to a connection that is gone meanwhile is dropped.
class ControlConnections {
 public:
  // Called at most once, on the loop thread; safe to call after the connection or this object
  // is gone (it does nothing then).
  using Reply = std::function<void(const std::string& out)>;
  using Handler = std::function<void(const std::string& line, Reply reply)>;
  ControlConnections(vhost::EventLoop& loop, int listener, Handler handler)
      : loop_(loop), listener_(listener), handler_(std::move(handler)) {}
  ~ControlConnections();
  ControlConnections(const ControlConnections&) = delete;
  ControlConnections& operator=(const ControlConnections&) = delete;

  // Watches the listener and the deadline timer on the loop.
  Status start();

 private:
  static constexpr std::size_t kMaxConns = 64, kMaxLine = 4096;
  static constexpr auto kDeadline = std::chrono::seconds(1);
  static constexpr auto kAnswerDeadline = std::chrono::seconds(30);
  struct Conn {
    UniqueFd fd;
    std::string in;
    std::chrono::steady_clock::time_point since;
    std::uint64_t order;
    bool answering = false;  // the request is whole and with the handler
  };

  void on_accept();
  void on_read(int fd, std::uint32_t ev);
  void on_timer();
  void answer(int fd, std::uint64_t order, const std::string& out);
  void close(int fd);
  void arm(bool on);

  vhost::EventLoop& loop_;
  int listener_;
  Handler handler_;
  UniqueFd timer_;
  std::map<int, Conn> conns_;
  std::uint64_t order_ = 0;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);  // a Reply outliving this sees it expire
};

}  // namespace vrdma::vrdmad
