#include "netns.hpp"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "vrdma/common/fd.hpp"

namespace vrdma::test {

bool can_make_netns() { return geteuid() == 0 && std::system("ip netns list >/dev/null 2>&1") == 0; }

int sh(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  if (rc != 0) std::fprintf(stderr, "test: command failed (%d): %s\n", rc, cmd.c_str());
  return rc;
}

NetnsPair::NetnsPair(const std::string& prefix, int net, int mtu)
    : a_(prefix + std::to_string(getpid() % 100000) + "a"), b_(prefix + std::to_string(getpid() % 100000) + "b"),
      net_(net) {
  sh("ip netns del " + a_ + " 2>/dev/null; ip netns del " + b_ + " 2>/dev/null; true");
  std::string m = std::to_string(mtu);
  ok_ = sh("ip netns add " + a_) == 0 && sh("ip netns add " + b_) == 0 &&
        sh("ip link add " + veth_a() + " netns " + a_ + " mtu " + m + " type veth peer name " + veth_b() +
           " netns " + b_ + " mtu " + m) == 0 &&
        sh("ip -n " + a_ + " addr add " + ip_a() + "/24 dev " + veth_a()) == 0 &&
        sh("ip -n " + b_ + " addr add " + ip_b() + "/24 dev " + veth_b()) == 0 &&
        sh("ip -n " + a_ + " link set " + veth_a() + " up && ip -n " + a_ + " link set lo up") == 0 &&
        sh("ip -n " + b_ + " link set " + veth_b() + " up && ip -n " + b_ + " link set lo up") == 0;
}

NetnsPair::~NetnsPair() { sh("ip netns del " + a_ + " 2>/dev/null; ip netns del " + b_ + " 2>/dev/null; true"); }

std::string NetnsPair::ip_a() const { return "10." + std::to_string(net_) + ".0.1"; }
std::string NetnsPair::ip_b() const { return "10." + std::to_string(net_) + ".0.2"; }

bool run_in_netns(const std::string& ns, const std::function<void()>& fn) {
  bool entered = false;
  std::thread t([&] {
    UniqueFd fd(::open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd || ::setns(fd.get(), CLONE_NEWNET) != 0) return;
    entered = true;
    fn();
  });
  t.join();
  return entered;
}

}  // namespace vrdma::test
