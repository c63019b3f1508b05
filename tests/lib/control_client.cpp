#include "control_client.hpp"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <thread>

namespace vrdma::test {

nlohmann::json control_request(const std::string& path, const nlohmann::json& req, int timeout_ms) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return nlohmann::json::value_t::discarded;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return nlohmann::json::value_t::discarded;
  }
  const std::string line = req.dump() + "\n";
  (void)::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) {
    out.append(buf, static_cast<std::size_t>(n));
    if (out.find('\n') != std::string::npos) break;
  }
  ::close(fd);
  return nlohmann::json::parse(out, nullptr, false);
}

std::string phase_of(const nlohmann::json& status) {
  if (!status.is_object()) return "";
  const auto m = status.find("migration");
  return m != status.end() && m->is_object() ? m->value("phase", "") : "";
}

nlohmann::json wait_for_phase(const std::string& path, const std::string& phase, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  nlohmann::json st;
  do {
    st = control_request(path, {{"cmd", "status"}});
    if (phase_of(st) == phase) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < deadline);
  return st;
}

}  // namespace vrdma::test
