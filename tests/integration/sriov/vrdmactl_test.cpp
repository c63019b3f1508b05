// The real vrdmactl binary, run as separate processes against a simulated sysfs tree and a real
// SQLite ledger: output formats, exit codes, and two concurrent `assign`s getting distinct VFs.
#define BOOST_TEST_MODULE sriov_vrdmactl
#include <boost/test/unit_test.hpp>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "sriov_sysfs_simulator.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
struct Out {
  int rc;
  std::string text;
};

Out run(const std::string& args) {
  std::string cmd = std::string(VRDMACTL_PATH) + " " + args + " 2>&1";
  Out o{0, {}};
  FILE* p = popen(cmd.c_str(), "r");
  BOOST_REQUIRE(p);
  std::array<char, 4096> buf{};
  for (std::size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) o.text.append(buf.data(), n);
  int st = pclose(p);
  o.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

struct Fixture {
  vrdma::sriov::test::SriovSysfsSimulator sim;
  std::string opts;
  Fixture() {
    sim.add_standard_nics();
    sim.start();
    opts = " --sysfs-root " + sim.root().string() + " --ledger " + (sim.root().parent_path() / "l.sqlite").string();
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(without_a_subcommand_vrdmactl_says_where_help_is_and_exits_2) {
  auto o = run("");
  BOOST_TEST(o.rc == 2);
  BOOST_TEST(o.text.find("vrdmactl: A subcommand is required (run 'vrdmactl --help' for the options)") !=
                 std::string::npos,
             o.text);
  auto h = run("--help");
  BOOST_TEST(h.rc == 0);
  BOOST_TEST(h.text.find("migration-vf") != std::string::npos, h.text);
  BOOST_TEST(run("vf --help").rc == 0);
  BOOST_TEST(run("vf bogus").rc == 2);
}

BOOST_FIXTURE_TEST_CASE(list_enable_assign_release_through_the_binary, Fixture) {
  auto e = run("vf enable --pf ens1f0 --count 4" + opts);
  BOOST_REQUIRE_MESSAGE(e.rc == 0, e.text);
  auto l = run("vf list --json" + opts);
  BOOST_REQUIRE_EQUAL(l.rc, 0);
  auto j = json::parse(l.text);
  BOOST_TEST(j["pfs"][0]["vfs"].size() == 4U);
  BOOST_TEST(j["pfs"][0]["vfs"][0]["rdma"][0]["ports"][0]["transports"][1] == "RoCE v2");
  auto a = run("vf assign --owner vm1/rdma0 --pf ens1f0 --xml interface" + opts);
  BOOST_REQUIRE_MESSAGE(a.rc == 0, a.text);
  BOOST_TEST(a.text.find("VF 0000:3b:00.2 (VF 0 of PF 0000:3b:00.0, RDMA device qedr_vf0) is assigned") !=
             std::string::npos);
  BOOST_TEST(a.text.find("<interface type='hostdev'") != std::string::npos);
  auto s = run("vf show 0000:3b:00.2" + opts);
  BOOST_TEST(s.text.find("guest:vm1/rdma0") != std::string::npos);
  BOOST_TEST(s.text.find("<hostdev mode='subsystem'") != std::string::npos);
  auto r = run("vf release --owner vm1/rdma0" + opts);
  BOOST_TEST(r.rc == 0);
  auto d = run("vf disable --pf ens1f0" + opts);
  BOOST_TEST(d.rc == 0, d.text);
}

BOOST_FIXTURE_TEST_CASE(two_vrdmactl_processes_assigning_at_once_get_different_vfs, Fixture) {
  BOOST_REQUIRE_EQUAL(run("vf enable --pf ens3f0np0 --count 2" + opts).rc, 0);
  // Start both before reading either (popen runs them concurrently).
  std::string c1 = std::string(VRDMACTL_PATH) + " vf assign --json --owner vmA/rdma0" + opts;
  std::string c2 = std::string(VRDMACTL_PATH) + " vf assign --json --owner vmB/rdma0" + opts;
  FILE* p1 = popen(c1.c_str(), "r");
  FILE* p2 = popen(c2.c_str(), "r");
  BOOST_REQUIRE(p1 && p2);
  std::string o1, o2;
  std::array<char, 4096> buf{};
  for (std::size_t n; (n = fread(buf.data(), 1, buf.size(), p1)) > 0;) o1.append(buf.data(), n);
  for (std::size_t n; (n = fread(buf.data(), 1, buf.size(), p2)) > 0;) o2.append(buf.data(), n);
  BOOST_TEST(pclose(p1) == 0);
  BOOST_TEST(pclose(p2) == 0);
  auto v1 = json::parse(o1)["vf"].get<std::string>();
  auto v2 = json::parse(o2)["vf"].get<std::string>();
  BOOST_TEST(v1 != v2);
  auto third = run("vf assign --owner vmC/rdma0" + opts);
  BOOST_TEST(third.rc == 1);
  BOOST_TEST(third.text.find("no free VF") != std::string::npos);
}

BOOST_FIXTURE_TEST_CASE(a_missing_vfio_driver_is_explained_by_the_binary, Fixture) {
  BOOST_REQUIRE_EQUAL(run("vf enable --pf ens2f0 --count 1" + opts).rc, 0);
  auto a = run("vf assign --owner vm1/net0 --passthrough" + opts);
  BOOST_TEST(a.rc == 1);
  BOOST_TEST(a.text.find("driver vfio-pci is not loaded") != std::string::npos, a.text);
  BOOST_TEST(a.text.find("modprobe vfio-pci") != std::string::npos);
}
