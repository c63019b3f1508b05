#include "vrdma/vhost/event_loop.hpp"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

namespace vrdma::vhost {
namespace {
constexpr std::uint64_t kWakeToken = 0;
}

Result<EventLoop> EventLoop::create() {
  EventLoop l;
  l.ep_ = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  if (!l.ep_) return errno_error(errno, "epoll_create1");
  l.wake_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!l.wake_) return errno_error(errno, "eventfd for the event loop");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeToken;
  if (::epoll_ctl(l.ep_.get(), EPOLL_CTL_ADD, l.wake_.get(), &ev) != 0) return errno_error(errno, "epoll_ctl(wake)");
  return l;
}

Status EventLoop::add(int fd, std::uint32_t events, Callback cb) {
  if (by_fd_.count(fd) != 0) return make_error(Errc::busy, "fd is already watched by the event loop");
  const std::uint64_t token = next_token_++;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  if (::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return errno_error(errno, "epoll_ctl(ADD)");
  by_token_.emplace(token, Entry{fd, std::move(cb)});
  by_fd_.emplace(fd, token);
  return {};
}

Status EventLoop::modify(int fd, std::uint32_t events) {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return make_error(Errc::not_found, "fd is not watched by the event loop");
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = it->second;
  if (::epoll_ctl(ep_.get(), EPOLL_CTL_MOD, fd, &ev) != 0) return errno_error(errno, "epoll_ctl(MOD)");
  return {};
}

void EventLoop::remove(int fd) noexcept {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return;
  ::epoll_ctl(ep_.get(), EPOLL_CTL_DEL, fd, nullptr);
  by_token_.erase(it->second);
  by_fd_.erase(it);
}

Result<int> EventLoop::run_once(int timeout_ms) {
  epoll_event evs[32];
  const int n = ::epoll_wait(ep_.get(), evs, 32, timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return 0;
    return errno_error(errno, "epoll_wait");
  }
  int ran = 0;
  for (int i = 0; i < n; ++i) {
    // Copies, never references: epoll_event is packed on x86-64 (its u64 sits at offset 4), so a
    // reference to evs[i].data.u64 (what unordered_map::find(const key&) would bind) is
    // misaligned, undefined behaviour that UBSan reports on the first event.
    const std::uint64_t token = evs[i].data.u64;
    const std::uint32_t events = evs[i].events;
    if (token == kWakeToken) {
      std::uint64_t v;
      while (::read(wake_.get(), &v, sizeof v) > 0) {
      }
      continue;
    }
    auto it = by_token_.find(token);
    if (it == by_token_.end()) continue;  // removed by an earlier callback in this batch
    Callback cb = it->second.cb;          // the callback may remove itself
    cb(events);
    ++ran;
  }
  return ran;
}

Status EventLoop::run() {
  stopping_->store(false);
  while (!stopping_->load()) {
    auto r = run_once(-1);
    if (!r) return std::move(r).error();
  }
  return {};
}

Status EventLoop::run_polling(std::chrono::microseconds window, const std::function<bool()>& poll,
                              const std::function<void()>& idle) {
  using Clock = std::chrono::steady_clock;
  stopping_->store(false);
  bool polling = false;
  auto last_work = Clock::now();
  // While polling, the file descriptors (vhost-user messages, control requests, timers) are
  // looked at every 16th round only, not with a system call on every message's way through.
  constexpr unsigned kRoundsPerWait = 16;
  unsigned rounds = 0;
  while (!stopping_->load()) {
    if (!polling || ++rounds >= kRoundsPerWait) {
      rounds = 0;
      auto r = run_once(polling ? 0 : -1);
      if (!r) return std::move(r).error();
      if (*r > 0) {
        polling = true;
        last_work = Clock::now();
      }
      if (!polling) continue;
    }
    if (poll()) {
      last_work = Clock::now();
    } else if (Clock::now() - last_work >= window) {
      idle();
      polling = false;
      continue;
    }
    // After every round, work or none: whoever shares this core (most likely the application
    // waiting for the completion just written, or the engine's thread) runs first.
    ::sched_yield();
  }
  return {};
}

void EventLoop::stop() noexcept {
  stopping_->store(true);
  const std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_.get(), &one, sizeof one);
}

}  // namespace vrdma::vhost
