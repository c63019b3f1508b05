#include "vrdma/vhost/guest_fault.hpp"

#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>

namespace vrdma::vhost {
namespace {

struct Entry {
  std::uintptr_t end;
  const char* what;
  FaultSink* sink;  // kept alive by the GuardedMapping that registered the entry
};

// The guarded ranges, by start. Changed under the lock; read by the handler under it too.
std::map<std::uintptr_t, Entry>* g_table = nullptr;
std::atomic_flag g_lock = ATOMIC_FLAG_INIT;
std::atomic<std::uint64_t> g_absorbed{0};
struct sigaction g_previous {};
std::uintptr_t g_page = 4096;
std::once_flag g_installed;

void lock() noexcept {
  while (g_lock.test_and_set(std::memory_order_acquire)) {
  }
}
void unlock() noexcept { g_lock.clear(std::memory_order_release); }

void on_sigbus(int sig, siginfo_t* si, void* uc) {
  const int saved_errno = errno;
  // si_code > 0: the kernel raised it for an access (BUS_ADRERR and friends); <= 0 came from
  // kill() or sigqueue(), which no page replacement can answer.
  if (si != nullptr && si->si_code > 0 && g_table != nullptr) {
    const auto a = reinterpret_cast<std::uintptr_t>(si->si_addr);
    lock();
    auto it = g_table->upper_bound(a);
    if (it != g_table->begin()) {
      --it;
      if (a < it->second.end) {
        const std::uintptr_t page = a & ~(g_page - 1);
        // Under the lock: the range cannot be unregistered (and then unmapped and reused)
        // between the look-up and the replacement.
        void* p = ::mmap(reinterpret_cast<void*>(page), it->second.end - page, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        const Entry e = it->second;
        unlock();
        if (p != MAP_FAILED) {
          g_absorbed.fetch_add(1, std::memory_order_relaxed);
          e.sink->record(a, e.what);
          errno = saved_errno;
          return;  // the access is retried on the zero pages
        }
        lock();
      }
    }
    unlock();
  }
  // Not ours: whoever handled SIGBUS before us, or the default action.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, si, uc);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGBUS, &dfl, nullptr);
    // A fault is raised again when the access is retried; a sent signal is sent again here
    // (blocked until this handler returns, then the default action ends the process).
    if (si == nullptr || si->si_code <= 0) ::raise(sig);
  }
  errno = saved_errno;
}

void install() {
  std::call_once(g_installed, [] {
    g_table = new std::map<std::uintptr_t, Entry>();  // lives as long as the process
    const long ps = ::sysconf(_SC_PAGESIZE);
    if (ps > 0) g_page = static_cast<std::uintptr_t>(ps);
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous);
  });
}

}  // namespace

Result<std::shared_ptr<FaultSink>> FaultSink::create() {
  auto s = std::make_shared<FaultSink>();
  s->efd_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->efd_) return errno_error(errno, "eventfd for guest memory faults");
  return s;
}

void FaultSink::record(std::uintptr_t addr, const char* what) noexcept {
  if (faults_.fetch_add(1, std::memory_order_acq_rel) == 0) {
    addr_.store(addr, std::memory_order_relaxed);
    what_.store(what, std::memory_order_release);
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] auto w = ::write(efd_.get(), &one, sizeof one);  // async-signal-safe
}

FaultSink::Report FaultSink::take() {
  std::uint64_t n;
  [[maybe_unused]] auto r = ::read(efd_.get(), &n, sizeof n);
  Report rep;
  rep.what = what_.load(std::memory_order_acquire);
  rep.addr = addr_.load(std::memory_order_relaxed);
  rep.faults = faults_.exchange(0, std::memory_order_acq_rel);
  return rep;
}

GuardedMapping::GuardedMapping(void* addr, std::size_t len, const char* what, std::shared_ptr<FaultSink> sink) {
  if (sink == nullptr || addr == nullptr || len == 0) return;
  install();
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  Entry e{a + len, what, sink.get()};
  lock();
  const bool fresh = g_table->emplace(a, e).second;
  unlock();
  if (!fresh) return;  // already guarded (by its first registration)
  start_ = a;
  sink_ = std::move(sink);
}

GuardedMapping::GuardedMapping(GuardedMapping&& o) noexcept
    : start_(std::exchange(o.start_, 0)), sink_(std::move(o.sink_)) {}

GuardedMapping& GuardedMapping::operator=(GuardedMapping&& o) noexcept {
  if (this != &o) {
    reset();
    start_ = std::exchange(o.start_, 0);
    sink_ = std::move(o.sink_);
  }
  return *this;
}

void GuardedMapping::reset() noexcept {
  if (start_ == 0) return;
  lock();
  g_table->erase(start_);
  unlock();
  start_ = 0;
  sink_.reset();
}

std::uint64_t guest_faults_absorbed() noexcept { return g_absorbed.load(std::memory_order_relaxed); }

}  // namespace vrdma::vhost
