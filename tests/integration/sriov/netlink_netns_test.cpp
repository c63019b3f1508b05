// rtnetlink through libnl against the real kernel, inside a network namespace this test creates.
// veth supports links and addresses; it has no SR-IOV, so VF settings must come back as the
// kernel's "not supported", turned into a sentence.
#define BOOST_TEST_MODULE sriov_netlink_netns
#include <boost/test/unit_test.hpp>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "netns.hpp"
#include "sriov_sysfs_simulator.hpp"
#include "vrdma/sriov/cli.hpp"
#include "vrdma/sriov/ledger.hpp"
#include "vrdma/sriov/netlink.hpp"

using namespace vrdma;
using namespace vrdma::sriov;
namespace t = vrdma::test;

namespace {
struct Netns {
  std::string name = "vrdmasriov" + std::to_string(getpid() % 100000);
  bool ok = false;
  Netns() {
    if (!t::can_make_netns()) return;
    t::sh("ip netns del " + name + " 2>/dev/null; true");
    ok = t::sh("ip netns add " + name) == 0 &&
         t::sh("ip -n " + name + " link add sv0 type veth peer name sv1") == 0 &&
         t::sh("ip -n " + name + " link add ens3f0np0 type veth peer name ens3peer") == 0;
  }
  ~Netns() {
    if (ok) t::sh("ip netns del " + name);
  }
};
bool has(const std::string& s, const char* x) { return s.find(x) != std::string::npos; }
}  // namespace

BOOST_AUTO_TEST_CASE(links_and_addresses_work_on_veth_in_a_netns) {
  Netns ns;
  if (!ns.ok) {
    BOOST_TEST_MESSAGE("SKIP: cannot create network namespaces here (needs root and iproute2)");
    return;
  }
  bool entered = t::run_in_netns(ns.name, [&] {
    auto nl = Rtnl::open();
    BOOST_REQUIRE(nl.ok());
    auto links = nl->links();
    BOOST_REQUIRE(links.ok());
    auto it = std::find_if(links->begin(), links->end(), [](const LinkInfo& l) { return l.name == "sv0"; });
    BOOST_REQUIRE(it != links->end());
    BOOST_TEST(it->kind == "veth");
    BOOST_TEST(it->num_vfs == 0U);
    BOOST_TEST(!it->admin_up);
    BOOST_REQUIRE(nl->set_mac("sv0", *parse_mac("02:00:5e:aa:bb:01")).ok());
    BOOST_REQUIRE(nl->set_admin_up("sv0", true).ok());
    auto l = nl->link("sv0");
    BOOST_REQUIRE(l.ok());
    BOOST_TEST(l->admin_up);
    BOOST_TEST(l->mac == "02:00:5e:aa:bb:01");
    auto add = nl->add_address("sv0", "10.231.0.1/24");
    BOOST_REQUIRE_MESSAGE(add.ok(), (add.ok() ? std::string() : add.error().message));
    BOOST_REQUIRE(nl->add_address("sv0", "fd00:231::1/64").ok());
    auto addrs = nl->addresses("sv0");
    BOOST_REQUIRE(addrs.ok());
    BOOST_TEST((std::find(addrs->begin(), addrs->end(), "10.231.0.1/24") != addrs->end()));
    BOOST_TEST((std::find(addrs->begin(), addrs->end(), "fd00:231::1/64") != addrs->end()));
    auto dup = nl->add_address("sv0", "10.231.0.1/24");
    BOOST_TEST(dup.error().is(Errc::busy));
    BOOST_TEST(nl->add_address("sv0", "10.231.0.1").error().is(Errc::invalid_argument));
    auto del = nl->del_address("sv0", "10.231.0.1/24");
    BOOST_REQUIRE_MESSAGE(del.ok(), (del.ok() ? std::string() : del.error().message));
    addrs = nl->addresses("sv0");
    BOOST_REQUIRE(addrs.ok());
    BOOST_TEST((std::find(addrs->begin(), addrs->end(), "10.231.0.1/24") == addrs->end()));
    BOOST_TEST((std::find(addrs->begin(), addrs->end(), "fd00:231::1/64") != addrs->end()));
    auto again = nl->del_address("sv0", "10.231.0.1/24");
    BOOST_TEST(again.error().is(Errc::not_found), again.error().message);
    BOOST_TEST(nl->del_address("sv0", "bogus").error().is(Errc::invalid_argument));
    auto missing = nl->link("nosuchdev0");
    BOOST_REQUIRE(!missing.ok());
    BOOST_TEST(missing.error().is(Errc::not_found));
    BOOST_TEST(has(missing.error().message, "no netdev named nosuchdev0"));
    BOOST_TEST(nl->link("a-name-longer-than-ifnamsiz").error().is(Errc::invalid_argument));
    auto vfs = nl->vfs("sv0");
    BOOST_REQUIRE(vfs.ok());
    BOOST_TEST(vfs->empty());
  });
  BOOST_TEST(entered);
}

