#include "vrdma/common/log.hpp"

#include <atomic>
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
std::mutex g_mu;

}  // namespace

void set_level(Level l) noexcept { g_level.store(l, std::memory_order_relaxed); }
Level level() noexcept { return g_level.load(std::memory_order_relaxed); }

void write(Level l, std::string_view line) noexcept {
  static constexpr const char* names[] = {"debug", "info", "warning", "error"};
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm tmv{};
  gmtime_r(&ts.tv_sec, &tmv);
  std::lock_guard lk(g_mu);
  std::fprintf(stderr, "%02d:%02d:%02d.%03ld vrdma %s: %.*s\n", tmv.tm_hour, tmv.tm_min, tmv.tm_sec,
               ts.tv_nsec / 1000000, names[static_cast<int>(l)], static_cast<int>(line.size()), line.data());
}

}  // namespace vrdma::log
