#include "sysfs_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "vrdma/common/fd.hpp"

namespace vrdma::sriov::detail {

Result<std::string> read_attr(const std::filesystem::path& p) {
  UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return errno_error(errno, "cannot open " + p.string());
  std::string out;
  char buf[4096];
  while (out.size() < 65536) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error(errno, "cannot read " + p.string());
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\0')) out.pop_back();
  return out;
}

Status write_attr(const std::filesystem::path& p, std::string_view value) {
  UniqueFd fd(::open(p.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC));
  if (!fd) return errno_error(errno, "cannot open " + p.string() + " for writing");
  std::string v(value);
  v += '\n';
  ssize_t n;
  do {
    n = ::write(fd.get(), v.data(), v.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) return errno_error(errno, "writing '" + std::string(value) + "' to " + p.string() + " failed");
  if (static_cast<std::size_t>(n) != v.size())
    return make_error(Errc::io_error, "short write of '" + std::string(value) + "' to " + p.string());
  return {};
}

std::optional<std::string> link_basename(const std::filesystem::path& p) {
  std::error_code ec;
  auto t = std::filesystem::read_symlink(p, ec);
  if (ec) return std::nullopt;
  return t.filename().string();
}

bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto step = std::chrono::milliseconds(1);
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(step);
    step = std::min(step * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace vrdma::sriov::detail
