#include "vrdma/sriov/parse.hpp"

#include <fmt/format.h>

#include <charconv>
#include <limits>

namespace vrdma::sriov {
namespace {

// Printable form of untrusted input for error sentences: bounded, control bytes escaped.
std::string shown(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  if (s.size() > 64) out += "...";
  return out;
}

bool hex_field(std::string_view s, std::size_t min_len, std::size_t max_len, std::uint64_t max, std::uint64_t& out) {
  if (s.size() < min_len || s.size() > max_len) return false;
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || p != s.data() + s.size() || v > max) return false;
  out = v;
  return true;
}

}  // namespace

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\0'))
    s.remove_suffix(1);
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  return s;
}

std::string PciAddress::str() const { return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", domain, bus, device, function); }

Result<PciAddress> parse_pci_address(std::string_view in) {
  std::string_view s = trim(in);
  auto bad = [&] {
    return make_error(Errc::invalid_argument,
                      fmt::format("'{}' is not a PCI address; expected DDDD:BB:DD.F such as 0000:3b:02.1", shown(in)));
  };
  auto dot = s.rfind('.');
  if (dot == std::string_view::npos) return bad();
  std::string_view fn = s.substr(dot + 1);
  std::string_view head = s.substr(0, dot);
  auto c2 = head.rfind(':');
  if (c2 == std::string_view::npos) return bad();
  std::string_view dev = head.substr(c2 + 1);
  std::string_view rest = head.substr(0, c2);
  std::string_view dom = "0";
  std::string_view bus = rest;
  if (auto c1 = rest.rfind(':'); c1 != std::string_view::npos) {
    dom = rest.substr(0, c1);
    bus = rest.substr(c1 + 1);
    if (dom.empty()) return bad();
  }
  std::uint64_t d = 0, b = 0, v = 0, f = 0;
  if (!hex_field(dom, 1, 8, 0xffffffffULL, d) || !hex_field(bus, 2, 2, 0xff, b) || !hex_field(dev, 2, 2, 0x1f, v) ||
      !hex_field(fn, 1, 1, 7, f))
    return bad();
  return PciAddress{static_cast<std::uint32_t>(d), static_cast<std::uint8_t>(b), static_cast<std::uint8_t>(v),
                    static_cast<std::uint8_t>(f)};
}

Result<MacAddress> parse_mac(std::string_view in, bool unicast_only) {
  std::string_view s = trim(in);
  auto bad = [&](std::string_view why) {
    return make_error(Errc::invalid_argument, fmt::format("'{}' is not a usable MAC address: {}", shown(in), why));
  };
  if (s.size() != 17) return bad("expected six hex pairs such as 02:00:5e:10:00:01");
  MacAddress m{};
  for (std::size_t i = 0; i < 6; ++i) {
    if (i > 0 && s[i * 3 - 1] != ':' && s[i * 3 - 1] != '-') return bad("pairs must be separated by ':'");
    std::uint64_t v = 0;
    if (!hex_field(s.substr(i * 3, 2), 2, 2, 0xff, v)) return bad("expected six hex pairs such as 02:00:5e:10:00:01");
    m[i] = static_cast<std::uint8_t>(v);
  }
  if (unicast_only) {
    if (m[0] & 1) return bad("it is a multicast address; a VF needs a unicast one");
    bool zero = true;
    for (auto b : m) zero = zero && b == 0;
    if (zero) return bad("the all-zero address cannot be assigned");
  }
  return m;
}

std::string format_mac(const MacAddress& m) {
  return fmt::format("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5]);
}

Result<std::int64_t> parse_sysfs_int(std::string_view in, std::int64_t min, std::int64_t max) {
  std::string_view s = trim(in);
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 10);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size())
    return make_error(Errc::invalid_argument, fmt::format("'{}' is not a decimal number", shown(in)));
  if (v < min || v > max)
    return make_error(Errc::invalid_argument, fmt::format("{} is outside the range {}..{}", v, min, max));
  return v;
}

Result<std::uint16_t> parse_pci_id(std::string_view in) {
  std::string_view s = trim(in);
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2);
  std::uint64_t v = 0;
  if (!hex_field(s, 1, 4, 0xffff, v))
    return make_error(Errc::invalid_argument, fmt::format("'{}' is not a PCI id such as 0x15b3", shown(in)));
  return static_cast<std::uint16_t>(v);
}

std::string_view transport_name(Transport t) {
  switch (t) {
    case Transport::infiniband: return "InfiniBand";
    case Transport::roce_v1: return "RoCE v1";
    case Transport::roce_v2: return "RoCE v2";
    case Transport::iwarp: return "iWARP";
  }
  return "?";
}

Result<NodeType> parse_node_type(std::string_view in) {
  // Kernel format (drivers/infiniband/core/sysfs.c): "<number>: <name>".
  std::string_view s = trim(in);
  auto colon = s.find(':');
  auto num = parse_sysfs_int(s.substr(0, colon), 0, 255);
  if (colon == std::string_view::npos || !num)
    return make_error(Errc::invalid_argument, fmt::format("'{}' is not an RDMA node_type such as '1: CA'", shown(in)));
  switch (*num) {
    case 1: return NodeType::ca;
    case 2: return NodeType::sw;
    case 3: return NodeType::router;
    case 4: return NodeType::rnic;
    case 5: return NodeType::usnic;
    case 6: return NodeType::usnic_udp;
    default: return NodeType::unspecified;
  }
}

std::optional<Transport> parse_gid_type(std::string_view in) {
  std::string_view s = trim(in);
  if (s == "IB/RoCE v1") return Transport::roce_v1;
  if (s == "RoCE v2") return Transport::roce_v2;
  return std::nullopt;
}

}  // namespace vrdma::sriov
