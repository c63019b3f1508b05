// The libvirt hook (the real vrdmactl binary, `vrdmactl hook qemu`) for domains whose vrdma:device
// asks for engine="verbs:vf": a VF of the host's SR-IOV pool taken through the real SQLite ledger
// on the simulated SR-IOV sysfs tree (sriov_sysfs_simulator: real SR-IOV NICs cannot exist
// here), the stand-in vrdmad (fake_vrdmad.py) started on the VF's RDMA device, the VF reused,
// given back and refused with sentences. The VF settings go to the real kernel's rtnetlink in a
// network namespace of the test's own (root only; skipped otherwise). The second suite: the
// host's migration VF for rdma:// migrations (migration_vf.hpp), taken by `vrdmactl
// migration-vf`, `vrdmactl migrate` (against libvirt's test driver, which cannot migrate: the
// pre-flight checks are what is under test) and the hook's `migrate begin`, with its address on
// a real veth in the test's namespace.
#define BOOST_TEST_MODULE integration_hook_vf
#include <boost/test/unit_test.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "netns.hpp"
#include "sriov_sysfs_simulator.hpp"
#include "vrdma/sriov/ledger.hpp"
#include "vrdma/sriov/parse.hpp"

namespace fs = std::filesystem;
using namespace vrdma;

namespace {

struct Out {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool has(const std::string& s, const std::string& x) { return s.find(x) != std::string::npos; }

std::string short_hostname() {
  char h[256] = {};
  if (::gethostname(h, sizeof h - 1) != 0) return "localhost";
  std::string s(h);
  return s.substr(0, s.find('.'));
}

// Running (a zombie counts as gone: the detached backend's new parent may never reap it).
bool runs(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return false;
  const auto p = stat.rfind(") ");
  return p != std::string::npos && p + 2 < stat.size() && stat[p + 2] != 'Z';
}

struct Fixture {
  sriov::test::SriovSysfsSimulator sim;
  fs::path w;  // the simulator's temporary folder: sockets, ledger, logs
  std::string host = short_hostname();
  std::string ledger_path;

  Fixture() {
    sim.add_standard_nics();
    sim.start();
    w = sim.root().parent_path();
    ledger_path = (w / "vf-ledger.sqlite").string();
    ::setenv("VRDMA_SYSFS_ROOT", sim.root().c_str(), 1);
    ::setenv("VRDMA_VF_LEDGER", ledger_path.c_str(), 1);
    ::setenv("VRDMA_VRDMAD", FAKE_VRDMAD, 1);
    ::setenv("VRDMA_HOOK_LOG", (w / "hook.log").c_str(), 1);
    ::setenv("VRDMA_DEFAULTS", (w / "no-defaults").c_str(), 1);  // not this machine's /etc/default/vrdma
    ::unsetenv("FAKE_MODE");
    ::unsetenv("VRDMA_MIGRATION_POOL");
    ::unsetenv("VRDMA_MIGRATION_ADDRESS");
  }
  ~Fixture() {
    // Backends are detached: stop every one the test left running.
    for (const auto& e : fs::directory_iterator(w))
      if (e.path().extension() == ".pid") {
        std::ifstream f(e.path());
        int pid = 0;
        if (f >> pid && pid > 0) ::kill(pid, SIGKILL);
      }
  }

  // Runs `prefix vrdmactl ARGS` with `stdin_text` on standard input.
  Out vrdmactl(const std::string& args, const std::string& stdin_text = "", const std::string& prefix = "") {
    static int n = 0;
    const auto in = w / ("in" + std::to_string(++n));
    const auto err = w / ("err" + std::to_string(n));
    std::ofstream(in) << stdin_text;
    const std::string cmd = prefix + std::string(VRDMACTL_PATH) + " " + args + " <" + in.string() + " 2>" + err.string();
    Out o;
    FILE* p = ::popen(cmd.c_str(), "r");
    BOOST_REQUIRE(p);
    std::array<char, 4096> buf{};
    for (std::size_t k; (k = std::fread(buf.data(), 1, buf.size(), p)) > 0;) o.out.append(buf.data(), k);
    const int st = ::pclose(p);
    o.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    o.err = slurp(err);
    return o;
  }

  void enable(const std::string& pf, int count) {
    auto e = vrdmactl("vf enable --pf " + pf + " --count " + std::to_string(count) + " --sysfs-root " +
                      sim.root().string() + " --ledger " + ledger_path);
    BOOST_REQUIRE_MESSAGE(e.rc == 0, e.out + e.err);
  }

  std::string sock(const std::string& dom) const { return (w / (dom + ".sock")).string(); }

