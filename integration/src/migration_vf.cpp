#include "vrdma/integration/migration_vf.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "commands.hpp"
#include "vf_pool.hpp"
#include "vrdma/sriov/discovery.hpp"
#include "vrdma/sriov/ledger.hpp"
#include "vrdma/sriov/netlink.hpp"
#include "vrdma/sriov/parse.hpp"
#include "vrdma/sriov/pool.hpp"

namespace vrdma::integration {
namespace {

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) s.pop_back();
  std::size_t b = 0;
  while (b < s.size() && (s[b] == ' ' || s[b] == '\t')) ++b;
  return s.substr(b);
}

std::string ip_of(const std::string& cidr) { return cidr.substr(0, cidr.find('/')); }

// The address as bytes (4 or 16), empty when it is not an IPv4 or IPv6 address with a prefix
// length that fits it.
std::vector<unsigned char> cidr_bytes(const std::string& cidr) {
  const auto slash = cidr.find('/');
  if (slash == std::string::npos || slash + 1 >= cidr.size() || cidr.size() - slash > 4) return {};
  const std::string ip = cidr.substr(0, slash);
  const std::string len = cidr.substr(slash + 1);
  for (char c : len)
    if (c < '0' || c > '9') return {};
  const int bits = std::atoi(len.c_str());
  unsigned char b[16] = {};
  if (::inet_pton(AF_INET, ip.c_str(), b) == 1) {
    if (bits < 1 || bits > 32) return {};
    return {b, b + 4};
  }
  if (::inet_pton(AF_INET6, ip.c_str(), b) == 1) {
    if (bits < 1 || bits > 128) return {};
    return {b, b + 16};
  }
  return {};
}

bool zero_mac(const std::string& mac) { return mac.empty() || mac == "00:00:00:00:00:00"; }

struct Described {
  std::string ibdev, netdev;
};

Result<Described> describe_vf(const sriov::SysfsRoot& sysfs, const sriov::PciAddress& vf) {
  auto inv = sriov::discover(sysfs);
  if (!inv) return std::move(inv).error();
  const sriov::PciFunction* f = inv->find(vf);
  if (f == nullptr || f->rdma.empty())
    return make_error(Errc::not_found, fmt::format("VF {} has no RDMA device any more (check its driver with 'vrdmactl "
                                                   "vf show {}')",
                                                   vf.str(), vf.str()));
  if (f->netdevs.empty())
    return make_error(Errc::not_found, fmt::format("VF {} has no netdev to carry the migration address (its driver {} "
                                                   "gives it none; check it with 'vrdmactl vf show {}')",
                                                   vf.str(), f->driver.empty() ? "(none)" : f->driver, vf.str()));
  return Described{f->rdma.front().name, f->netdevs.front()};
}

// MAC (when the VF has none), link up, address: the netdev side of the migration VF.
Status bring_up(const sriov::Inventory& inv, const sriov::Allocation& a, const MigrationNet& net, MigrationVf& out) {
  auto rtnl = sriov::Rtnl::open();
  if (!rtnl) return std::move(rtnl).error();
  auto link = rtnl->link(out.netdev);
  if (!link)
    return Error{link.error().code, fmt::format("the VF's netdev {} is not in this network namespace ({})", out.netdev,
                                                link.error().message)};
  // The address must be the migration VF's alone: on a second netdev the kernel could route the
  // migration stream through a port without RDMA.
  auto links = rtnl->links();
  if (!links) return std::move(links).error();
  for (const auto& l : *links) {
    if (l.name == out.netdev) continue;
    auto addrs = rtnl->addresses(l.name);
    if (!addrs) continue;
    for (const auto& x : *addrs)
      if (ip_of(x) == ip_of(net.address))
        return make_error(Errc::busy, fmt::format("the migration address {} is already on netdev {}; "
                                                  "VRDMA_MIGRATION_ADDRESS must be an address of the migration VF "
                                                  "alone (take it off {} or choose another)",
                                                  ip_of(net.address), l.name, l.name));
  }
  if (zero_mac(link->mac)) {
    sriov::VfConfig c;
    auto mac = sriov::parse_mac(migration_vf_mac(net.address));
    if (!mac) return std::move(mac).error();
    c.mac = *mac;
    if (auto st = sriov::configure_vf(inv, a.pf, a.vf_index, c); !st.ok())
      return Error{st.error().code, fmt::format("VF {} has no MAC and its PF would not give it {}: {}", out.vf,
                                                migration_vf_mac(net.address), st.error().message)};
    out.mac_set = true;
  }
  if (!link->admin_up) VRDMA_TRY(rtnl->set_admin_up(out.netdev, true));
  auto have = rtnl->addresses(out.netdev);
  if (!have) return std::move(have).error();
  bool present = false;
  for (const auto& x : *have) present = present || x == net.address;
  if (!present) {
    VRDMA_TRY(rtnl->add_address(out.netdev, net.address));
    out.address_added = true;
  }
  return {};
}

}  // namespace

