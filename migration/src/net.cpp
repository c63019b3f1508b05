#include "net.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/if_ether.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "vrdma/common/log.hpp"

namespace vrdma::migration {

Result<sockaddr_in> parse_tcp_address(const std::string& addr) {
  const auto bad = [&] {
    return make_error(Errc::invalid_argument,
                      "migration address '" + addr + "' is not of the form tcp:<IPv4>:<port>, e.g. tcp:10.67.0.2:7800");
  };
  if (addr.rfind("tcp:", 0) != 0) return bad();
  const auto rest = addr.substr(4);
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) return bad();
  const std::string ip = rest.substr(0, colon), port = rest.substr(colon + 1);
  unsigned p = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc{} || ptr != port.data() + port.size() || p == 0 || p > 65535) return bad();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(p));
  if (::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) return bad();
  return a;
}

std::string to_string(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return fmt::format("tcp:{}:{}", ip, ntohs(a.sin_port));
}

Result<UniqueFd> tcp_listen(const sockaddr_in& a) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return errno_error(errno, "migration listen socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    return errno_error(errno, "binding the migration listener to " + to_string(a) +
                                  " (is that address on this host, and the port free?)");
  if (::listen(fd.get(), 4) != 0) return errno_error(errno, "listening on " + to_string(a));
  return fd;
}

namespace {
Error connect_error(int err, const sockaddr_in& a) {
  return errno_error(err, "connecting to the destination vrdmad at " + to_string(a) + " (is it running with --incoming " +
                              to_string(a) + "?)");
}
}  // namespace

Result<UniqueFd> tcp_connect_start(const sockaddr_in& a) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return errno_error(errno, "migration socket");
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS)
    return connect_error(errno, a);
  return fd;
}

Status connect_outcome(int fd, const sockaddr_in& a) {
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err == 0) return {};
  return connect_error(err, a);
}

Status set_noarp(const std::string& ifname, bool noarp) {
  UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) return errno_error(errno, "socket for interface flags");
  ifreq ifr{};
  if (ifname.size() >= IFNAMSIZ) return make_error(Errc::invalid_argument, "interface name too long: " + ifname);
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  if (::ioctl(s.get(), SIOCGIFFLAGS, &ifr) != 0) return errno_error(errno, "reading the flags of interface " + ifname);
  const short want = static_cast<short>(noarp ? (ifr.ifr_flags | IFF_NOARP) : (ifr.ifr_flags & ~IFF_NOARP));
  if (want == ifr.ifr_flags) return {};
  ifr.ifr_flags = want;
  if (::ioctl(s.get(), SIOCSIFFLAGS, &ifr) != 0)
    return errno_error(errno, fmt::format("{} ARP on interface {} (needs CAP_NET_ADMIN)", noarp ? "turning off" : "turning on",
                                          ifname));
  return {};
}

Result<std::uint32_t> send_gratuitous_arp(const std::string& ifname, int count) {
  const unsigned idx = ::if_nametoindex(ifname.c_str());
  if (idx == 0) return errno_error(errno, "interface " + ifname + " for the gratuitous ARP");
  std::vector<in_addr> addrs;
  ifaddrs* ifa = nullptr;
  if (::getifaddrs(&ifa) != 0) return errno_error(errno, "listing the addresses of " + ifname);
  for (auto* p = ifa; p != nullptr; p = p->ifa_next)
    if (p->ifa_addr != nullptr && p->ifa_addr->sa_family == AF_INET && ifname == p->ifa_name)
      addrs.push_back(reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr);
  ::freeifaddrs(ifa);
  if (addrs.empty()) return make_error(Errc::not_found, "interface " + ifname + " has no IPv4 address to announce");
  UniqueFd s(::socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC, htons(ETH_P_ARP)));
  if (!s) return errno_error(errno, "packet socket for the gratuitous ARP (needs CAP_NET_RAW)");
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  if (::ioctl(s.get(), SIOCGIFHWADDR, &ifr) != 0) return errno_error(errno, "reading the MAC of " + ifname);
  std::uint8_t mac[6];
  std::memcpy(mac, ifr.ifr_hwaddr.sa_data, 6);
  sockaddr_ll to{};
  to.sll_family = AF_PACKET;
  to.sll_protocol = htons(ETH_P_ARP);
  to.sll_ifindex = static_cast<int>(idx);
  to.sll_halen = 6;
  std::memset(to.sll_addr, 0xff, 6);
  std::uint32_t sent = 0;
  for (int round = 0; round < count; ++round) {
    for (const auto& ip : addrs) {
      ether_arp a{};
      a.arp_hrd = htons(ARPHRD_ETHER);
      a.arp_pro = htons(ETH_P_IP);
      a.arp_hln = 6;
      a.arp_pln = 4;
      a.arp_op = htons(ARPOP_REQUEST);
      std::memcpy(a.arp_sha, mac, 6);
      std::memcpy(a.arp_spa, &ip, 4);
      std::memcpy(a.arp_tpa, &ip, 4);  // target = sender: gratuitous (RFC 5227 announcement)
      if (::sendto(s.get(), &a, sizeof a, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) == sizeof a) ++sent;
    }
  }
  if (sent == 0) return errno_error(errno, "sending the gratuitous ARP on " + ifname);
  return sent;
}

void Announcer::start(const std::string& ifname) {
  stop();
  {
    std::lock_guard lk(mu_);
    stopping_ = false;
  }
  thread_ = std::thread([this, ifname] {
    constexpr int kAfterFirstMs[] = {50, 150, 300, 500};
    const auto t0 = std::chrono::steady_clock::now();
    for (int round = 0; round <= 4; ++round) {
      if (round > 0) {
        std::unique_lock lk(mu_);
        if (cv_.wait_until(lk, t0 + std::chrono::milliseconds(kAfterFirstMs[round - 1]), [this] { return stopping_; }))
          return;
      }
      auto n = send_gratuitous_arp(ifname, round == 0 ? 3 : 1);
      if (n) sent_ += *n;
      else if (round == 0) log::error("migration: announcing the guest's address: {}", n.error().message);
    }
  });
}

void Announcer::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Result<bool> turn_off_ipv6(const std::string& ifname) {
  if (ifname.empty() || ifname.find('/') != std::string::npos || ifname == "." || ifname == "..")
    return make_error(Errc::invalid_argument, "'" + ifname + "' is not an interface name");
  const std::string path = "/proc/sys/net/ipv6/conf/" + ifname + "/disable_ipv6";
  std::string now;
  {
    std::ifstream in(path);
    if (!in) {
      if (::if_nametoindex(ifname.c_str()) == 0) return errno_error(errno, "interface " + ifname);
      return false;  // the kernel has no IPv6
    }
    in >> now;
  }
  if (now == "1") return false;
  std::ofstream out(path);
  out << "1\n";
  out.close();
  if (!out) return make_error(Errc::io_error, "could not turn off IPv6 on " + ifname + " (writing " + path +
                                                 " needs CAP_NET_ADMIN in the interface's network namespace)");
  return true;
}

}  // namespace vrdma::migration
