// The pure parts of the hook's VF handling (guest_vf.hpp): ledger owner names, the VF settings an
// element asks for and their reset, and the vrdmad arguments for a VF. The flow itself (ledger,
// sysfs, backend) is integration_hook_vf_test.
#define BOOST_TEST_MODULE integration_guest_vf
#include <boost/test/unit_test.hpp>

#include "vrdma/integration/guest_vf.hpp"
#include "vrdma/sriov/pool.hpp"

using namespace vrdma;
using namespace vrdma::integration;

namespace {
DeviceMeta vf_device() {
  DeviceMeta m;
  m.socket = "/run/vrdma/g1.sock";
  m.engine = "verbs:vf";
  m.vf = VfRequest{};
  return m;
}
}  // namespace

BOOST_AUTO_TEST_CASE(owner_names_are_domain_at_host_and_fit_the_ledger) {
  BOOST_TEST(vf_owner("g1", "hv-a") == "g1@hv-a");
  BOOST_TEST(vf_owner("my guest", "hv-a") == "my_guest@hv-a");
  BOOST_TEST(vf_owner(std::string(300, 'x'), "h").size() == 96U + 2U);
  BOOST_TEST(vf_owner("", "h") == "_@h");
}

BOOST_AUTO_TEST_CASE(the_vf_settings_come_from_the_element_and_reset_to_a_fresh_vf) {
  auto m = vf_device();
  auto none = vf_config_for(m);
  BOOST_REQUIRE(none.ok());
  BOOST_TEST(none->empty());  // nothing asked: no netlink needed
  m.mac = "52:54:00:12:34:56";
  m.vf->vlan = 42;
  m.vf->max_rate_mbps = 10000;
  m.vf->trust = true;
  m.vf->spoofchk = false;
  auto c = vf_config_for(m);
  BOOST_REQUIRE(c.ok());
  BOOST_TEST(sriov::format_mac(c->mac.value()) == "52:54:00:12:34:56");
  BOOST_TEST(c->vlan.value() == 42);
  BOOST_TEST(c->max_tx_rate_mbps.value() == 10000U);
  BOOST_TEST(c->trust.value());
  BOOST_TEST(!c->spoofchk.value());
  const auto r = sriov::clean_vf_config(*c);
  BOOST_TEST(sriov::format_mac(r.mac.value()) == "00:00:00:00:00:00");
  BOOST_TEST(r.vlan.value() == 0);
  BOOST_TEST(r.max_tx_rate_mbps.value() == 0U);
  BOOST_TEST(!r.trust.value());
  BOOST_TEST(r.spoofchk.value());
  BOOST_TEST(!r.min_tx_rate_mbps.has_value());  // not asked, not touched
  BOOST_TEST(!r.link_state.has_value());
  BOOST_TEST(r.validate().ok());
  m.mac = "01:00:5e:00:00:01";
  auto multicast = vf_config_for(m);
  BOOST_REQUIRE(!multicast.ok());
  BOOST_TEST(multicast.error().message.find("the device's mac cannot be a VF's MAC") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(vrdmad_runs_on_the_vf_s_rdma_device_with_the_guest_s_mac) {
  auto m = vf_device();
  GuestVf vf{"0000:3b:00.2", "0000:3b:00.0", 0, "qedr_vf0", "02:5e:3b:02:00:00", "g1@h", false};
  auto b = backend_for_vf(m, vf);
  BOOST_TEST(b.engine == "verbs:qedr_vf0");
  BOOST_TEST(b.mac == "02:5e:3b:02:00:00");  // no mac in the element: the VF's own
  BOOST_TEST(b.socket == m.socket);
  m.engine = "verbs:vf?gid_index=3";
  m.mac = "52:54:00:12:34:56";
  b = backend_for_vf(m, vf);
  BOOST_TEST(b.engine == "verbs:qedr_vf0?gid_index=3");
  BOOST_TEST(b.mac == "52:54:00:12:34:56");
}