std::string host_setting(const std::string& name) {
  if (const char* v = std::getenv(name.c_str()); v && *v) return v;
  const char* f = std::getenv("VRDMA_DEFAULTS");
  std::ifstream in(f && *f ? f : "/etc/default/vrdma");
  std::string line, value;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.rfind("export ", 0) == 0) line = trim(line.substr(7));
    if (line.empty() || line[0] == '#' || line.rfind(name + "=", 0) != 0) continue;
    std::string v = trim(line.substr(name.size() + 1));
    if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) v = v.substr(1, v.size() - 2);
    value = v;  // the last one wins, as when the shell sources the file
  }
  return value;
}

Result<std::optional<MigrationNet>> MigrationNet::from_host_settings() {
  MigrationNet n{host_setting("VRDMA_MIGRATION_POOL"), host_setting("VRDMA_MIGRATION_ADDRESS")};
  if (n.pool.empty() && n.address.empty()) return std::optional<MigrationNet>();
  if (n.pool.empty())
    return make_error(Errc::invalid_argument, "VRDMA_MIGRATION_ADDRESS is set but VRDMA_MIGRATION_POOL is not: name the "
                                              "PF whose VFs carry migrations (/etc/default/vrdma)");
  if (n.address.empty())
    return make_error(Errc::invalid_argument, "VRDMA_MIGRATION_POOL is set but VRDMA_MIGRATION_ADDRESS is not: give "
                                              "this host's migration address with its prefix, e.g. 10.77.0.11/24 "
                                              "(/etc/default/vrdma)");
  if (cidr_bytes(n.address).empty())
    return make_error(Errc::invalid_argument,
                      fmt::format("VRDMA_MIGRATION_ADDRESS '{}' is not an address with its prefix length such as "
                                  "10.77.0.11/24 or fd00:77::11/64 (/etc/default/vrdma)",
                                  n.address.substr(0, 64)));
  return std::optional<MigrationNet>(std::move(n));
}

std::string migration_vf_owner(const std::string& host) { return "migration@" + ledger_safe(host, 31); }

std::string migration_vf_mac(const std::string& cidr) {
  const auto b = cidr_bytes(cidr);
  if (b.size() < 3) return "02:76:6d:00:00:01";
  const auto n = b.size();
  return fmt::format("02:76:6d:{:02x}:{:02x}:{:02x}", b[n - 3], b[n - 2], b[n - 1]);
}

