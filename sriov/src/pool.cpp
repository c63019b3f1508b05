#include "vrdma/sriov/pool.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "vrdma/common/log.hpp"
#include "vrdma/sriov/control.hpp"

namespace vrdma::sriov {

std::vector<Candidate> pool_candidates(const Inventory& inv, const PoolFilter& filter,
                                       std::vector<std::string>* excluded) {
  std::vector<Candidate> out;
  auto skip = [&](const PciFunction& f, const std::string& why) {
    if (excluded) excluded->push_back(fmt::format("VF {} {}", f.addr.str(), why));
  };
  for (const auto& f : inv.functions) {
    if (f.is_pf() || !f.pf || !f.vf_index) continue;
    if (filter.vf && f.addr != *filter.vf) continue;
    if (filter.pf && *f.pf != *filter.pf) continue;
    if (filter.numa_node && f.numa_node != *filter.numa_node) {
      skip(f, fmt::format("is on NUMA node {}, not {}", f.numa_node, *filter.numa_node));
      continue;
    }
    if (f.driver == "vfio-pci") {
      skip(f, "is bound to vfio-pci (a guest may own it)");
      continue;
    }
    if (filter.need_rdma && f.rdma.empty()) {
      skip(f, f.driver.empty() ? std::string("has no driver bound, so it has no RDMA function")
                               : fmt::format("has no RDMA device (driver {})", f.driver));
      continue;
    }
    out.push_back({f.addr, *f.pf, *f.vf_index});
  }
  return out;
}

Status configure_vf(const Inventory& inv, const PciAddress& pf, std::uint32_t vf_index, const VfConfig& cfg) {
  if (cfg.empty()) return {};
  const PciFunction* f = inv.find(pf);
  if (f == nullptr || f->netdevs.empty())
    return make_error(Errc::bad_state, fmt::format("PF {} has no netdev, so its VF {} cannot be configured through "
                                                   "rtnetlink; bring up the PF's network driver",
                                                   pf.str(), vf_index));
  auto nl = Rtnl::open();
  if (!nl) return std::move(nl).error();
  return nl->set_vf(f->netdevs.front(), vf_index, cfg);
}

VfConfig clean_vf_config(const VfConfig& applied) {
  VfConfig c;
  if (applied.mac) c.mac = MacAddress{};
  if (applied.vlan || applied.qos) c.vlan = 0;
  if (applied.spoofchk) c.spoofchk = true;
  if (applied.trust) c.trust = false;
  if (applied.link_state) c.link_state = VfLinkState::follow_pf;
  if (applied.min_tx_rate_mbps) c.min_tx_rate_mbps = 0;
  if (applied.max_tx_rate_mbps) c.max_tx_rate_mbps = 0;
  return c;
}

Result<Allocation> assign_vf(const SysfsRoot& sysfs, Ledger& ledger, const AllocateRequest& req,
                             const AssignOptions& opts) {
  VRDMA_TRY(opts.net.validate());
  auto inv = discover(sysfs);
  if (!inv) return std::move(inv).error();
  if (opts.filter.vf) {
    const PciFunction* f = inv->find(*opts.filter.vf);
    if (f == nullptr || f->is_pf())
      return make_error(Errc::not_found, fmt::format("there is no VF {}; 'vrdmactl vf list' shows the VFs",
                                                     opts.filter.vf->str()));
  }
  std::vector<std::string> excluded;
  auto cands = pool_candidates(*inv, opts.filter, &excluded);
  if (cands.empty()) {
    std::string why = excluded.empty() ? std::string("no VF matches (enable VFs with 'vrdmactl vf enable')")
                                       : fmt::format("{}", fmt::join(excluded, "; "));
    return make_error(Errc::no_memory, fmt::format("no free VF for {} '{}': {}", purpose_name(req.purpose), req.owner,
                                                   why));
  }
  auto a = ledger.allocate(req, cands);
  if (!a) return a;
  // Roll the reservation back on any later failure, keeping the first error.
  auto undo = [&](Error e) -> Result<Allocation> {
    auto st = ledger.release(a->vf);
    if (!st.ok()) log::warn("could not undo the reservation of VF {}: {}", a->vf.str(), st.error().message);
    return e;
  };
  if (auto st = configure_vf(*inv, a->pf, a->vf_index, opts.net); !st.ok()) return undo(st.error());
  if (opts.bind == BindMode::vfio) {
    auto st = bind_driver(sysfs, a->vf, "vfio-pci");
    if (!st.ok()) return undo(st.error());
  } else if (opts.bind == BindMode::native) {
    auto st = bind_native_driver(sysfs, a->vf);
    if (!st.ok()) return undo(st.error());
  }
  auto st = ledger.activate(a->vf, opts.persistent || req.owner_pid == 0);
  if (!st.ok()) return undo(st.error());
  a->state = AllocState::active;
  log::info("VF {} (VF {} of PF {}) assigned to {} '{}'", a->vf.str(), a->vf_index, a->pf.str(),
            purpose_name(a->purpose), a->owner);
  return a;
}

Status release_vf(const SysfsRoot& sysfs, Ledger& ledger, const PciAddress& vf,
                  const std::optional<std::string>& owner, bool rebind_native) {
  auto cur = ledger.find(vf);
  if (!cur) return std::move(cur).error();
  if (!*cur)
    return make_error(Errc::not_found, fmt::format("VF {} is not allocated in the ledger; nothing to release", vf.str()));
  if (owner && (*cur)->owner != *owner)
    return make_error(Errc::access_denied, fmt::format("VF {} is held by {} '{}', not by '{}'; it was not released",
                                                       vf.str(), purpose_name((*cur)->purpose), (*cur)->owner,
                                                       owner->substr(0, 128)));
  VRDMA_TRY(ledger.mark_releasing(vf));
  if (rebind_native) {
    auto inv = discover(sysfs);
    if (inv) {
      const PciFunction* f = inv->find(vf);
      if (f != nullptr && f->driver == "vfio-pci") VRDMA_TRY(bind_native_driver(sysfs, vf));
    }
  }
  return ledger.release(vf, owner);
}

}  // namespace vrdma::sriov
