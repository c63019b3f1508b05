#include "vrdma/vhost/peer_fd.hpp"

#include "vrdma/vhost/message.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

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

}  // namespace

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
  ssize_t r = ::read(fd, &v, sizeof v);
  if (r == sizeof v && v >= 2) return false;
  if (r < 0 && errno != EAGAIN) return errno_error(errno, "reading an eventfd");
  const std::uint64_t two = 2;
  if (::write(fd, &two, sizeof two) != static_cast<ssize_t>(sizeof two)) {
    // Only a counter at its maximum refuses 2, and a plain eventfd was emptied by the read above.
    if (errno == EAGAIN) return true;
    return errno_error(errno, "writing an eventfd");
  }
  r = ::read(fd, &v, sizeof v);
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
