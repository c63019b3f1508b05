// vrdmad --supervise (supervise.hpp).
#include "supervise.hpp"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "vrdma/common/log.hpp"

namespace vrdma::vrdmad {

namespace {

constexpr int kMaxRestarts = 5;

pid_t start_backend(const std::vector<std::string>& args) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  // A supervisor that is itself killed takes its backend with it (no orphan serving the socket).
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "vrdmad: cannot start the backend again: %s\n", std::strerror(errno));
  ::_exit(127);
}

std::string how_it_ended(int st) {
  if (WIFSIGNALED(st)) {
    const char* n = ::sigabbrev_np(WTERMSIG(st));
    return fmt::format("was killed by signal {} (SIG{})", WTERMSIG(st), n ? n : "?");
  }
  return fmt::format("exited with status {}", WEXITSTATUS(st));
}

}  // namespace

int supervise(int argc, char** argv) {
  std::vector<std::string> args;
  std::string socket = "its socket";
  bool incoming = false;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--supervise") continue;
    if (a == "--incoming" || a.rfind("--incoming=", 0) == 0) incoming = true;
    if (a == "--socket" && i + 1 < argc) socket = argv[i + 1];
    args.push_back(a);
  }
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGTERM, SIGINT, SIGCHLD}) sigaddset(&mask, sig);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  pid_t child = start_backend(args);
  if (child < 0) {
    log::error("vrdmad: cannot start the backend: {}", std::strerror(errno));
    return 1;
  }
  std::deque<std::chrono::steady_clock::time_point> restarts;
  for (;;) {
    siginfo_t si{};
    if (::sigwaitinfo(&mask, &si) < 0) continue;
    if (si.si_signo == SIGTERM || si.si_signo == SIGINT) {
      ::kill(child, si.si_signo);
      int st = 0;
      while (::waitpid(child, &st, 0) < 0 && errno == EINTR) {
      }
      return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    int st = 0;
    const pid_t done = ::waitpid(child, &st, WNOHANG);
    if (done != child) continue;
    if (WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 2)) return WEXITSTATUS(st);  // asked to, or usage
    const auto now = std::chrono::steady_clock::now();
    while (!restarts.empty() && now - restarts.front() > std::chrono::minutes(1)) restarts.pop_front();
    if (restarts.size() >= kMaxRestarts) {
      log::error("vrdmad: the backend {} {} for the {}th time within a minute; not starting it again (its log above "
                 "says why; the guest's device stays without a backend until one serves {})",
                 done, how_it_ended(st), kMaxRestarts + 1, socket);
      return 1;
    }
    restarts.push_back(now);
    if (!incoming) {
      args.insert(args.end(), {"--incoming", "guest"});
      incoming = true;
    }
    if (std::find(args.begin(), args.end(), "--restarted") == args.end()) args.emplace_back("--restarted");
    log::warn("vrdmad: the backend {} {}; starting it again (restart {} of at most {} a minute), with --incoming "
              "guest: a device state the guest's memory holds from a migration is taken from there",
              done, how_it_ended(st), restarts.size(), kMaxRestarts);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    child = start_backend(args);
    if (child < 0) {
      log::error("vrdmad: cannot start the backend again: {}", std::strerror(errno));
      return 1;
    }
  }
}

}  // namespace vrdma::vrdmad
