#define BOOST_TEST_MODULE sriov_cli
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sriov_sysfs_simulator.hpp"
#include "vrdma/sriov/cli.hpp"

using namespace vrdma::sriov;
using vrdma::sriov::test::SriovSysfsSimulator;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
struct Fixture {
  SriovSysfsSimulator sim;
  std::string ledger;
  std::string out, err;
  Fixture() {
    sim.add_standard_nics();
    sim.start();
    ledger = (sim.root().parent_path() / "vf-ledger.sqlite").string();
  }
  int run(std::vector<std::string> args) {
    args.insert(args.end(), {"--sysfs-root", sim.root().string(), "--ledger", ledger});
    return run_raw(args);
  }
  int run_raw(const std::vector<std::string>& args) {
    std::ostringstream o, e;
    int rc = vf_cli_run(args, o, e);
    out = o.str();
    err = e.str();
    return rc;
  }
  json run_json(std::vector<std::string> args) {
    args.push_back("--json");
    int rc = run(args);
    BOOST_REQUIRE_MESSAGE(rc == 0, err);
    return json::parse(out);
  }
};
}  // namespace

BOOST_FIXTURE_TEST_CASE(list_prints_a_table_and_json_of_every_pf, Fixture) {
  BOOST_REQUIRE_EQUAL(run({"list"}), 0);
  BOOST_TEST(out.find("FUNCTION") != std::string::npos);
  BOOST_TEST(out.find("QLogic FastLinQ QL41000") != std::string::npos);
  BOOST_TEST(out.find("iWARP") != std::string::npos);
  BOOST_TEST(out.find("RoCE v1,RoCE v2") != std::string::npos);
  auto j = run_json({"list"});
  BOOST_TEST(j["pfs"].size() == 4U);
  BOOST_TEST(j["pfs"][0]["address"] == "0000:3b:00.0");
  BOOST_TEST(j["pfs"][0]["rdma"][0]["ports"][0]["link_layer"] == "Ethernet");
  BOOST_TEST(!fs::exists(ledger));  // reading does not create the ledger
}

BOOST_FIXTURE_TEST_CASE(enable_assign_show_release_disable_round_trip, Fixture) {
  auto e = run_json({"enable", "--pf", "ens3f0np0", "--count", "3"});
  BOOST_TEST(e["vfs"].size() == 3U);
  auto a = run_json({"assign", "--owner", "vm1/rdma0", "--pf", "0000:af:00.0", "--xml", "hostdev"});
  BOOST_TEST(a["vf"] == "0000:af:00.2");
  BOOST_TEST(a["state"] == "active");
  BOOST_TEST(a["function"]["rdma"][0]["name"] == "mlx5_1");
  BOOST_TEST(a["libvirt_xml"].get<std::string>().find("bus='0xaf'") != std::string::npos);
  auto m = run_json({"assign", "--owner", "mig-7", "--migration"});
  BOOST_TEST(m["vf"] == "0000:af:00.3");
  BOOST_TEST(m["purpose"] == "migration");
  auto s = run_json({"show", "0000:af:00.2"});
  BOOST_TEST(s["held_by"]["owner"] == "vm1/rdma0");
  BOOST_REQUIRE_EQUAL(run({"list"}), 0);
  BOOST_TEST(out.find("guest:vm1/rdma0") != std::string::npos);
  BOOST_TEST(out.find("migration:mig-7") != std::string::npos);
  // Disabling while VFs are held is refused with the holders named.
  BOOST_TEST(run({"disable", "--pf", "0000:af:00.0"}) == 1);
  BOOST_TEST(err.find("still has VFs in use") != std::string::npos);
  BOOST_TEST(err.find("guest 'vm1/rdma0'") != std::string::npos);
  BOOST_REQUIRE_EQUAL(run({"release", "--owner", "vm1/rdma0"}), 0);
  BOOST_REQUIRE_EQUAL(run({"release", "--vf", "0000:af:00.3"}), 0);
  BOOST_REQUIRE_EQUAL(run({"disable", "--pf", "0000:af:00.0"}), 0);
  BOOST_TEST(out.find("has no VFs now") != std::string::npos);
}

