#include "vrdma/sriov/cli.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "vrdma/common/cli.hpp"
#include "vrdma/common/table.hpp"
#include "vrdma/sriov/control.hpp"
#include "vrdma/sriov/discovery.hpp"
#include "vrdma/sriov/ledger.hpp"
#include "vrdma/sriov/libvirt_xml.hpp"
#include "vrdma/sriov/pool.hpp"

namespace vrdma::sriov {
namespace {
using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

struct Common {
  std::string sysfs_root = "/sys";
  std::string ledger = "/var/lib/vrdma/vf-ledger.sqlite";
  bool json_out = false;
};

// A failure the CLI reports: exit status 1, one sentence.
struct Fail {
  std::string sentence;
};

template <class T>
T take(Result<T> r) {
  if (!r) throw Fail{r.error().message};
  return std::move(r).value();
}
void take(Status s) {
  if (!s) throw Fail{s.error().message};
}

Result<std::optional<bool>> parse_onoff(const std::string& s, std::string_view what) {
  if (s.empty()) return std::optional<bool>();
  if (s == "on" || s == "yes" || s == "true") return std::optional<bool>(true);
  if (s == "off" || s == "no" || s == "false") return std::optional<bool>(false);
  return make_error(Errc::invalid_argument, fmt::format("--{} takes on or off, not '{}'", what, s.substr(0, 32)));
}

std::string transports_str(const PciFunction& f) {
  std::vector<std::string> t;
  for (const auto& d : f.rdma)
    for (auto x : d.transports())
      if (std::find(t.begin(), t.end(), transport_name(x)) == t.end()) t.emplace_back(transport_name(x));
  return t.empty() ? "-" : fmt::format("{}", fmt::join(t, ","));
}

json function_json(const PciFunction& f, const std::optional<Allocation>& held) {
  json j;
  j["address"] = f.addr.str();
  j["kind"] = f.is_pf() ? "pf" : "vf";
  j["model"] = f.model();
  j["vendor"] = fmt::format("0x{:04x}", f.vendor);
  j["device"] = fmt::format("0x{:04x}", f.device);
  j["driver"] = f.driver;
  if (!f.driver_override.empty()) j["driver_override"] = f.driver_override;
  j["iommu_group"] = f.iommu_group ? json(*f.iommu_group) : json(nullptr);
  j["numa_node"] = f.numa_node;
  j["netdevs"] = f.netdevs;
  json rd = json::array();
  for (const auto& d : f.rdma) {
    json dj;
    dj["name"] = d.name;
    json ports = json::array();
    for (const auto& p : d.ports) {
      json t = json::array();
      for (auto x : p.transports) t.push_back(transport_name(x));
      ports.push_back({{"port", p.port}, {"link_layer", p.link_layer}, {"state", p.state}, {"transports", t}});
    }
    dj["ports"] = ports;
    rd.push_back(dj);
  }
  j["rdma"] = rd;
  if (f.is_pf()) {
    j["total_vfs"] = f.total_vfs;
    j["num_vfs"] = f.num_vfs;
  } else {
    j["pf"] = f.pf ? f.pf->str() : "";
    j["vf_index"] = f.vf_index ? json(*f.vf_index) : json(nullptr);
  }
  if (held) {
    j["held_by"] = {{"purpose", purpose_name(held->purpose)}, {"owner", held->owner},
                    {"state", alloc_state_name(held->state)}, {"owner_pid", held->owner_pid},
                    {"allocated_at", held->allocated_at}};
  } else if (!f.is_pf()) {
    j["held_by"] = nullptr;
  }
  return j;
}

struct Ctx {
  Common c;
  std::ostream& out;
  SysfsRoot sysfs() const { return SysfsRoot{c.sysfs_root, std::chrono::milliseconds(5000)}; }
  Ledger ledger() const { return take(Ledger::open(c.ledger)); }
  // Readers do not create a ledger that is not there yet.
  std::map<PciAddress, Allocation> holders() const {
    std::map<PciAddress, Allocation> m;
    std::error_code ec;
    if (!fs::exists(c.ledger, ec)) return m;
    auto l = ledger();
    for (auto& a : take(l.list())) m.emplace(a.vf, a);
    return m;
  }
};

std::optional<Allocation> held(const std::map<PciAddress, Allocation>& h, const PciAddress& a) {
  auto it = h.find(a);
  if (it == h.end()) return std::nullopt;
  return it->second;
}

std::string holder_str(const std::optional<Allocation>& a) {
  if (!a) return "-";
  return fmt::format("{}:{}{}", purpose_name(a->purpose), a->owner,
                     a->state == AllocState::active ? "" : fmt::format(" ({})", alloc_state_name(a->state)));
}

void cmd_list(Ctx& x, const std::string& pf_arg) {
  auto inv = take(discover(x.sysfs()));
  auto h = x.holders();
  std::optional<PciAddress> only;
  if (!pf_arg.empty()) only = take(resolve_pf(inv, pf_arg));
  if (x.c.json_out) {
    json pfs = json::array();
    for (const auto* pf : inv.pfs()) {
      if (only && pf->addr != *only) continue;
      json pj = function_json(*pf, std::nullopt);
      json vfs = json::array();
      for (const auto* vf : inv.vfs_of(pf->addr)) vfs.push_back(function_json(*vf, held(h, vf->addr)));
      pj["vfs"] = vfs;
      pfs.push_back(pj);
    }
    x.out << json{{"pfs", pfs}}.dump(2) << '\n';
    return;
  }
  std::vector<std::vector<std::string>> rows{
      {"FUNCTION", "KIND", "VF", "MODEL", "DRIVER", "NETDEV", "RDMA", "TRANSPORTS", "NUMA", "IOMMU", "VFS/HELD BY"}};
  for (const auto* pf : inv.pfs()) {
    if (only && pf->addr != *only) continue;
    auto row = [&](const PciFunction& f, const std::string& last) {
      std::vector<std::string> names;
      for (const auto& d : f.rdma) names.push_back(d.name);
      rows.push_back({f.addr.str(), f.is_pf() ? "PF" : "VF", f.vf_index ? std::to_string(*f.vf_index) : "-", f.model(),
                      f.driver.empty() ? "(none)" : f.driver,
                      f.netdevs.empty() ? "-" : fmt::format("{}", fmt::join(f.netdevs, ",")),
                      names.empty() ? "-" : fmt::format("{}", fmt::join(names, ",")), transports_str(f),
                      std::to_string(f.numa_node), f.iommu_group ? std::to_string(*f.iommu_group) : "-", last});
    };
    row(*pf, fmt::format("{}/{}", pf->num_vfs, pf->total_vfs));
    for (const auto* vf : inv.vfs_of(pf->addr)) row(*vf, holder_str(held(h, vf->addr)));
  }
  if (rows.size() == 1) {
    x.out << "No SR-IOV physical functions found under " << x.c.sysfs_root << ".\n";
    return;
  }
  print_table(x.out, rows);
}

void cmd_enable(Ctx& x, const std::string& pf_arg, std::uint32_t count) {
  auto sysfs = x.sysfs();
  auto inv = take(discover(sysfs));
  auto pf = take(resolve_pf(inv, pf_arg));
  take(set_num_vfs(sysfs, pf, count));
  auto after = take(discover(sysfs));
  if (x.c.json_out) {
    json vfs = json::array();
    for (const auto* vf : after.vfs_of(pf)) vfs.push_back(vf->addr.str());
    x.out << json{{"pf", pf.str()}, {"num_vfs", count}, {"vfs", vfs}}.dump(2) << '\n';
  } else {
    x.out << fmt::format("PF {} now has {} VFs.\n", pf.str(), count);
  }
}

void cmd_disable(Ctx& x, const std::string& pf_arg) {
  auto sysfs = x.sysfs();
  auto inv = take(discover(sysfs));
  auto pf = take(resolve_pf(inv, pf_arg));
  std::vector<std::string> busy;
  for (const auto& [vf, a] : x.holders())
    if (a.pf == pf) busy.push_back(fmt::format("{} by {} '{}'", vf.str(), purpose_name(a.purpose), a.owner));
  if (!busy.empty())
    throw Fail{fmt::format("PF {} still has VFs in use ({}); release them first with 'vrdmactl vf release --vf ...'",
                           pf.str(), fmt::join(busy, ", "))};
  take(set_num_vfs(sysfs, pf, 0));
  if (x.c.json_out) x.out << json{{"pf", pf.str()}, {"num_vfs", 0}}.dump(2) << '\n';
  else x.out << fmt::format("PF {} has no VFs now.\n", pf.str());
}

struct AssignArgs {
  std::string owner, pf, vf, mac, spoofchk, trust, link_state, xml = "none";
  bool migration = false, passthrough = false;
  std::optional<int> numa;
  std::optional<std::uint16_t> vlan;
  std::optional<std::uint8_t> qos;
  std::optional<std::uint32_t> min_rate, max_rate;
};

void cmd_assign(Ctx& x, const AssignArgs& a) {
  auto sysfs = x.sysfs();
  auto inv = take(discover(sysfs));
  AssignOptions o;
  if (!a.pf.empty()) o.filter.pf = take(resolve_pf(inv, a.pf));
  if (!a.vf.empty()) o.filter.vf = take(parse_pci_address(a.vf));
  o.filter.numa_node = a.numa;
  o.filter.need_rdma = !a.passthrough;
  o.bind = a.passthrough ? BindMode::vfio : BindMode::keep;
  o.persistent = true;
  if (!a.mac.empty()) o.net.mac = take(parse_mac(a.mac));
  o.net.vlan = a.vlan;
  o.net.qos = a.qos;
  o.net.spoofchk = take(parse_onoff(a.spoofchk, "spoofchk"));
  o.net.trust = take(parse_onoff(a.trust, "trust"));
  if (!a.link_state.empty()) o.net.link_state = take(parse_vf_link_state(a.link_state));
  o.net.min_tx_rate_mbps = a.min_rate;
  o.net.max_tx_rate_mbps = a.max_rate;
  if (a.xml != "none" && a.xml != "hostdev" && a.xml != "interface")
    throw Fail{fmt::format("--xml takes none, hostdev or interface, not '{}'", a.xml.substr(0, 32))};
  take(o.net.validate());
  auto ledger = x.ledger();
  // Free what crashed owners left behind before choosing (reconcile is idempotent).
  take(ledger.reconcile(inv, ReconcileEnv{current_boot_id(), {}}));
  AllocateRequest req{a.migration ? Purpose::migration : Purpose::guest, a.owner, static_cast<std::int64_t>(getpid()),
                      current_boot_id()};
  // The CLI's pid only guards the reservation; the finished assignment is held until released.
  auto al = take(assign_vf(sysfs, ledger, req, o));
  std::string xml;
  if (a.xml == "hostdev") xml = hostdev_xml(al.vf);
  if (a.xml == "interface") xml = take(interface_hostdev_xml(al.vf, {o.net.mac, o.net.vlan, true}));
  auto after = take(discover(sysfs));
  const PciFunction* f = after.find(al.vf);
  if (x.c.json_out) {
    json j{{"vf", al.vf.str()}, {"pf", al.pf.str()}, {"vf_index", al.vf_index},
           {"purpose", purpose_name(al.purpose)}, {"owner", al.owner}, {"state", alloc_state_name(al.state)}};
    if (f) j["function"] = function_json(*f, al);
    if (!xml.empty()) j["libvirt_xml"] = xml;
    x.out << j.dump(2) << '\n';
  } else {
    std::vector<std::string> rd;
    if (f)
      for (const auto& d : f->rdma) rd.push_back(d.name);
    x.out << fmt::format("VF {} (VF {} of PF {}{}) is assigned to {} '{}'.\n", al.vf.str(), al.vf_index, al.pf.str(),
                         rd.empty() ? "" : fmt::format(", RDMA device {}", fmt::join(rd, ",")),
                         purpose_name(al.purpose), al.owner);
    x.out << xml;
  }
}

void cmd_release(Ctx& x, const std::string& vf_arg, const std::string& owner, bool migration, bool keep_driver) {
  auto ledger = x.ledger();
  PciAddress vf;
  if (!vf_arg.empty()) {
    vf = take(parse_pci_address(vf_arg));
  } else if (!owner.empty()) {
    auto a = take(ledger.find_owner(migration ? Purpose::migration : Purpose::guest, owner));
    if (!a)
      throw Fail{fmt::format("{} '{}' holds no VF; 'vrdmactl vf list' shows who holds what",
                             migration ? "migration" : "guest", owner.substr(0, 128))};
    vf = a->vf;
  } else {
    throw Fail{"say which VF to release: --vf ADDRESS or --owner NAME"};
  }
  std::optional<std::string> who;
  if (!owner.empty()) who = owner;
  take(release_vf(x.sysfs(), ledger, vf, who, !keep_driver));
  if (x.c.json_out) x.out << json{{"released", vf.str()}}.dump(2) << '\n';
  else x.out << fmt::format("VF {} is released.\n", vf.str());
}

void cmd_show(Ctx& x, const std::string& arg) {
  auto inv = take(discover(x.sysfs()));
  const PciFunction* f = nullptr;
  if (auto a = parse_pci_address(arg); a) f = inv.find(*a);
  else f = inv.find_by_netdev(arg);
  if (f == nullptr)
    throw Fail{fmt::format("no SR-IOV function '{}' found; 'vrdmactl vf list' shows them", arg.substr(0, 64))};
  auto h = x.holders();
  auto hd = held(h, f->addr);
  if (x.c.json_out) {
    json j = function_json(*f, hd);
    if (!f->is_pf()) j["libvirt_hostdev_xml"] = hostdev_xml(f->addr);
    x.out << j.dump(2) << '\n';
    return;
  }
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"address:", f->addr.str()});
  rows.push_back({"kind:", f->is_pf() ? "physical function" : "virtual function"});
  rows.push_back({"model:", fmt::format("{} ({:04x}:{:04x})", f->model(), f->vendor, f->device)});
  rows.push_back({"driver:", f->driver.empty() ? "(none)" : f->driver});
  if (!f->driver_override.empty()) rows.push_back({"driver_override:", f->driver_override});
  rows.push_back({"iommu group:", f->iommu_group ? std::to_string(*f->iommu_group) : "(none)"});
  rows.push_back({"numa node:", std::to_string(f->numa_node)});
  rows.push_back({"netdevs:", f->netdevs.empty() ? "-" : fmt::format("{}", fmt::join(f->netdevs, ", "))});
  for (const auto& d : f->rdma)
    for (const auto& p : d.ports) {
      std::vector<std::string> t;
      for (auto tr : p.transports) t.emplace_back(transport_name(tr));
      rows.push_back({"rdma:", fmt::format("{} port {}: {} ({})", d.name, p.port, p.link_layer,
                                           t.empty() ? "-" : fmt::format("{}", fmt::join(t, ", ")))});
    }
  if (f->is_pf()) {
    rows.push_back({"vfs:", fmt::format("{} of {}", f->num_vfs, f->total_vfs)});
  } else {
    rows.push_back({"pf:", fmt::format("{} (VF {})", f->pf ? f->pf->str() : "?",
                                       f->vf_index ? std::to_string(*f->vf_index) : "?")});
    rows.push_back({"held by:", holder_str(hd)});
  }
  print_table(x.out, rows);
  if (!f->is_pf()) x.out << "libvirt:\n" << hostdev_xml(f->addr);
}

