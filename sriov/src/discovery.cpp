#include "vrdma/sriov/discovery.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "sysfs_io.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::sriov {
namespace fs = std::filesystem;
using detail::link_basename;
using detail::read_attr;

namespace {

struct KnownDevice {
  std::uint16_t vendor, device;
  std::string_view model;
  std::string_view native_driver;
};
// PCI ids from the pci.ids database; native driver as in the kernel's id tables.
constexpr KnownDevice kKnown[] = {
    {0x1077, 0x8070, "QLogic FastLinQ QL41000", "qede"},
    {0x1077, 0x8090, "QLogic FastLinQ QL41000 VF", "qede"},
    {0x8086, 0x1593, "Intel E810-C", "ice"},
    {0x8086, 0x159b, "Intel E810-XXV", "ice"},
    {0x8086, 0x1889, "Intel Ethernet Adaptive VF", "iavf"},
    {0x15b3, 0x1017, "Mellanox ConnectX-5", "mlx5_core"},
    {0x15b3, 0x1018, "Mellanox ConnectX-5 VF", "mlx5_core"},
    {0x15b3, 0x101b, "Mellanox ConnectX-6", "mlx5_core"},
    {0x15b3, 0x101c, "Mellanox ConnectX-6 VF", "mlx5_core"},
    {0x15b3, 0x101d, "Mellanox ConnectX-6 Dx", "mlx5_core"},
    {0x15b3, 0x101e, "Mellanox ConnectX Family VF", "mlx5_core"},
};

const KnownDevice* known(std::uint16_t v, std::uint16_t d) {
  for (const auto& k : kKnown)
    if (k.vendor == v && k.device == d) return &k;
  return nullptr;
}

std::optional<PciAddress> bdf_of_device_link(const fs::path& device_link) {
  std::error_code ec;
  auto real = fs::canonical(device_link, ec);
  if (ec) return std::nullopt;
  auto a = parse_pci_address(real.filename().string());
  if (!a) return std::nullopt;
  return *a;
}

RdmaDevice read_rdma_device(const fs::path& dir, const std::string& name) {
  RdmaDevice d;
  d.name = name;
  if (auto nt = read_attr(dir / "node_type"); nt) {
    if (auto t = parse_node_type(*nt); t) d.node_type = *t;
  }
  std::error_code ec;
  for (const auto& pe : fs::directory_iterator(dir / "ports", ec)) {
    auto num = parse_sysfs_int(pe.path().filename().string(), 1, 255);
    if (!num) continue;
    RdmaPort p;
    p.port = static_cast<std::uint32_t>(*num);
    if (auto ll = read_attr(pe.path() / "link_layer"); ll) p.link_layer = *ll;
    if (auto st = read_attr(pe.path() / "state"); st) p.state = *st;
    std::set<Transport> ts;
    if (d.node_type == NodeType::rnic) {
      ts.insert(Transport::iwarp);
    } else if (p.link_layer == "InfiniBand") {
      ts.insert(Transport::infiniband);
    } else {
      // Unused GID entries read back EINVAL on a real host; only populated ones name a type.
      std::error_code ec2;
      for (const auto& te : fs::directory_iterator(pe.path() / "gid_attrs" / "types", ec2)) {
        if (auto v = read_attr(te.path()); v) {
          if (auto t = parse_gid_type(*v)) ts.insert(*t);
        }
        if (ts.size() == 2) break;
      }
    }
    p.transports.assign(ts.begin(), ts.end());
    d.ports.push_back(std::move(p));
  }
  std::sort(d.ports.begin(), d.ports.end(), [](const RdmaPort& a, const RdmaPort& b) { return a.port < b.port; });
  return d;
}

}  // namespace

fs::path SysfsRoot::pci_device(const PciAddress& a) const { return root / "bus/pci/devices" / a.str(); }
fs::path SysfsRoot::pci_driver(std::string_view name) const { return root / "bus/pci/drivers" / std::string(name); }

