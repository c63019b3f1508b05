// Surviving guest memory that goes away under the backend.
//
// The backend maps files the frontend passed (guest RAM, the dirty log, the inflight area) and
// the RDMA device maps guest pages a second time for memory regions. When such a file is
// shrunk after it was mapped (a frontend can ftruncate a memfd it did not seal), or cannot
// supply a page (a full tmpfs, an empty huge page pool), the next access to a missing page raises
// SIGBUS, on whichever thread touched it: the event loop's (rings, commands, the dirty log) or
// an engine's (RDMA data into and out of registered memory). Unhandled, that ends the process.
//
// A GuardedMapping registers a mapping's address range. The process-wide SIGBUS handler
// (installed with the first registration) looks the faulting address up; inside a guarded
// range it replaces the rest of that range, from the faulting page on, with private zero pages
// (so the access, retried, completes, and every later one too), counts the fault in the
// mapping's FaultSink and writes the sink's eventfd. The sink's owner (the vhost-user server)
// sees the eventfd on its event loop and fails that frontend's device with a sentence. A
// SIGBUS anywhere else, or one sent with kill(), goes on to the handler that was there before,
// or to the default action (the process ends, as it would have without this).
//
// Threads: GuardedMapping is created and destroyed on any thread (a spin lock guards the table;
// the handler takes it too, and nothing holding it touches guest memory). A mapping must be
// unregistered (its GuardedMapping destroyed) before it is unmapped: declare it after the
// mapping's owner (MmapArea) so it goes first.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"

namespace vrdma::vhost {

class FaultSink {
 public:
  static Result<std::shared_ptr<FaultSink>> create();
  // Readable (EPOLLIN) after a fault was absorbed.
  [[nodiscard]] int fd() const { return efd_.get(); }

  struct Report {
    std::uint64_t faults = 0;    // absorbed since the last take()
    std::uintptr_t addr = 0;     // the first of them: its address
    const char* what = nullptr;  // and the guarded mapping's name
  };
  // What was absorbed since the last call; empties the eventfd.
  Report take();

  // Signal-handler side (async-signal-safe): records one fault.
  void record(std::uintptr_t addr, const char* what) noexcept;

 private:
  UniqueFd efd_;
  std::atomic<std::uint64_t> faults_{0};
  std::atomic<std::uintptr_t> addr_{0};
  std::atomic<const char*> what_{nullptr};
};

class GuardedMapping {
 public:
  GuardedMapping() = default;
  // Guards [addr, addr + len). `what` (a string literal) names it in the report. No-op without
  // a sink.
  GuardedMapping(void* addr, std::size_t len, const char* what, std::shared_ptr<FaultSink> sink);
  ~GuardedMapping() { reset(); }
  GuardedMapping(GuardedMapping&& o) noexcept;
  GuardedMapping& operator=(GuardedMapping&& o) noexcept;
  GuardedMapping(const GuardedMapping&) = delete;
  GuardedMapping& operator=(const GuardedMapping&) = delete;

  void reset() noexcept;
  [[nodiscard]] bool active() const { return start_ != 0; }
  [[nodiscard]] const std::shared_ptr<FaultSink>& sink() const { return sink_; }

 private:
  std::uintptr_t start_ = 0;
  std::shared_ptr<FaultSink> sink_;
};

// Faults absorbed in this process since it started (all sinks).
std::uint64_t guest_faults_absorbed() noexcept;

}  // namespace vrdma::vhost