BOOST_AUTO_TEST_CASE(vf_settings_on_veth_report_the_kernels_not_supported_clearly) {
  Netns ns;
  if (!ns.ok) {
    BOOST_TEST_MESSAGE("SKIP: cannot create network namespaces here (needs root and iproute2)");
    return;
  }
  t::run_in_netns(ns.name, [&] {
    auto nl = Rtnl::open();
    BOOST_REQUIRE(nl.ok());
    VfConfig each[6];
    each[0].mac = *parse_mac("02:00:5e:00:00:07");
    each[1].vlan = 100;
    each[1].qos = 3;
    each[2].spoofchk = false;
    each[3].trust = true;
    each[4].link_state = VfLinkState::disable;
    each[5].max_tx_rate_mbps = 10000;
    for (const auto& c : each) {
      auto st = nl->set_vf("sv0", 0, c);
      BOOST_REQUIRE(!st.ok());
      BOOST_TEST(st.error().is(Errc::not_supported));
      BOOST_TEST(has(st.error().message, "netdev sv0 (a veth device) does not support SR-IOV VF settings"),
                 st.error().message);
    }
    VfConfig bad;
    bad.vlan = 5000;
    BOOST_TEST(nl->set_vf("sv0", 0, bad).error().is(Errc::invalid_argument));  // checked before the kernel
  });
}

BOOST_AUTO_TEST_CASE(cli_assign_with_vf_settings_rolls_back_when_the_kernel_refuses) {
  // The simulated ConnectX-5 PF's netdev name exists in this netns as a veth: the VF request
  // reaches the real kernel, which refuses it; the ledger must not keep the reservation.
  Netns ns;
  if (!ns.ok) {
    BOOST_TEST_MESSAGE("SKIP: cannot create network namespaces here (needs root and iproute2)");
    return;
  }
  vrdma::sriov::test::SriovSysfsSimulator sim;
  sim.add_standard_nics();
  sim.start();
  std::string ledger = (sim.root().parent_path() / "ledger.sqlite").string();
  std::string root = sim.root().string();
  auto run = [&](std::vector<std::string> args, std::string& err) {
    args.insert(args.end(), {"--sysfs-root", root, "--ledger", ledger});
    std::ostringstream o, e;
    int rc = vf_cli_run(args, o, e);
    err = e.str();
    return rc;
  };
  std::string err;
  BOOST_REQUIRE_EQUAL(run({"enable", "--pf", "ens3f0np0", "--count", "2"}, err), 0);
  t::run_in_netns(ns.name, [&] {
    BOOST_TEST(run({"assign", "--owner", "vm1/rdma0", "--vlan", "10", "--max-rate", "2500"}, err) == 1);
    BOOST_TEST(has(err, "netdev ens3f0np0 (a veth device) does not support SR-IOV VF settings"), err);
    BOOST_TEST(run({"assign", "--owner", "vm1/rdma0"}, err) == 0, err);  // without VF settings it works
  });
  auto l = Ledger::open(ledger);
  BOOST_REQUIRE(l.ok());
  auto rows = l->list();
  BOOST_REQUIRE(rows.ok());
  BOOST_REQUIRE_EQUAL(rows->size(), 1U);
  BOOST_TEST(rows->at(0).vf.str() == "0000:af:00.2");  // the refused attempt left nothing behind
}
