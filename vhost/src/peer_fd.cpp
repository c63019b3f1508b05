#include "vrdma/vhost/peer_fd.hpp"

#include "vrdma/vhost/message.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace vrdma::vhost {
namespace {

// What /proc/self/fd says the fd is ("anon_inode:[eventfd]", "pipe:[123]", "/memfd:x (deleted)").
Result<std::string> fd_target(int fd) {
  char link[64];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  char buf[256];
  const ssize_t n = ::readlink(link, buf, sizeof buf - 1);
  if (n < 0) return errno_error(errno, fmt::format("readlink {}", link));
  return std::string(buf, static_cast<std::size_t>(n));
}

// ---- The watchdog of peer_read/peer_write -------------------------------------------------
// Each thread that makes a guarded call has a slot; the watchdog thread (started with the first
// guarded call, 40 looks a second) signals a thread whose call has lasted longer than the limit.
// The signal's handler does nothing and is installed without SA_RESTART, so the blocked call
// returns EINTR. A thread's slot lives as long as the thread.
struct Slot {
  std::atomic<std::int64_t> since_ns{0};  // 0: not in a guarded call
  std::atomic<bool> fired{false};
  pthread_t tid{};
};
std::mutex g_slots_mu;
std::vector<Slot*>* g_slots = nullptr;
std::once_flag g_watchdog;

int interrupt_signal() { return SIGRTMIN + 4; }

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void start_watchdog() {
  std::call_once(g_watchdog, [] {
    g_slots = new std::vector<Slot*>();  // lives as long as the process
    struct sigaction sa {};
    sa.sa_handler = [](int) {};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: the blocked call must return
    ::sigaction(interrupt_signal(), &sa, nullptr);
    std::thread([] {
      const std::int64_t limit = std::chrono::duration_cast<std::chrono::nanoseconds>(kPeerIoLimit).count();
      for (;;) {
        std::this_thread::sleep_for(kPeerIoLimit / 2);
        const std::int64_t now = now_ns();
        std::lock_guard g(g_slots_mu);
        for (Slot* s : *g_slots) {
          const std::int64_t since = s->since_ns.load(std::memory_order_acquire);
          if (since != 0 && now - since > limit && !s->fired.exchange(true)) ::pthread_kill(s->tid, interrupt_signal());
        }
      }
    }).detach();
  });
}

struct SlotOwner {
  Slot slot;
  SlotOwner() {
    start_watchdog();
    slot.tid = ::pthread_self();
    std::lock_guard g(g_slots_mu);
    g_slots->push_back(&slot);
  }
  ~SlotOwner() {
    std::lock_guard g(g_slots_mu);
    std::erase(*g_slots, &slot);
  }
};

template <class F>
ssize_t guarded(F&& call) {
  thread_local SlotOwner owner;
  Slot& s = owner.slot;
  s.fired.store(false, std::memory_order_relaxed);
  s.since_ns.store(now_ns(), std::memory_order_release);
  ssize_t r = call();
  const int err = errno;
  s.since_ns.store(0, std::memory_order_release);
  if (s.fired.exchange(false)) {
    if (r < 0 && err == EINTR) {
      errno = ETIMEDOUT;
      return -1;
    }
  }
  errno = err;
  return r;
}

}  // namespace

ssize_t peer_read(int fd, void* buf, std::size_t len) {
  iovec iov{buf, len};
  const ssize_t r = ::preadv2(fd, &iov, 1, -1, RWF_NOWAIT);
  if (r >= 0 || (errno != EOPNOTSUPP && errno != EINVAL)) return r;
  return guarded([&] { return ::read(fd, buf, len); });
}

ssize_t peer_write(int fd, const void* buf, std::size_t len) {
  // An eventfd has no non-blocking write of its own (no RWF_NOWAIT): always guarded.
  return guarded([&] { return ::write(fd, buf, len); });
}

Result<bool> is_semaphore_eventfd(int fd, bool force_probe) {
  if (!force_probe) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    if (std::FILE* f = std::fopen(path, "re")) {
      char line[128];
      int found = -1;
      while (std::fgets(line, sizeof line, f) != nullptr) {
        unsigned v = 0;
        if (std::sscanf(line, "eventfd-semaphore: %u", &v) == 1) found = v != 0 ? 1 : 0;
      }
      std::fclose(f);
      if (found >= 0) return found == 1;
    }
  }
  // The probe (the fd is non-blocking here). A semaphore read always yields 1.
  std::uint64_t v = 0;
  ssize_t r = peer_read(fd, &v, sizeof v);
  if (r == sizeof v && v >= 2) return false;
  if (r < 0 && errno != EAGAIN) return errno_error(errno, "reading an eventfd");
  const std::uint64_t two = 2;
  if (peer_write(fd, &two, sizeof two) != static_cast<ssize_t>(sizeof two)) {
    // Only a counter at its maximum refuses 2, and a plain eventfd was emptied by the read above.
    if (errno == EAGAIN) return true;
    return errno_error(errno, "writing an eventfd");
  }
  r = peer_read(fd, &v, sizeof v);
  if (r != sizeof v) return errno_error(errno, "reading an eventfd");
  return v == 1;
}

Status check_eventfd(int fd, std::string_view what, EventfdUse use) {
  auto target = fd_target(fd);
  if (!target)
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: cannot tell what kind of file its fd is ({})", what, target.error().message));
  if (*target != "anon_inode:[eventfd]")
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: its fd is {}, not an eventfd; refused (the backend would block or spin on it)",
                                  what, *target));
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ((fl & O_NONBLOCK) == 0 && ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0))
    return errno_error(errno, fmt::format("{}: making its eventfd non-blocking", what));
  if (use == EventfdUse::read) {
    auto sem = is_semaphore_eventfd(fd);
    if (!sem) return prefixed(fmt::format("{}: ", what), sem.error());
    if (*sem)
      return make_error(Errc::invalid_argument,
                        fmt::format("{}: its eventfd is a semaphore (EFD_SEMAPHORE): each read takes one count, so "
                                    "its kicks could never be drained; refused",
                                    what));
  }
  return {};
}

}  // namespace vrdma::vhost