  // A domain whose vrdma:device asks for a VF; `extra` adds attributes.
  std::string domain(const std::string& name, const std::string& extra = "vf-pool='ens1f0'") const {
    return "<domain type='kvm'><name>" + name +
           "</name>\n  <metadata><vrdma:device xmlns:vrdma='https://vrdma.dev/xmlns/1' socket='" + sock(name) +
           "' engine='verbs:vf' " + extra + "/></metadata>\n  <devices><disk type='vhostuser' device='disk'>"
           "<source type='unix' path='" + sock(name) + "'/><target dev='vdb' bus='virtio'/></disk></devices>\n"
           "</domain>\n";
  }

  Out hook(const std::string& dom, const std::string& op, const std::string& sub, const std::string& xml,
           const std::string& prefix = "") {
    return vrdmactl("hook qemu " + dom + " " + op + " " + sub + " -", xml, prefix);
  }

  std::string owner(const std::string& dom) const { return dom + "@" + host; }

  std::optional<sriov::Allocation> held_by(const std::string& dom) {
    auto l = sriov::Ledger::open(ledger_path);
    BOOST_REQUIRE(l.ok());
    auto a = l->find_owner(sriov::Purpose::guest, owner(dom));
    BOOST_REQUIRE(a.ok());
    return *a;
  }

  std::size_t ledger_rows() {
    auto l = sriov::Ledger::open(ledger_path);
    BOOST_REQUIRE(l.ok());
    auto rows = l->list();
    BOOST_REQUIRE(rows.ok());
    return rows->size();
  }

  int backend_pid(const std::string& socket) {
    std::ifstream f(socket + ".pid");
    int pid = 0;
    f >> pid;
    return pid;
  }

  std::string args_of(const std::string& socket) { return slurp(socket + ".args"); }

