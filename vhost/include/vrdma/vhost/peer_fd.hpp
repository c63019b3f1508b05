// Checks on the file descriptors a vhost-user frontend hands the backend. The frontend is
// untrusted (a compromised QEMU, or anything that can reach the socket), and the backend's event
// loop must never block or spin on an fd the frontend controls: docs/vhost.md "What a frontend
// cannot do to the event loop" has the rule for each fd.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string_view>

#include "vrdma/common/result.hpp"

namespace vrdma::vhost {

// What the backend does with an eventfd: reads it (kick), or writes it (call, err).
enum class EventfdUse { read, write };

// Checks that `fd` is an eventfd (/proc/self/fd names it anon_inode:[eventfd]; a pipe, socket,
// file or other anonymous inode is refused), refuses a semaphore eventfd (EFD_SEMAPHORE) the
// backend would read (each read takes one count, so one kick could never be drained), and makes
// the fd non-blocking. O_NONBLOCK is a flag of the open file description, which the frontend
// shares: QEMU and our frontend create their eventfds non-blocking already, and a frontend
// that waits with poll() is not affected. `what` ("SET_VRING_KICK") starts the error sentence.
Status check_eventfd(int fd, std::string_view what, EventfdUse use);

// Whether the eventfd `fd` counts as a semaphore. Read from /proc/self/fdinfo where the kernel
// shows it ("eventfd-semaphore:", Linux 6.3 on); elsewhere (or with `force_probe`) by a probe
// on the fd itself: read it (a semaphore gives 1 and keeps the rest), add 2 and read again (a
// semaphore gives 1, a plain eventfd everything). The probe consumes pending kicks; the caller
// processes the ring afterwards anyway.
Result<bool> is_semaphore_eventfd(int fd, bool force_probe = false);

// One read or write on a frontend's fd that cannot hold the calling thread for long. The fd
// was made non-blocking, but O_NONBLOCK is a flag of the description the frontend shares, and
// it can clear it again (and then fill the eventfd, or drain it under us). So: a read is tried
// with RWF_NOWAIT first (never blocks, whatever the flag, where the file supports it: eventfds
// and pipes on Linux 5.12 on); otherwise the call runs under a watchdog thread that interrupts
// it after kPeerIoLimit. The result is read()/write()'s; an interrupted call returns -1 with
// errno ETIMEDOUT (the frontend is hostile: its fd blocked us although we made it non-blocking).
inline constexpr std::chrono::milliseconds kPeerIoLimit{50};
ssize_t peer_read(int fd, void* buf, std::size_t len);
ssize_t peer_write(int fd, const void* buf, std::size_t len);

}  // namespace vrdma::vhost