std::vector<Transport> RdmaDevice::transports() const {
  std::set<Transport> ts;
  for (const auto& p : ports) ts.insert(p.transports.begin(), p.transports.end());
  return {ts.begin(), ts.end()};
}

std::string PciFunction::model() const {
  if (const auto* k = known(vendor, device)) return std::string(k->model);
  return fmt::format("{:04x}:{:04x}", vendor, device);
}

std::string PciFunction::native_driver() const {
  if (const auto* k = known(vendor, device)) return std::string(k->native_driver);
  if (!driver.empty() && driver != "vfio-pci") return driver;
  return {};
}

const PciFunction* Inventory::find(const PciAddress& a) const {
  for (const auto& f : functions)
    if (f.addr == a) return &f;
  return nullptr;
}

const PciFunction* Inventory::find_by_netdev(std::string_view ifname) const {
  for (const auto& f : functions)
    for (const auto& n : f.netdevs)
      if (n == ifname) return &f;
  return nullptr;
}

std::vector<const PciFunction*> Inventory::pfs() const {
  std::vector<const PciFunction*> out;
  for (const auto& f : functions)
    if (f.is_pf()) out.push_back(&f);
  return out;
}

std::vector<const PciFunction*> Inventory::vfs_of(const PciAddress& pf) const {
  std::vector<const PciFunction*> out;
  for (const auto& f : functions)
    if (!f.is_pf() && f.pf == pf) out.push_back(&f);
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->vf_index < b->vf_index; });
  return out;
}

