// Operator log: one line per event, a sentence that says what failed and what to do.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace vrdma::log {

enum class Level { debug = 0, info, warn, error };

void set_level(Level level) noexcept;
Level level() noexcept;
void write(Level level, std::string_view line) noexcept;

template <class... A>
void debug(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::debug) write(Level::debug, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void info(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::info) write(Level::info, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void warn(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::warn) write(Level::warn, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void error(fmt::format_string<A...> f, A&&... a) {
  write(Level::error, fmt::format(f, std::forward<A>(a)...));
}

}  // namespace vrdma::log
