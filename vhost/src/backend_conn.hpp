// The backend's end of one vhost-user connection, driven by the event loop (private to vhost/).
// It never blocks on the frontend: the socket is non-blocking; a message is read piece by piece
// as bytes arrive and must be whole within a deadline counted from its first byte (not per
// read); replies are sent at once when the socket takes them and queued otherwise, up to a
// bound. docs/vhost.md "What a frontend cannot do to the event loop".
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"
#include "vrdma/vhost/message.hpp"

namespace vrdma::vhost {

class BackendConn {
 public:
  using Clock = std::chrono::steady_clock;

  BackendConn() = default;
  // Takes the connected socket and makes it non-blocking. `max_queued_bytes` bounds the replies
  // waiting for a frontend that does not read them.
  static Result<BackendConn> adopt(UniqueFd sock, std::size_t max_queued_bytes);

  // Reads toward the next message without blocking: the whole message once its last byte is
  // in, nullopt while bytes are still missing, or an error after which the stream cannot go on
  // (EOF, too large, too many fds). Fds that came with the message belong to it and are closed
  // on every error path.
  Result<std::optional<Message>> read();
  // Some bytes of a message have arrived, not all; since when.
  [[nodiscard]] bool mid_message() const { return have_ > 0; }
  [[nodiscard]] Clock::time_point message_started() const { return started_; }
  [[nodiscard]] std::size_t message_bytes_read() const { return have_; }
  // The whole message's size once its header is in (0 before).
  [[nodiscard]] std::size_t message_bytes_expected() const {
    return have_ >= sizeof(Header) ? sizeof(Header) + msg_.hdr.size : 0;
  }

  // Sends m (its fds with its first byte) as far as the socket takes it now and queues the
  // rest, after anything queued before. Error when the queue would pass its bound (the frontend
  // does not read its replies) or the socket failed.
  Status send(Message m);
  // Sends what is queued as far as the socket takes it (on EPOLLOUT).
  Status flush();
  [[nodiscard]] bool has_queued() const { return !out_.empty(); }
  [[nodiscard]] std::size_t queued_bytes() const { return queued_; }

  [[nodiscard]] int fd() const { return sock_.get(); }
  [[nodiscard]] bool valid() const { return sock_.valid(); }

 private:
  struct Out {
    std::vector<std::uint8_t> bytes;
    std::vector<UniqueFd> fds;  // go with the first byte; empty once that is sent
    std::size_t off = 0;
  };
  // One sendmsg of o's rest: bytes sent, 0 when the socket is full.
  Result<std::size_t> send_some(Out& o);

  UniqueFd sock_;
  std::size_t max_queued_ = 0;
  // The message being read.
  Message msg_;
  std::size_t have_ = 0;  // bytes of msg_ read (header first, then payload)
  Clock::time_point started_{};
  // Replies the socket has not taken yet.
  std::deque<Out> out_;
  std::size_t queued_ = 0;
};

}  // namespace vrdma::vhost
