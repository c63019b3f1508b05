// A vhost-user connection: one UNIX stream socket, messages with SCM_RIGHTS fds.
// Not thread-safe; one owner thread at a time.
#pragma once

#include <string>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"
#include "vrdma/vhost/message.hpp"

namespace vrdma::vhost {

class Channel {
 public:
  Channel() = default;
  explicit Channel(UniqueFd sock) : sock_(std::move(sock)) {}

  // Connects to a listening vhost-user socket.
  static Result<Channel> connect(const std::string& path);

  // Receives one message. A payload larger than kMaxPayload, more than kMaxFds fds, a short
  // read or EOF is an error (the stream cannot be resynchronised: close the connection). Fds
  // received are owned by the returned message, and closed on every error path. Reads that
  // stall longer than the socket's receive timeout fail with Errc::timeout.
  Result<Message> recv();
  // Sends one message with m.fds as SCM_RIGHTS (the fds stay owned by m).
  Status send(const Message& m);
  // Sends raw bytes and fds (for tests of malformed input).
  Status send_raw(const void* data, std::size_t len, const int* fds, std::size_t nfds);

  // Bounds how long recv() may block in the middle of a message.
  Status set_recv_timeout_ms(int ms);

  [[nodiscard]] int fd() const { return sock_.get(); }
  [[nodiscard]] bool valid() const { return sock_.valid(); }
  void close() { sock_.reset(); }

 private:
  UniqueFd sock_;
};

// Makes `path` free for a new listening socket: nothing there, or a socket file nobody listens
// on any more (a backend that died left it), which is removed. Errors: busy when a process of this
// network namespace listens on it (a second backend for the same device would steal its guest),
// invalid_argument when something that is not a socket is there (never removed).
Status claim_socket_path(const std::string& path);

// Creates a listening UNIX socket at path, claimed first (claim_socket_path).
Result<UniqueFd> listen_unix(const std::string& path, int backlog = 4);

}  // namespace vrdma::vhost
