// The vhost-user backend (device side): serves one frontend at a time on a UNIX socket and
// drives a Device.
//
// Threading model: everything runs on the EventLoop's thread: reading and dispatching
// messages, kick eventfds and the device's queue handling. So GET_VRING_BASE is handled
// between two queue callbacks, never during one: once its reply is sent, the ring is stopped
// and nothing writes to it (the vhost-user stop protocol). A memory-table change swaps the
// whole table between callbacks. When the frontend goes away (or breaks the protocol beyond
// repair) the session is dropped, the device is reset, and the server accepts the next
// connection (frontend reconnect; inflight tracking resumes the rings).
//
// Errors: each bad message is logged as one sentence. With REPLY_ACK and need_reply the
// frontend gets a non-zero ack and the session continues; a request that needs a reply and
// cannot get one, or a broken stream, closes the connection. The process stays up.
//
// The frontend cannot hold the event loop (docs/vhost.md "What a frontend cannot do to the
// event loop"): the connection is non-blocking; a message must be whole within
// message_deadline_ms of its first byte; replies the socket does not take at once are queued
// up to max_reply_backlog bytes; a frontend past either bound is disconnected with a sentence
// in the log; every fd it passes is checked for its kind and made non-blocking.
#pragma once

#include <memory>
#include <string>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"
#include "vrdma/vhost/channel.hpp"
#include "vrdma/vhost/device.hpp"
#include "vrdma/vhost/event_loop.hpp"
#include "vrdma/vhost/guest_fault.hpp"

namespace vrdma::vhost {

struct BackendOptions {
  bool packed = true;         // offer VIRTIO_F_RING_PACKED
  bool event_idx = true;      // offer VIRTIO_F_RING_EVENT_IDX
  bool indirect = true;       // offer VIRTIO_F_RING_INDIRECT_DESC
  bool inflight = true;       // offer VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD
  bool mem_slots = true;      // offer VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS
  // A message must arrive whole within this many ms of its first byte (not per read: a
  // frontend that drips bytes is held to the same bound), or the frontend is disconnected.
  int message_deadline_ms = 2000;
  // Replies waiting for a frontend that does not read them: past this many bytes it is
  // disconnected (a reply is at most 280 bytes; a batch of a few hundred fits).
  std::size_t max_reply_backlog = 64 * 1024;
  // Messages handled per wake-up of the event loop before the other fds get their turn.
  unsigned messages_per_wake = 32;
};

class BackendSession;
class BackendConn;

// Counters a test or operator can read (loop thread only).
struct BackendStats {
  std::uint64_t connections = 0;
  std::uint64_t messages = 0;
  std::uint64_t rejected = 0;  // messages refused with an error
  std::uint64_t kicks = 0;
  std::uint64_t dropped_slow = 0;       // frontends disconnected for a message not whole in time
  std::uint64_t dropped_backlog = 0;    // frontends disconnected for not reading their replies
  std::uint64_t calls_dropped = 0;      // call/err signals an eventfd at its maximum refused
  std::uint64_t guest_faults = 0;       // SIGBUS absorbed in guest mappings (each failed a frontend's device)
};

class BackendServer {
 public:
  // Listens on `path`; the device and loop must outlive the server.
  static Result<std::unique_ptr<BackendServer>> listen(const std::string& path, Device& dev, EventLoop& loop,
                                                       BackendOptions opts = {});
  // Serves an already-connected socket (socketpair tests, fuzzing); no listener.
  static Result<std::unique_ptr<BackendServer>> adopt(UniqueFd conn, Device& dev, EventLoop& loop,
                                                      BackendOptions opts = {});
  ~BackendServer();
  BackendServer(const BackendServer&) = delete;
  BackendServer& operator=(const BackendServer&) = delete;

  [[nodiscard]] const BackendStats& stats() const { return stats_; }
  [[nodiscard]] bool connected() const { return session_ != nullptr; }

 private:
  BackendServer(Device& dev, EventLoop& loop, BackendOptions opts);
  void on_accept();
  Status start_session(UniqueFd conn);
  void on_io(std::uint32_t events);
  void on_deadline();
  void on_guest_fault();
  void on_failure();
  // One whole message: validate, dispatch, reply. False when the session was dropped.
  bool handle(Message& m);
  bool send(Message m);
  void watch_output();
  void drop_session(const std::string& why);

  Device& dev_;
  EventLoop& loop_;
  BackendOptions opts_;
  UniqueFd listener_;
  std::unique_ptr<BackendConn> conn_;
  bool want_out_ = false;    // EPOLLOUT is being watched on the connection
  UniqueFd deadline_;        // timerfd: the message being read must be whole by then
  std::int64_t armed_ns_ = -1;  // the message start the timer is armed for
  std::shared_ptr<FaultSink> faults_;  // SIGBUS absorbed in this server's guest mappings
  UniqueFd failed_;          // eventfd: the session asked to be dropped (failure_ says why)
  std::string failure_;
  std::unique_ptr<BackendSession> session_;
  BackendStats stats_;
};

}  // namespace vrdma::vhost
