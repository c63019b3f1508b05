#include "backend_proc.hpp"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/integration/migration_vf.hpp"
#include "vrdma/sriov/ledger.hpp"

namespace vrdma::integration {
namespace {

std::string self_dir() {
  char buf[4096];
  const auto n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<std::size_t>(n));
  return p.substr(0, p.rfind('/'));
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

std::string pid_file(const DeviceMeta& m) { return m.socket + ".pid"; }
std::string log_file(const DeviceMeta& m) { return m.socket + ".log"; }

// Alive and not a zombie (a detached backend's parent may never reap it).
bool alive(int pid) { return sriov::process_alive(pid); }

std::string cmdline(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string s;
  for (char buf[1024]; f.read(buf, sizeof buf) || f.gcount() > 0;) s.append(buf, static_cast<std::size_t>(f.gcount()));
  for (auto& c : s)
    if (c == '\0') c = ' ';
  return s;
}

bool is_socket(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

std::string last_log_line(const DeviceMeta& m) {
  std::ifstream f(log_file(m));
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  return last.empty() ? "(its log " + log_file(m) + " is empty)" : "its log says: " + last;
}

std::vector<std::string> backend_argv(const DeviceMeta& m, bool incoming, const BackendPrograms& progs) {
  if (m.backend == BackendKind::vhost_user_blk) return {progs.vhost_user_blk, "--socket", m.socket, "--disk", m.disk};
  std::vector<std::string> a{progs.vrdmad, "--socket", m.socket, "--engine", m.engine, "--control", m.control};
  if (!m.mac.empty()) a.insert(a.end(), {"--mac", m.mac});
  if (!m.announce.empty()) a.insert(a.end(), {"--announce", m.announce});
  if (incoming) a.insert(a.end(), {"--incoming", m.incoming});
  if (m.poll_us != 0) a.insert(a.end(), {"--poll-us", std::to_string(m.poll_us)});
  if (!m.notices.empty()) a.insert(a.end(), {"--notices", m.notices});
  if (!m.domain.empty()) a.insert(a.end(), {"--domain", m.domain});
  if (!progs.qemu_group.empty()) a.insert(a.end(), {"--socket-group", progs.qemu_group});
  // A backend that crashes or is killed is started again at once (by vrdmad's own parent): a
  // destination that dies before it loaded the guest's state then still takes it from guest
  // memory, and the guest's connections survive (docs/migration.md "A backend that dies").
  a.emplace_back("--supervise");
  return a;
}

// fork, setsid, fork: the backend is nobody's child once the hook exits, and holds none of
// the hook's descriptors (libvirt reads the hook's stdout until every writer closes it).
Result<int> spawn_detached(const std::vector<std::string>& argv, const std::string& log) {
  int pfd[2];
  if (::pipe2(pfd, O_CLOEXEC) != 0) return errno_error(errno, "creating a pipe");
  UniqueFd rd(pfd[0]), wr(pfd[1]);
  const pid_t first = ::fork();
  if (first < 0) return errno_error(errno, "forking the backend");
  if (first == 0) {
    ::setsid();
    const pid_t second = ::fork();
    if (second != 0) {
      const int v = second;
      [[maybe_unused]] auto w = ::write(wr.get(), &v, sizeof v);
      ::_exit(second < 0 ? 1 : 0);
    }
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0640);
    const int in = ::open("/dev/null", O_RDONLY);
    if (out < 0 || in < 0) ::_exit(127);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::close_range(3, ~0U, 0);
    std::vector<char*> args;
    for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "cannot execute %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  wr.reset();
  int st = 0;
  ::waitpid(first, &st, 0);
  int pid = -1;
  if (::read(rd.get(), &pid, sizeof pid) != static_cast<ssize_t>(sizeof pid) || pid <= 0)
    return make_error(Errc::io_error, "cannot fork the backend process");
  return pid;
}

}  // namespace

BackendPrograms BackendPrograms::from_environment() {
  const auto dir = self_dir();
  // In a build tree vrdmad sits next to vrdmactl's folder (daemon/); installed, in ../sbin.
  std::string vrdmad = dir + "/../sbin/vrdmad";
  for (const auto& c : {dir + "/vrdmad", dir + "/../daemon/vrdmad"})
    if (::access(c.c_str(), X_OK) == 0) vrdmad = c;
  // The environment, else /etc/default/vrdma (host_setting).
  std::string group = host_setting("VRDMA_QEMU_GROUP");
  if (group.empty()) {
    const std::string conf = host_setting("VRDMA_QEMU_CONF");
    group = qemu_conf_group(conf.empty() ? "/etc/libvirt/qemu.conf" : conf);
  }
  if (group.empty() && ::getgrnam("libvirt-qemu") != nullptr) group = "libvirt-qemu";
  if (group == "none") group.clear();
  return {env_or("VRDMA_VRDMAD", vrdmad), env_or("VRDMA_BLK_BACKEND", dir + "/vhost_blk_backend"), group};
}

std::string qemu_conf_group(const std::string& path) {
  std::ifstream f(path);
  std::string line, group;
  while (std::getline(f, line)) {
    std::size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line.compare(i, 5, "group") != 0) continue;
    i = line.find_first_not_of(" \t", i + 5);
    if (i == std::string::npos || line[i] != '=') continue;
    const auto open = line.find('"', i);
    const auto close = open == std::string::npos ? open : line.find('"', open + 1);
    if (close != std::string::npos) group = line.substr(open + 1, close - open - 1);  // the last one counts
  }
  return group;
}

int backend_pid(const DeviceMeta& m) {
  std::ifstream f(pid_file(m));
  int pid = 0;
  if (!(f >> pid) || pid <= 0 || !alive(pid)) return 0;
  // A recycled pid is some other process: it must be serving this socket.
  return cmdline(pid).find(" " + m.socket) != std::string::npos ? pid : 0;
}

Result<nlohmann::json> control_json(const std::string& path, const nlohmann::json& request, int timeout_ms) {
  auto r = control_request(path, request.dump(), timeout_ms);
  if (!r) return std::move(r).error();
  auto j = nlohmann::json::parse(*r, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(Errc::protocol_error, "vrdmad at " + path + " answered something that is not JSON: " + *r);
  return j;
}

Result<std::string> control_request(const std::string& path, const std::string& line, int timeout_ms) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return errno_error(errno, "creating a socket");
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) return make_error(Errc::invalid_argument, "control socket path too long: " + path);
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    return errno_error(errno, "connecting to vrdmad's control socket " + path);
  const auto req = line + "\n";
  if (::send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size()))
    return errno_error(errno, "sending to " + path);
  std::string reply;
  char buf[4096];
  while (reply.find('\n') == std::string::npos) {
    const auto n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n < 0) return errno_error(errno, "reading the reply of " + path);
    if (n == 0) break;
    reply.append(buf, static_cast<std::size_t>(n));
  }
  if (reply.empty()) return make_error(Errc::connection_lost, path + " closed without a reply");
  return reply.substr(0, reply.find('\n'));
}

