// Sockets for the switchover stream and the guest-address announcement (private to migration/).
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"

namespace vrdma::migration {

// "tcp:IPv4:PORT" -> socket address.
Result<sockaddr_in> parse_tcp_address(const std::string& addr);
// Listening socket (non-blocking, SO_REUSEADDR).
Result<UniqueFd> tcp_listen(const sockaddr_in& a);
// Connected socket (non-blocking afterwards), within `timeout`.
Result<UniqueFd> tcp_connect(const sockaddr_in& a, std::chrono::milliseconds timeout);
std::string to_string(const sockaddr_in& a);

// The guest's address on this host's interface `ifname`: silence it (IFF_NOARP: the kernel
// neither answers nor sends ARP for it) or announce it (clear NOARP, then gratuitous ARP
// requests, sender = target = the address, so switches learn the MAC's new port and peers
// refresh their neighbour entries).
Status set_noarp(const std::string& ifname, bool noarp);
// Sends `count` gratuitous ARPs for every IPv4 address of `ifname`; returns how many went out.
Result<std::uint32_t> send_gratuitous_arp(const std::string& ifname, int count);
// Turns IPv6 off on `ifname` (net.ipv6.conf.<ifname>.disable_ipv6). Every host that may run the
// guest carries its MAC on such an interface; with IPv6 on, the kernel of a host the guest has
// left still sends MLD reports and neighbour discovery from that MAC (each time the interface's
// flags change, NOARP included), and a switch then steers the guest's traffic back to it.
// Returns true when it changed the setting, false when IPv6 was off already or is not built in.
Result<bool> turn_off_ipv6(const std::string& ifname);

}  // namespace vrdma::migration
