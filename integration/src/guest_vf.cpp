#include "vrdma/integration/guest_vf.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <vector>

#include "vrdma/sriov/discovery.hpp"
#include "vrdma/sriov/ledger.hpp"
#include "vrdma/sriov/pool.hpp"
#include "vf_pool.hpp"
#include "vrdma/integration/migration_vf.hpp"

namespace vrdma::integration {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const std::string v = host_setting(name);
  return v.empty() ? fallback : v;
}

std::string read_line(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::string s;
  std::getline(f, s);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Whether the process that the ledger row names still runs (a pid of an earlier boot is someone else).
bool holder_runs(const sriov::Allocation& a, const std::string& boot_id) {
  if (a.owner_pid <= 0 || a.owner_pid == ::getpid()) return false;
  if (!boot_id.empty() && !a.boot_id.empty() && a.boot_id != boot_id) return false;
  return sriov::process_alive(a.owner_pid);
}

// The VF's RDMA device and MAC as sysfs shows them now (after the MAC was set).
Result<GuestVf> describe(const sriov::SysfsRoot& sysfs, const sriov::PciAddress& vf, const sriov::PciAddress& pf,
                         std::uint32_t index, const std::string& owner, bool reused) {
  GuestVf g{vf.str(), pf.str(), index, {}, {}, owner, reused};
  auto inv = sriov::discover(sysfs);
  const sriov::PciFunction* f = inv ? inv->find(vf) : nullptr;
  if (f == nullptr || f->rdma.empty())
    return make_error(Errc::not_found, fmt::format("VF {} has no RDMA device any more (check its driver with 'vrdmactl "
                                                   "vf show {}')",
                                                   g.vf, g.vf));
  g.ibdev = f->rdma.front().name;
  if (!f->netdevs.empty()) g.mac = read_line(sysfs.pci_device(vf) / "net" / f->netdevs.front() / "address");
  return g;
}

}  // namespace

sriov::SysfsRoot sysfs_of(const VfPaths& p) { return sriov::SysfsRoot{p.sysfs_root, std::chrono::milliseconds(5000)}; }

std::string short_hostname() {
  char h[256] = {};
  if (::gethostname(h, sizeof h - 1) != 0) return "localhost";
  std::string s(h);
  return s.substr(0, s.find('.'));
}

std::string ledger_safe(const std::string& s, std::size_t max) {
  std::string out = s.substr(0, max);
  for (auto& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x21 || u > 0x7e) c = '_';
  }
  return out.empty() ? "_" : out;
}

static std::string pool_words(const std::string& pool) { return pool.empty() ? "this host's VF pool" : "VF pool " + pool; }

Error no_free_vf(const sriov::Inventory& inv, sriov::Ledger& ledger, const sriov::PoolFilter& filter,
                 const std::string& pool, const std::string& use) {
  const std::string enable = fmt::format("'vrdmactl vf enable --pf {} --count N'", pool.empty() ? "PF" : pool);
  std::vector<std::string> excluded;
  const auto cands = sriov::pool_candidates(inv, filter, &excluded);
  if (cands.empty()) {
    const std::string why = excluded.empty() ? std::string("it has no VFs") : fmt::format("{}", fmt::join(excluded, "; "));
    return make_error(Errc::no_memory, fmt::format("no VF in {} can {}: {}; enable VFs whose driver gives "
                                                   "them an RDMA function with {} ('vrdmactl vf list' shows the PFs)",
                                                   pool_words(pool), use, why, enable));
  }
  auto rows = ledger.list();
  std::vector<std::string> holders;
  std::string example = "OWNER";
  std::size_t held = 0;
  for (const auto& c : cands) {
    if (!rows) break;
    for (const auto& a : *rows) {
      if (a.vf != c.vf) continue;
      if (++held <= 8)
        holders.push_back(fmt::format("{} to {} '{}'", a.vf.str(), sriov::purpose_name(a.purpose), a.owner));
      if (a.purpose == sriov::Purpose::guest || example == "OWNER")
        example = a.owner + (a.purpose == sriov::Purpose::migration ? " --migration" : "");
    }
  }
  if (held > holders.size()) holders.push_back(fmt::format("and {} more", held - holders.size()));
  return make_error(Errc::no_memory,
                    fmt::format("no free VF in {}: {} of {} VFs with an RDMA function are assigned ({}); stop one of "
                                "those domains (its hook gives the VF back), free a VF left behind with 'vrdmactl vf "
                                "release --owner {}', or add VFs with {}",
                                pool_words(pool), held, cands.size(), fmt::join(holders, ", "), example, enable));
}