Result<Inventory> discover(const SysfsRoot& sysfs) {
  const fs::path devices = sysfs.root / "bus/pci/devices";
  std::error_code ec;
  fs::directory_iterator it(devices, ec);
  if (ec)
    return make_error(Errc::not_found, fmt::format("cannot list PCI devices in {} ({}); is sysfs mounted there "
                                                   "(see --sysfs-root)?",
                                                   devices.string(), ec.message()));
  Inventory inv;
  for (const auto& e : it) {
    auto addr = parse_pci_address(e.path().filename().string());
    if (!addr) continue;
    const fs::path dir = e.path();
    PciFunction f;
    f.addr = *addr;
    if (fs::exists(dir / "sriov_totalvfs", ec)) f.kind = FunctionKind::pf;
    else if (fs::is_symlink(dir / "physfn", ec)) f.kind = FunctionKind::vf;
    else continue;  // not SR-IOV: not ours

    auto vendor = read_attr(dir / "vendor");
    auto device = read_attr(dir / "device");
    if (vendor) {
      if (auto v = parse_pci_id(*vendor); v) f.vendor = *v;
    }
    if (device) {
      if (auto d = parse_pci_id(*device); d) f.device = *d;
    }
    f.driver = link_basename(dir / "driver").value_or("");
    if (auto o = read_attr(dir / "driver_override"); o && *o != "(null)") f.driver_override = *o;
    if (auto g = link_basename(dir / "iommu_group")) {
      if (auto n = parse_sysfs_int(*g, 0, 1 << 30); n) f.iommu_group = static_cast<int>(*n);
    }
    if (auto nn = read_attr(dir / "numa_node"); nn) {
      if (auto n = parse_sysfs_int(*nn, -1, 1 << 16); n) f.numa_node = static_cast<int>(*n);
    }
    if (f.is_pf()) {
      auto total = read_attr(dir / "sriov_totalvfs");
      auto num = read_attr(dir / "sriov_numvfs");
      auto t = total ? parse_sysfs_int(*total, 0, 65535) : Result<std::int64_t>(total.error());
      auto n = num ? parse_sysfs_int(*num, 0, 65535) : Result<std::int64_t>(num.error());
      if (!t || !n) {
        log::warn("skipping PF {}: its sriov_totalvfs/sriov_numvfs cannot be read ({})", f.addr.str(),
                  !t ? t.error().message : n.error().message);
        continue;
      }
      f.total_vfs = static_cast<std::uint32_t>(*t);
      f.num_vfs = static_cast<std::uint32_t>(*n);
      std::map<std::uint32_t, PciAddress> vfs;
      for (const auto& ve : fs::directory_iterator(dir, ec)) {
        std::string name = ve.path().filename().string();
        if (name.rfind("virtfn", 0) != 0) continue;
        auto idx = parse_sysfs_int(std::string_view(name).substr(6), 0, 65535);
        auto target = link_basename(ve.path());
        if (!idx || !target) continue;
        if (auto va = parse_pci_address(*target); va) vfs[static_cast<std::uint32_t>(*idx)] = *va;
      }
      for (auto& [i, a] : vfs) f.vfs.push_back(a);
    } else {
      if (auto p = link_basename(dir / "physfn")) {
        if (auto pa = parse_pci_address(*p); pa) f.pf = *pa;
      }
    }
    for (const auto& ne : fs::directory_iterator(dir / "net", ec)) f.netdevs.push_back(ne.path().filename().string());
    inv.functions.push_back(std::move(f));
  }
  std::sort(inv.functions.begin(), inv.functions.end(),
            [](const PciFunction& a, const PciFunction& b) { return a.addr < b.addr; });

  // VF index from the PF's virtfnN links (the VF itself does not know its number).
  for (auto& pf : inv.functions) {
    if (!pf.is_pf()) continue;
    for (std::size_t i = 0; i < pf.vfs.size(); ++i)
      for (auto& vf : inv.functions)
        if (!vf.is_pf() && vf.addr == pf.vfs[i]) vf.vf_index = static_cast<std::uint32_t>(i);
  }

  // Netdevs and RDMA devices as the class directories list them (catches renamed netdevs too).
  auto by_addr = [&](const PciAddress& a) -> PciFunction* {
    for (auto& f : inv.functions)
      if (f.addr == a) return &f;
    return nullptr;
  };
  for (const auto& ne : fs::directory_iterator(sysfs.root / "class/net", ec)) {
    auto a = bdf_of_device_link(ne.path() / "device");
    if (!a) continue;
    if (auto* f = by_addr(*a)) {
      std::string name = ne.path().filename().string();
      if (std::find(f->netdevs.begin(), f->netdevs.end(), name) == f->netdevs.end()) f->netdevs.push_back(name);
    }
  }
  for (const auto& ie : fs::directory_iterator(sysfs.root / "class/infiniband", ec)) {
    auto a = bdf_of_device_link(ie.path() / "device");
    if (!a) continue;
    if (auto* f = by_addr(*a)) f->rdma.push_back(read_rdma_device(ie.path(), ie.path().filename().string()));
  }
  for (auto& f : inv.functions) {
    std::sort(f.netdevs.begin(), f.netdevs.end());
    std::sort(f.rdma.begin(), f.rdma.end(), [](const RdmaDevice& a, const RdmaDevice& b) { return a.name < b.name; });
  }
  return inv;
}

Result<PciAddress> resolve_pf(const Inventory& inv, std::string_view pf) {
  const PciFunction* f = nullptr;
  if (auto a = parse_pci_address(pf); a) f = inv.find(*a);
  else f = inv.find_by_netdev(pf);
  if (f == nullptr)
    return make_error(Errc::not_found, fmt::format("no SR-IOV physical function '{}' found; 'vrdmactl vf list' shows "
                                                   "the PFs by PCI address and netdev",
                                                   pf.substr(0, 64)));
  if (!f->is_pf())
    return make_error(Errc::invalid_argument,
                      fmt::format("{} is a VF (of PF {}), not a physical function", f->addr.str(),
                                  f->pf ? f->pf->str() : std::string("?")));
  return f->addr;
}

}  // namespace vrdma::sriov