BOOST_FIXTURE_TEST_CASE(operational_errors_are_sentences_with_exit_status_1, Fixture) {
  BOOST_TEST(run({"assign", "--owner", "vm1"}) == 1);
  BOOST_TEST(err.find("no free VF for guest 'vm1'") != std::string::npos);
  BOOST_TEST(run({"enable", "--pf", "eth42", "--count", "2"}) == 1);
  BOOST_TEST(err.find("no SR-IOV physical function 'eth42'") != std::string::npos);
  BOOST_TEST(run({"enable", "--pf", "ens1f0", "--count", "17"}) == 1);
  BOOST_TEST(err.find("at most 16 VFs") != std::string::npos);
  BOOST_TEST(run({"release", "--vf", "0000:af:00.9"}) == 1);
  BOOST_TEST(err.find("is not a PCI address") != std::string::npos);
  BOOST_TEST(run({"show", "nothing"}) == 1);
  BOOST_TEST(run({"assign", "--owner", "vm1", "--mac", "01:00:00:00:00:01"}) == 1);
  BOOST_TEST(err.find("multicast") != std::string::npos);
  BOOST_TEST(run({"assign", "--owner", "vm1", "--qos", "3"}) == 1);
  BOOST_TEST(err.find("needs a VLAN id") != std::string::npos);
  BOOST_TEST(run({"assign", "--owner", "vm1", "--trust", "maybe"}) == 1);
  BOOST_TEST(err.find("--trust takes on or off") != std::string::npos);
  BOOST_TEST(run_raw({"list", "--json", "--sysfs-root", "/nonexistent"}) == 1);
  BOOST_TEST(json::parse(err)["error"].get<std::string>().find("cannot list PCI devices") != std::string::npos);
}

BOOST_FIXTURE_TEST_CASE(usage_errors_exit_2, Fixture) {
  BOOST_TEST(run({}) == 2);
  BOOST_TEST(run({"frobnicate"}) == 2);
  BOOST_TEST(run({"enable", "--pf", "ens1f0"}) == 2);
  BOOST_TEST(run({"enable", "--pf", "ens1f0", "--count", "0"}) == 2);
  BOOST_TEST(run({"assign", "--owner", "vm1", "--vlan", "5000"}) == 2);
  BOOST_TEST(run({"enable", "--pf", "ens1f0", "--count", "x"}) == 2);
}

BOOST_FIXTURE_TEST_CASE(network_xml_and_reconcile_commands, Fixture) {
  BOOST_REQUIRE_EQUAL(run({"network-xml", "--pf", "ens3f0np0", "--name", "vrdma-cx5"}), 0);
  BOOST_TEST(out.find("<pf dev='ens3f0np0'/>") != std::string::npos);
  BOOST_TEST(run({"network-xml", "--pf", "ens3f0np0", "--name", "x", "--vf-list"}) == 1);
  BOOST_TEST(err.find("has no VFs") != std::string::npos);
  BOOST_REQUIRE_EQUAL(run({"enable", "--pf", "ens3f0np0", "--count", "2"}), 0);
  BOOST_REQUIRE_EQUAL(run({"assign", "--owner", "vm1"}), 0);
  BOOST_REQUIRE_EQUAL(run({"reconcile"}), 0);
  BOOST_TEST(out.find("nothing to do") != std::string::npos);
  // Remove the VFs behind vrdma's back: reconcile notices and frees the entry.
  test::write_file(sim.root() / "bus/pci/devices/0000:af:00.0/sriov_numvfs", "0");
  for (int i = 0; i < 200 && fs::exists(sim.root() / "bus/pci/devices/0000:af:00.2"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto r = run_json({"reconcile"});
  BOOST_REQUIRE_EQUAL(r["actions"].size(), 1U);
  BOOST_TEST(r["actions"][0]["message"].get<std::string>().find("no longer exists in sysfs") != std::string::npos);
}
