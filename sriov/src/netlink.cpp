#include "vrdma/sriov/netlink.hpp"

#include <fmt/format.h>
#include <linux/if_ether.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netlink/errno.h>
#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <netlink/route/link/sriov.h>

namespace vrdma::sriov {
namespace {

// Owners for libnl objects (STYLE.md: RAII for every resource).
struct SockDel { void operator()(nl_sock* s) const { nl_socket_free(s); } };
struct LinkDel { void operator()(rtnl_link* l) const { rtnl_link_put(l); } };
struct AddrDel { void operator()(rtnl_addr* a) const { rtnl_addr_put(a); } };
struct NlAddrDel { void operator()(nl_addr* a) const { nl_addr_put(a); } };
struct CacheDel { void operator()(nl_cache* c) const { nl_cache_free(c); } };
struct VfDel { void operator()(rtnl_link_vf* v) const { rtnl_link_vf_put(v); } };
using LinkPtr = std::unique_ptr<rtnl_link, LinkDel>;
using AddrPtr = std::unique_ptr<rtnl_addr, AddrDel>;
using NlAddrPtr = std::unique_ptr<nl_addr, NlAddrDel>;
using CachePtr = std::unique_ptr<nl_cache, CacheDel>;
using VfPtr = std::unique_ptr<rtnl_link_vf, VfDel>;

// The one place that turns a libnl error (negative NLE_*) into ours.
Error nl_error(int err, const std::string& what) {
  int e = err < 0 ? -err : err;
  Errc c = Errc::io_error;
  switch (e) {
    case NLE_OPNOTSUPP: case NLE_AF_NOSUPPORT: case NLE_MSGTYPE_NOSUPPORT: c = Errc::not_supported; break;
    case NLE_OBJ_NOTFOUND: case NLE_NODEV: c = Errc::not_found; break;
    case NLE_PERM: case NLE_NOACCESS: c = Errc::access_denied; break;
    case NLE_BUSY: case NLE_EXIST: c = Errc::busy; break;
    case NLE_INVAL: case NLE_RANGE: c = Errc::invalid_argument; break;
    case NLE_NOMEM: c = Errc::no_memory; break;
    case NLE_AGAIN: case NLE_INTR: case NLE_DUMP_INTR: c = Errc::would_block; break;
    default: break;
  }
  return make_error(c, fmt::format("{}: {}", what, nl_geterror(e)));
}

std::string addr_str(nl_addr* a) {
  if (a == nullptr) return {};
  char buf[128];
  return nl_addr2str(a, buf, sizeof buf);
}

std::string bounded(std::string_view s) { return std::string(s.substr(0, IFNAMSIZ + 8)); }

// An rtnl address object for `cidr` ("10.1.0.1/24") on the link, for adding or deleting.
Result<AddrPtr> address_for(rtnl_link* link, std::string_view cidr) {
  const std::string c(cidr.substr(0, 64));
  nl_addr* local = nullptr;
  if (c.find('/') == std::string::npos || nl_addr_parse(c.c_str(), AF_UNSPEC, &local) < 0)
    return make_error(Errc::invalid_argument,
                      fmt::format("'{}' is not an address with prefix such as 10.1.0.1/24 or fd00::1/64", c));
  NlAddrPtr lp(local);
  AddrPtr a(rtnl_addr_alloc());
  rtnl_addr_set_ifindex(a.get(), rtnl_link_get_ifindex(link));
  if (int err = rtnl_addr_set_local(a.get(), local); err < 0) return nl_error(err, fmt::format("cannot use address {}", c));
  return a;
}

}  // namespace

Result<VfLinkState> parse_vf_link_state(std::string_view s) {
  if (s == "auto") return VfLinkState::follow_pf;
  if (s == "enable") return VfLinkState::enable;
  if (s == "disable") return VfLinkState::disable;
  return make_error(Errc::invalid_argument,
                    fmt::format("'{}' is not a VF link state; use auto, enable or disable", bounded(s)));
}

std::string_view vf_link_state_name(VfLinkState s) {
  switch (s) {
    case VfLinkState::follow_pf: return "auto";
    case VfLinkState::enable: return "enable";
    case VfLinkState::disable: return "disable";
  }
  return "?";
}

bool VfConfig::empty() const {
  return !mac && !vlan && !qos && !spoofchk && !trust && !link_state && !min_tx_rate_mbps && !max_tx_rate_mbps;
}

Status VfConfig::validate() const {
  if (vlan && *vlan > 4094)
    return make_error(Errc::invalid_argument, fmt::format("VLAN {} is out of range; use 1..4094 (0 clears)", *vlan));
  if (qos && *qos > 7)
    return make_error(Errc::invalid_argument, fmt::format("QoS {} is out of range; 802.1p priorities are 0..7", *qos));
  if (qos && !vlan)
    return make_error(Errc::invalid_argument, "a VLAN QoS priority needs a VLAN id too (--vlan)");
  if (min_tx_rate_mbps && max_tx_rate_mbps && *max_tx_rate_mbps != 0 && *min_tx_rate_mbps > *max_tx_rate_mbps)
    return make_error(Errc::invalid_argument, fmt::format("the minimum rate {} Mb/s exceeds the maximum {} Mb/s",
                                                          *min_tx_rate_mbps, *max_tx_rate_mbps));
  return {};
}

struct Rtnl::Impl {
  std::unique_ptr<nl_sock, SockDel> sock;

