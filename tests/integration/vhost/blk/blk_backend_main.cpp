// vhost_blk_backend: the vhost-user-blk test fixture as a process.
//   vhost_blk_backend --socket PATH --disk FILE [--size-mib N] [--queues N] [--no-packed]
//                     [--no-event-idx] [--no-indirect] [--no-inflight] [--crash-after N]
//                     [--unlogged-reads]
// Creates FILE of N MiB if it does not exist. Serves one frontend at a time, forever; after a
// disconnect it accepts the next one. SIGTERM/SIGINT end it; it prints its counters on exit.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "blk_device.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/vhost/backend.hpp"

using namespace vrdma;

int main(int argc, char** argv) {
  std::string sock, disk;
  long size_mib = 64, queues = 1;
  long long crash_after = -1;
  bool unlogged_reads = false;
  vhost::BackendOptions opts;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--socket") sock = next();
    else if (a == "--disk") disk = next();
    else if (a == "--size-mib") size_mib = std::strtol(next().c_str(), nullptr, 10);
    else if (a == "--queues") queues = std::strtol(next().c_str(), nullptr, 10);
    else if (a == "--no-packed") opts.packed = false;
    else if (a == "--no-event-idx") opts.event_idx = false;
    else if (a == "--no-indirect") opts.indirect = false;
    else if (a == "--no-inflight") opts.inflight = false;
    else if (a == "--crash-after") crash_after = std::strtoll(next().c_str(), nullptr, 10);
    else if (a == "--unlogged-reads") unlogged_reads = true;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (sock.empty() || disk.empty() || queues < 1 || queues > 64 || size_mib < 1) {
    std::fprintf(stderr, "usage: %s --socket PATH --disk FILE [--size-mib N] [--queues N]\n", argv[0]);
    return 2;
  }
  UniqueFd fd(::open(disk.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd) {
    log::error("cannot open disk {}: {}", disk, std::strerror(errno));
    return 1;
  }
  if (::lseek(fd.get(), 0, SEEK_END) == 0 && ::ftruncate(fd.get(), size_mib << 20) != 0) {
    log::error("cannot size disk {}: {}", disk, std::strerror(errno));
    return 1;
  }
  auto dev = test::BlkDevice::open(std::move(fd), static_cast<std::uint16_t>(queues));
  if (!dev) {
    log::error("{}", dev.error().message);
    return 1;
  }
  if (crash_after >= 0) (*dev)->crash_after(static_cast<std::uint64_t>(crash_after));
  (*dev)->unlogged_reads(unlogged_reads);
  auto loop = vhost::EventLoop::create();
  if (!loop) {
    log::error("{}", loop.error().message);
    return 1;
  }
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  UniqueFd sfd(::signalfd(-1, &mask, SFD_CLOEXEC));
  (void)loop->add(sfd.get(), EPOLLIN, [&](std::uint32_t) { loop->stop(); });
  auto server = vhost::BackendServer::listen(sock, **dev, *loop, opts);
  if (!server) {
    log::error("{}", server.error().message);
    return 1;
  }
  auto st = loop->run();
  const auto& s = (*server)->stats();
  std::printf("vhost_blk_backend: connections=%lu messages=%lu rejected=%lu kicks=%lu requests=%lu errors=%lu\n",
              static_cast<unsigned long>(s.connections), static_cast<unsigned long>(s.messages),
              static_cast<unsigned long>(s.rejected), static_cast<unsigned long>(s.kicks),
              static_cast<unsigned long>((*dev)->requests()), static_cast<unsigned long>((*dev)->errors()));
  std::printf("vhost_blk_backend: per_queue");
  for (auto n : (*dev)->per_queue()) std::printf(" %lu", static_cast<unsigned long>(n));
  std::printf("\n");
  std::fflush(stdout);
  loop->remove(sfd.get());
  return st.ok() ? 0 : 1;
}
