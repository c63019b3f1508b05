#include "vrdma/common/log.hpp"

#include <sys/stat.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

namespace vrdma::log {
namespace {

Level initial_level() {
  const char* env = std::getenv("VRDMA_LOG");
  if (env == nullptr) return Level::info;
  std::string_view v(env);
  if (v == "debug") return Level::debug;
  if (v == "warn") return Level::warn;
  if (v == "error") return Level::error;
  return Level::info;
}

std::atomic<Level> g_level{initial_level()};

// True when stderr is the systemd journal's stream (systemd sets JOURNAL_STREAM to its
// "device:inode", systemd.exec(5)): lines then carry a syslog priority prefix ("<3>") that
// journald turns into the entry's priority, and no time stamp (the journal has its own).
bool stderr_is_journal() {
  const char* js = std::getenv("JOURNAL_STREAM");
  if (js == nullptr) return false;
  std::uintmax_t dev = 0, ino = 0;
  if (std::sscanf(js, "%" SCNuMAX ":%" SCNuMAX, &dev, &ino) != 2) return false;
  struct stat st {};
  return ::fstat(2, &st) == 0 && static_cast<std::uintmax_t>(st.st_dev) == dev &&
         static_cast<std::uintmax_t>(st.st_ino) == ino;
}
const bool g_journal = stderr_is_journal();
std::mutex g_mu;

}  // namespace

void set_level(Level l) noexcept { g_level.store(l, std::memory_order_relaxed); }
Level level() noexcept { return g_level.load(std::memory_order_relaxed); }

void write(Level l, std::string_view line) noexcept {
  static constexpr const char* names[] = {"debug", "info", "warning", "error"};
  static constexpr int priorities[] = {7, 6, 4, 3};  // syslog's LOG_DEBUG, LOG_INFO, LOG_WARNING, LOG_ERR
  const int i = static_cast<int>(l);
  if (g_journal) {
    std::lock_guard lk(g_mu);
    std::fprintf(stderr, "<%d>%s: %.*s\n", priorities[i], names[i], static_cast<int>(line.size()), line.data());
    return;
  }
  // A file or a terminal: the date and time in UTC (ISO 8601), the level, the sentence.
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm tmv{};
  gmtime_r(&ts.tv_sec, &tmv);
  std::lock_guard lk(g_mu);
  std::fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ vrdma %s: %.*s\n", tmv.tm_year + 1900, tmv.tm_mon + 1,
               tmv.tm_mday, tmv.tm_hour, tmv.tm_min, tmv.tm_sec, ts.tv_nsec / 1000000, names[i],
               static_cast<int>(line.size()), line.data());
}

}  // namespace vrdma::log
