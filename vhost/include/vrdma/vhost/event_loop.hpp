// An epoll event loop.
//
// Threading model: one thread runs the loop (run() or run_once()); every callback runs on
// that thread, one at a time, so state touched only from callbacks needs no lock. add(),
// modify() and remove() must be called from the loop thread (or before it starts). stop() is
// the one call that is safe from any thread (it writes an eventfd). A callback may remove
// any fd, including its own; a removed fd's pending events are dropped.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <chrono>
#include <functional>
#include <unordered_map>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"

namespace vrdma::vhost {

class EventLoop {
 public:
  using Callback = std::function<void(std::uint32_t events)>;

  static Result<EventLoop> create();
  EventLoop(EventLoop&&) = default;
  EventLoop& operator=(EventLoop&&) = default;

  // Watches fd (not owned) for `events` (EPOLLIN...). One registration per fd.
  Status add(int fd, std::uint32_t events, Callback cb);
  Status modify(int fd, std::uint32_t events);
  void remove(int fd) noexcept;
  [[nodiscard]] bool watching(int fd) const { return by_fd_.count(fd) != 0; }

  // Waits up to timeout_ms (-1: forever) and dispatches what is ready. Returns the number of
  // callbacks run, or an error from epoll_wait.
  Result<int> run_once(int timeout_ms);
  // Runs until stop().
  Status run();
  // Runs until stop() like run(), but does not sleep while there is work: after an event, it
  // calls `poll` round after round (yielding the core after each, and looking at the file
  // descriptors without waiting every 16th) until `poll` has found nothing for `window`; then
  // `idle`, and a blocking wait again.
  Status run_polling(std::chrono::microseconds window, const std::function<bool()>& poll,
                     const std::function<void()>& idle);
  void stop() noexcept;

 private:
  EventLoop() = default;
  struct Entry {
    int fd;
    Callback cb;
  };
  UniqueFd ep_;
  UniqueFd wake_;
  std::unique_ptr<std::atomic<bool>> stopping_ = std::make_unique<std::atomic<bool>>(false);
  std::uint64_t next_token_ = 1;
  std::unordered_map<std::uint64_t, Entry> by_token_;
  std::unordered_map<int, std::uint64_t> by_fd_;
};

}  // namespace vrdma::vhost