void cmd_reconcile(Ctx& x) {
  auto inv = take(discover(x.sysfs()));
  auto ledger = x.ledger();
  auto acts = take(ledger.reconcile(inv, ReconcileEnv{current_boot_id(), {}}));
  if (x.c.json_out) {
    json arr = json::array();
    for (const auto& a : acts) arr.push_back({{"vf", a.vf.str()}, {"action", static_cast<int>(a.kind)},
                                              {"message", a.sentence}});
    x.out << json{{"actions", arr}}.dump(2) << '\n';
    return;
  }
  if (acts.empty()) x.out << "The ledger agrees with sysfs; nothing to do.\n";
  for (const auto& a : acts) x.out << a.sentence << ".\n";
}

void cmd_network_xml(Ctx& x, const std::string& pf_arg, const std::string& name, bool list_vfs) {
  auto inv = take(discover(x.sysfs()));
  auto pf = take(resolve_pf(inv, pf_arg));
  HostdevNetworkOptions o;
  o.name = name;
  if (list_vfs) {
    for (const auto* vf : inv.vfs_of(pf)) o.vfs.push_back(vf->addr);
    if (o.vfs.empty()) throw Fail{fmt::format("PF {} has no VFs; enable some with 'vrdmactl vf enable'", pf.str())};
  } else {
    const PciFunction* f = inv.find(pf);
    if (f->netdevs.empty())
      throw Fail{fmt::format("PF {} has no netdev for <pf dev=.../>; use --vf-list to list its VFs instead", pf.str())};
    o.pf_dev = f->netdevs.front();
  }
  auto xml = take(hostdev_network_xml(o));
  if (x.c.json_out) x.out << json{{"network_xml", xml}}.dump(2) << '\n';
  else x.out << xml;
}

}  // namespace