VfPaths VfPaths::from_environment() {
  VfPaths p;
  p.sysfs_root = env_or("VRDMA_SYSFS_ROOT", p.sysfs_root);
  p.ledger = env_or("VRDMA_VF_LEDGER", p.ledger);
  return p;
}

std::string vf_owner(const std::string& domain, const std::string& host) {
  return ledger_safe(domain, 96) + "@" + ledger_safe(host, 31);
}

Result<sriov::VfConfig> vf_config_for(const DeviceMeta& m) {
  sriov::VfConfig c;
  if (!m.mac.empty()) {
    auto mac = sriov::parse_mac(m.mac);
    if (!mac)
      return make_error(Errc::invalid_argument,
                        fmt::format("the device's mac cannot be a VF's MAC: {}", mac.error().message));
    c.mac = *mac;
  }
  if (m.vf) {
    c.vlan = m.vf->vlan;
    c.max_tx_rate_mbps = m.vf->max_rate_mbps;
    c.trust = m.vf->trust;
    c.spoofchk = m.vf->spoofchk;
  }
  VRDMA_TRY(c.validate());
  return c;
}

Result<GuestVf> assign_guest_vf(const VfPaths& paths, const DeviceMeta& m, const std::string& owner) {
  if (!m.vf) return make_error(Errc::invalid_argument, "the device does not ask for a VF (its engine is not verbs:vf)");
  auto cfg = vf_config_for(m);
  if (!cfg) return std::move(cfg).error();
  const auto sysfs = sysfs_of(paths);
  auto inv = sriov::discover(sysfs);
  if (!inv)
    return Error{inv.error().code, fmt::format("cannot read the SR-IOV devices under {}: {}", paths.sysfs_root,
                                               inv.error().message)};
  sriov::PoolFilter filter;
  if (!m.vf->pool.empty()) {
    auto pf = sriov::resolve_pf(*inv, m.vf->pool);
    if (!pf) return std::move(pf).error();
    filter.pf = *pf;
  }
  filter.numa_node = m.vf->numa_node;
  filter.need_rdma = true;  // vrdmad drives the VF's RDMA function on the host
  auto ledger = sriov::Ledger::open(paths.ledger);
  if (!ledger) return std::move(ledger).error();
  const auto boot = sriov::current_boot_id();

  // The owner's VF from an earlier start (its backend exited, or the operator pinned one with
  // 'vrdmactl vf assign --owner'): the same VF again when it still fits the element.
  auto prior = ledger->find_owner(sriov::Purpose::guest, owner);
  if (!prior) return std::move(prior).error();
  if (*prior) {
    const sriov::Allocation& a = **prior;
    if (holder_runs(a, boot))
      return make_error(Errc::busy,
                        fmt::format("the ledger gives VF {} to '{}', held by process {}, which still runs but serves "
                                    "no backend on {}; stop that process, or free the VF with 'vrdmactl vf release "
                                    "--owner {}'",
                                    a.vf.str(), owner, a.owner_pid, m.socket, owner));
    sriov::PoolFilter same = filter;
    same.vf = a.vf;
    if (a.state == sriov::AllocState::active && !sriov::pool_candidates(*inv, same).empty()) {
      VRDMA_TRY(ledger->hand_over(a.vf, owner, ::getpid()));
      auto g = [&]() -> Result<GuestVf> {
        VRDMA_TRY(sriov::configure_vf(*inv, a.pf, a.vf_index, *cfg));
        return describe(sysfs, a.vf, a.pf, a.vf_index, owner, true);
      }();
      if (!g) (void)sriov::release_vf(sysfs, *ledger, a.vf, owner, false);
      return g;
    }
    // A half-done or no longer fitting row (VF gone, moved to vfio-pci, other pool asked): a new VF.
    VRDMA_TRY(sriov::release_vf(sysfs, *ledger, a.vf, owner, false));
  }

  // Free what crashed hooks and dead backends left behind before choosing (as `vf assign` does).
  auto acts = ledger->reconcile(*inv, sriov::ReconcileEnv{boot, {}});
  if (!acts) return std::move(acts).error();
  sriov::AssignOptions o;
  o.filter = filter;
  o.bind = sriov::BindMode::keep;  // the VF's own driver gives vrdmad its RDMA device
  o.persistent = false;            // held by this process until handed to the backend
  o.net = *cfg;
  sriov::AllocateRequest req{sriov::Purpose::guest, owner, static_cast<std::int64_t>(::getpid()), boot};
  auto a = sriov::assign_vf(sysfs, *ledger, req, o);
  if (!a) {
    if (a.error().is(Errc::no_memory)) return no_free_vf(*inv, *ledger, filter, m.vf->pool, "serve a backend");
    return std::move(a).error();
  }
  auto g = describe(sysfs, a->vf, a->pf, a->vf_index, owner, false);
  if (!g) (void)sriov::release_vf(sysfs, *ledger, a->vf, owner, false);
  return g;
}

