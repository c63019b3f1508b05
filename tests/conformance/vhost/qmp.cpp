#include "qmp.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace vrdma::test {

bool Qmp::connect(const std::string& path, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    fd_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    if (::connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) break;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (read_line(timeout_ms).find("QMP") == std::string::npos) return false;
  return command(R"({"execute":"qmp_capabilities"})").find("return") != std::string::npos;
}

std::string Qmp::read_line(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return "";
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return "";
    char tmp[4096];
    const ssize_t n = ::read(fd_.get(), tmp, sizeof tmp);
    if (n <= 0) return "";
    buf_.append(tmp, static_cast<std::size_t>(n));
  }
}

std::string Qmp::command(const std::string& json, int timeout_ms) {
  const std::string line = json + "\n";
  if (::write(fd_.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) return "";
  for (;;) {
    std::string r = read_line(timeout_ms);
    if (r.empty() || r.find("\"event\"") == std::string::npos) return r;
  }
}

}  // namespace vrdma::test