Status ensure_backend(const DeviceMeta& m, bool incoming, const BackendPrograms& progs) {
  if (backend_pid(m) != 0 && is_socket(m.socket)) return {};
  const auto argv = backend_argv(m, incoming, progs);
  if (::access(argv[0].c_str(), X_OK) != 0)
    return make_error(Errc::not_found, "the backend program " + argv[0] + " is not there or not executable");
  // The socket's folder (e.g. /run/vrdma after a reboot emptied /run) is made when missing.
  if (const auto dir = std::filesystem::path(m.socket).parent_path(); !dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      return make_error(Errc::io_error, "cannot create the folder " + dir.string() + " for the socket " + m.socket +
                                            ": " + ec.message());
  }
  ::unlink(m.socket.c_str());
  auto pid = spawn_detached(argv, log_file(m));
  if (!pid) return std::move(pid).error();
  {
    std::ofstream f(pid_file(m), std::ios::trunc);
    f << *pid << "\n";
    if (!f) return make_error(Errc::io_error, "cannot write the pid file " + pid_file(m));
  }
  using namespace std::chrono;
  const auto deadline = steady_clock::now() + seconds(10);
  while (steady_clock::now() < deadline) {
    if (!alive(*pid)) {
      ::unlink(pid_file(m).c_str());
      return make_error(Errc::io_error, "the backend " + argv[0] + " for " + m.socket + " exited at start; " +
                                            last_log_line(m));
    }
    if (is_socket(m.socket) &&
        (m.backend != BackendKind::vrdmad || control_request(m.control, R"({"cmd":"status"})", 500).ok()))
      return {};
    std::this_thread::sleep_for(milliseconds(20));
  }
  (void)stop_backend(m);
  return make_error(Errc::timeout, "the backend " + argv[0] + " did not serve " + m.socket + " within 10 s; " +
                                       last_log_line(m));
}

Status stop_backend(const DeviceMeta& m) {
  if (const int pid = backend_pid(m); pid != 0) {
    ::kill(pid, SIGTERM);
    using namespace std::chrono;
    const auto deadline = steady_clock::now() + seconds(5);
    while (alive(pid) && steady_clock::now() < deadline) std::this_thread::sleep_for(milliseconds(20));
    if (alive(pid)) ::kill(pid, SIGKILL);
  }
  ::unlink(pid_file(m).c_str());
  ::unlink(m.socket.c_str());
  if (!m.control.empty()) ::unlink(m.control.c_str());
  return {};
}

}  // namespace vrdma::integration
