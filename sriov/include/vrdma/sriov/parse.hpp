// Parsers for the small values the SR-IOV manager reads from sysfs (semi-trusted) and from the
// command line (untrusted). Each returns an Error with a sentence naming the bad value; none throws.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "vrdma/common/result.hpp"

namespace vrdma::sriov {

// A PCI function address, "DDDD:BB:DD.F" (domain up to 8 hex digits, as with VMD domains 10000+).
struct PciAddress {
  std::uint32_t domain = 0;
  std::uint8_t bus = 0;
  std::uint8_t device = 0;    // 0..31
  std::uint8_t function = 0;  // 0..7
  [[nodiscard]] std::string str() const;  // canonical "0000:3b:00.0"
  friend auto operator<=>(const PciAddress&, const PciAddress&) = default;
};

// Accepts "0000:3b:02.1" and the short form "3b:02.1" (domain 0). Case-insensitive hex.
Result<PciAddress> parse_pci_address(std::string_view s);

using MacAddress = std::array<std::uint8_t, 6>;
// "02:00:5e:10:00:01" (also '-' separators). Rejects multicast and all-zero addresses when
// `unicast_only`, because a VF MAC must be a unicast station address.
Result<MacAddress> parse_mac(std::string_view s, bool unicast_only = true);
std::string format_mac(const MacAddress& m);

// Decimal integer attribute such as sriov_numvfs or numa_node ("-1\n" is valid for numa_node).
Result<std::int64_t> parse_sysfs_int(std::string_view s, std::int64_t min, std::int64_t max);
// "0x15b3\n" style PCI id.
Result<std::uint16_t> parse_pci_id(std::string_view s);

// RDMA transports a port offers (IBTA Annex A16/A17 for RoCE v1/v2; RFC 5040 for iWARP).
enum class Transport { infiniband, roce_v1, roce_v2, iwarp };
std::string_view transport_name(Transport t);

// /sys/class/infiniband/<dev>/node_type: "1: CA", "4: RNIC", ...
enum class NodeType { ca, sw, router, rnic, usnic, usnic_udp, unspecified };
Result<NodeType> parse_node_type(std::string_view s);
// ports/N/gid_attrs/types/M: "IB/RoCE v1" or "RoCE v2".
std::optional<Transport> parse_gid_type(std::string_view s);

// Trims trailing newline/whitespace the way sysfs attributes end.
std::string_view trim(std::string_view s);

}  // namespace vrdma::sriov
