// The migration rig: four network namespaces on one bridge, for tests and benchmarks.
//   "switch" mgsw: the bridge br0 (nftables there can drop RoCE packets);
//   host A mga and host B mgb: each with the guest's interface (gA / gB: the same MAC and the
//   same address 10.66.0.1, B's silent with NOARP) and the management link mA--mB
//   (10.67.0.1 / 10.67.0.2) that carries the switchover stream;
//   the peer mgp: 10.66.0.2.
// Built on construction, removed on destruction. Needs root.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "netns.hpp"

namespace vrdma::test {

constexpr const char* kGuestIp = "10.66.0.1";
constexpr const char* kPeerIp = "10.66.0.2";
constexpr const char* kGuestMac = "52:54:00:66:00:01";

// The four namespaces. Removed on destruction.
struct Fabric {
  std::string sw = "mgsw", a = "mga", b = "mgb", p = "mgp";
  bool ok = false;
  explicit Fabric(int loss_percent = 0) {
    teardown();
    std::string c;
    for (const auto& n : {sw, a, b, p})
      c += "ip netns add " + n + " && ip netns exec " + n +
           " sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 && ip -n " + n +
           " link set lo up && ";
    c += "ip -n " + sw + " link add br0 type bridge && ip -n " + sw + " link set br0 up && ";
    // Guest-facing interfaces: the same MAC and address on both hosts (the guest's identity).
    const std::pair<std::string, std::string> legs[] = {{a, "gA"}, {b, "gB"}, {p, "gP"}};
    for (const auto& [ns, ifn] : legs) {
      const std::string port = "s" + ifn;
      c += "ip -n " + ns + " link add " + ifn + " type veth peer name " + port + " netns " + sw + " && ip -n " + sw +
           " link set " + port + " master br0 up && ";
      if (ns != p) c += "ip -n " + ns + " link set " + ifn + " address " + kGuestMac + " && ip -n " + ns + " addr add " +
                        kGuestIp + "/24 dev " + ifn + " && ";
      else c += "ip -n " + ns + " addr add " + kPeerIp + "/24 dev " + ifn + " && ";
      c += "ip -n " + ns + " link set " + ifn + " up && ";
    }
    // Host B's copy of the guest's address stays silent until the guest arrives.
    c += "ip -n " + b + " link set gB arp off && ";
    // The management link between the hosts (the switchover stream).
    c += "ip -n " + a + " link add mA type veth peer name mB netns " + b + " && ip -n " + a +
         " addr add 10.67.0.1/24 dev mA && ip -n " + b + " addr add 10.67.0.2/24 dev mB && ip -n " + a +
         " link set mA up && ip -n " + b + " link set mB up";
    ok = sh(c) == 0;
    if (ok && loss_percent > 0) {
      // Lose RoCE packets on the switch (both directions), like a lossy fabric.
      ok = sh("ip netns exec " + sw + " nft add table bridge loss && ip netns exec " + sw +
              " nft add chain bridge loss lossy '{ type filter hook forward priority 0; }' && ip netns exec " + sw +
              " nft add rule bridge loss lossy udp dport 4791 numgen random mod 100 '<' " + std::to_string(loss_percent) +
              " counter drop") == 0;
    }
  }
  ~Fabric() { teardown(); }
  // Packets the switch dropped so far (the nftables counter).
  [[nodiscard]] long dropped() const {
    FILE* f = ::popen(("ip netns exec " + sw + " nft list chain bridge loss lossy 2>/dev/null").c_str(), "r");
    if (f == nullptr) return -1;
    std::string out;
    char buf[512];
    while (std::fgets(buf, sizeof buf, f) != nullptr) out += buf;
    ::pclose(f);
    const auto at = out.find("counter packets ");
    return at == std::string::npos ? -1 : std::atol(out.c_str() + at + 16);
  }
  void teardown() {
    for (const auto& n : {sw, a, b, p}) sh("ip netns del " + n + " 2>/dev/null || true");
  }
};

}  // namespace vrdma::test