DeviceMeta backend_for_vf(const DeviceMeta& m, const GuestVf& vf) {
  DeviceMeta b = m;
  const auto q = m.engine.find('?');
  b.engine = "verbs:" + vf.ibdev + (q == std::string::npos ? std::string() : m.engine.substr(q));
  if (b.mac.empty()) b.mac = vf.mac;
  return b;
}

Status hand_over_guest_vf(const VfPaths& paths, const GuestVf& vf, int pid) {
  auto addr = sriov::parse_pci_address(vf.vf);
  if (!addr) return std::move(addr).error();
  auto ledger = sriov::Ledger::open(paths.ledger);
  if (!ledger) return std::move(ledger).error();
  return ledger->hand_over(*addr, vf.owner, pid);
}

Result<std::optional<ReleasedVf>> release_guest_vf(const VfPaths& paths, const DeviceMeta& m,
                                                   const std::string& owner) {
  auto ledger = sriov::Ledger::open(paths.ledger);
  if (!ledger) return std::move(ledger).error();
  auto held = ledger->find_owner(sriov::Purpose::guest, owner);
  if (!held) return std::move(held).error();
  if (!*held) return std::optional<ReleasedVf>();
  const sriov::Allocation a = **held;
  ReleasedVf r{a.vf.str(), {}};
  const auto sysfs = sysfs_of(paths);
  // What the element asked for goes back to a fresh VF's settings, so the next guest starts
  // clean. A failure leaves the VF free all the same: the guest is gone, and the next guest's
  // own settings are applied when it takes the VF.
  if (auto cfg = vf_config_for(m); cfg && !cfg->empty()) {
    auto inv = sriov::discover(sysfs);
    Status st = inv ? sriov::configure_vf(*inv, a.pf, a.vf_index, sriov::clean_vf_config(*cfg))
                    : Status(std::move(inv).error());
    if (!st.ok())
      r.warning = fmt::format("the settings of VF {} could not be reset: {}", r.vf, st.error().message);
  }
  // The backend never binds the VF to vfio-pci, so there is no driver to give back.
  VRDMA_TRY(sriov::release_vf(sysfs, *ledger, a.vf, owner, false));
  return std::optional<ReleasedVf>(std::move(r));
}

}  // namespace vrdma::integration
