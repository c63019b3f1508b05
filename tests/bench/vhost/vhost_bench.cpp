// vhost_bench [out.json] [seconds]
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "vrdma/common/log.hpp"
#include "vrdma/vhost/backend.hpp"
#include "vrdma/vhost/frontend.hpp"

using namespace vrdma;
using namespace vrdma::vhost;
using Clock = std::chrono::steady_clock;

namespace {

// Completes every chain at once: measures descriptor processing, not a device.
class NullDevice final : public Device {
 public:
  DeviceInfo info() const override {
    DeviceInfo i;
    i.num_queues = 1;
    i.max_queue_size = 1024;
    return i;
  }
  void queue_ready(Queue& q) override {
    while (auto c = q.pop()) (void)q.push(*c, 0);
  }
};

double cpu_seconds(pid_t pid) {
  char path[64], buf[1024] = {};
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return 0;
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const std::string s(buf, n);
  std::size_t at = s.rfind(')') + 2;
  // After the command: state is field 3; utime and stime are fields 14 and 15.
  for (int field = 3; field < 14 && at != std::string::npos; ++field) at = s.find(' ', at) + 1;
  unsigned long ut = 0, st = 0;
  if (std::sscanf(s.c_str() + at, "%lu %lu", &ut, &st) != 2) return 0;
  return static_cast<double>(ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

// Baseline: the same two processes bouncing one eventfd write each way (no vhost at all).
std::vector<double> eventfd_pingpong(int rounds) {
  const int a = ::eventfd(0, 0), b = ::eventfd(0, 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::uint64_t v;
    for (int i = 0; i < rounds; ++i) {
      if (::read(a, &v, 8) != 8) _exit(1);
      if (::write(b, &v, 8) != 8) _exit(1);
    }
    _exit(0);
  }
  std::vector<double> lat;
  std::uint64_t one = 1;
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = Clock::now();
    if (::write(a, &one, 8) != 8 || ::read(b, &one, 8) != 8) break;
    lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  ::waitpid(pid, nullptr, 0);
  ::close(a);
  ::close(b);
  return lat;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string out = argc > 1 ? argv[1] : "";
  const double seconds = argc > 2 ? std::atof(argv[2]) : 3.0;
  log::set_level(log::Level::warn);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(sv[0]);
    NullDevice dev;
    auto loop = EventLoop::create();
    auto server = BackendServer::adopt(UniqueFd(sv[1]), dev, *loop);
    if (!server) _exit(2);
    while ((*server)->connected()) (void)loop->run_once(1000);
    _exit(0);
  }
  ::close(sv[1]);
  auto fe = Frontend::adopt(UniqueFd(sv[0]));
  auto ram = GuestRam::create(GuestRam::vm_layout(64));
  if (!fe || !ram) return 1;
  auto acked = fe->negotiate({VirtioFeature::version_1, VirtioFeature::protocol_features, VirtioFeature::ring_event_idx},
                             {ProtocolFeature::reply_ack});
  if (!acked || !fe->set_mem_table(*ram).ok()) return 1;
  constexpr std::uint16_t kSize = 256;
  auto q = DriverQueue::create(*ram, kSize, false, true);
  if (!q || !fe->start_queue(0, *q).ok()) return 1;
  const std::uint64_t req = ram->alloc(64).value(), resp = ram->alloc(64).value();
  const std::vector<DriverBuf> chain{{req, 64, false}, {resp, 64, true}};

  // 1. Throughput: keep the ring full for `seconds`; chains per second, and per second of
  //    backend CPU (the backend is one thread: chains per second per core).
  std::uint64_t done = 0;
  const double cpu0 = cpu_seconds(child);
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    bool added = false;
    while (q->free_slots() >= 2 && q->add(chain).ok()) added = true;
    if (added) {
      q->publish();
      if (q->needs_kick() && !fe->kick(0).ok()) return 1;
    }
    bool got = false;
    while (q->get_used()) {
      ++done;
      got = true;
    }
    if (!got) (void)fe->wait_call(0, 1);
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = cpu_seconds(child) - cpu0;
  while (q->free_slots() < kSize) {  // drain
    if (!q->get_used()) (void)fe->wait_call(0, 10);
  }

  // 2. Latency: one chain at a time, kick -> call -> used.
  std::vector<double> lat;
  for (int i = 0; i < 20000; ++i) {
    const auto s0 = Clock::now();
    if (!q->add(chain).ok()) return 1;
    q->publish();
    if (q->needs_kick() && !fe->kick(0).ok()) return 1;
    for (;;) {
      auto r = fe->wait_call(0, 1000);
      if (!r || !*r) return 3;
      if (q->get_used()) break;
    }
    lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s0).count());
  }
  fe->channel().close();
  ::waitpid(child, nullptr, 0);
  const auto base = eventfd_pingpong(20000);

  char json[1024];
  std::snprintf(json, sizeof json,
                "{\n  \"chains_per_second\": %.0f,\n  \"backend_cpu_seconds\": %.3f,\n"
                "  \"chains_per_backend_cpu_second\": %.0f,\n  \"descriptors_per_chain\": 2,\n"
                "  \"kick_to_call_us_p50\": %.2f,\n  \"kick_to_call_us_p99\": %.2f,\n"
                "  \"baseline_eventfd_pingpong_us_p50\": %.2f,\n  \"baseline_eventfd_pingpong_us_p99\": %.2f,\n"
                "  \"latency_over_baseline_p50\": %.2f\n}\n",
                static_cast<double>(done) / wall, cpu, cpu > 0 ? static_cast<double>(done) / cpu : 0.0,
                pct(lat, 0.5), pct(lat, 0.99), pct(base, 0.5), pct(base, 0.99), pct(lat, 0.5) / pct(base, 0.5));
  std::fputs(json, stdout);
  if (!out.empty()) {
    FILE* o = std::fopen(out.c_str(), "w");
    if (o != nullptr) {
      std::fputs(json, o);
      std::fclose(o);
    }
  }
  return 0;
}