int vf_cli_run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app{"Manage SR-IOV VFs for vrdma backends and migrations", "vrdmactl vf"};
  cli::prepare(app);
  app.require_subcommand(1);
  app.fallthrough();
  Ctx x{{}, out};
  app.add_option("--sysfs-root", x.c.sysfs_root, "where sysfs is mounted")->capture_default_str();
  app.add_option("--ledger", x.c.ledger, "the VF ledger (SQLite)")->capture_default_str();
  app.add_flag("--json", x.c.json_out, "JSON output");

  std::string pf, vf, owner, name;
  std::uint32_t count = 0;
  bool migration = false, keep_driver = false, vf_list = false;
  AssignArgs aa;

  auto* list = app.add_subcommand("list", "list PFs and VFs with their RDMA devices and holders");
  list->add_option("--pf", pf, "only this PF (address or netdev)");
  auto* enable = app.add_subcommand("enable", "create VFs on a PF");
  enable->add_option("--pf", pf, "PF address or netdev")->required();
  enable->add_option("--count", count, "number of VFs")->required()->check(CLI::Range(1, 65535));
  auto* disable = app.add_subcommand("disable", "remove all VFs of a PF");
  disable->add_option("--pf", pf, "PF address or netdev")->required();
  auto* assign = app.add_subcommand("assign", "allocate a VF to a guest or a migration");
  assign->add_option("--owner", aa.owner, "guest device (vm1/rdma0) or migration id")->required();
  assign->add_flag("--migration", aa.migration, "the VF carries a migration, not a guest");
  assign->add_option("--pf", aa.pf, "take the VF from this PF");
  assign->add_option("--vf", aa.vf, "take exactly this VF");
  assign->add_option("--numa", aa.numa, "take a VF on this NUMA node");
  assign->add_flag("--passthrough", aa.passthrough, "bind the VF to vfio-pci for the guest (no host RDMA needed)");
  assign->add_option("--mac", aa.mac, "VF MAC address");
  assign->add_option("--vlan", aa.vlan, "VF VLAN id (0 clears)")->check(CLI::Range(0, 4094));
  assign->add_option("--qos", aa.qos, "VLAN priority 0..7")->check(CLI::Range(0, 7));
  assign->add_option("--spoofchk", aa.spoofchk, "on|off");
  assign->add_option("--trust", aa.trust, "on|off");
  assign->add_option("--link-state", aa.link_state, "auto|enable|disable");
  assign->add_option("--min-rate", aa.min_rate, "minimum tx rate, Mb/s");
  assign->add_option("--max-rate", aa.max_rate, "maximum tx rate, Mb/s (0 = unlimited)");
  assign->add_option("--xml", aa.xml, "print libvirt XML: none|hostdev|interface");
  auto* release = app.add_subcommand("release", "give a VF back to the pool");
  release->add_option("--vf", vf, "VF address");
  release->add_option("--owner", owner, "owner that holds the VF");
  release->add_flag("--migration", migration, "the owner is a migration");
  release->add_flag("--keep-driver", keep_driver, "leave the VF on vfio-pci");
  auto* show = app.add_subcommand("show", "show one PF or VF");
  show->add_option("function", vf, "PCI address or netdev")->required();
  auto* reconcile = app.add_subcommand("reconcile", "bring the ledger in line with sysfs after a crash or reboot");
  auto* netxml = app.add_subcommand("network-xml", "print a libvirt <network> with a hostdev VF pool");
  netxml->add_option("--pf", pf, "PF address or netdev")->required();
  netxml->add_option("--name", name, "network name")->required();
  netxml->add_flag("--vf-list", vf_list, "list the VFs instead of <pf dev=.../>");

  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e, out, err);
    return rc == 0 ? 0 : 2;
  }
  try {
    if (list->parsed()) cmd_list(x, pf);
    else if (enable->parsed()) cmd_enable(x, pf, count);
    else if (disable->parsed()) cmd_disable(x, pf);
    else if (assign->parsed()) cmd_assign(x, aa);
    else if (release->parsed()) cmd_release(x, vf, owner, migration, keep_driver);
    else if (show->parsed()) cmd_show(x, vf);
    else if (reconcile->parsed()) cmd_reconcile(x);
    else if (netxml->parsed()) cmd_network_xml(x, pf, name, vf_list);
  } catch (const Fail& f) {
    if (x.c.json_out) err << json{{"error", f.sentence}}.dump() << '\n';
    else err << "vrdmactl vf: " << f.sentence << ".\n";
    return 1;
  }
  return 0;
}

int vf_cli_main(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 2; i < argc; ++i) args.emplace_back(argv[i]);
  return vf_cli_run(args, std::cout, std::cerr);
}

}  // namespace vrdma::sriov