Result<MigrationVf> ensure_migration_vf(const VfPaths& paths, const MigrationNet& net, const std::string& host) {
  const auto sysfs = sysfs_of(paths);
  auto inv = sriov::discover(sysfs);
  if (!inv)
    return Error{inv.error().code, fmt::format("cannot read the SR-IOV devices under {}: {}", paths.sysfs_root,
                                               inv.error().message)};
  auto pf = sriov::resolve_pf(*inv, net.pool);
  if (!pf) return Error{pf.error().code, "VRDMA_MIGRATION_POOL: " + pf.error().message};
  sriov::PoolFilter filter;
  filter.pf = *pf;
  filter.need_rdma = true;  // QEMU's rdma:// goes through the VF's RDMA function
  auto ledger = sriov::Ledger::open(paths.ledger);
  if (!ledger) return std::move(ledger).error();
  const auto boot = sriov::current_boot_id();
  const auto owner = migration_vf_owner(host);

  std::optional<sriov::Allocation> held;
  bool reused = false;
  auto prior = ledger->find_owner(sriov::Purpose::migration, owner);
  if (!prior) return std::move(prior).error();
  if (*prior) {
    sriov::PoolFilter same = filter;
    same.vf = (*prior)->vf;
    if ((*prior)->state == sriov::AllocState::active && !sriov::pool_candidates(*inv, same).empty()) {
      held = **prior;
      reused = true;
    } else {
      // Gone, moved to vfio-pci, or of another pool than the one configured now: a new VF.
      VRDMA_TRY(sriov::release_vf(sysfs, *ledger, (*prior)->vf, owner, false));
    }
  }
  if (!held) {
    auto acts = ledger->reconcile(*inv, sriov::ReconcileEnv{boot, {}});
    if (!acts) return std::move(acts).error();
    sriov::AssignOptions o;
    o.filter = filter;
    o.bind = sriov::BindMode::keep;  // QEMU uses the VF's RDMA device through its own driver
    o.persistent = true;             // this host's migration VF until `vrdmactl migration-vf release`
    sriov::AllocateRequest req{sriov::Purpose::migration, owner, static_cast<std::int64_t>(::getpid()), boot};
    auto a = sriov::assign_vf(sysfs, *ledger, req, o);
    if (!a) {
      if (a.error().is(Errc::no_memory)) return no_free_vf(*inv, *ledger, filter, net.pool, "carry RDMA migrations");
      return std::move(a).error();
    }
    held = *a;
  }
  MigrationVf out;
  out.vf = held->vf.str();
  out.pf = held->pf.str();
  out.owner = owner;
  out.reused = reused;
  out.address = net.address;
  auto fail = [&](const Error& e) -> Error {
    if (reused) return e;
    const Status back = sriov::release_vf(sysfs, *ledger, held->vf, owner, false);
    return Error{e.code, e.message + (back.ok() ? fmt::format("; VF {} was given back to the pool", out.vf)
                                                : fmt::format("; VF {} could not be given back ({}): 'vrdmactl "
                                                              "migration-vf release' does it",
                                                              out.vf, back.error().message))};
  };
  auto d = describe_vf(sysfs, held->vf);
  if (!d) return fail(d.error());
  out.ibdev = d->ibdev;
  out.netdev = d->netdev;
  if (auto st = bring_up(*inv, *held, net, out); !st.ok()) return fail(st.error());
  return out;
}

Result<std::optional<MigrationVf>> find_migration_vf(const VfPaths& paths, const std::string& host) {
  auto ledger = sriov::Ledger::open(paths.ledger);
  if (!ledger) return std::move(ledger).error();
  const auto owner = migration_vf_owner(host);
  auto row = ledger->find_owner(sriov::Purpose::migration, owner);
  if (!row) return std::move(row).error();
  if (!*row) return std::optional<MigrationVf>();
  MigrationVf out;
  out.vf = (*row)->vf.str();
  out.pf = (*row)->pf.str();
  out.owner = owner;
  out.reused = true;
  auto d = describe_vf(sysfs_of(paths), (*row)->vf);
  if (!d) return std::move(d).error();
  out.ibdev = d->ibdev;
  out.netdev = d->netdev;
  if (auto rtnl = sriov::Rtnl::open())
    if (auto addrs = rtnl->addresses(out.netdev)) {
      std::vector<std::string> shown;  // link-local ones are every netdev's, not the migration's
      for (const auto& a : *addrs)
        if (a.rfind("fe80:", 0) != 0) shown.push_back(a);
      out.address = fmt::format("{}", fmt::join(shown, ", "));
    }
  return std::optional<MigrationVf>(std::move(out));
}

Result<std::optional<std::string>> release_migration_vf(const VfPaths& paths, const MigrationNet* net,
                                                        const std::string& host) {
  auto ledger = sriov::Ledger::open(paths.ledger);
  if (!ledger) return std::move(ledger).error();
  const auto owner = migration_vf_owner(host);
  auto row = ledger->find_owner(sriov::Purpose::migration, owner);
  if (!row) return std::move(row).error();
  if (!*row) return std::optional<std::string>();
  const auto sysfs = sysfs_of(paths);
  // The netdev first: a VF back in the pool must not keep answering for the migration address.
  if (auto d = describe_vf(sysfs, (*row)->vf)) {
    if (auto rtnl = sriov::Rtnl::open(); rtnl && rtnl->link(d->netdev)) {
      if (net != nullptr) {
        const Status st = rtnl->del_address(d->netdev, net->address);
        if (!st.ok() && !st.error().is(Errc::not_found)) return st.error();
      }
      VRDMA_TRY(rtnl->set_admin_up(d->netdev, false));
    }
  }
  VRDMA_TRY(sriov::release_vf(sysfs, *ledger, (*row)->vf, owner, false));
  return std::optional<std::string>((*row)->vf.str());
}

}  // namespace vrdma::integration

