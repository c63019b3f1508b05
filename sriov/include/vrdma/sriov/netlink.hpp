// rtnetlink through libnl-route-3: links and addresses in the caller's network namespace, and the
// per-VF settings a PF driver exposes (IFLA_VF_* inside IFLA_VFINFO_LIST: MAC, VLAN/QoS,
// spoof-check, trust, link state, tx rate). A netdev without SR-IOV (veth, dummy) makes the kernel
// answer EOPNOTSUPP, returned as Errc::not_supported with a sentence naming the netdev.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/sriov/parse.hpp"

namespace vrdma::sriov {

enum class VfLinkState : std::uint32_t { follow_pf = 0, enable = 1, disable = 2 };  // IFLA_VF_LINK_STATE_*
Result<VfLinkState> parse_vf_link_state(std::string_view s);  // "auto", "enable", "disable"
std::string_view vf_link_state_name(VfLinkState s);

// What to change on one VF; unset fields are left alone.
struct VfConfig {
  std::optional<MacAddress> mac;
  std::optional<std::uint16_t> vlan;  // 0 clears the VLAN; 1..4094
  std::optional<std::uint8_t> qos;    // 802.1p priority 0..7, only with a VLAN
  std::optional<bool> spoofchk;
  std::optional<bool> trust;
  std::optional<VfLinkState> link_state;
  std::optional<std::uint32_t> min_tx_rate_mbps;
  std::optional<std::uint32_t> max_tx_rate_mbps;  // 0 = unlimited

  [[nodiscard]] bool empty() const;
  // Range checks that do not need the kernel (VLAN id, QoS only with VLAN, min <= max).
  [[nodiscard]] Status validate() const;
};

struct LinkInfo {
  int ifindex = 0;
  std::string name;
  std::string kind;  // rtnl link type ("veth", "dummy", "" for hardware)
  std::string mac;
  std::uint32_t mtu = 0;
  bool admin_up = false;
  std::uint32_t num_vfs = 0;  // IFLA_NUM_VF, 0 when the netdev has no SR-IOV
};

struct VfState {
  std::uint32_t index = 0;
  std::string mac;
  std::uint32_t vlan = 0;
  std::uint32_t qos = 0;
  std::optional<bool> spoofchk;
  std::optional<bool> trust;
  std::optional<VfLinkState> link_state;
  std::uint32_t min_tx_rate_mbps = 0;
  std::uint32_t max_tx_rate_mbps = 0;
};

// One NETLINK_ROUTE socket, bound in the network namespace of the thread that opens it.
// Move-only; not thread-safe (one socket, one sequence space).
class Rtnl {
 public:
  static Result<Rtnl> open();
  Rtnl(Rtnl&&) noexcept;
  Rtnl& operator=(Rtnl&&) noexcept;
  Rtnl(const Rtnl&) = delete;
  Rtnl& operator=(const Rtnl&) = delete;
  ~Rtnl();

  Result<std::vector<LinkInfo>> links();
  Result<LinkInfo> link(std::string_view ifname);  // not_found when there is no such netdev
  Status set_admin_up(std::string_view ifname, bool up);
  Status set_mac(std::string_view ifname, const MacAddress& mac);
  Status add_address(std::string_view ifname, std::string_view cidr);  // "10.1.0.1/24", "fd00::1/64"
  Status del_address(std::string_view ifname, std::string_view cidr);  // not_found when it is not there
  Result<std::vector<std::string>> addresses(std::string_view ifname);  // "10.1.0.1/24"

  // Applies `cfg` to VF `vf_index` of the PF netdev `pf_ifname` in one RTM_SETLINK.
  Status set_vf(std::string_view pf_ifname, std::uint32_t vf_index, const VfConfig& cfg);
  // Reads back the VF table of a PF netdev (empty when the netdev has no VFs).
  Result<std::vector<VfState>> vfs(std::string_view pf_ifname);

 private:
  struct Impl;
  explicit Rtnl(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vrdma::sriov