  // The MAC the simulated VF's netdev shows in sysfs.
  std::string vf_mac(const std::string& vf) {
    for (const auto& e : fs::directory_iterator(sim.root() / "bus/pci/devices" / vf / "net")) {
      std::string mac = slurp(e.path() / "address");
      while (!mac.empty() && mac.back() == '\n') mac.pop_back();
      return mac;
    }
    return {};
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(hook_vf, Fixture)

BOOST_AUTO_TEST_CASE(start_takes_a_free_vf_records_it_and_runs_vrdmad_on_its_rdma_device) {
  enable("ens1f0", 2);
  const auto xml = domain("g1");
  auto p = hook("g1", "prepare", "begin", xml);
  BOOST_REQUIRE_MESSAGE(p.rc == 0, p.err);
  BOOST_TEST(p.out.empty());  // prepare prints nothing: libvirt keeps its XML

  // The ledger: the first VF of the pool, active, held by the backend's pid under "g1@host".
  auto a = held_by("g1");
  BOOST_REQUIRE(a.has_value());
  BOOST_TEST(a->vf.str() == "0000:3b:00.2");
  BOOST_TEST(a->pf.str() == "0000:3b:00.0");
  BOOST_TEST((a->state == sriov::AllocState::active));
  const int pid = backend_pid(sock("g1"));
  BOOST_TEST(pid > 0);
  BOOST_TEST(runs(pid));
  BOOST_TEST(a->owner_pid == pid);

  // The backend's command names the VF's RDMA device, and its MAC is the VF's own (no mac asked).
  const auto args = args_of(sock("g1"));
  BOOST_TEST(has(args, "--engine verbs:qedr_vf0 "), args);
  BOOST_TEST(has(args, "--mac " + vf_mac("0000:3b:00.2")), args);
  BOOST_TEST(!has(args, "--incoming"), args);
  const auto log = slurp(w / "hook.log");
  BOOST_TEST(has(log, "g1 prepare begin: started backend with VF 0000:3b:00.2 (qedr_vf0, engine verbs:qedr_vf0"), log);

  // start begin right after prepare: the same backend, the same VF, no second row.
  auto s = hook("g1", "start", "begin", xml);
  BOOST_REQUIRE_MESSAGE(s.rc == 0, s.err);
  BOOST_TEST(backend_pid(sock("g1")) == pid);
  BOOST_TEST(held_by("g1")->vf.str() == "0000:3b:00.2");
  BOOST_TEST(ledger_rows() == 1U);
  BOOST_TEST(has(slurp(w / "hook.log"), "g1 start begin: backend already runs"));

  // release: the backend stops and the VF is free again in the ledger.
  auto r = hook("g1", "release", "end", xml);
  BOOST_REQUIRE_MESSAGE(r.rc == 0, r.err);
  BOOST_TEST(!runs(pid));
  BOOST_TEST(!held_by("g1").has_value());
  BOOST_TEST(ledger_rows() == 0U);
  BOOST_TEST(has(slurp(w / "hook.log"), "g1 release end: stopped backend on " + sock("g1") + ", released VF 0000:3b:00.2"));
  // A second release has nothing to give back and is no error.
  BOOST_TEST(hook("g1", "release", "end", xml).rc == 0);
}

BOOST_AUTO_TEST_CASE(the_domain_vrdmactl_domain_attach_writes_gets_a_vf_from_the_hook) {
  enable("ens1f0", 1);
  const std::string plain = "<domain type='kvm'><name>g1</name><memory unit='MiB'>256</memory><devices/></domain>";
  auto x = vrdmactl("domain attach --socket " + sock("g1") + " --vf-pool ens1f0 --vf-numa 0", plain);
  BOOST_REQUIRE_MESSAGE(x.rc == 0, x.err);
  BOOST_TEST(has(x.out, "engine=\"verbs:vf\""), x.out);  // any --vf-* option means verbs:vf
  BOOST_TEST(has(x.out, "vf-pool=\"ens1f0\" vf-numa=\"0\""), x.out);
  auto p = hook("g1", "prepare", "begin", x.out);
  BOOST_REQUIRE_MESSAGE(p.rc == 0, p.err);
  BOOST_TEST(held_by("g1")->vf.str() == "0000:3b:00.2");
  BOOST_TEST(has(args_of(sock("g1")), "--engine verbs:qedr_vf0 "));
  BOOST_TEST(hook("g1", "release", "end", x.out).rc == 0);
  BOOST_TEST(ledger_rows() == 0U);

  auto soft = vrdmactl("domain attach --socket /run/g2.sock --engine soft:10.0.0.5 --vf-pool ens1f0", plain);
  BOOST_TEST(soft.rc == 1);
  BOOST_TEST(has(soft.err, "VF pool options need the engine verbs:vf"), soft.err);
  auto vlan = vrdmactl("domain attach --socket /run/g2.sock --vf-vlan 5000", plain);
  BOOST_TEST(vlan.rc == 2);
  BOOST_TEST(has(vlan.err, "--vf-vlan takes a VLAN id, 0..4094 (0: none), not '5000'"), vlan.err);
}

BOOST_AUTO_TEST_CASE(a_restarted_domain_gets_its_own_vf_back) {
  enable("ens1f0", 3);
  BOOST_REQUIRE_EQUAL(hook("g0", "prepare", "begin", domain("g0")).rc, 0);
  BOOST_REQUIRE_EQUAL(hook("g1", "prepare", "begin", domain("g1")).rc, 0);
  BOOST_REQUIRE_EQUAL(held_by("g1")->vf.str(), "0000:3b:00.3");
  // g1's backend dies; g0 is released, so the lowest free VF is now g0's old one.
  const int dead = backend_pid(sock("g1"));
  ::kill(dead, SIGKILL);
  for (int i = 0; i < 100 && runs(dead); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  BOOST_REQUIRE_EQUAL(hook("g0", "release", "end", domain("g0")).rc, 0);
  auto p = hook("g1", "prepare", "begin", domain("g1"));
  BOOST_REQUIRE_MESSAGE(p.rc == 0, p.err);
  auto a = held_by("g1");
  BOOST_REQUIRE(a.has_value());
  BOOST_TEST(a->vf.str() == "0000:3b:00.3");  // its own, not the lowest free one
  const int pid = backend_pid(sock("g1"));
  BOOST_TEST(pid != dead);
  BOOST_TEST(a->owner_pid == pid);
  BOOST_TEST(has(args_of(sock("g1")), "--engine verbs:qedr_vf1 "));
  BOOST_TEST(has(slurp(w / "hook.log"), "started backend with its VF 0000:3b:00.3"));
  BOOST_TEST(ledger_rows() == 1U);
}

BOOST_AUTO_TEST_CASE(what_a_killed_hook_left_in_the_ledger_does_not_block_the_next_start) {
  enable("ens1f0", 2);
  {
    // A hook killed between reserving and starting vrdmad: a reserved row of a process that is gone,
    // for this domain and for another one.
    auto l = sriov::Ledger::open(ledger_path);
    BOOST_REQUIRE(l.ok());
    const std::vector<sriov::Candidate> c{{*sriov::parse_pci_address("0000:3b:00.2"),
                                           *sriov::parse_pci_address("0000:3b:00.0"), 0},
                                          {*sriov::parse_pci_address("0000:3b:00.3"),
                                           *sriov::parse_pci_address("0000:3b:00.0"), 1}};
    BOOST_REQUIRE(l->allocate({sriov::Purpose::guest, owner("g1"), 999999, sriov::current_boot_id()}, c).ok());
    BOOST_REQUIRE(l->allocate({sriov::Purpose::guest, owner("gx"), 999998, sriov::current_boot_id()}, c).ok());
  }
  BOOST_REQUIRE(!sriov::process_alive(999999) && !sriov::process_alive(999998));
  auto p = hook("g1", "prepare", "begin", domain("g1"));
  BOOST_REQUIRE_MESSAGE(p.rc == 0, p.err);
  auto a = held_by("g1");
  BOOST_REQUIRE(a.has_value());
  BOOST_TEST((a->state == sriov::AllocState::active));
  BOOST_TEST(a->owner_pid == backend_pid(sock("g1")));
  BOOST_TEST(!held_by("gx").has_value());  // reconciled away
  BOOST_TEST(ledger_rows() == 1U);
}

BOOST_AUTO_TEST_CASE(a_vf_the_operator_assigned_to_the_domain_is_the_one_it_gets) {
  enable("ens1f0", 3);
  auto pin = vrdmactl("vf assign --owner " + owner("g1") + " --vf 0000:3b:00.4 --sysfs-root " + sim.root().string() +
                      " --ledger " + ledger_path);
  BOOST_REQUIRE_MESSAGE(pin.rc == 0, pin.out + pin.err);
  BOOST_REQUIRE_EQUAL(held_by("g1")->owner_pid, 0);  // held until released
  auto p = hook("g1", "prepare", "begin", domain("g1"));
  BOOST_REQUIRE_MESSAGE(p.rc == 0, p.err);
  BOOST_TEST(held_by("g1")->vf.str() == "0000:3b:00.4");
  BOOST_TEST(held_by("g1")->owner_pid == backend_pid(sock("g1")));
  BOOST_TEST(has(args_of(sock("g1")), "--engine verbs:qedr_vf2 "));
  BOOST_TEST(hook("g1", "release", "end", domain("g1")).rc == 0);
  BOOST_TEST(ledger_rows() == 0U);
}

BOOST_AUTO_TEST_CASE(an_exhausted_pool_fails_the_start_with_who_holds_it_and_how_to_free_one) {
  enable("ens1f0", 2);
  BOOST_REQUIRE_EQUAL(hook("g1", "prepare", "begin", domain("g1")).rc, 0);
  BOOST_REQUIRE_EQUAL(hook("g2", "prepare", "begin", domain("g2")).rc, 0);
  auto x = hook("g3", "prepare", "begin", domain("g3"));
  BOOST_TEST(x.rc == 1);
  const std::string want = "vrdma hook: cannot give domain g3 on " + host +
                           " a VF: no free VF in VF pool ens1f0: 2 of 2 VFs with an RDMA function are assigned "
                           "(0000:3b:00.2 to guest '" + owner("g1") + "', 0000:3b:00.3 to guest '" + owner("g2") +
                           "'); stop one of those domains (its hook gives the VF back), free a VF left behind with "
                           "'vrdmactl vf release --owner " + owner("g2") + "', or add VFs with 'vrdmactl vf enable "
                           "--pf ens1f0 --count N'";
  BOOST_TEST(has(x.err, want), x.err);
  BOOST_TEST(!fs::exists(sock("g3") + ".args"));  // no backend was started
  BOOST_TEST(ledger_rows() == 2U);

  // A backend that died frees its VF for the next guest (the ledger is reconciled first).
  const int dead = backend_pid(sock("g2"));
  ::kill(dead, SIGKILL);
  for (int i = 0; i < 100 && runs(dead); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto y = hook("g3", "prepare", "begin", domain("g3"));
  BOOST_REQUIRE_MESSAGE(y.rc == 0, y.err);
  BOOST_TEST(held_by("g3")->vf.str() == "0000:3b:00.3");
  BOOST_TEST(!held_by("g2").has_value());

  // A pool whose VFs have no RDMA function (E810: iavf) says so.
  enable("ens2f0", 1);
  auto z = hook("g4", "prepare", "begin", domain("g4", "vf-pool='ens2f0'"));
  BOOST_TEST(z.rc == 1);
  BOOST_TEST(has(z.err, "no VF in VF pool ens2f0 can serve a backend: VF 0000:5e:01.0 has no RDMA device (driver iavf)"),
             z.err);
  // An unknown pool is named.
  auto u = hook("g4", "prepare", "begin", domain("g4", "vf-pool='ens9f9'"));
  BOOST_TEST(u.rc == 1);
  BOOST_TEST(has(u.err, "ens9f9"), u.err);
}

BOOST_AUTO_TEST_CASE(an_incoming_migration_takes_a_vf_on_the_destination) {
  enable("ens3f0np0", 2);
  const auto xml = domain("g1", "vf-pool='ens3f0np0' incoming='tcp:10.99.9.2:7811'");
  auto m = hook("g1", "migrate", "begin", xml);
  BOOST_REQUIRE_MESSAGE(m.rc == 0, m.err);
  const std::string here = (w / ("g1." + host + ".sock")).string();
  // The printed XML: this host's socket, and still engine="verbs:vf" (the VF is this host's, not the guest's).
  BOOST_TEST(has(m.out, "path=\"" + here + "\""), m.out);
  BOOST_TEST(has(m.out, "engine=\"verbs:vf\""), m.out);
  const auto args = args_of(here);
  BOOST_TEST(has(args, "--engine verbs:mlx5_1 "), args);
  BOOST_TEST(has(args, "--incoming tcp:10.99.9.2:7811"), args);
  auto a = held_by("g1");
  BOOST_REQUIRE(a.has_value());
  BOOST_TEST(a->vf.str() == "0000:af:00.2");
  BOOST_TEST(a->owner_pid == backend_pid(here));
  BOOST_TEST(has(slurp(w / "hook.log"), "g1 migrate begin: started vrdmad --incoming with VF 0000:af:00.2 (mlx5_1"));

  // prepare/start with the printed XML: the incoming backend and its VF are kept.
  BOOST_TEST(hook("g1", "prepare", "begin", m.out).rc == 0);
  BOOST_TEST(hook("g1", "start", "begin", m.out).rc == 0);
  BOOST_TEST(held_by("g1")->vf.str() == "0000:af:00.2");
  BOOST_TEST(ledger_rows() == 1U);
  BOOST_TEST(hook("g1", "release", "end", m.out).rc == 0);
  BOOST_TEST(ledger_rows() == 0U);
}

BOOST_AUTO_TEST_CASE(a_backend_that_fails_to_start_gives_the_vf_back) {
  enable("ens1f0", 1);
  ::setenv("FAKE_MODE", "die", 1);
  auto p = hook("g1", "prepare", "begin", domain("g1"));
  ::unsetenv("FAKE_MODE");
  BOOST_TEST(p.rc == 1);
  BOOST_TEST(has(p.err, "cannot start the vrdmad backend for domain g1 on " + host), p.err);
  BOOST_TEST(has(p.err, "VF 0000:3b:00.2 was given back to the pool"), p.err);
  BOOST_TEST(ledger_rows() == 0U);
}

BOOST_AUTO_TEST_CASE(the_element_s_mac_and_settings_go_to_the_pf_and_a_refusal_gives_the_vf_back) {
  if (!test::can_make_netns()) {
    BOOST_TEST_MESSAGE("SKIP: cannot create network namespaces here (needs root and iproute2)");
    return;
  }
  // The simulated PF's netdev exists in this namespace as a veth: the real kernel answers the
  // VF settings request (RTM_SETLINK with IFLA_VFINFO_LIST) with "not supported".
  const std::string ns = "vrdmahookvf" + std::to_string(::getpid() % 100000);
  test::sh("ip netns del " + ns + " 2>/dev/null; true");
  BOOST_REQUIRE_EQUAL(test::sh("ip netns add " + ns), 0);
  struct Del {
    std::string ns;
    ~Del() { test::sh("ip netns del " + ns); }
  } del{ns};
  BOOST_REQUIRE_EQUAL(test::sh("ip -n " + ns + " link add ens1f0 type veth peer name ens1peer"), 0);
  enable("ens1f0", 1);
  const auto in_ns = "ip netns exec " + ns + " ";
  auto p = hook("g1", "prepare", "begin", domain("g1", "vf-pool='ens1f0' mac='52:54:00:66:00:01' vf-vlan='7'"), in_ns);
  BOOST_TEST(p.rc == 1);
  BOOST_TEST(has(p.err, "cannot give domain g1 on " + host + " a VF: "), p.err);
  BOOST_TEST(has(p.err, "ens1f0"), p.err);
  BOOST_TEST(has(p.err, "not support"), p.err);
  BOOST_TEST_MESSAGE("the refusal: " << p.err);
  BOOST_TEST(ledger_rows() == 0U);
  BOOST_TEST(!fs::exists(sock("g1") + ".args"));
  // An element that asks for no settings needs no netlink: the same VF serves.
  auto q = hook("g1", "prepare", "begin", domain("g1"), in_ns);
  BOOST_REQUIRE_MESSAGE(q.rc == 0, q.err);
  BOOST_TEST(held_by("g1")->vf.str() == "0000:3b:00.2");
  // A release whose element names settings puts them back to a fresh VF's through the PF; when
  // the kernel refuses, the hook says so, and the VF is free all the same (the guest is gone).
  auto r = hook("g1", "release", "end", domain("g1", "vf-pool='ens1f0' vf-vlan='7'"), in_ns);
  BOOST_TEST(r.rc == 0, r.err);
  BOOST_TEST(has(r.err, "vrdma hook: domain g1: the settings of VF 0000:3b:00.2 could not be reset: "), r.err);
  BOOST_TEST(ledger_rows() == 0U);
  // Without settings, nothing to reset and nothing said.
  BOOST_REQUIRE_EQUAL(hook("g1", "prepare", "begin", domain("g1"), in_ns).rc, 0);
  auto r2 = hook("g1", "release", "end", domain("g1"), in_ns);
  BOOST_TEST(r2.rc == 0);
  BOOST_TEST(r2.err.empty(), r2.err);
  BOOST_TEST(ledger_rows() == 0U);
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

// Two network namespaces joined by a veth: "src" (this host, whose end is named as the simulated
// VF's netdev ens1f0v0, so the migration VF's address goes on a real link) and "dst" (the
// destination's migration address 10.77.0.12/24), plus a second link from src to 10.88.0.2
// that carries no RDMA GID.
struct MigrationNets : Fixture {
  std::string src = "vrdmamvfs" + std::to_string(::getpid() % 100000);
  std::string dst = "vrdmamvfd" + std::to_string(::getpid() % 100000);
  bool ok = false;

  MigrationNets() {
    if (!test::can_make_netns()) return;
    for (const auto& n : {src, dst}) test::sh("ip netns del " + n + " 2>/dev/null; true");
    ok = test::sh("ip netns add " + src) == 0 && test::sh("ip netns add " + dst) == 0 &&
         test::sh("ip -n " + src + " link add ens1f0v0 type veth peer name mig0 netns " + dst) == 0 &&
         test::sh("ip -n " + dst + " addr add 10.77.0.12/24 dev mig0 && ip -n " + dst + " link set mig0 up") == 0 &&
         test::sh("ip -n " + src + " link add eth9 type veth peer name eth9p netns " + dst) == 0 &&
         test::sh("ip -n " + src + " addr add 10.88.0.1/24 dev eth9 && ip -n " + src + " link set eth9 up") == 0 &&
         test::sh("ip -n " + dst + " addr add 10.88.0.2/24 dev eth9p && ip -n " + dst + " link set eth9p up") == 0;
  }
  ~MigrationNets() {
    for (const auto& n : {src, dst}) test::sh("ip netns del " + n + " 2>/dev/null; true");
  }
  std::string in_src() const { return "ip netns exec " + src + " "; }

  // A libvirt test-driver node with one running domain of 4 MiB (under this machine's 8 MiB
  // locked-memory limit) and a memory hard_limit: every RDMA pre-flight check but the route passes.
  std::string test_node() const {
    const auto p = w / "node.xml";
    std::ofstream(p) << "<node><domain type='test'><name>mig1</name><memory unit='MiB'>4</memory>"
                        "<memtune><hard_limit unit='MiB'>64</hard_limit></memtune><os><type>hvm</type></os>"
                        "</domain></node>\n";
    return "test://" + p.string();
  }

  Out migrate(const std::string& uri) {
    return vrdmactl("migrate mig1 qemu+tcp://10.77.0.12/system --connect " + test_node() + " --migrateuri " + uri,
                    "", in_src());
  }

  std::optional<sriov::Allocation> migration_row() {
    auto l = sriov::Ledger::open(ledger_path);
    BOOST_REQUIRE(l.ok());
    auto a = l->find_owner(sriov::Purpose::migration, "migration@" + host);
    BOOST_REQUIRE(a.ok());
    return *a;
  }

  std::string addresses(const std::string& ifname) {
    return run("ip -n " + src + " -o addr show dev " + ifname + " 2>&1; ip -n " + src + " -o link show dev " + ifname +
               " 2>&1");
  }
  std::string route_to(const std::string& ip) { return run("ip -n " + src + " route get " + ip + " 2>&1"); }
  static std::string run(const std::string& cmd) {
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    std::array<char, 1024> buf{};
    for (std::size_t k; (k = std::fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), k);
    ::pclose(p);
    return out;
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(migration_vf, MigrationNets)

BOOST_AUTO_TEST_CASE(the_host_takes_one_migration_vf_from_the_pool_puts_its_address_on_it_and_gives_it_back) {
  if (!ok) {
    BOOST_TEST_MESSAGE("SKIP: cannot create network namespaces here (needs root and iproute2)");
    return;
  }
  enable("ens1f0", 3);
  // Not configured: said, nothing taken.
  auto none = vrdmactl("migration-vf up", "", in_src());
  BOOST_TEST(none.rc == 1);
  BOOST_TEST(has(none.err, "this host has no migration VF configured: set VRDMA_MIGRATION_POOL"), none.err);
  BOOST_TEST(ledger_rows() == 0U);
  ::setenv("VRDMA_MIGRATION_POOL", "ens1f0", 1);
  ::setenv("VRDMA_MIGRATION_ADDRESS", "10.77.0.300/24", 1);
  auto bad = vrdmactl("migration-vf up", "", in_src());
  BOOST_TEST(bad.rc == 1);
  BOOST_TEST(has(bad.err, "VRDMA_MIGRATION_ADDRESS '10.77.0.300/24' is not an address with its prefix length"), bad.err);
  BOOST_TEST(ledger_rows() == 0U);

  ::setenv("VRDMA_MIGRATION_ADDRESS", "10.77.0.11/24", 1);
  BOOST_TEST(!has(route_to("10.77.0.12"), "dev ens1f0v0"));  // no address yet, no route
  auto up = vrdmactl("migration-vf up", "", in_src());
  BOOST_REQUIRE_MESSAGE(up.rc == 0, up.out + up.err);
  BOOST_TEST(has(up.out, "This host's migration VF is now 0000:3b:00.2 (RDMA device qedr_vf0, netdev ens1f0v0) with "
                         "10.77.0.11/24."), up.out);
  BOOST_TEST(has(up.out, "--migrateuri rdma://10.77.0.11:PORT"), up.out);
  auto row = migration_row();
  BOOST_REQUIRE(row.has_value());
  BOOST_TEST(row->vf.str() == "0000:3b:00.2");
  BOOST_TEST((row->state == sriov::AllocState::active));
  BOOST_TEST(row->owner_pid == 0);  // the host's, until released
  const auto a = addresses("ens1f0v0");
  BOOST_TEST(has(a, "inet 10.77.0.11/24"), a);
  BOOST_TEST(has(a, ",UP"), a);
  // The destination's migration address is now reached through it, from this address.
  BOOST_TEST(has(route_to("10.77.0.12"), "dev ens1f0v0 src 10.77.0.11"), route_to("10.77.0.12"));

  // Again: the same VF, nothing added, still one row.
  auto again = vrdmactl("migration-vf up", "", in_src());
  BOOST_REQUIRE_MESSAGE(again.rc == 0, again.err);
  BOOST_TEST(has(again.out, "The migration VF of this host is 0000:3b:00.2"), again.out);
  BOOST_TEST(ledger_rows() == 1U);
  auto show = vrdmactl("migration-vf show", "", in_src());
  BOOST_TEST(has(show.out, "The migration VF of " + host + " is 0000:3b:00.2 (RDMA device qedr_vf0, netdev ens1f0v0) "
                           "with 10.77.0.11/24."), show.out);

  // Guests never get it: the next guest's VF is the next one, and an exhausted pool names it.
  BOOST_REQUIRE_EQUAL(hook("g1", "prepare", "begin", domain("g1")).rc, 0);
  BOOST_TEST(held_by("g1")->vf.str() == "0000:3b:00.3");
  BOOST_REQUIRE_EQUAL(hook("g2", "prepare", "begin", domain("g2")).rc, 0);
  auto full = hook("g3", "prepare", "begin", domain("g3"));
  BOOST_TEST(full.rc == 1);
  BOOST_TEST(has(full.err, "0000:3b:00.2 to migration 'migration@" + host + "'"), full.err);

  // Another netdev holding the address is refused when a new VF would take it.
  auto rel = vrdmactl("migration-vf release", "", in_src());
  BOOST_REQUIRE_MESSAGE(rel.rc == 0, rel.err);
  BOOST_TEST(has(rel.out, "The migration VF 0000:3b:00.2 of " + host + " went back to the pool."), rel.out);
  BOOST_TEST(!migration_row().has_value());
  const auto gone = addresses("ens1f0v0");
  BOOST_TEST(!has(gone, "10.77.0.11"), gone);
  BOOST_TEST(!has(gone, ",UP"), gone);
  BOOST_REQUIRE_EQUAL(test::sh("ip -n " + src + " addr add 10.77.0.11/32 dev eth9"), 0);
  auto clash = vrdmactl("migration-vf up", "", in_src());
  BOOST_TEST(clash.rc == 1);
  BOOST_TEST(has(clash.err, "the migration address 10.77.0.11 is already on netdev eth9; VRDMA_MIGRATION_ADDRESS must "
                            "be an address of the migration VF alone"), clash.err);
  BOOST_TEST(has(clash.err, "VF 0000:3b:00.2 was given back to the pool"), clash.err);
  BOOST_TEST(!migration_row().has_value());
  auto rel2 = vrdmactl("migration-vf release", "", in_src());
  BOOST_TEST(has(rel2.out, "holds no migration VF"), rel2.out);
}

BOOST_AUTO_TEST_CASE(vrdmactl_migrate_over_rdma_takes_the_migration_vf_before_it_checks_the_route) {
  if (!ok) {
    BOOST_TEST_MESSAGE("SKIP: cannot create network namespaces here (needs root and iproute2)");
    return;
  }
  enable("ens1f0", 2);
  // Without a migration VF the destination's migration address has no route from here.
  auto before = migrate("rdma://10.77.0.12:4444");
  BOOST_TEST(has(before.out, "RDMA migration is not possible: the destination 10.77.0.12 is not reachable from this "
                             "host (no route). Falling back to TCP (tcp://10.77.0.12:4444)."), before.out);
  // A route through a netdev without an RDMA GID is named.
  auto eth9 = migrate("rdma://10.88.0.2:4444");
  BOOST_TEST(has(eth9.out, "the destination 10.88.0.2 is reached through eth9, which carries no RDMA GID (RDMA GIDs "
                           "are on "), eth9.out);

  ::setenv("VRDMA_MIGRATION_POOL", "ens1f0", 1);
  ::setenv("VRDMA_MIGRATION_ADDRESS", "10.77.0.11/24", 1);
  auto m = migrate("rdma://10.77.0.12:4444");
  BOOST_TEST(has(m.out, "This host's migration VF 0000:3b:00.2 (RDMA device qedr_vf0, netdev ens1f0v0) carries "
                        "10.77.0.11/24 (taken from the pool now; 'vrdmactl migration-vf release' gives it back)."),
             m.out);
  // Every check passes: QEMU's rdma:// is what goes to libvirt (whose test driver then refuses
  // to migrate at all, so the command fails after the choice).
  BOOST_TEST(has(m.out, "The memory goes over RDMA (rdma://10.77.0.12:4444, all guest memory pinned)."), m.out);
  BOOST_TEST(has(m.out, "Migrating domain mig1 from test://"), m.out);
  BOOST_TEST(has(m.out, " over rdma://10.77.0.12:4444."), m.out);
  BOOST_TEST(!has(m.out, "Falling back"), m.out);
  BOOST_TEST(m.rc == 1);
  BOOST_TEST(has(m.err, "The domain still runs on test://"), m.err);
  BOOST_TEST(migration_row().has_value());
  // The second migration finds it there.
  auto m2 = migrate("rdma://10.77.0.12:4444");
  BOOST_TEST(has(m2.out, "carries 10.77.0.11/24.\n"), m2.out);
  BOOST_TEST(ledger_rows() == 1U);
  // A TCP migration does not touch it.
  auto t = migrate("tcp://10.77.0.12:4444");
  BOOST_TEST(!has(t.out, "migration VF"), t.out);

  // A pool that cannot give one: the reason, and TCP.
  BOOST_REQUIRE(vrdmactl("migration-vf release", "", in_src()).rc == 0);
  ::setenv("VRDMA_MIGRATION_POOL", "ens2f0", 1);  // E810: iavf VFs have no RDMA function
  enable("ens2f0", 1);
  auto e = migrate("rdma://10.77.0.12:4444");
  BOOST_TEST(has(e.out, "RDMA migration is not possible: this host's migration VF could not be set up: no VF in VF pool "
                        "ens2f0 can carry RDMA migrations: VF 0000:5e:01.0 has no RDMA device (driver iavf)"), e.out);
  BOOST_TEST(has(e.out, "Falling back to TCP (tcp://10.77.0.12:4444)."), e.out);
}

BOOST_AUTO_TEST_CASE(the_destination_hook_takes_the_migration_vf_on_migrate_begin) {
  if (!ok) {
    BOOST_TEST_MESSAGE("SKIP: cannot create network namespaces here (needs root and iproute2)");
    return;
  }
  enable("ens1f0", 2);
  const std::string plain = "<domain type='kvm'><name>p1</name><memory unit='MiB'>64</memory><devices/></domain>";
  ::setenv("VRDMA_MIGRATION_POOL", "ens1f0", 1);
  ::setenv("VRDMA_MIGRATION_ADDRESS", "10.77.0.11/24", 1);
  // Any domain's incoming migration may come over rdma://: a domain without the device too.
  auto m = hook("p1", "migrate", "begin", plain, in_src());
  BOOST_REQUIRE_MESSAGE(m.rc == 0, m.err);
  BOOST_TEST(m.out.empty());  // libvirt keeps its XML
  BOOST_TEST(has(slurp(w / "hook.log"), host + " p1 migrate begin: migration VF 0000:3b:00.2 (qedr_vf0, netdev "
                                        "ens1f0v0) carries 10.77.0.11/24 (taken from the pool now)"));
  BOOST_TEST(has(addresses("ens1f0v0"), "inet 10.77.0.11/24"));
  // A vrdma domain's incoming migration: the migration VF stays, the guest gets its own.
  auto g = hook("g1", "migrate", "begin", domain("g1", "vf-pool='ens1f0' incoming='tcp:10.99.9.2:7811'"), in_src());
  BOOST_REQUIRE_MESSAGE(g.rc == 0, g.err);
  BOOST_TEST(held_by("g1")->vf.str() == "0000:3b:00.3");
  BOOST_TEST(ledger_rows() == 2U);
  // A broken setting does not stop the migration (TCP needs no VF); it is said.
  ::setenv("VRDMA_MIGRATION_ADDRESS", "10.77.0.11", 1);
  auto b = hook("p1", "migrate", "begin", plain, in_src());
  BOOST_TEST(b.rc == 0);
  BOOST_TEST(has(b.err, "vrdma hook: VRDMA_MIGRATION_ADDRESS '10.77.0.11' is not an address with its prefix length"),
             b.err);
}

BOOST_AUTO_TEST_SUITE_END()
