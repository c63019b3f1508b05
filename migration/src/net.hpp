// Sockets for the switchover stream and the guest-address announcement (private to migration/).
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"

namespace vrdma::migration {

// "tcp:IPv4:PORT" -> socket address.
Result<sockaddr_in> parse_tcp_address(const std::string& addr);
// Listening socket (non-blocking, SO_REUSEADDR).
Result<UniqueFd> tcp_listen(const sockaddr_in& a);
// A non-blocking socket connecting to `a`: connected, or still connecting (writable once it is
// done; connect_outcome() then says whether it worked). An error here is an immediate refusal.
Result<UniqueFd> tcp_connect_start(const sockaddr_in& a);
// How a non-blocking connect on `fd` ended, once the socket is writable (SO_ERROR).
Status connect_outcome(int fd, const sockaddr_in& a);
std::string to_string(const sockaddr_in& a);

// The guest's address on this host's interface `ifname`: silence it (IFF_NOARP: the kernel
// neither answers nor sends ARP for it) or announce it (clear NOARP, then gratuitous ARP
// requests, sender = target = the address, so switches learn the MAC's new port and peers
// refresh their neighbour entries).
Status set_noarp(const std::string& ifname, bool noarp);
// Sends `count` gratuitous ARPs for every IPv4 address of `ifname`; returns how many went out.
Result<std::uint32_t> send_gratuitous_arp(const std::string& ifname, int count);
// The rounds of gratuitous ARPs after a switchover, on a thread of their own: 3 at once, then
// one each 50, 150, 300 and 500 ms after (QEMU's announce-self timing), so that a switch that
// saw a late frame from the host the guest left learns the MAC's port again and a peer that
// missed the first round refreshes its neighbour entry. Off the event loop because one send
// walks the bridge and every namespace behind it in the sender's context: milliseconds on a
// busy host, which the guest's rings starting after the switchover must not wait for.
class Announcer {
 public:
  Announcer() = default;
  Announcer(const Announcer&) = delete;
  Announcer& operator=(const Announcer&) = delete;
  ~Announcer() { stop(); }
  // Starts the rounds on `ifname` (after any earlier ones stopped). Errors go to the log.
  void start(const std::string& ifname);
  // Stops the rounds still to come (the guest leaves again, the device goes).
  void stop();
  // Gratuitous ARPs sent so far.
  [[nodiscard]] std::uint32_t sent() const { return sent_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
  std::atomic<std::uint32_t> sent_{0};
};

// Turns IPv6 off on `ifname` (net.ipv6.conf.<ifname>.disable_ipv6). Every host that may run the
// guest carries its MAC on such an interface; with IPv6 on, the kernel of a host the guest has
// left still sends MLD reports and neighbour discovery from that MAC (each time the interface's
// flags change, NOARP included), and a switch then steers the guest's traffic back to it.
// Returns true when it changed the setting, false when IPv6 was off already or is not built in.
Result<bool> turn_off_ipv6(const std::string& ifname);

}  // namespace vrdma::migration