namespace vrdma::integration {
namespace {

// With json, one object on stdout instead of the sentence.
int report(const MigrationVf& m, const std::string& sentence, bool json, const char* action) {
  if (json)
    std::printf("%s\n", nlohmann::json{{"action", action}, {"vf", m.vf}, {"ibdev", m.ibdev}, {"netdev", m.netdev},
                                       {"address", m.address}, {"reused", m.reused}}.dump().c_str());
  else
    std::printf("%s%s (RDMA device %s, netdev %s) with %s.\n", sentence.c_str(), m.vf.c_str(), m.ibdev.c_str(),
                m.netdev.c_str(), m.address.empty() ? "no address" : m.address.c_str());
  return 0;
}

int fail(const char* cmd, const std::string& sentence, bool json) {
  if (json) std::printf("%s\n", nlohmann::json{{"action", cmd}, {"error", sentence}}.dump().c_str());
  std::fprintf(stderr, "vrdmactl migration-vf %s: %s\n", cmd, sentence.c_str());
  return 1;
}

int migration_vf(const std::string& cmd, bool json) {
  const auto paths = VfPaths::from_environment();
  const auto host = short_hostname();
  auto net = MigrationNet::from_host_settings();
  if (!net) return fail(cmd.c_str(), net.error().message, json);
  if (cmd == "show") {
    auto m = find_migration_vf(paths, host);
    if (!m) return fail("show", m.error().message, json);
    if (!*m) {
      if (json) std::printf("%s\n", nlohmann::json{{"action", "show"}, {"vf", nullptr}, {"configured", static_cast<bool>(*net)}}.dump().c_str());
      else
        std::printf("%s has no migration VF%s.\n", host.c_str(),
                    *net ? " yet ('vrdmactl migration-vf up' takes one)"
                         : " (VRDMA_MIGRATION_POOL and VRDMA_MIGRATION_ADDRESS in /etc/default/vrdma configure one)");
      return 0;
    }
    return report(**m, "The migration VF of " + host + " is ", json, "show");
  }
  if (cmd == "release") {
    auto r = release_migration_vf(paths, *net ? &**net : nullptr, host);
    if (!r) return fail("release", "cannot give the migration VF back: " + r.error().message, json);
    if (json)
      std::printf("%s\n", nlohmann::json{{"action", "release"}, {"released", *r ? nlohmann::json(**r) : nlohmann::json(nullptr)}}.dump().c_str());
    else if (*r)
      std::printf("The migration VF %s of %s went back to the pool.\n", (*r)->c_str(), host.c_str());
    else
      std::printf("%s holds no migration VF.\n", host.c_str());
    return 0;
  }
  if (!*net)
    return fail("up", "this host has no migration VF configured: set VRDMA_MIGRATION_POOL (the PF whose VFs carry "
                      "migrations) and VRDMA_MIGRATION_ADDRESS (this host's address on it, e.g. 10.77.0.11/24) in "
                      "/etc/default/vrdma", json);
  auto m = ensure_migration_vf(paths, **net, host);
  if (!m) return fail("up", "cannot set up the migration VF of " + host + ": " + m.error().message, json);
  report(*m, m->reused ? "The migration VF of this host is " : "This host's migration VF is now ", json, "up");
  if (!json)
    std::printf("RDMA migrations to this host name its address: --migrateuri rdma://%s:PORT.\n",
                m->address.substr(0, m->address.find('/')).c_str());
  return 0;
}

}  // namespace

void add_migration_vf_commands(CLI::App& top, Commands& out) {
  auto* mv = top.add_subcommand(
      "migration-vf",
      "this host's VF for rdma:// migrations; the settings come from the environment or /etc/default/vrdma "
      "($VRDMA_DEFAULTS)");
  mv->require_subcommand(1);
  auto json = std::make_shared<bool>(false);
  const std::pair<const char*, const char*> cmds[] = {
      {"up", "take this host's migration VF from VRDMA_MIGRATION_POOL and put VRDMA_MIGRATION_ADDRESS on its netdev "
             "(vrdmactl migrate and the libvirt hook do it by themselves)"},
      {"show", "which VF it is, its RDMA device, netdev and addresses"},
      {"release", "take the address off and give the VF back to the pool"}};
  for (const auto& [name, help] : cmds) {
    auto* c = mv->add_subcommand(name, help);
    c->add_flag("--json", *json, "one JSON object on stdout");
    const std::string cmd = name;
    out.push_back({c, [json, cmd] { return migration_vf(cmd, *json); }});
  }
}

}  // namespace vrdma::integration
