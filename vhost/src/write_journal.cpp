#include "vrdma/vhost/write_journal.hpp"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "vrdma/common/log.hpp"

namespace vrdma::vhost::journal {
namespace {

class Journal {
 public:
  explicit Journal(int fd) : fd_(fd) { buf_.reserve(kBuffer); }

  void add(Record r) noexcept {
    std::lock_guard lock(mu_);
    if (r.type == static_cast<std::uint8_t>(Type::write) && stopped()) r.flags |= kAfterStop;
    buf_.push_back(r);
    if (buf_.size() >= kBuffer || (r.flags & kAfterStop) != 0) flush_locked();
  }
  void ring(std::uint16_t index, bool started) noexcept {
    std::lock_guard lock(mu_);
    const std::uint64_t bit = std::uint64_t{1} << (index % 64);
    running_ = started ? (running_ | bit) : (running_ & ~bit);
    if (started) ran_ = true;
    buf_.push_back(stamp(Type::event, static_cast<std::uint8_t>(started ? Event::ring_started : Event::ring_stopped),
                         index, 0, 0, 0));
    if (stopped()) flush_locked();
  }
  void flush() noexcept {
    std::lock_guard lock(mu_);
    flush_locked();
  }
  ~Journal() {
    flush();
    ::close(fd_);
  }

  static Record stamp(Type t, std::uint8_t kind, std::uint32_t id, std::uint64_t gpa, std::uint64_t len,
                      std::uint64_t aux) noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    Record r{};
    r.t_ns = static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
    r.gpa = gpa;
    r.len = len;
    r.aux = aux;
    r.type = static_cast<std::uint8_t>(t);
    r.kind = kind;
    r.id = id;
    return r;
  }

 private:
  static constexpr std::size_t kBuffer = 4096;
  // No ring runs, and one did before: the frontend stopped the device (GET_VRING_BASE on every
  // ring), and its last pass over the dirty log may already have been made.
  [[nodiscard]] bool stopped() const { return ran_ && running_ == 0; }
  void flush_locked() noexcept {
    const auto* p = reinterpret_cast<const char*>(buf_.data());
    std::size_t left = buf_.size() * sizeof(Record);
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (!failed_) log::error("write journal: cannot write it: {}; it stops here", std::strerror(errno));
        failed_ = true;
        break;
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    buf_.clear();
  }

  std::mutex mu_;
  int fd_;
  std::vector<Record> buf_;
  std::uint64_t running_ = 0;
  bool ran_ = false;
  bool failed_ = false;
};

Journal* open_from_environment() {
  const char* v = std::getenv("VRDMA_WRITE_JOURNAL");
  if (v == nullptr || *v == '\0') return nullptr;
  std::string path(v);
  for (auto at = path.find("%p"); at != std::string::npos; at = path.find("%p"))
    path.replace(at, 2, std::to_string(::getpid()));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    log::error("write journal: cannot open {}: {}; no journal is kept", path, std::strerror(errno));
    return nullptr;
  }
  log::info("write journal: every write into guest memory is recorded in {}", path);
  static Journal j(fd);  // flushed and closed at exit
  j.add(Journal::stamp(Type::event, static_cast<std::uint8_t>(Event::opened), 0, static_cast<std::uint64_t>(::getpid()),
                       0, 0));
  return &j;
}

Journal* instance() noexcept {
  static Journal* const j = open_from_environment();
  return j;
}

}  // namespace

bool enabled() noexcept { return instance() != nullptr; }

void write(std::uint64_t gpa, std::uint64_t len, Source src, bool logging, bool logged) noexcept {
  Journal* j = instance();
  if (j == nullptr) return;
  Record r = Journal::stamp(Type::write, static_cast<std::uint8_t>(src), 0, gpa, len, 0);
  r.flags = static_cast<std::uint8_t>((logging ? kLogging : 0) | (logged ? kLogged : 0));
  j->add(r);
}

void event(Event e, std::uint32_t id, std::uint64_t gpa, std::uint64_t len, std::uint64_t aux) noexcept {
  if (Journal* j = instance()) j->add(Journal::stamp(Type::event, static_cast<std::uint8_t>(e), id, gpa, len, aux));
}

void object(Object o, std::uint32_t id, std::uint64_t gpa, std::uint64_t len, std::uint64_t aux) noexcept {
  if (Journal* j = instance()) j->add(Journal::stamp(Type::object, static_cast<std::uint8_t>(o), id, gpa, len, aux));
}

void ring_started(std::uint16_t index) noexcept {
  if (Journal* j = instance()) j->ring(index, true);
}

void ring_stopped(std::uint16_t index) noexcept {
  if (Journal* j = instance()) j->ring(index, false);
}

void flush() noexcept {
  if (Journal* j = instance()) j->flush();
}

}  // namespace vrdma::vhost::journal