  Result<LinkPtr> get(std::string_view ifname) {
    if (ifname.empty() || ifname.size() >= IFNAMSIZ)
      return make_error(Errc::invalid_argument, fmt::format("'{}' is not a valid netdev name", bounded(ifname)));
    rtnl_link* l = nullptr;
    std::string n(ifname);
    int err = rtnl_link_get_kernel(sock.get(), 0, n.c_str(), &l);
    if (err < 0) {
      Error e = nl_error(err, fmt::format("cannot look up netdev {}", n));
      if (e.is(Errc::not_found))
        return make_error(Errc::not_found, fmt::format("there is no netdev named {} in this network namespace", n));
      return e;
    }
    return LinkPtr(l);
  }

  Status change(rtnl_link* orig, rtnl_link* chg, const std::string& what) {
    int err = rtnl_link_change(sock.get(), orig, chg, 0);
    if (err < 0) return nl_error(err, what);
    return {};
  }
};

Rtnl::Rtnl(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Rtnl::Rtnl(Rtnl&&) noexcept = default;
Rtnl& Rtnl::operator=(Rtnl&&) noexcept = default;
Rtnl::~Rtnl() = default;

Result<Rtnl> Rtnl::open() {
  auto impl = std::make_unique<Impl>();
  impl->sock.reset(nl_socket_alloc());
  if (!impl->sock) return make_error(Errc::no_memory, "cannot allocate a netlink socket");
  int err = nl_connect(impl->sock.get(), NETLINK_ROUTE);
  if (err < 0) return nl_error(err, "cannot open an rtnetlink socket");
  return Rtnl(std::move(impl));
}

static LinkInfo to_info(rtnl_link* l) {
  LinkInfo i;
  i.ifindex = rtnl_link_get_ifindex(l);
  if (const char* n = rtnl_link_get_name(l)) i.name = n;
  if (const char* t = rtnl_link_get_type(l)) i.kind = t;
  i.mac = addr_str(rtnl_link_get_addr(l));
  i.mtu = rtnl_link_get_mtu(l);
  i.admin_up = (rtnl_link_get_flags(l) & IFF_UP) != 0;
  std::uint32_t n = 0;
  if (rtnl_link_get_num_vf(l, &n) == 0) i.num_vfs = n;
  return i;
}

Result<std::vector<LinkInfo>> Rtnl::links() {
  nl_cache* c = nullptr;
  int err = rtnl_link_alloc_cache(impl_->sock.get(), AF_UNSPEC, &c);
  if (err < 0) return nl_error(err, "cannot list netdevs");
  CachePtr cache(c);
  std::vector<LinkInfo> out;
  for (nl_object* o = nl_cache_get_first(c); o != nullptr; o = nl_cache_get_next(o))
    out.push_back(to_info(reinterpret_cast<rtnl_link*>(o)));
  return out;
}

Result<LinkInfo> Rtnl::link(std::string_view ifname) {
  auto l = impl_->get(ifname);
  if (!l) return std::move(l).error();
  return to_info(l->get());
}

Status Rtnl::set_admin_up(std::string_view ifname, bool up) {
  auto l = impl_->get(ifname);
  if (!l) return std::move(l).error();
  LinkPtr chg(rtnl_link_alloc());
  if (up) rtnl_link_set_flags(chg.get(), IFF_UP);
  else rtnl_link_unset_flags(chg.get(), IFF_UP);
  return impl_->change(l->get(), chg.get(), fmt::format("cannot set netdev {} {}", bounded(ifname), up ? "up" : "down"));
}

Status Rtnl::set_mac(std::string_view ifname, const MacAddress& mac) {
  auto l = impl_->get(ifname);
  if (!l) return std::move(l).error();
  LinkPtr chg(rtnl_link_alloc());
  NlAddrPtr a(nl_addr_build(AF_LLC, mac.data(), mac.size()));
  rtnl_link_set_addr(chg.get(), a.get());
  return impl_->change(l->get(), chg.get(), fmt::format("cannot set the MAC of netdev {}", bounded(ifname)));
}

Status Rtnl::add_address(std::string_view ifname, std::string_view cidr) {
  auto l = impl_->get(ifname);
  if (!l) return std::move(l).error();
  auto a = address_for(l->get(), cidr);
  if (!a) return std::move(a).error();
  if (int err = rtnl_addr_add(impl_->sock.get(), a->get(), 0); err < 0)
    return nl_error(err, fmt::format("cannot add address {} to netdev {}", std::string(cidr.substr(0, 64)), bounded(ifname)));
  return {};
}

Status Rtnl::del_address(std::string_view ifname, std::string_view cidr) {
  auto l = impl_->get(ifname);
  if (!l) return std::move(l).error();
  auto a = address_for(l->get(), cidr);
  if (!a) return std::move(a).error();
  const int err = rtnl_addr_delete(impl_->sock.get(), a->get(), 0);
  if (err == -NLE_NOADDR || err == -NLE_OBJ_NOTFOUND)
    return make_error(Errc::not_found, fmt::format("netdev {} has no address {}", bounded(ifname), std::string(cidr.substr(0, 64))));
  if (err < 0) return nl_error(err, fmt::format("cannot remove address {} from netdev {}", std::string(cidr.substr(0, 64)), bounded(ifname)));
  return {};
}

Result<std::vector<std::string>> Rtnl::addresses(std::string_view ifname) {
  auto l = impl_->get(ifname);
  if (!l) return std::move(l).error();
  int idx = rtnl_link_get_ifindex(l->get());
  nl_cache* c = nullptr;
  int err = rtnl_addr_alloc_cache(impl_->sock.get(), &c);
  if (err < 0) return nl_error(err, "cannot list addresses");
  CachePtr cache(c);
  std::vector<std::string> out;
  for (nl_object* o = nl_cache_get_first(c); o != nullptr; o = nl_cache_get_next(o)) {
    auto* a = reinterpret_cast<rtnl_addr*>(o);
    if (rtnl_addr_get_ifindex(a) == idx) out.push_back(addr_str(rtnl_addr_get_local(a)));
  }
  return out;
}

Status Rtnl::set_vf(std::string_view pf_ifname, std::uint32_t vf_index, const VfConfig& cfg) {
  VRDMA_TRY(cfg.validate());
  if (cfg.empty()) return {};
  auto l = impl_->get(pf_ifname);
  if (!l) return std::move(l).error();
  LinkPtr chg(rtnl_link_alloc());
  VfPtr vf(rtnl_link_vf_alloc());
  if (!chg || !vf) return make_error(Errc::no_memory, "cannot allocate a netlink VF request");
  rtnl_link_vf_set_index(vf.get(), vf_index);
  NlAddrPtr mac;
  if (cfg.mac) {
    mac.reset(nl_addr_build(AF_LLC, cfg.mac->data(), cfg.mac->size()));
    rtnl_link_vf_set_addr(vf.get(), mac.get());
  }
  if (cfg.vlan) {
    nl_vf_vlans_t* vlans = nullptr;
    if (rtnl_link_vf_vlan_alloc(&vlans, 1) < 0) return make_error(Errc::no_memory, "cannot allocate a VLAN list");
    vlans->vlans[0].vf_vlan = *cfg.vlan;
    vlans->vlans[0].vf_vlan_qos = cfg.qos.value_or(0);
    vlans->vlans[0].vf_vlan_proto = htons(ETH_P_8021Q);
    rtnl_link_vf_set_vlans(vf.get(), vlans);
    rtnl_link_vf_vlan_put(vlans);
  }
  if (cfg.spoofchk) rtnl_link_vf_set_spoofchk(vf.get(), *cfg.spoofchk ? 1U : 0U);
  if (cfg.trust) rtnl_link_vf_set_trust(vf.get(), *cfg.trust ? 1U : 0U);
  if (cfg.link_state) rtnl_link_vf_set_linkstate(vf.get(), static_cast<std::uint32_t>(*cfg.link_state));
  if (cfg.min_tx_rate_mbps || cfg.max_tx_rate_mbps) {
    nl_vf_rate r{};
    r.api = RTNL_LINK_VF_RATE_API_NEW;  // IFLA_VF_RATE carries min and max together
    r.min_tx_rate = cfg.min_tx_rate_mbps.value_or(0);
    r.max_tx_rate = cfg.max_tx_rate_mbps.value_or(0);
    rtnl_link_vf_set_rate(vf.get(), &r);
  }
  int err = rtnl_link_vf_add(chg.get(), vf.get());
  if (err < 0) return nl_error(err, "cannot build the VF request");
  std::string pf(bounded(pf_ifname));
  err = rtnl_link_change(impl_->sock.get(), l->get(), chg.get(), 0);
  if (err < 0) {
    Error e = nl_error(err, "");
    const char* kind = rtnl_link_get_type(l->get());
    if (e.is(Errc::not_supported))
      return make_error(Errc::not_supported,
                        fmt::format("the kernel says netdev {}{} does not support SR-IOV VF settings ({}); configure "
                                    "VF {} through the netdev of its physical function",
                                    pf, kind ? fmt::format(" (a {} device)", kind) : std::string(),
                                    nl_geterror(err < 0 ? -err : err), vf_index));
    return nl_error(err, fmt::format("the kernel refused the settings for VF {} of netdev {}", vf_index, pf));
  }
  return {};
}

Result<std::vector<VfState>> Rtnl::vfs(std::string_view pf_ifname) {
  auto l = impl_->get(pf_ifname);
  if (!l) return std::move(l).error();
  std::uint32_t n = 0;
  std::vector<VfState> out;
  if (rtnl_link_get_num_vf(l->get(), &n) < 0) return out;
  for (std::uint32_t i = 0; i < n; ++i) {
    VfPtr vf(rtnl_link_vf_get(l->get(), i));
    if (!vf) continue;
    VfState s;
    s.index = i;
    nl_addr* a = nullptr;
    if (rtnl_link_vf_get_addr(vf.get(), &a) == 0) s.mac = addr_str(a);
    nl_vf_vlans_t* vl = nullptr;
    if (rtnl_link_vf_get_vlans(vf.get(), &vl) == 0 && vl != nullptr && vl->size > 0) {
      s.vlan = vl->vlans[0].vf_vlan;
      s.qos = vl->vlans[0].vf_vlan_qos;
    }
    std::uint32_t v = 0;
    if (rtnl_link_vf_get_spoofchk(vf.get(), &v) == 0) s.spoofchk = v != 0;
    if (rtnl_link_vf_get_trust(vf.get(), &v) == 0) s.trust = v != 0;
    if (rtnl_link_vf_get_linkstate(vf.get(), &v) == 0 && v <= 2) s.link_state = static_cast<VfLinkState>(v);
    nl_vf_rate r{};
    if (rtnl_link_vf_get_rate(vf.get(), &r) == 0) {
      s.min_tx_rate_mbps = r.min_tx_rate;
      s.max_tx_rate_mbps = r.max_tx_rate ? r.max_tx_rate : r.rate;
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace vrdma::sriov
